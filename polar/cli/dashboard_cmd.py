"""``polar dashboard [RUNS_DIR] [--host 127.0.0.1] [--port N]``: a web UI over a folder of runs.

Live curves (server-sent events), resources, events, agent sessions at token level, recorded episodes and
human ratings. Listens on 127.0.0.1 unless told otherwise, and then answers only requests addressed to a
loopback name (DNS rebinding) and changes nothing for another site's page (CSRF). The token
(``$POLAR_DASHBOARD_TOKEN``, ``$POLAR_DASHBOARD_TOKEN_FILE`` or ``--token-file``; never on the command line, where
``ps`` shows it) guards ratings, and on a non-loopback ``--host``, which needs one, every read too. It is never
written to disk."""

from __future__ import annotations

import argparse

HELP = "serve a web dashboard over a folder of runs (curves, sessions, episodes, ratings)"
TOKEN_ENV = "POLAR_DASHBOARD_TOKEN"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs_dir", nargs="?", default="runs", help="folder holding run directories, or one run (default: runs)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only; "
                                                       f"any other needs a token, ${TOKEN_ENV})")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help=f"file holding the dashboard's token (default: ${TOKEN_ENV}, ${TOKEN_ENV}_FILE; none: anyone "
                        "who reaches the page may rate)")
    p.add_argument("--ratings-token", default=None, help=argparse.SUPPRESS)  # kept for old scripts: visible in ps


def main(args: argparse.Namespace) -> int:
    from polar.cli._progress import cli_console
    from polar.config.secrets import from_env, read_secret_file
    from polar.dashboard.server import DashboardServer
    from polar.httpserver import is_loopback

    console = cli_console()
    if args.ratings_token:
        console.print("[yellow]warning:[/] --ratings-token puts the token on the command line, where ps shows it; "
                      f"use ${TOKEN_ENV} or --token-file")
    token = (args.ratings_token or (read_secret_file(args.token_file, "--token-file") if args.token_file
                                    else from_env(TOKEN_ENV)))
    server = DashboardServer(args.runs_dir, args.host, args.port, token)
    if not is_loopback(args.host):
        console.print(f"[yellow]note:[/] listening on {args.host}: every request needs the token; open "
                      f"{server.url}/?token=... once in the browser (it sets a cookie)")
    # flushed at once: scripts and tests wait for this line to know the server accepts connections
    print(f"polar dashboard: serving {server.root.resolve()} at {server.url}/", flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    return 0
