"""``polar gateway``: serve the model-API gateway in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rich.console import Console

from polar.config.base import validate
from polar.config.gateway import GatewayConfig
from polar.config.loader import read_yaml_file
from polar.config.secrets import read_secret_file
from polar.errors import ConfigError
from polar.httpserver import is_loopback

HELP = "serve the model-API gateway (OpenAI, Anthropic, Gemini) in front of an engine, recording token ids"

console = Console(stderr=True)
TOKEN_ENV = "POLAR_GATEWAY_ADMIN_TOKEN"


def admin_token(args: argparse.Namespace) -> str | None:
    """The admin token from ``--admin-token-file``, ``--admin-token`` (warned: ``ps`` shows it) or
    ``$POLAR_GATEWAY_ADMIN_TOKEN``; None when none is given."""
    path = getattr(args, "admin_token_file", None)
    if path:
        return read_secret_file(str(path), "--admin-token-file",
                                unreadable="{what} {path}: cannot read it ({cause}); give a readable file holding "
                                           "the token",
                                empty="{what} {path} is empty; write the token into it")
    given = getattr(args, "admin_token", None)
    if given:
        console.print(f"[yellow]warning:[/] --admin-token puts the token on the command line, where every user of "
                      f"this machine sees it (ps, /proc); use {TOKEN_ENV} or --admin-token-file instead")
        return str(given)
    return os.environ.get(TOKEN_ENV) or None


def bound_address(host: str, url: str) -> str:
    """The banner's address: the one the socket is bound to, with where to reach it from here when that
    is every interface."""
    port = url.rsplit(":", 1)[1]
    if host in ("0.0.0.0", "::"):
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port} (all interfaces; from this machine: {url})"
    return url


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML: a gateway section, or a run config with 'gateway:'")
    parser.add_argument("--model", metavar="NAME_OR_PATH", help="a preset (tiny, smollm2-135m), a local HF folder, 'vllm:URL[,URL]' or 'sglang:URL[,URL]'")
    parser.add_argument("--engine", choices=["embedded", "vllm", "openai_compat"],
                        help="vllm: launch and supervise vLLM servers of --model (needs `make vllm`); openai_compat: "
                             "forward to the chat endpoint at --base-url, which serves --model")
    parser.add_argument("--base-url", metavar="URL", help="with --engine openai_compat: the endpoint, up to /v1")
    parser.add_argument("--api-key-env", metavar="VAR",
                        help="with --engine openai_compat: the environment variable holding its key (never the key)")
    parser.add_argument("--replicas", type=int, help="with --engine vllm: how many servers (default 1)")
    parser.add_argument("--log-dir", metavar="DIR", help="with --engine vllm: the servers' logs (default: beside the records)")
    parser.add_argument("--chat-template", metavar="NAME_OR_FILE",
                        help="'model', 'hermes-tools' or a Jinja file (default: the model's own if it renders tools)")
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (default: a free one)")
    parser.add_argument("--records-dir", metavar="DIR", help="where session records go (default runs/gateway-<time>/sessions)")
    parser.add_argument("--admin-token-file", metavar="FILE",
                        help=f"read the admin token (required on /admin/* and to read others' sessions) from FILE; "
                             f"or set {TOKEN_ENV}. Needed for a non-loopback --host")
    parser.add_argument("--admin-token", metavar="TOKEN",
                        help=f"the admin token on the command line: visible to every user in `ps`; prefer {TOKEN_ENV} "
                             "or --admin-token-file")
    parser.add_argument("--resume-records", action="store_true", default=None,
                        help="continue the sessions already in --records-dir (without it, a used directory is refused)")


def load_config(args: argparse.Namespace) -> GatewayConfig:
    data: dict = {}
    if args.config:
        raw = read_yaml_file(args.config)
        data = dict(raw.get("gateway") or {}) if "gateway" in raw else raw
    if getattr(args, "log_dir", None):
        data["engine_log_dir"] = args.log_dir
    for key in ("model", "chat_template", "engine", "replicas", "host", "port", "resume_records", "base_url",
                "api_key_env"):
        value = getattr(args, key, None)
        if value is not None:
            data[key] = value
    token = admin_token(args)
    if token is not None:
        data["admin_token"] = token
    if getattr(args, "records_dir", None):
        data["records_dir"] = args.records_dir
    config = validate(GatewayConfig, data, source=args.config or "gateway")
    if not is_loopback(config.host) and not config.admin_token:
        raise ConfigError(
            f"--host {config.host} is not a loopback address, and without an admin token anyone who can reach it could "
            f"pause the gateway, load weights and read every session; set {TOKEN_ENV} or pass --admin-token-file FILE "
            "(or listen on 127.0.0.1)")
    if config.records_dir is None:
        config.records_dir = str(Path("runs") / time.strftime("gateway-%Y%m%d-%H%M%S") / "sessions")
    return config


def main(args: argparse.Namespace) -> int:
    from polar.gateway.server import serve_forever

    config = load_config(args)
    console.print(f"loading engine [bold]{config.model}[/] ...")

    def announce(url: str) -> None:
        console.print(f"[green]gateway listening on[/] {bound_address(config.host, url)}  (records: {config.records_dir})")
        if config.admin_token:
            console.print("  admin token required on /admin/* and to read others' sessions")
        console.print(f"  OpenAI:    OPENAI_BASE_URL={url}/s/<session>/v1")
        console.print(f"  Anthropic: ANTHROPIC_BASE_URL={url}/s/<session>")
        console.print(f"  Gemini:    GOOGLE_GEMINI_BASE_URL={url}/s/<session>")

    serve_forever(config, on_listen=announce)  # returns on Ctrl-C / SIGTERM after a graceful shutdown
    console.print("gateway stopped")
    return 0
