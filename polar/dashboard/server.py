"""The dashboard's HTTP server: uvicorn on a socket bound before it starts, on a thread or in the foreground."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import uvicorn

from polar.dashboard.app import LOOPBACK_NAMES, build_app
from polar.errors import PolarError


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class DashboardServer:
    """``polar dashboard`` as an object: ``start()`` serves on a background thread (tests, benchmarks),
    ``serve()`` in the foreground (the CLI). ``url`` is known once the socket is bound."""

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0,
                 ratings_token: str | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise PolarError(f"runs folder {self.root} does not exist or is not a directory; pass the folder "
                             "`polar run` writes into (default: runs)")
        self.host = host
        loopback = is_loopback(host)
        if not loopback and not ratings_token:
            raise PolarError(f"--host {host} is not a loopback address: anyone who reaches it could read every run; "
                             "set $POLAR_DASHBOARD_TOKEN (or $POLAR_DASHBOARD_TOKEN_FILE, or --token-file) to a token "
                             "the page must present, or listen on 127.0.0.1")
        # loopback: only loopback Host names (DNS rebinding); elsewhere the token guards every read and write
        self.app = build_app(self.root, ratings_token, LOOPBACK_NAMES if loopback else None,
                             token_for_reads=not loopback)
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as e:
            self.sock.close()
            raise PolarError(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port "
                             "(0 chooses a free one)") from None
        self.sock.listen(128)
        self.bound_host, self.port = self.sock.getsockname()[:2]
        config = uvicorn.Config(self.app, lifespan="off", access_log=False, log_level="warning",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.bound_host}]" if ":" in self.bound_host else self.bound_host
        return f"http://{host}:{self.port}"

    def serve(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self, timeout_s: float = 30.0) -> DashboardServer:
        self._thread = threading.Thread(target=self.serve, name=f"polar-dashboard:{self.port}", daemon=True)
        self._thread.start()
        done = threading.Event()
        for _ in range(int(timeout_s / 0.01)):
            if self.server.started:
                return self
            done.wait(0.01)
        raise PolarError(f"the dashboard did not start within {timeout_s}s")

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self.sock.close()

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
