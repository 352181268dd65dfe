"""Loopback-to-Unix-socket relay that runs *inside* a network-isolated sandbox, then runs the harness.

    python3 relay.py --listen 127.0.0.1:PORT --uds /path/gw.sock -- CMD [ARGS...]

Inside ``bwrap --unshare-net`` the only interface is an empty loopback, so the CLI cannot reach any
host. This process listens on ``127.0.0.1:PORT`` (the gateway URL the preset gave the CLI), pipes
each connection to the bind-mounted Unix socket that the host side forwards to the gateway, starts
``CMD`` once the listener is up, and exits with ``CMD``'s status. Standard library only: it runs
under the system ``python3`` without polar installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(uds: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(uds)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _main(listen: str, uds: str, cmd: list[str]) -> int:
    host, _, port = listen.rpartition(":")
    server = await asyncio.start_server(lambda r, w: _serve(uds, r, w), host, int(port))
    try:
        proc = await asyncio.create_subprocess_exec(*cmd)
    except OSError as e:
        sys.stderr.write(f"polar relay: cannot start {cmd[0]!r}: {e}\n")
        return 127
    rc = await proc.wait()
    server.close()
    return rc if rc >= 0 else 128 - rc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--uds", required=True)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given after --")
    return asyncio.run(_main(args.listen, args.uds, cmd))


if __name__ == "__main__":
    raise SystemExit(main())
