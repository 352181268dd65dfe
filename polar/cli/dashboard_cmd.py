"""``polar dashboard [RUNS_DIR] [--host 127.0.0.1] [--port N]``: a web UI over a folder of runs.

Live curves (server-sent events), resources, events, agent sessions at token level, recorded episodes and
human ratings. Listens on 127.0.0.1 unless told otherwise; ratings need ``--ratings-token`` (or
``POLAR_DASHBOARD_TOKEN``) when one is set, and the token is never written to disk."""

from __future__ import annotations

import argparse
import os

HELP = "serve a web dashboard over a folder of runs (curves, sessions, episodes, ratings)"
TOKEN_ENV = "POLAR_DASHBOARD_TOKEN"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs_dir", nargs="?", default="runs", help="folder holding run directories, or one run (default: runs)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--ratings-token", default=None,
                   help=f"a token the page must send to store ratings (default: ${TOKEN_ENV}; none: anyone who "
                        "reaches the page may rate)")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from polar.dashboard.server import DashboardServer

    console = Console(stderr=True)
    token = args.ratings_token or os.environ.get(TOKEN_ENV) or None
    server = DashboardServer(args.runs_dir, args.host, args.port, token)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] listening on {args.host}: anyone who can reach this address can read "
                      "these runs" + ("" if token else " and store ratings (set --ratings-token)"))
    # flushed at once: scripts and tests wait for this line to know the server accepts connections
    print(f"polar dashboard: serving {server.root.resolve()} at {server.url}/", flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    return 0
