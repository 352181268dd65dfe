// Nim, a 2-player game written in JavaScript, trained by polar through the multi-agent connector protocol
// (docs/connector-protocol.md section 7; examples/node_connector/nim_selfplay.yaml).
//
// A pile of stones (a seeded random size in [min_pile, max_pile]); the players take turns, each taking 1 to
// max_take stones; whoever takes the last stone wins (+1, the other -1). Player "first" moves first. Only the
// player to move is observed; its action mask forbids taking more stones than are left.
// Observation: the pile as a one-hot vector of max_pile + 1 (float32). Action k: take k + 1 stones.
'use strict';

const { NDArray, serveMultiAgent } = require('./polar_connector');

// mulberry32: the same seed gives the same piles
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

const MAX_PILE = 21;
const MAX_TAKE = 3;
const space = { type: 'Box', low: 0.0, high: 1.0, shape: [MAX_PILE + 1], dtype: 'float32' };

class Nim {
  static possibleAgents = ['first', 'second'];
  static observationSpaces = { first: space, second: space };
  static actionSpaces = { first: { type: 'Discrete', n: MAX_TAKE }, second: { type: 'Discrete', n: MAX_TAKE } };
  static actionMasks = true;

  constructor(config) {
    this.minPile = config.min_pile || 5;
    this.maxPile = Math.min(config.max_pile || MAX_PILE, MAX_PILE);
    if (this.minPile < 1 || this.minPile > this.maxPile) throw new RangeError(`min_pile must be in 1..max_pile, got ${this.minPile}`);
    this.random = rng(config.seed || 0);
  }

  observe() {
    const o = new Array(MAX_PILE + 1).fill(0);
    o[this.pile] = 1;
    const mover = Nim.possibleAgents[this.turn];
    const mask = Array.from({ length: MAX_TAKE }, (_, k) => (k + 1 <= this.pile ? 1 : 0));
    return { obs: { [mover]: NDArray.float32(o) }, masks: { [mover]: mask } };
  }

  reset(seed) {
    if (seed !== null && seed !== undefined) this.random = rng(seed);
    this.pile = this.minPile + Math.floor(this.random() * (this.maxPile - this.minPile + 1));
    this.turn = 0;
    return this.observe();
  }

  step(actions) {
    const mover = Nim.possibleAgents[this.turn];
    const other = Nim.possibleAgents[1 - this.turn];
    const a = actions[mover];
    if (!Number.isInteger(a) || a < 0 || a + 1 > Math.min(MAX_TAKE, this.pile)) {
      throw new RangeError(`${mover} cannot take ${a + 1} stones from a pile of ${this.pile}`);
    }
    this.pile -= a + 1;
    if (this.pile === 0) {
      return { obs: {}, masks: {}, rewards: { [mover]: 1, [other]: -1 },
        terminated: { [mover]: true, [other]: true }, truncated: { [mover]: false, [other]: false } };
    }
    this.turn = 1 - this.turn;
    return { ...this.observe(), rewards: { [mover]: 0 }, terminated: { [mover]: false }, truncated: { [mover]: false } };
  }
}

if (require.main === module) serveMultiAgent(Nim);
module.exports = { Nim };
