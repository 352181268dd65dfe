"""The attacks LLM-written code is run against (the reward designer's candidates, the code generator's
connectors): one copy of each attack, so both sandboxes are attacked the same way. Each attack is one Python
statement the code runs inside its sandbox, plus what the host checks afterwards."""

from __future__ import annotations

import contextlib
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

HANG = "while True: pass"


def connect_to(port: int) -> str:
    """Open a TCP connection to a host port (the sandbox has no network: this must fail)."""
    return f"__import__('socket').create_connection(('127.0.0.1', {port}), timeout=1).close()"


def write_to(path: Path) -> str:
    """Write a file outside the code's own folder."""
    return f"open({str(path)!r}, 'w').write('pwned')"


def read_from(path: Path) -> str:
    """Read a host file."""
    return f"open({str(path)!r}).read()"


@contextlib.contextmanager
def host_listener() -> Iterator[tuple[int, Callable[[], bool]]]:
    """A listening socket on a host port: ``(port, connected)``, where ``connected()`` (after the attack) says
    whether anything reached it. A connection the kernel completed waits in the backlog even after its client
    closed it, so one non-blocking ``accept`` answers without a thread or a wait."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def connected() -> bool:
        srv.setblocking(False)
        try:
            conn, _ = srv.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    try:
        yield srv.getsockname()[1], connected
    finally:
        srv.close()


@contextlib.contextmanager
def home_secret() -> Iterator[Path]:
    """A file in the host's home (like ~/.ssh/id_rsa), removed afterwards."""
    with tempfile.NamedTemporaryFile("w", dir=Path.home(), prefix=".polar-test-secret-") as f:
        f.write("hunter2")
        f.flush()
        yield Path(f.name)
