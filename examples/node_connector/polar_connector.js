// polar connector protocol for Node.js, self-contained (no npm packages).
//
// Implements docs/connector-protocol.md: length-prefixed msgpack frames over the socket named in
// POLAR_CONNECTOR_ADDRESS, numpy arrays as msgpack ext type 1.
// - One agent (protocol 1): a game supplies a class with
//     constructor(config), reset(seed) -> obs, step(action) -> [obs, reward, terminated, truncated, info]
//   plus static observationSpace / actionSpace maps, and calls serve(TheClass).
// - Several agents (protocol 2, section 7): a game supplies a class with static possibleAgents (a list of ids),
//   observationSpaces / actionSpaces (maps from agent id to space), actionMasks (true when it sends masks), and
//     constructor(config), reset(seed) -> {obs, masks}, step({agent: action}) -> {obs, rewards, terminated, truncated, masks}
//   where each field is a map from agent id (obs and masks: only the agents that act next), and calls
//   serveMultiAgent(TheClass).
'use strict';

const net = require('net');

// ------------------------------------------------------------------------------------ ndarrays
// An ndarray on the wire: dtype string (numpy style: '<f4', '<f8', '<i8', '|b1', '|u1'), shape, bytes.
class NDArray {
  constructor(dtype, shape, data) {
    this.dtype = dtype;
    this.shape = shape;
    this.data = data; // Buffer, C order, little-endian
  }
  static float32(values, shape) {
    const buf = Buffer.alloc(values.length * 4);
    values.forEach((v, i) => buf.writeFloatLE(v, i * 4));
    return new NDArray('<f4', shape || [values.length], buf);
  }
  static float64(values) {
    const buf = Buffer.alloc(values.length * 8);
    values.forEach((v, i) => buf.writeDoubleLE(v, i * 8));
    return new NDArray('<f8', [values.length], buf);
  }
  static int8(values) {
    return new NDArray('|i1', [values.length], Buffer.from(Int8Array.from(values).buffer));
  }
  static bool(values) {
    return new NDArray('|b1', [values.length], Buffer.from(values.map((v) => (v ? 1 : 0))));
  }
  // Flat JS numbers from any numeric dtype polar sends.
  toArray() {
    const readers = {
      '<f4': [4, (b, o) => b.readFloatLE(o)], '<f8': [8, (b, o) => b.readDoubleLE(o)],
      '<i8': [8, (b, o) => Number(b.readBigInt64LE(o))], '<i4': [4, (b, o) => b.readInt32LE(o)],
      '<u8': [8, (b, o) => Number(b.readBigUInt64LE(o))], '|u1': [1, (b, o) => b.readUInt8(o)],
      '|i1': [1, (b, o) => b.readInt8(o)], '|b1': [1, (b, o) => b.readUInt8(o) !== 0],
    };
    const r = readers[this.dtype];
    if (!r) throw new Error(`unsupported dtype ${this.dtype}`);
    const out = [];
    for (let o = 0; o < this.data.length; o += r[0]) out.push(r[1](this.data, o));
    return out;
  }
}

function encodeNDArray(a) {
  const dt = Buffer.from(a.dtype, 'ascii');
  const head = Buffer.alloc(2 + dt.length + 4 * a.shape.length);
  head.writeUInt8(dt.length, 0);
  dt.copy(head, 1);
  head.writeUInt8(a.shape.length, 1 + dt.length);
  a.shape.forEach((d, i) => head.writeUInt32LE(d, 2 + dt.length + 4 * i));
  return Buffer.concat([head, a.data]);
}

function decodeNDArray(buf) {
  const n = buf.readUInt8(0);
  const dtype = buf.toString('ascii', 1, 1 + n);
  const ndim = buf.readUInt8(1 + n);
  const shape = [];
  for (let i = 0; i < ndim; i++) shape.push(buf.readUInt32LE(2 + n + 4 * i));
  return new NDArray(dtype, shape, buf.subarray(2 + n + 4 * ndim));
}

// ------------------------------------------------------------------------------------ msgpack
function pack(value) {
  const parts = [];
  const u8 = (b) => parts.push(Buffer.from([b]));
  const hdr = (b, size, bytes) => {
    const buf = Buffer.alloc(1 + bytes);
    buf.writeUInt8(b, 0);
    if (bytes === 1) buf.writeUInt8(size, 1);
    else if (bytes === 2) buf.writeUInt16BE(size, 1);
    else buf.writeUInt32BE(size, 1);
    parts.push(buf);
  };
  const enc = (v) => {
    if (v === null || v === undefined) u8(0xc0);
    else if (v === true) u8(0xc3);
    else if (v === false) u8(0xc2);
    else if (typeof v === 'number') {
      if (Number.isInteger(v) && v >= 0 && v < 128) u8(v);
      else if (Number.isInteger(v) && v < 0 && v >= -32) u8(0x100 + v);
      else if (Number.isInteger(v) && Math.abs(v) < 2 ** 31) {
        const b = Buffer.alloc(5); b.writeUInt8(0xd2, 0); b.writeInt32BE(v, 1); parts.push(b);
      } else {
        const b = Buffer.alloc(9); b.writeUInt8(0xcb, 0); b.writeDoubleBE(v, 1); parts.push(b);
      }
    } else if (typeof v === 'string') {
      const s = Buffer.from(v, 'utf8');
      if (s.length < 32) u8(0xa0 | s.length); else if (s.length < 256) hdr(0xd9, s.length, 1);
      else if (s.length < 65536) hdr(0xda, s.length, 2); else hdr(0xdb, s.length, 4);
      parts.push(s);
    } else if (v instanceof NDArray) {
      const payload = encodeNDArray(v);
      if (payload.length < 256) hdr(0xc7, payload.length, 1);
      else if (payload.length < 65536) hdr(0xc8, payload.length, 2); else hdr(0xc9, payload.length, 4);
      u8(1); // ext type 1: ndarray
      parts.push(payload);
    } else if (Buffer.isBuffer(v)) {
      if (v.length < 256) hdr(0xc4, v.length, 1); else if (v.length < 65536) hdr(0xc5, v.length, 2);
      else hdr(0xc6, v.length, 4);
      parts.push(v);
    } else if (Array.isArray(v)) {
      if (v.length < 16) u8(0x90 | v.length); else if (v.length < 65536) hdr(0xdc, v.length, 2);
      else hdr(0xdd, v.length, 4);
      v.forEach(enc);
    } else if (typeof v === 'object') {
      const keys = Object.keys(v);
      if (keys.length < 16) u8(0x80 | keys.length); else if (keys.length < 65536) hdr(0xde, keys.length, 2);
      else hdr(0xdf, keys.length, 4);
      keys.forEach((k) => { enc(k); enc(v[k]); });
    } else throw new Error(`cannot pack ${typeof v}`);
  };
  enc(value);
  return Buffer.concat(parts);
}

function unpack(buf) {
  let o = 0;
  const take = (n) => { const s = buf.subarray(o, o + n); o += n; return s; };
  const arr = (n) => { const a = []; for (let i = 0; i < n; i++) a.push(dec()); return a; };
  const map = (n) => { const m = {}; for (let i = 0; i < n; i++) { const k = dec(); m[k] = dec(); } return m; };
  const ext = (n) => { const type = buf.readInt8(o); o += 1; const data = take(n);
    if (type !== 1) throw new Error(`unsupported ext type ${type} (this connector never asks for compression)`);
    return decodeNDArray(data); };
  const dec = () => {
    const b = buf.readUInt8(o); o += 1;
    if (b < 0x80) return b;
    if (b < 0x90) return map(b & 0x0f);
    if (b < 0xa0) return arr(b & 0x0f);
    if (b < 0xc0) return take(b & 0x1f).toString('utf8');
    if (b >= 0xe0) return b - 0x100;
    let v;
    switch (b) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return Buffer.from(take(buf.readUInt8((o += 1) - 1)));
      case 0xc5: v = buf.readUInt16BE(o); o += 2; return Buffer.from(take(v));
      case 0xc6: v = buf.readUInt32BE(o); o += 4; return Buffer.from(take(v));
      case 0xc7: v = buf.readUInt8(o); o += 1; return ext(v);
      case 0xc8: v = buf.readUInt16BE(o); o += 2; return ext(v);
      case 0xc9: v = buf.readUInt32BE(o); o += 4; return ext(v);
      case 0xca: v = buf.readFloatBE(o); o += 4; return v;
      case 0xcb: v = buf.readDoubleBE(o); o += 8; return v;
      case 0xcc: v = buf.readUInt8(o); o += 1; return v;
      case 0xcd: v = buf.readUInt16BE(o); o += 2; return v;
      case 0xce: v = buf.readUInt32BE(o); o += 4; return v;
      case 0xcf: v = Number(buf.readBigUInt64BE(o)); o += 8; return v;
      case 0xd0: v = buf.readInt8(o); o += 1; return v;
      case 0xd1: v = buf.readInt16BE(o); o += 2; return v;
      case 0xd2: v = buf.readInt32BE(o); o += 4; return v;
      case 0xd3: v = Number(buf.readBigInt64BE(o)); o += 8; return v;
      case 0xd4: return ext(1);
      case 0xd5: return ext(2);
      case 0xd6: return ext(4);
      case 0xd7: return ext(8);
      case 0xd8: return ext(16);
      case 0xd9: v = buf.readUInt8(o); o += 1; return take(v).toString('utf8');
      case 0xda: v = buf.readUInt16BE(o); o += 2; return take(v).toString('utf8');
      case 0xdb: v = buf.readUInt32BE(o); o += 4; return take(v).toString('utf8');
      case 0xdc: v = buf.readUInt16BE(o); o += 2; return arr(v);
      case 0xdd: v = buf.readUInt32BE(o); o += 4; return arr(v);
      case 0xde: v = buf.readUInt16BE(o); o += 2; return map(v);
      case 0xdf: v = buf.readUInt32BE(o); o += 4; return map(v);
      default: throw new Error(`bad msgpack byte 0x${b.toString(16)}`);
    }
  };
  return dec();
}

// ------------------------------------------------------------------------------------ server
function stackObs(list) {
  const shape = [list.length, ...list[0].shape];
  return new NDArray(list[0].dtype, shape, Buffer.concat(list.map((a) => a.data)));
}

function serve(EnvClass) {
  connect(EnvClass, 1, singleAgentHandler(EnvClass));
}

function serveMultiAgent(GameClass) {
  connect(GameClass, 2, multiAgentHandler(GameClass));
}

// Protocol 2's messages (docs/connector-protocol.md section 7): one map per copy, keyed by agent id. A copy
// whose agents have all ended waits for a reset that names it (no auto-reset).
function multiAgentHandler(GameClass) {
  let games = [];
  const masks = (m) => Object.fromEntries(Object.entries(m || {}).map(([a, v]) => [a, NDArray.int8(v)]));
  return (msg) => {
    switch (msg.op) {
      case 'init': {
        const copies = Array.isArray(msg.copies) ? msg.copies : [];
        games = Array.from({ length: msg.num_envs }, (_, i) => {
          const copy = copies[i] || {};
          return new GameClass(Object.assign({}, msg.config || {}, 'seed' in copy ? { seed: copy.seed } : {}), copy);
        });
        return { class_name: GameClass.name, multi_agent: true, possible_agents: GameClass.possibleAgents,
          observation_spaces: GameClass.observationSpaces, action_spaces: GameClass.actionSpaces,
          action_masks: Boolean(GameClass.actionMasks), reset_accepts_seed: true };
      }
      case 'ping': return {};
      case 'reset': {
        const ids = msg.env_ids || games.map((_, i) => i);
        const seeds = msg.seeds || ids.map(() => null);
        const outs = ids.map((i, j) => games[i].reset(seeds[j]));
        return { obs: outs.map((o) => o.obs), action_masks: outs.map((o) => masks(o.masks)), infos: ids.map(() => ({})) };
      }
      case 'step': {
        const outs = games.map((g, i) => {
          const acts = {};
          for (const [agent, a] of Object.entries(msg.actions[i] || {})) acts[agent] = a instanceof NDArray ? a.toArray()[0] : a;
          return g.step(acts);
        });
        return { obs: outs.map((o) => o.obs), rewards: outs.map((o) => o.rewards), terminated: outs.map((o) => o.terminated),
          truncated: outs.map((o) => o.truncated), action_masks: outs.map((o) => masks(o.masks)) };
      }
      default: throw new Error(`unknown op ${msg.op}`);
    }
  };
}

function singleAgentHandler(EnvClass) {
  let envs = [];
  return (msg) => {
    switch (msg.op) {
      case 'init': {
        // copy i's config: the shared one, with copy i's own seed when polar sent one; its place
        // (worker_index, vector_index, restarts) is the second argument (docs/connector-protocol.md, 4.1)
        const copies = Array.isArray(msg.copies) ? msg.copies : [];
        envs = Array.from({ length: msg.num_envs }, (_, i) => {
          const copy = copies[i] || {};
          const config = Object.assign({}, msg.config || {}, 'seed' in copy ? { seed: copy.seed } : {});
          return new EnvClass(config, copy);
        });
        return { class_name: EnvClass.name, observation_space: EnvClass.observationSpace,
          action_space: EnvClass.actionSpace, reset_accepts_seed: true };
      }
      case 'ping': return {};
      case 'reset': {
        const ids = msg.env_ids || envs.map((_, i) => i);
        const seeds = msg.seeds || ids.map(() => null);
        const obs = ids.map((i, j) => envs[i].reset(seeds[j]));
        return { obs: stackObs(obs), infos: ids.map(() => ({})) };
      }
      case 'step': {
        const actions = msg.actions.toArray();
        const obs = [], rewards = [], term = [], trunc = [], infos = [];
        const finalObs = envs.map(() => null), finalInfos = envs.map(() => null);
        let anyFinal = false;
        envs.forEach((env, i) => {
          let [o, r, te, tr, info] = env.step(actions[i]);
          if (te || tr) { anyFinal = true; finalObs[i] = o; finalInfos[i] = info; o = env.reset(null); info = {}; }
          obs.push(o); rewards.push(r); term.push(te); trunc.push(tr); infos.push(info);
        });
        const reply = { obs: stackObs(obs), rewards: NDArray.float64(rewards), terminated: NDArray.bool(term),
          truncated: NDArray.bool(trunc), infos };
        if (anyFinal) { reply.final_obs = finalObs; reply.final_infos = finalInfos; }
        return reply;
      }
      default: throw new Error(`unknown op ${msg.op}`);
    }
  };
}

function connect(EnvClass, protocol, handle) {
  const address = process.env.POLAR_CONNECTOR_ADDRESS;
  if (!address) { process.stderr.write('POLAR_CONNECTOR_ADDRESS is not set; polar starts this process\n'); process.exit(2); }
  const [kind, ...rest] = address.split(':');
  const sock = kind === 'unix' ? net.createConnection({ path: rest.join(':') })
    : net.createConnection({ host: rest.slice(0, -1).join(':'), port: Number(rest[rest.length - 1]) });
  sock.setNoDelay(true);
  let maxFrame = 64 * 1024 * 1024;
  const send = (msg) => {
    const body = pack(msg);
    const head = Buffer.alloc(4); head.writeUInt32BE(body.length, 0);
    sock.write(Buffer.concat([head, body]));
  };
  sock.on('connect', () => send({ type: 'hello', protocol, token: process.env.POLAR_CONNECTOR_TOKEN || '',
    pid: process.pid, language: 'javascript', name: EnvClass.name }));
  let pending = Buffer.alloc(0);
  sock.on('data', (chunk) => {
    pending = Buffer.concat([pending, chunk]);
    while (pending.length >= 4) {
      const n = pending.readUInt32BE(0);
      if (n > maxFrame) { process.stderr.write(`frame of ${n} bytes over max_frame_bytes=${maxFrame}\n`); process.exit(1); }
      if (pending.length < 4 + n) break;
      const msg = unpack(pending.subarray(4, 4 + n));
      pending = pending.subarray(4 + n);
      if (msg.op === 'close') { send({ ok: true }); sock.end(); return; }
      let reply;
      try {
        reply = handle(msg);
        reply.ok = true;
      } catch (e) {
        reply = { ok: false, error: { kind: 'remote', message: `${EnvClass.name}.${msg.op} raised ${e.name}: ${e.message}`,
          traceback: String(e.stack || '') } };
      }
      send(reply);
    }
  });
  sock.on('close', () => process.exit(0));
  sock.on('error', (e) => { process.stderr.write(`connector socket error: ${e.message}\n`); process.exit(1); });
}

module.exports = { NDArray, pack, unpack, serve, serveMultiAgent };
