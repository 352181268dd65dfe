"""``polar serve MODEL_DIR|RUN_DIR [--host 127.0.0.1] [--port N]``: an Open Inference Protocol v2 server.

The token (needed to listen on a non-loopback address) comes from ``$POLAR_SERVE_TOKEN``, or a file
(``$POLAR_SERVE_TOKEN_FILE`` or ``--token-file``), never from the command line, where ``ps`` shows it."""

from __future__ import annotations

import argparse
import sys

TOKEN_ENV = "POLAR_SERVE_TOKEN"
HELP = "serve exported policies (or a run's checkpoints) over HTTP: KServe Open Inference Protocol v2 + /v1/act"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="an export directory (polar export --out), a directory of them (one per "
                                  "version), or a run directory (its checkpoints are the versions)")
    p.add_argument("--host", default="127.0.0.1",
                   help=f"address to listen on (default 127.0.0.1); any other needs a token (${TOKEN_ENV})")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--name", default=None, help="model name in the URLs (default: the folder layout NAME/VERSION/, "
                                                "else the run's name)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help=f"file holding the token clients send as 'Authorization: Bearer' (default: ${TOKEN_ENV}, "
                        f"${TOKEN_ENV}_FILE)")
    p.add_argument("--trust-code", action="store_true",
                   help="load TorchScript exports and runs whose config names code (custom agents, envs, "
                        "connectors): only for exports and runs you trust")
    p.add_argument("--backend", choices=["auto", "onnxruntime", "torch"], default="auto",
                   help="a run directory: load checkpoints into onnxruntime (auto) or torch; an export runs on "
                        "the runtime of its format")
    p.add_argument("--max-batch-size", type=int, default=256, help="rows per model call; larger requests get 413")
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a request waits for others to batch with")
    p.add_argument("--max-sessions", type=int, default=10_000, help="recurrent client sessions kept (LRU)")
    p.add_argument("--max-versions", type=int, default=3, help="model versions loaded side by side")
    p.add_argument("--poll-s", type=float, default=1.0, help="scan for new versions every S seconds (0 = never)")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads per version")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampled actions' RNG")


def main(args: argparse.Namespace) -> int:
    from polar.config.secrets import from_env, read_secret_file
    from polar.deploy.serve import ServeSettings, serve

    token = read_secret_file(args.token_file, "--token-file") if args.token_file else from_env(TOKEN_ENV)
    settings = ServeSettings(backend=args.backend, max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
                             max_sessions=args.max_sessions, max_versions=args.max_versions, poll_s=args.poll_s,
                             threads=args.threads, seed=args.seed, name=args.name, token=token,
                             trust_code=args.trust_code)

    def announce(url: str) -> None:  # one unwrapped line, flushed: scripts read the address from it
        print(f"polar serve: {args.target} on {url} (/v2/models/<name>/infer, /v1/act, /metrics)"
              + ("; clients send 'Authorization: Bearer <token>'" if token else ""), file=sys.stderr, flush=True)

    serve(args.target, args.host, args.port, settings, announce)
    return 0
