// LineWalk: a tiny game written in JavaScript, trained by polar through the connector protocol.
//
// The agent stands on a line of `size` cells and must reach the goal at the right end.
// Actions: 0 = left, 1 = right. Reward +1 at the goal, -0.01 per step; `max_steps` ends the
// episode as truncated. Observation: [position / (size - 1), steps taken / max_steps] (float32).
'use strict';

const { NDArray, serve } = require('./polar_connector');

// A small seeded PRNG (mulberry32) so the same seed gives the same start cells.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class LineWalk {
  static observationSpace = { type: 'Box', low: 0.0, high: 1.0, shape: [2], dtype: 'float32' };
  static actionSpace = { type: 'Discrete', n: 2 };

  constructor(config) {
    this.size = config.size || 8;
    this.maxSteps = config.max_steps || 30;
    this.random = rng(config.seed || 0);
    if (config.noisy) console.log('LineWalk constructed (stdout is not the channel, this is harmless)');
  }

  reset(seed) {
    if (seed !== null && seed !== undefined) this.random = rng(seed);
    this.pos = Math.floor(this.random() * (this.size - 1)); // never starts on the goal
    this.t = 0;
    return this.observe();
  }

  step(action) {
    if (action !== 0 && action !== 1) throw new RangeError(`action must be 0 or 1, got ${action}`);
    this.t += 1;
    this.pos = Math.max(0, Math.min(this.size - 1, this.pos + (action === 1 ? 1 : -1)));
    const terminated = this.pos === this.size - 1;
    const truncated = !terminated && this.t >= this.maxSteps;
    const reward = (terminated ? 1.0 : 0.0) - 0.01;
    const info = terminated || truncated ? { success: terminated } : {};
    return [this.observe(), reward, terminated, truncated, info];
  }

  observe() {
    return NDArray.float32([this.pos / (this.size - 1), this.t / this.maxSteps]);
  }
}

serve(LineWalk);
