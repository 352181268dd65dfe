"""``polar serve``'s app on a real socket on 127.0.0.1, in a thread of the test process, with the same uvicorn
config (connection limits included) as ``polar serve``."""

from __future__ import annotations

import time

import httpx

from polar.deploy.serve import ServeSettings, make_server, uvicorn_config
from polar.httpserver import ThreadedUvicorn, bind


class LiveServer:
    def __init__(self, path, **settings) -> None:
        self.settings = ServeSettings(**settings)
        self.policy_server = make_server(path, self.settings)
        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.uv = ThreadedUvicorn(uvicorn_config(self.policy_server, self.settings, timeout_graceful_shutdown=2),
                                  self.sock, "polar-serve-test")

    def __enter__(self) -> LiveServer:
        if not self.uv.start(60):
            self.uv.stop(30)
            raise RuntimeError("the server did not start")
        self.client = httpx.Client(base_url=self.url, timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        assert self.uv.stop(30), "the server thread outlived shutdown"

    def wait_for_version(self, name: str, version: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = self.client.get(f"/v2/models/{name}")
            if r.status_code == 200 and r.json()["parameters"]["default_version"] == version:
                return
            time.sleep(0.05)
        raise AssertionError(f"version {version} never became the default")
