"""``polar serve``'s app on a real socket on 127.0.0.1, in a thread of the test process."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import uvicorn

from polar.deploy.serve import ServeSettings, build_app, make_server


class LiveServer:
    def __init__(self, path, **settings) -> None:
        self.policy_server = make_server(path, ServeSettings(**settings))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(build_app(self.policy_server), log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2)
        self.uv = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uv.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.uv.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        self.client = httpx.Client(base_url=self.url, timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.uv.should_exit = True
        self.thread.join(30)
        self.sock.close()
        assert not self.thread.is_alive(), "the server thread outlived shutdown"

    def wait_for_version(self, name: str, version: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = self.client.get(f"/v2/models/{name}")
            if r.status_code == 200 and r.json()["parameters"]["default_version"] == version:
                return
            time.sleep(0.05)
        raise AssertionError(f"version {version} never became the default")
