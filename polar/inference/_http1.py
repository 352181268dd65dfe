"""A minimal keep-alive HTTP/1.1 POST client for the upstream hop's non-streamed calls.

httpx costs ~3 ms of CPU per request on a small box, more than the rest of the gateway; one upstream call
per generation only needs: write a POST, read status, headers and a Content-Length (or chunked) body,
and keep the connection for the next call.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from urllib.parse import urlsplit


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it), for a server polar is about to start."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class HttpError(Exception):
    """The connection failed or the reply was not valid HTTP/1.1."""


class Http1Pool:
    """Idle keep-alive connections to one origin (``scheme://host:port``)."""

    def __init__(self, base_url: str, headers: dict[str, str], max_idle: int = 256) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        host_header = parts.netloc
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"Host: {host_header}\r\n{extra}Content-Type: application/json\r\nContent-Length: "
        self.max_idle = max_idle
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(
        self, path: str, body: bytes, timeout_s: float, connect_timeout_s: float
    ) -> tuple[int, bytes]:
        """POST ``body``; return (status, body). A reused connection that turns out closed is retried once."""
        request = f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}{len(body)}\r\n\r\n".encode() + body
        while self._idle:
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            try:
                async with asyncio.timeout(timeout_s):  # no extra task per call, unlike wait_for
                    return await self._exchange(reader, writer, request)
            except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                writer.close()
                break  # the server closed this idle connection: retry once on a fresh one
            except asyncio.TimeoutError as exc:
                writer.close()
                raise HttpError(f"no reply within {timeout_s} s") from exc
            except BaseException:
                writer.close()
                raise
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self.host, self.port, ssl=ssl.create_default_context() if self.tls else None
                ),
                connect_timeout_s,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {exc!r}") from exc
        try:
            async with asyncio.timeout(timeout_s):
                return await self._exchange(reader, writer, request)
        except (
            OSError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            asyncio.TimeoutError,
        ) as exc:
            writer.close()
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            writer.close()
            raise

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> tuple[int, bytes]:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        try:
            status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError) as exc:
            raise HttpError(f"bad status line {lines[0][:100]!r}") from exc
        length: int | None = None
        chunked, keep = False, True
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection" and b"close" in value.lower():
                keep = False
        if chunked:
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # optional trailers
                        pass
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            data = b"".join(parts)
        elif length is not None:
            data = await reader.readexactly(length)
        else:
            data = await reader.read()
            keep = False
        if keep and len(self._idle) < self.max_idle:
            self._idle.append((reader, writer))
        else:
            writer.close()
        return status, data

    def close(self) -> None:
        for _, writer in self._idle:
            try:
                writer.close()
            except RuntimeError:  # its event loop is already closed: the socket went with it
                pass
        self._idle.clear()
