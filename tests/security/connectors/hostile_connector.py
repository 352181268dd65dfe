"""A connector written against the wire protocol (run as a ``command:``) that attacks the learner. ``HOSTILE``
(set through ``connector_spec.env``) picks the attack:

- ``zstd_bomb`` (default): its reset reply carries about 32 KiB on the wire that inflates to 1 GiB. It declares
  a 2-float observation; the array header claims 2**30 bytes of uint8;
- ``lying_header``: the bomb's compressed bytes under a header that announces the declared 2 floats (8 bytes);
- ``init_bomb``: the same bomb as the ``low`` of its declared observation space, a Box of shape [1] whose dtype
  (``V1073741824``) claims a gigabyte per element;
- ``map_bomb``: a 16 MiB reset reply of nested tiny lists of empty maps: msgpack-decoded, about 1.1 GiB of dicts;
- ``forged_name``: a correct game whose declared class name holds a newline, a forged log line and a terminal
  escape sequence.
"""

from __future__ import annotations

import os
import socket
import struct

import msgpack
import zstandard

from polar.harness.connector.wire import (
    EXT_COMPRESSED,
    PROTOCOL_VERSION,
    Codec,
    ConnectionClosed,
    FrameSocket,
    parse_address,
)

BOMB_BYTES = 1 << 30
MODE = os.environ.get("HOSTILE", "zstd_bomb")
FORGED_NAME = "Game\n2026-12-06 21:00:00 WARNING polar: reward verified by the operator \x1b[2J\x1b[31mOK"


def bomb(lie: bool = False) -> msgpack.ExtType:
    """ext 2, codec 1 (zstd), header ``|u1`` shape (2**30,) (or, with ``lie``, ``<f4`` shape (1, 2)), then 1 GiB of
    zeros compressed, streamed so no 1 GiB buffer exists here."""
    cctx = zstandard.ZstdCompressor(level=19)
    chunk = bytes(1 << 20)
    out = bytearray()
    writer = cctx.compressobj(size=BOMB_BYTES)
    for _ in range(BOMB_BYTES // len(chunk)):
        out += writer.compress(chunk)
    out += writer.flush()
    header = bytes([3]) + b"|u1" + bytes([1]) + struct.pack("<I", BOMB_BYTES)
    if lie:
        header = bytes([3]) + b"<f4" + bytes([2]) + struct.pack("<2I", 1, 2)
    return msgpack.ExtType(EXT_COMPRESSED, bytes([1]) + header + bytes(out))


def map_bomb() -> bytes:
    """``{"ok": true, "obs": [[{} x 15] x N]}`` in 16 MiB: 16 wire bytes become a list and 15 dicts (~1.1 KiB)."""
    n = (16 << 20) // 16
    return (b"\x82\xa2ok\xc3\xa3obs" + b"\xdd" + struct.pack(">I", n) + (b"\x9f" + b"\x80" * 15) * n)


def main() -> int:
    family, addr = parse_address(os.environ["POLAR_CONNECTOR_ADDRESS"])
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.connect(addr)
    conn, codec = FrameSocket(sock), Codec()
    conn.send(codec.pack({"type": "hello", "protocol": PROTOCOL_VERSION, "token": os.environ["POLAR_CONNECTOR_TOKEN"],
                          "pid": os.getpid(), "language": "python-raw"}))
    payload = bomb(lie=MODE == "lying_header") if MODE in ("zstd_bomb", "init_bomb", "lying_header") else None
    while True:
        try:
            msg = codec.unpack(conn.recv())
        except ConnectionClosed:
            return 0
        op = msg.get("op")
        reply: dict = {"ok": True}
        if op == "init":
            reply.update(class_name="ZstdBomb" if MODE != "forged_name" else FORGED_NAME, action_space={"type": "Discrete", "n": 2},
                         observation_space={"type": "Box", "low": -1.0, "high": 1.0, "shape": [2], "dtype": "float32"})
            if MODE == "init_bomb":
                reply["observation_space"] = {"type": "Box", "low": payload, "high": 1.0, "shape": [1],
                                              "dtype": "V1073741824"}
        elif op == "reset" and MODE == "map_bomb":
            conn.send(map_bomb())
            continue
        elif op == "reset":
            reply.update(obs=payload if MODE in ("zstd_bomb", "lying_header") else [[0.0, 0.0]], infos=[{}])
        elif op == "step":
            reply.update(obs=[[0.0, 0.0]], rewards=[0.0], terminated=[False], truncated=[False])
        conn.send(msgpack.packb(reply, use_bin_type=True))
        if op == "close":
            return 0


if __name__ == "__main__":
    raise SystemExit(main())
