"""The wire format: ndarray ext types, compression codecs, malformed input. No pickle anywhere."""

from __future__ import annotations

import socket
import struct

import msgpack
import numpy as np
import pytest

from polar.errors import ProtocolError
from polar.harness.connector.wire import Codec, FrameSocket


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "uint8", "bool", "int16", ">f4"])
def test_ndarray_roundtrip(dtype):
    arr = (np.arange(24).reshape(2, 3, 4) % 2).astype(dtype)
    out = Codec().unpack(Codec().pack({"a": arr, "nested": [arr[0], {"s": arr[0, 0, 0]}]}))
    np.testing.assert_array_equal(out["a"], arr)
    assert out["a"].dtype == arr.dtype and out["a"].flags.writeable
    assert out["nested"][1]["s"] == arr[0, 0, 0]


def test_ext_payload_layout_matches_the_spec():
    packed = Codec().pack(np.array([1.5, -2.0], dtype="<f4"))
    ext = msgpack.unpackb(packed, ext_hook=lambda code, data: (code, data))
    code, data = ext
    assert code == 1
    assert data == bytes([3]) + b"<f4" + bytes([1]) + struct.pack("<I", 2) + np.array([1.5, -2.0], "<f4").tobytes()


@pytest.mark.parametrize("codec", ["zstd", "lz4", "png", "jpeg"])
def test_compression_codecs(codec):
    img = np.zeros((2, 32, 32, 3), dtype=np.uint8)
    img[:, 8:24, 8:24] = 200
    packed = Codec(codec, compress_min_bytes=0).pack({"pixels": img})
    assert len(packed) < img.nbytes / 4
    out = Codec().unpack(packed)["pixels"]
    assert out.shape == img.shape
    if codec == "jpeg":
        assert np.abs(out.astype(int) - img).mean() < 3
    else:
        np.testing.assert_array_equal(out, img)


def test_object_arrays_and_unknown_types_are_refused():
    with pytest.raises(TypeError, match="cannot be sent"):
        Codec().pack(np.array([object()]))
    with pytest.raises(TypeError, match="cannot be sent"):
        Codec().pack({"x": object()})
    evil = msgpack.packb(msgpack.ExtType(1, bytes([3]) + b"|O8" + bytes([1]) + struct.pack("<I", 1) + b"\0" * 8))
    with pytest.raises(ProtocolError, match="not allowed"):
        Codec().unpack(evil)
    with pytest.raises(ProtocolError, match="unknown msgpack ext type 9"):
        Codec().unpack(msgpack.packb(msgpack.ExtType(9, b"x")))
    with pytest.raises(ProtocolError, match="malformed"):
        Codec().unpack(b"\xc1")


def test_frame_size_cap_and_deadline():
    a, b = socket.socketpair()
    sender, receiver = FrameSocket(a, max_frame_bytes=2048), FrameSocket(b, max_frame_bytes=1024)
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=2048"):
        sender.send(b"x" * 4096)
    sender.send(b"y" * 1500)
    with pytest.raises(ProtocolError, match="incoming frame of 1500 bytes exceeds max_frame_bytes=1024"):
        receiver.recv(timeout_s=2)
    from polar.errors import ConnectorTimeout

    c, d = socket.socketpair()
    with pytest.raises(ConnectorTimeout):
        FrameSocket(c).recv(timeout_s=0.05)  # the peer is alive but silent
    for s in (a, b, c, d):
        s.close()
