"""``polar`` command line: one subcommand per module in ``polar.cli``.

Each subcommand module defines ``HELP``, ``add_arguments(parser)`` and ``main(args) -> int``.
Errors that polar raises on purpose print as one red line; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from rich.console import Console

from polar import __version__
from polar.errors import PolarError

# name -> module; add a line here when adding a subcommand
SUBCOMMANDS: dict[str, str] = {
    "run": "polar.cli.run_cmd",
    "resume": "polar.cli.resume_cmd",
    "eval": "polar.cli.eval_cmd",
    "check": "polar.cli.check_cmd",
    "gateway": "polar.cli.gateway_cmd",
    "generate": "polar.cli.generate_cmd",
    "scale": "polar.cli.scale_cmd",
    "dashboard": "polar.cli.dashboard_cmd",
    "ratings": "polar.cli.ratings_cmd",
    "export": "polar.cli.export_cmd",
    "serve": "polar.cli.serve_cmd",
    "collect": "polar.cli.collect_cmd",
    "design-reward": "polar.cli.design_reward_cmd",
}

console = Console(stderr=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polar", description="Reinforcement learning on any harness, at scale.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks and debug logs")
    parser.add_argument("--version", action="version", version=f"polar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:
                continue  # subcommand not shipped in this build
            raise
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks")
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


# httpx and httpcore, and the httpx2/httpcore2 that the openai, anthropic and google-genai SDKs now use
QUIET_HTTP_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    debug = getattr(args, "debug", False)
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not debug:  # one INFO line per HTTP request (gateway -> engine, SDK clients) would bury the run's own logs
        for name in QUIET_HTTP_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return int(args._module.main(args) or 0)
    except PolarError as e:
        if debug:
            console.print_exception()
        else:
            console.print("[bold red]error:[/]", end=" ")
            console.print(str(e), markup=False, highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt as e:  # polar.trainers.lifecycle.Stopped (Ctrl-C, SIGTERM) says what was saved
        console.print(getattr(e, "message", None) or "interrupted", style="yellow", markup=False, highlight=False,
                      soft_wrap=True)
        return int(getattr(e, "exit_code", 130))


if __name__ == "__main__":
    sys.exit(main())
