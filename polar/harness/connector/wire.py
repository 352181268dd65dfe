"""The connector wire format: length-prefixed msgpack frames, numpy arrays as msgpack ext types.

Specified for other languages in ``docs/connector-protocol.md``. In short:

- a frame is a 4-byte big-endian unsigned length followed by that many bytes of msgpack;
- ``ext 1`` is an ndarray: ``u8 len, dtype str, u8 ndim, u32le dims..., raw C-order bytes``;
- ``ext 2`` is a compressed ndarray: ``u8 codec`` then the ext-1 header, then the compressed bytes
  (codec 1 zstd, 2 lz4 frame, 3 PNG, 4 JPEG).

No pickle anywhere: only msgpack's own types and these two ext types are ever decoded.
"""

from __future__ import annotations

import io
import math
import select
import socket
import struct
import time
from typing import Any

import msgpack
import numpy as np

from polar.errors import ConnectorTimeout, ProtocolError

PROTOCOL_VERSION = 1  # what polar's own (single-agent) Python host says in its hello
PROTOCOL_MULTI_AGENT = 2  # protocol 1 plus the multi-agent messages (docs/connector-protocol.md section 7)
PROTOCOL_VERSIONS = (PROTOCOL_VERSION, PROTOCOL_MULTI_AGENT)
EXT_NDARRAY = 1
EXT_COMPRESSED = 2
CODECS = {"zstd": 1, "lz4": 2, "png": 3, "jpeg": 4}
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")
_EMPTY_FRAME = b"\x00\x00\x00\x00"
_ALLOWED_KINDS = set("biufc")  # bool, int, uint, float, complex: no object/void/str arrays


NOT_POLAR = "does not speak the polar connector protocol"
_QUOTE_BYTES = 16  # how much of an unreadable frame an error quotes


class ConnectionClosed(ProtocolError):
    """The peer closed the socket (usually: the connector process died)."""


def _looks_like_text(data: bytes) -> bool:
    """Printable ASCII or whitespace: somebody wrote text (a log line, a traceback, HTTP) where a frame belongs."""
    return bool(data) and all(32 <= b < 127 or b in (9, 10, 13) for b in data)


# ----------------------------------------------------------------------------------------- arrays
_HEADERS: dict[tuple, bytes] = {}


def _array_header(arr: np.ndarray) -> bytes:
    key = (arr.dtype.str, arr.shape)
    header = _HEADERS.get(key)
    if header is None:  # a handful of (dtype, shape) pairs per run: cache their headers
        dtype = arr.dtype.str.encode("ascii")
        header = bytes([len(dtype)]) + dtype + bytes([arr.ndim]) + struct.pack(f"<{arr.ndim}I", *arr.shape)
        if len(_HEADERS) < 4096:
            _HEADERS[key] = header
    return header


_DTYPES: dict[bytes, np.dtype] = {}


_PARSED: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}


def _parse_header(data: memoryview) -> tuple[np.dtype, tuple[int, ...], int]:
    n = data[0]
    end = 2 + n + 4 * data[1 + n] if len(data) > 1 + n else 0
    cached = _PARSED.get(bytes(data[:end])) if end else None
    if cached is not None:
        return cached
    parsed = _parse_header_slow(data)
    if len(_PARSED) < 4096:
        _PARSED[bytes(data[:end])] = parsed
    return parsed


def _parse_header_slow(data: memoryview) -> tuple[np.dtype, tuple[int, ...], int]:
    n = data[0]
    key = bytes(data[1 : 1 + n])
    dtype = _DTYPES.get(key)
    if dtype is None:
        try:
            dtype = np.dtype(key.decode("ascii"))
        except (TypeError, ValueError, UnicodeDecodeError):
            raise ProtocolError(f"ndarray ext: unknown dtype {key!r}") from None
        if dtype.kind not in _ALLOWED_KINDS or dtype.hasobject:
            raise ProtocolError(f"ndarray dtype {dtype.str!r} is not allowed on the wire (numbers and bools only)")
        _DTYPES[key] = dtype
    ndim = data[1 + n]
    start = 2 + n
    shape = struct.unpack_from(f"<{ndim}I", data, start)
    return dtype, shape, start + 4 * ndim


def _image_view(arr: np.ndarray) -> np.ndarray | None:
    """The 2-D/3-D image a uint8 array is sent as for PNG/JPEG, or None if it is not image-shaped."""
    if arr.dtype != np.uint8 or arr.ndim < 2 or arr.size == 0:
        return None
    if arr.ndim == 2:
        return arr
    if arr.shape[-1] in (1, 3, 4):
        rows = math.prod(arr.shape[:-2])
        img = arr.reshape(rows, arr.shape[-2], arr.shape[-1])
        return img[:, :, 0] if img.shape[-1] == 1 else img
    return None


def _compress(arr: np.ndarray, codec: str) -> bytes | None:
    raw = np.ascontiguousarray(arr)
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(raw.tobytes())
    if codec == "lz4":
        import lz4.frame

        return lz4.frame.compress(raw.tobytes())
    img = _image_view(raw)
    if img is None or (codec == "jpeg" and img.ndim == 3 and img.shape[-1] == 4):
        return None  # not an image: send raw
    from PIL import Image

    buf = io.BytesIO()
    if codec == "png":
        Image.fromarray(img).save(buf, format="PNG", compress_level=1)
    else:
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _decompress(codec: int, payload: memoryview, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Decode a compressed array, never producing more than its header's ``prod(shape) * itemsize`` bytes.

    The caller has checked that size against its budget; every codec here stops at that size plus one
    byte (zstd and lz4 streaming with an output limit, images by their header before any pixel is
    decoded), so a small frame cannot make the learner allocate what its header does not announce.
    """
    expected = math.prod(shape) * dtype.itemsize
    if codec == 1:
        import zstandard

        try:
            with zstandard.ZstdDecompressor().stream_reader(bytes(payload)) as reader:
                raw = reader.read(expected + 1)
        except zstandard.ZstdError as e:
            raise ProtocolError(f"compressed ndarray: invalid zstd data ({e})") from None
    elif codec == 2:
        import lz4.frame

        try:
            raw = lz4.frame.LZ4FrameDecompressor().decompress(bytes(payload), max_length=expected + 1)
        except RuntimeError as e:
            raise ProtocolError(f"compressed ndarray: invalid lz4 frame ({e})") from None
    elif codec in (3, 4):
        from PIL import Image

        try:
            img = Image.open(io.BytesIO(bytes(payload)))
            width, height = img.size
            if width * height * len(img.getbands()) != expected:  # checked before a single pixel is decoded
                raise ProtocolError(f"compressed ndarray: a {width}x{height} {img.mode} image cannot fill shape {shape} "
                                    f"{dtype} ({expected} bytes)")
            raw = np.asarray(img).tobytes()
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise ProtocolError(f"compressed ndarray: invalid image data ({e})") from None
    else:
        raise ProtocolError(f"unknown compression codec {codec} in ext 2 (known: {CODECS})")
    if len(raw) > expected:
        raise ProtocolError(f"compressed ndarray decodes to more than the {expected} bytes its shape {shape} {dtype} needs")
    if len(raw) != expected:
        raise ProtocolError(f"compressed ndarray decodes to {len(raw)} bytes; shape {shape} {dtype} needs {expected}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


# ----------------------------------------------------------------------------------------- object cost
# What decoding a frame costs in Python objects, estimated from its msgpack bytes before it is decoded. A 1-byte
# empty map becomes a 64-byte dict: 64 MiB of them (one frame under the default max_frame_bytes) would build
# about 5 GiB. A list or dict costs its header and 8 bytes per slot (a dict 24 more per entry); a value costs
# its object unless CPython shares it (None, bools, small ints, one-character strings).
OBJECT_COST_RATIO = 16  # legitimate frames measure 3.6 (floats) to 8.7 (infos, plain int lists); empty maps 72
WALK_MIN_BYTES = 1 << 20  # smaller frames cannot build more than ~72 MiB: not worth the walk
_FIXED = {0xC0: (0, 0), 0xC2: (0, 0), 0xC3: (0, 0), 0xCA: (4, 24), 0xCB: (8, 24), 0xCC: (1, 0), 0xCD: (2, 32),
          0xCE: (4, 32), 0xCF: (8, 32), 0xD0: (1, 32), 0xD1: (2, 32), 0xD2: (4, 32), 0xD3: (8, 32)}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_LENGTH = {0xC4: (1, 33), 0xC5: (2, 33), 0xC6: (4, 33), 0xD9: (1, 49), 0xDA: (2, 49), 0xDB: (4, 49),
           0xC7: (1, 0), 0xC8: (2, 0), 0xC9: (4, 0)}  # str, bin, ext: length bytes, object overhead
_COUNT = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # array16/32, map16/32: length bytes, values per entry


def object_cost(data: bytes | bytearray | memoryview, limit: int) -> int:
    """Estimated bytes of Python objects ``msgpack.unpackb(data)`` builds, counted until it passes ``limit``.

    Ext payloads count their size (ndarray data is copied once; compressed arrays have their own budget).
    Malformed input stops the count early: the decoder then reports it.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    size, pos, pending, cost = len(view), 0, 1, 0
    while pending and pos < size and cost <= limit:
        pending -= 1
        b = view[pos]
        pos += 1
        if b <= 0x7F:
            pass
        elif b <= 0x8F:
            cost += 64 + 40 * (b & 0x0F)
            pending += 2 * (b & 0x0F)
        elif b <= 0x9F:
            cost += 56 + 8 * (b & 0x0F)
            pending += b & 0x0F
        elif b <= 0xBF:
            n = b & 0x1F
            pos += n
            cost += 49 + n if n > 1 else 0
            cost += 40
        elif b in _FIXED:
            skip, c = _FIXED[b]
            pos += skip
            cost += c
        elif b in _FIXEXT:
            n = _FIXEXT[b]
            pos += 1 + n
            cost += n
        elif b in _LENGTH:
            width, overhead = _LENGTH[b]
            n = int.from_bytes(view[pos : pos + width], "big")
            pos += width + n + (1 if 0xC7 <= b <= 0xC9 else 0)
            cost += overhead + n
        elif b in _COUNT:
            width, per = _COUNT[b]
            n = int.from_bytes(view[pos : pos + width], "big")
            pos += width
            cost += 64 + 40 * n if per == 2 else 56 + 8 * n
            pending += per * n
        else:  # 0xc1 (never used) : let msgpack say what is wrong
            break
    return cost


class Codec:
    """msgpack packer/unpacker with the ndarray ext types and optional compression of large arrays.

    ``max_decoded_bytes`` bounds what the compressed arrays of one frame may inflate to, all together
    (None: no bound, for the connector side, which decodes only polar's frames). Uncompressed data is
    bounded by the frame size already; without this bound a 32 KiB zstd frame announcing a 1 GiB array
    makes its reader allocate 1 GiB. ``decode_limit_why`` says in an error where the bound comes from.
    """

    def __init__(self, compression: str | None = None, compress_min_bytes: int = 4096,
                 max_decoded_bytes: int | None = None) -> None:
        if compression is not None and compression not in CODECS:
            raise ValueError(f"compression must be one of {sorted(CODECS)} or None, got {compression!r}")
        self.compression = compression
        self.compress_min_bytes = compress_min_bytes
        self.max_decoded_bytes = max_decoded_bytes
        self.decode_limit_why = "the decode limit"
        self._budget: int | None = None  # what the current frame's compressed arrays may still inflate to
        self._packer = msgpack.Packer(default=self._default, use_bin_type=True, autoreset=True)

    def _default(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if obj.dtype.kind not in _ALLOWED_KINDS:
                raise TypeError(f"numpy array of dtype {obj.dtype} cannot be sent; use numeric or bool arrays")
            if self.compression and obj.nbytes >= self.compress_min_bytes:
                packed = _compress(obj, self.compression)
                if packed is not None:
                    code = CODECS[self.compression]
                    return msgpack.ExtType(EXT_COMPRESSED, bytes([code]) + _array_header(obj) + packed)
            return msgpack.ExtType(EXT_NDARRAY, _array_header(obj) + np.ascontiguousarray(obj).tobytes())
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, tuple):
            return list(obj)
        raise TypeError(
            f"a value of type {type(obj).__name__} cannot be sent; use numbers, strings, bools, None, "
            "lists, dicts with string keys, or numpy arrays"
        )

    def pack(self, obj: Any) -> bytes:
        return self._packer.pack(obj)

    def _ext_hook(self, code: int, data: bytes) -> Any:
        view = memoryview(data)
        if code == EXT_NDARRAY:
            dtype, shape, start = _parse_header(view)
            expected = math.prod(shape) * dtype.itemsize
            if len(view) - start != expected:
                raise ProtocolError(f"ndarray ext: {len(view) - start} data bytes, shape {shape} {dtype} needs {expected}")
            # frombuffer over immutable bytes is read-only; learners write into obs, so own a copy
            return np.frombuffer(data, dtype=dtype, offset=start).reshape(shape).copy()
        if code == EXT_COMPRESSED:
            dtype, shape, start = _parse_header(view[1:])
            size = math.prod(shape) * dtype.itemsize
            if self._budget is not None:
                if size > self._budget:
                    raise ProtocolError(
                        f"a compressed array of shape {list(shape)} {dtype} ({size} bytes, from "
                        f"{len(view)} on the wire) is over the {self.max_decoded_bytes}-byte limit on what one "
                        f"frame's compressed arrays may decode to ({self.decode_limit_why}); refused undecoded")
                self._budget -= size
            return _decompress(view[0], view[1 + start :], dtype, shape)
        raise ProtocolError(f"unknown msgpack ext type {code} (known: 1 ndarray, 2 compressed ndarray)")

    @staticmethod
    def skim(data: bytes | bytearray | memoryview) -> Any:
        """The frame's plain msgpack values with every array left undecoded (None): what a reply declares,
        read before its arrays are inflated. None for a frame that is not msgpack (``unpack`` says why)."""
        try:
            return msgpack.unpackb(data, ext_hook=lambda code, payload: None, raw=False, strict_map_key=False)
        except Exception:  # garbage: the real decode reports it
            return None

    def unpack(self, data: bytes | bytearray | memoryview) -> Any:
        self._budget = self.max_decoded_bytes
        if self.max_decoded_bytes is not None and len(data) > WALK_MIN_BYTES:
            limit = OBJECT_COST_RATIO * len(data)
            cost = object_cost(data, limit)
            if cost > limit:
                raise ProtocolError(
                    f"a frame of {len(data)} bytes would build over {limit} bytes of Python objects ({OBJECT_COST_RATIO} "
                    "x its size: many tiny maps, lists or strings); refused undecoded. Send arrays as the ndarray ext "
                    "types (docs/connector-protocol.md, 3. Values)")
        try:
            return msgpack.unpackb(data, ext_hook=self._ext_hook, raw=False, strict_map_key=False, use_list=True)
        except ProtocolError:
            raise
        except Exception as e:  # msgpack raises several unrelated types for garbage input, some with no text
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise ProtocolError(
                f"malformed msgpack frame of {len(data)} bytes starting {bytes(data[:_QUOTE_BYTES])!r} ({detail})"
            ) from None


# ----------------------------------------------------------------------------------------- frames
class FrameSocket:
    """A socket that sends and receives whole frames, with a size cap and deadlines."""

    def __init__(self, sock: socket.socket, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.sock = sock
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self.frames_received = 0
        self.skip_empty = False  # with shared-memory steps (shm.py) an empty frame is a wake, not a message

    def send(self, body: bytes) -> None:
        if len(body) > self.max_frame_bytes:
            raise ProtocolError(
                f"outgoing frame of {len(body)} bytes exceeds max_frame_bytes={self.max_frame_bytes}; "
                "raise connector_spec.max_frame_bytes or enable connector_spec.compression"
            )
        self.sock.settimeout(None)
        if len(body) < 65536:
            self.sock.sendall(_HEADER.pack(len(body)) + body)
        else:
            self.sock.sendall(_HEADER.pack(len(body)))
            self.sock.sendall(body)

    def _fill(self, need: int, deadline: float | None) -> None:
        while len(self._buf) < need:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ConnectorTimeout("timed out waiting for a frame")
                self.sock.settimeout(remaining)
            else:
                self.sock.settimeout(None)
            try:
                chunk = self.sock.recv(max(65536, need - len(self._buf)))
            except TimeoutError:
                raise ConnectorTimeout("timed out waiting for a frame") from None
            if not chunk:
                raise ConnectionClosed("the peer closed the connection")
            self._buf += chunk

    def send_wake(self) -> None:
        """An empty frame: ends the peer's sleep on the socket (shared-memory steps only)."""
        self.sock.settimeout(None)
        self.sock.sendall(_EMPTY_FRAME)

    def readable(self, timeout_s: float | None) -> bool:
        """Whether bytes (or the peer's EOF) are buffered or arrive within ``timeout_s`` (None: no limit)."""
        if len(self._buf) > 4 and self._buf[:4] != _EMPTY_FRAME:
            return True
        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        return bool(ready)

    def drain(self) -> None:
        """Read what is there without blocking and drop leading wake frames; ConnectionClosed on EOF."""
        self.sock.settimeout(0.0)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionClosed("the peer closed the connection")
                self._buf += chunk
        except (BlockingIOError, InterruptedError):
            pass
        finally:
            self.sock.settimeout(None)
        while self._buf[:4] == _EMPTY_FRAME:
            del self._buf[:4]

    def recv(self, timeout_s: float | None = None) -> bytes:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._fill(4, deadline)
        (n,) = _HEADER.unpack_from(self._buf)
        while n == 0 and self.skip_empty:
            del self._buf[:4]
            self._fill(4, deadline)
            (n,) = _HEADER.unpack_from(self._buf)
        if n > self.max_frame_bytes:
            raise ProtocolError(self._oversized(n))
        self._fill(4 + n, deadline)
        body = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        self.frames_received += 1
        return body

    def _oversized(self, n: int) -> str:
        """Why a frame header announcing ``n`` bytes (over the cap) arrived: garbage, or a frame that is too big.

        The first frame is a hello or an init of a few hundred bytes, so an oversized one means the peer is
        not a polar connector at all; so does text where a header belongs. Either way, quote the bytes.
        """
        head = bytes(self._buf[:_QUOTE_BYTES])
        if self.frames_received == 0:
            return (f"the peer {NOT_POLAR}: its first bytes are {head!r} (read as a frame header: incoming frame of "
                    f"{n} bytes exceeds max_frame_bytes={self.max_frame_bytes}, where a hello takes a few hundred). "
                    "A frame is a 4-byte big-endian length, then a msgpack map; check that the connector implements "
                    "docs/connector-protocol.md")
        if _looks_like_text(head[:4]):
            return (f"the peer wrote bytes that are not a polar frame: {head!r} (read as a frame header they announce "
                    f"{n} bytes, over max_frame_bytes={self.max_frame_bytes}); a connector writes only frames to its "
                    "socket and prints to stdout or stderr")
        return (f"incoming frame of {n} bytes exceeds max_frame_bytes={self.max_frame_bytes} (it starts {head!r}); "
                "raise connector_spec.max_frame_bytes or enable connector_spec.compression")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def parse_address(address: str) -> tuple[int, Any]:
    """``unix:/path`` or ``tcp:host:port`` -> (socket family, sockaddr)."""
    kind, _, rest = address.partition(":")
    if kind == "unix" and rest:
        return socket.AF_UNIX, rest
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return socket.AF_INET, (host.strip("[]"), int(port))
    raise ProtocolError(f"bad connector address {address!r}; expected unix:/path/to.sock or tcp:HOST:PORT")
