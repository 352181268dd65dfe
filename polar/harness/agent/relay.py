"""Loopback-to-Unix-socket relay that runs *inside* a network-isolated sandbox, then runs the harness.

    python3 relay.py --listen 127.0.0.1:PORT --uds /path/gw.sock -- CMD [ARGS...]

Inside ``bwrap --unshare-net`` the only interface is an empty loopback, so the CLI cannot reach any
host. This process listens on ``127.0.0.1:PORT`` (the gateway URL the preset gave the CLI), pipes
each connection to the bind-mounted Unix socket that the host side forwards to the gateway, starts
``CMD`` once the listener is up, and exits with ``CMD``'s status. Standard library only: it runs
under the system ``python3`` without polar installed.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

# threads and plain sockets, no asyncio or argparse: their imports took ~160 ms of every session's start


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(uds: str, conn: socket.socket) -> None:
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(uds)
    except OSError:
        conn.close()
        up.close()
        return
    back = threading.Thread(target=_pipe, args=(up, conn), daemon=True)
    back.start()
    _pipe(conn, up)
    back.join()
    conn.close()
    up.close()


def _accept(server: socket.socket, uds: str) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=_serve, args=(uds, conn), daemon=True).start()


def _usage(why: str) -> int:
    sys.stderr.write(f"polar relay: {why}\nusage: relay.py --listen HOST:PORT --uds PATH -- CMD [ARGS...]\n")
    return 2


def main(argv: list[str]) -> int:
    if "--" not in argv:
        return _usage("no command given after --")
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1:]
    values = dict(zip(opts[::2], opts[1::2], strict=False))
    if not cmd or set(values) != {"--listen", "--uds"} or len(opts) != 4:
        return _usage("expected --listen HOST:PORT --uds PATH -- CMD")
    host, _, port = values["--listen"].rpartition(":")
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen(128)
    # the listener is up before the command starts (forked before any thread; the socket is not inherited)
    try:
        pid = os.fork()
    except OSError as e:
        sys.stderr.write(f"polar relay: cannot start {cmd[0]!r}: {e}\n")
        return 127
    if pid == 0:
        try:
            os.execvp(cmd[0], cmd)
        except OSError as e:
            sys.stderr.write(f"polar relay: cannot start {cmd[0]!r}: {e}\n")
        os._exit(127)
    threading.Thread(target=_accept, args=(server, values["--uds"]), daemon=True).start()
    _, status = os.waitpid(pid, 0)
    server.close()
    rc = os.waitstatus_to_exitcode(status)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
