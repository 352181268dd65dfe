"""Raw-socket clients for the connection-limit attacks (slowloris headers, dripped bodies, huge headers, idle
sockets): one copy, shared by every server's tests, so each server is attacked the same way."""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Callable


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed ``sock``: reads what is left of an answer, then EOF (or a reset). Reads block
    for the socket's own timeout; a socket still open returns False when a read times out."""
    try:
        for _ in range(64):
            if sock.recv(65536) == b"":
                return True
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    except (BlockingIOError, TimeoutError):
        return False


def drip_headers(port: int, path: str, interval_s: float, budget_s: float,
                 served: Callable[[], None] | None = None, check_every: int = 1) -> float | None:
    """Start a GET of ``path`` and send one more header every ``interval_s`` for up to ``budget_s``, never the
    blank line that ends them; every ``check_every`` headers call ``served`` (an assertion that others are
    served meanwhile). Seconds until the server cut the connection, None when it never did."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.sendall(b"GET %s HTTP/1.1\r\nhost: 127.0.0.1\r\n" % path.encode())
        t0 = time.monotonic()
        for i in range(int(budget_s / interval_s)):
            try:
                sock.sendall(b"x-drip-%d: y\r\n" % i)
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - t0
            sock.settimeout(interval_s)
            if closed_by_peer(sock):
                return time.monotonic() - t0
            if served is not None and i % check_every == 0:
                served()
        return None
    finally:
        sock.close()


def rest_of_answer(sock: socket.socket, first: bytes, timeout_s: float = 5.0) -> bytes:
    """The body that follows a response's first bytes: a server may write the status and headers and the body
    in separate segments, so one ``recv`` can end at the headers. Reads to its content-length or the socket's
    end, bounded by ``timeout_s``."""
    if not first:
        return b""
    rest, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        head, sep, body = (first + rest).partition(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if sep and length and len(body) >= int(length.group(1)):
            break
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        rest += chunk
    return rest


def drip_body(port: int, head: bytes, seconds: float) -> tuple[bytes, float]:
    """Send ``head`` (request line, headers, blank line, the body's first bytes), then one body byte every 0.1 s
    for up to ``seconds``; the whole answer and when its first bytes came."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    answer, t0 = b"", time.monotonic()
    try:
        sock.sendall(head)
        for _ in range(int(seconds / 0.1)):
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b" ")
            sock.settimeout(0.1)
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            break
        elapsed_s = time.monotonic() - t0
        answer += rest_of_answer(sock, answer)
    finally:
        sock.close()
    return answer, elapsed_s


def huge_header(port: int, path: str, total_bytes: int = 100 * 1024 * 1024) -> tuple[int, bytes, float]:
    """Send one header of up to ``total_bytes`` in 64 KiB writes until the server stops reading; the bytes sent,
    the first answer (b"" when the connection was closed or reset) and the seconds it all took."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sent, chunk, answer = 0, b"a" * 65536, b""
    t0 = time.monotonic()
    try:
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nx-huge: " % path.encode())
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while sent < total_bytes:
                sock.sendall(chunk)
                sent += len(chunk)
        sock.settimeout(10)
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            answer = sock.recv(65536)
    finally:
        sock.close()
    return sent, answer, time.monotonic() - t0

