"""A connector written against the wire protocol directly (no polar server), to misbehave on purpose.

polar starts it as a ``command:`` connector. ``RAW_FAULT`` (set through ``connector_spec.env``) picks
one deviation from docs/connector-protocol.md; without it the connector is correct:

- ``garbage_hello``: writes an HTTP request instead of the hello frame, then waits for polar to hang up;
- ``text_frame_hello``: a well-sized first frame whose body is not msgpack;
- ``no_final_obs``: step replies never carry ``final_obs`` / ``final_infos`` (documented as optional);
- ``obs_shape``: step observations of shape (K, 8) for a declared Box of shape (5,);
- ``reset_obs_shape``: the same, in the reset reply;
- ``rewards_short``: a rewards array one entry short;
- ``final_obs_shape``: the final observation of the last copy has shape (3,);
- ``final_obs_short``: the ``final_obs`` list is one entry short;
- ``garbage_step``: from step ``RAW_FAULT_AT`` on, a frame whose body is not msgpack;
- ``text_step``: from step ``RAW_FAULT_AT`` on, text written to the socket with no frame header;
- ``shm_bad_counter``: offers shared-memory steps (section 4.7), maps the file, then answers the first request
  with a reply counter 5 past the request's.

The env: obs ``[t, copy, 0, 0, 0]`` (Box(0, 100, (5,))), Discrete(2) actions, reward 1 per step;
copy ``i`` ends its episode after ``3 + i`` steps, terminated when the action was 1, else truncated.
"""

from __future__ import annotations

import mmap
import os
import socket
import sys
import time

import numpy as np

from polar.harness.connector.wire import PROTOCOL_VERSION, Codec, ConnectionClosed, FrameSocket, parse_address

FAULT = os.environ.get("RAW_FAULT", "")
FAULT_AT = int(os.environ.get("RAW_FAULT_AT", "1"))
OBS_SPACE = {"type": "Box", "low": 0.0, "high": 100.0, "shape": [5], "dtype": "float32"}


def main() -> int:
    family, addr = parse_address(os.environ["POLAR_CONNECTOR_ADDRESS"])
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.connect(addr)
    if FAULT == "garbage_hello":
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        while sock.recv(4096):  # polar hangs up; then exit
            pass
        return 0
    if FAULT == "text_frame_hello":
        sock.sendall(b"\x00\x00\x00\x0b\xc1not-a-hello")
        while sock.recv(4096):
            pass
        return 0
    conn, codec = FrameSocket(sock), Codec()
    hello = {"type": "hello", "protocol": PROTOCOL_VERSION, "token": os.environ["POLAR_CONNECTOR_TOKEN"],
             "pid": os.getpid(), "language": "python-raw"}
    if FAULT == "shm_bad_counter":
        hello["shared_memory"] = 1
    conn.send(codec.pack(hello))
    k, t, steps = 1, np.zeros(1, dtype=np.int64), 0

    def observe(ts: np.ndarray) -> np.ndarray:
        obs = np.zeros((len(ts), 5), dtype=np.float32)
        obs[:, 0], obs[:, 1] = ts, np.arange(len(ts))
        return obs

    while True:
        try:
            msg = codec.unpack(conn.recv())
        except ConnectionClosed:
            return 0
        op = msg.get("op")
        reply: dict = {"ok": True}
        if op == "init":
            k = int(msg["num_envs"])
            t = np.zeros(k, dtype=np.int64)
            reply.update(class_name="RawWalk", action_space={"type": "Discrete", "n": 2},
                         observation_space=OBS_SPACE, reset_accepts_seed=False)
        elif op == "reset":
            ids = msg.get("env_ids") or list(range(k))
            t[ids] = 0
            obs = observe(t[ids])
            if FAULT == "reset_obs_shape":
                obs = np.zeros((len(ids), 8), dtype=np.float32)
            reply.update(obs=obs, infos=[{} for _ in ids])
        elif op == "step":
            steps += 1
            if FAULT == "garbage_step" and steps >= FAULT_AT:
                conn.send(b"\xc1\xc1 not msgpack")
                continue
            if FAULT == "text_step" and steps >= FAULT_AT:
                sock.sendall(b"Traceback (most recent call last):\n")
                continue
            actions = np.asarray(msg["actions"]).reshape(-1)
            t += 1
            done = t >= 3 + np.arange(k)
            terminated, truncated = done & (actions == 1), done & (actions != 1)
            final = observe(t)
            t[done] = 0
            obs = observe(t)
            if FAULT == "obs_shape":
                obs = np.zeros((k, 8), dtype=np.float32)
            rewards = np.ones(k, dtype=np.float64)
            if FAULT == "rewards_short":
                rewards = rewards[:-1]
            reply.update(obs=obs, rewards=rewards, terminated=terminated, truncated=truncated)
            if done.any() and FAULT != "no_final_obs":
                reply["final_obs"] = [final[i] if done[i] else None for i in range(k)]
                reply["final_infos"] = [{"steps": int(steps)} if done[i] else None for i in range(k)]
                if FAULT == "final_obs_shape" and done[k - 1]:
                    reply["final_obs"][k - 1] = np.zeros(3, dtype=np.float32)
                if FAULT == "final_obs_short":
                    reply["final_obs"].pop()
        elif op == "close":
            conn.send(codec.pack(reply))
            return 0
        elif op == "shared_memory":
            return bad_counter(msg, conn, codec.pack(reply))
        conn.send(codec.pack(reply))


def bad_counter(msg: dict, conn: FrameSocket, ok: bytes) -> int:
    """Map the file as section 4.7 says (then reply), wait for polar's first request, answer it with a wrong counter."""
    fd = os.open(msg["path"], os.O_RDWR)
    slots = memoryview(mmap.mmap(fd, int(msg["size"]))).cast("q")
    os.close(fd)
    conn.send(ok)
    index = msg["slots"]
    while slots[index["req_seq"]] == 0:
        time.sleep(0.001)
    slots[index["rep_kind"]] = 0
    slots[index["rep_seq"]] = slots[index["req_seq"]] + 5
    conn.send_wake()
    while conn.readable(None):  # until polar hangs up
        try:
            conn.drain()
        except ConnectionClosed:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
