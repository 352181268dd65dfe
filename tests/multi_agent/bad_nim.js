// nim.js with one bad field in its replies, chosen by config.bad (tests/multi_agent/test_connector.py).
'use strict';

const path = require('path');
const { NDArray, serveMultiAgent } = require(path.join(__dirname, '../../examples/node_connector/polar_connector'));
const { Nim } = require(path.join(__dirname, '../../examples/node_connector/nim'));

class BadNim extends Nim {
  constructor(config) {
    super(config);
    this.bad = config.bad;
  }

  reset(seed) {
    const out = super.reset(seed);
    if (this.bad === 'unknown_agent') out.obs.ghost = out.obs.first;
    if (this.bad === 'mask_shape') out.masks.first = [1, 1];
    return out;
  }

  step(actions) {
    const out = super.step(actions);
    if (this.bad === 'reward_text') out.rewards.first = 'lots';
    if (this.bad === 'missing_terminated') delete out.terminated.first;
    if (this.bad === 'obs_shape' && out.obs.second) out.obs.second = NDArray.float32([0, 0, 0, 0, 1]);
    if (this.bad === 'nobody') { out.obs = {}; out.masks = {}; }
    if (this.bad === 'crash') process.exit(3);
    return out;
  }
}

serveMultiAgent(BadNim);
