"""A minimal connector that records the opening exchange byte for byte (for the hex dump in the docs).

Writes a JSON list of ``[direction, hex]`` to the path in ``argv[1]``: its hello, polar's ``init``
and its ``init`` reply, each frame whole (length header included) exactly as it crossed the socket.
Then it serves ``reset`` and ``close`` until polar hangs up. ``pid`` is fixed so the dump is stable.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import numpy as np

from polar.harness.connector.wire import PROTOCOL_VERSION, Codec, ConnectionClosed, FrameSocket, parse_address

HELLO = {"type": "hello", "protocol": PROTOCOL_VERSION, "token": "", "pid": 4242, "language": "python"}
INIT_REPLY = {"ok": True, "class_name": "LineWalk", "action_space": {"type": "Discrete", "n": 2},
              "observation_space": {"type": "Box", "low": 0.0, "high": 1.0, "shape": [2], "dtype": "float32"},
              "reset_accepts_seed": True}


def frame(body: bytes) -> str:
    return (len(body).to_bytes(4, "big") + body).hex()


def main() -> int:
    family, addr = parse_address(os.environ["POLAR_CONNECTOR_ADDRESS"])
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.connect(addr)
    conn, codec = FrameSocket(sock), Codec()
    frames = []
    hello = codec.pack({**HELLO, "token": os.environ["POLAR_CONNECTOR_TOKEN"]})
    frames.append(["connector -> polar", frame(hello)])
    conn.send(hello)
    frames.append(["polar -> connector", frame(conn.recv())])
    reply = codec.pack(INIT_REPLY)
    frames.append(["connector -> polar", frame(reply)])
    with open(sys.argv[1], "w") as f:
        json.dump(frames, f)
    conn.send(reply)
    while True:
        try:
            msg = codec.unpack(conn.recv())
        except ConnectionClosed:
            return 0
        if msg.get("op") == "close":
            conn.send(codec.pack({"ok": True}))
            return 0
        conn.send(codec.pack({"ok": True, "obs": np.zeros((1, 2), np.float32), "infos": [{}]}))


if __name__ == "__main__":
    sys.exit(main())
