"""The LLM agent and the offline benchmarks on a real model: zero-shot scores, and GRPO before/after.

    # zero-shot held-out scores of each config's model (default: SmolLM2-135M-Instruct) on its eval_tasks
    python benchmarks/llm_env_grpo.py zero-shot examples/llm_frozenlake.yaml examples/llm_humaneval.yaml \
        examples/llm_reasoning_gym.yaml [--limit 50] [--samples 1] [--dump DIR]
    # a whole GRPO run (polar run), then its held-out success before and after
    python benchmarks/llm_env_grpo.py train examples/llm_frozenlake.yaml [-o policy.kwargs.total_steps=10]

Zero-shot runs go through the same gateway, session pipeline, runner and verifier as training (one
process; the config's engine: embedded, or ``model: {engine: vllm, ...}`` for vLLM replicas polar launches); ``success`` is the share of held-out sessions whose verifier says success
(env runs: the episode reached the goal; HumanEval: the tests passed, i.e. pass@1 at one sample per
problem; reasoning-gym: score_answer == 1). Results print as a table and as one JSON line per config.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _success(result) -> float:
    v = result.verifier_output or {}
    if result.status.value != "done":
        return 0.0
    if "success" in v:
        return float(bool(v["success"]))
    if "passed" in v:
        return float(bool(v["passed"]))
    return float((result.reward or 0.0) >= 1.0)


class _Engines:
    """The engines of one invocation, one per distinct model setting: configs that name the same model
    and engine share it (a launched vLLM starts once, not once per config). ``close()`` ends them."""

    def __init__(self) -> None:
        self.owned: dict[str, object] = {}
        self.tmp = tempfile.TemporaryDirectory(prefix="llm-env-zero-shot-")

    def get(self, cfg) -> tuple[object, float]:
        from polar.evaluation.agents import _Proxy
        from polar.inference import load_engine

        class Kept(_Proxy):  # each run's gateway closes its engine when it stops; the shared one stays up
            async def close(self) -> None:
                return None

        model = cfg.model
        spec = model.name_or_path if model else "smollm2-135m"
        key = json.dumps([spec, model.engine if model else "embedded", model.replicas if model else 1,
                          model.engine_kwargs if model else {}], sort_keys=True, default=str)
        t0 = time.monotonic()
        if key not in self.owned:
            if model is not None and model.engine == "vllm":  # polar launches vLLM (model: {engine: vllm, ...})
                log_dir = Path(self.tmp.name) / f"vllm-{len(self.owned)}"
                self.owned[key] = load_engine(spec, engine="vllm", replicas=model.replicas, log_dir=str(log_dir),
                                              **model.engine_kwargs)
            else:
                self.owned[key] = load_engine(spec)
        return Kept(self.owned[key]), time.monotonic() - t0

    def close(self) -> None:
        import asyncio

        for engine in self.owned.values():
            asyncio.run(engine.close())
        self.owned.clear()
        self.tmp.cleanup()


def zero_shot(config: str, limit: int | None, samples: int, overrides: list[str], engines: _Engines,
              dump: str | None = None) -> dict:
    from polar.config import load_config
    from polar.harness.benchmarks.humaneval import pass_at_k
    from polar.harness.sessions import load_run_tasks, session_runner, session_verifier
    from polar.rollout.sessions.local import LocalStack
    from polar.rollout.sessions.pipeline import PipelineSettings

    cfg = load_config(config, overrides)
    tasks = load_run_tasks(cfg.eval_tasks, cfg.config_dir)[:limit]
    spec = cfg.model.name_or_path if cfg.model else "smollm2-135m"
    engine_kind = cfg.model.engine if cfg.model else "embedded"
    timeout = cfg.agent.timeout_s if getattr(cfg.agent, "type", None) == "llm" else cfg.harness.timeout_s
    engine, load_s = engines.get(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        settings = PipelineSettings(max_run_workers=cfg.sessions.max_run_workers, agent_timeout_s=timeout,
                                    session_budget_s=cfg.sessions.session_budget_s, builder=cfg.trajectory.builder,
                                    workspace_root=str(Path(tmp) / "ws"))
        records = Path(dump) / Path(config).stem if dump else None  # the gateway's call records, per config
        with LocalStack(engine, session_runner(cfg), session_verifier(cfg), settings,
                        records_dir=records / "gateway" if records else None) as stack:
            t1 = time.monotonic()
            groups = stack.run_groups([(t, samples, {"eval": "zero_shot"}) for t in tasks], timeout_s=7200)
            run_s = time.monotonic() - t1
    results = [r for g in groups for r in g]
    if records is not None:
        with (records / "sessions.jsonl").open("w") as f:
            for r in results:
                f.write(json.dumps({"task_id": r.task_id, "status": r.status.value, "error": r.error,
                                    "reward": r.reward, "output": r.output, "verifier": r.verifier_output},
                                   default=str) + "\n")
    ok = [_success(r) for r in results]
    out = {"config": config, "model": spec, "engine": engine_kind, "tasks": len(tasks), "sessions": len(results),
           "success": round(sum(ok) / max(1, len(ok)), 4),
           "errors": sum(r.status.value == "error" for r in results),
           "timeouts": sum(r.status.value == "timeout" for r in results),
           "run_s": round(run_s, 1), "load_s": round(load_s, 1)}
    steps = [r.verifier_output.get("steps", 0) for r in results if r.verifier_output]
    invalid = [r.verifier_output.get("invalid_actions", 0) for r in results if r.verifier_output]
    if steps and sum(steps):
        out["invalid_action_rate"] = round(sum(invalid) / sum(steps), 4)
    if any("passed" in (r.verifier_output or {}) for r in results):
        by_task: dict[str, list[bool]] = {}
        for task, group in zip(tasks, groups, strict=True):
            by_task[task["id"]] = [bool(_success(r)) for r in group]
        out.update(pass_at_k(by_task, ks=tuple(k for k in (1, 10) if k <= samples)))
    return out


def train(config: str, overrides: list[str]) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="llm-env-grpo-"))
    args = [sys.executable, "-m", "polar.cli.main", "run", "--config", config, "--run-dir", str(run_dir),
            "--no-progress", *[a for o in overrides for a in ("-o", o)]]
    t0 = time.monotonic()
    subprocess.run(args, cwd=ROOT, check=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    return {"config": config, "run_dir": str(run_dir), "wall_s": round(time.monotonic() - t0, 1),
            "before": before.get("success"), "after": after.get("success"), "sessions": after.get("sessions"),
            "grpo": summary.get("grpo")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("zero-shot", "train"))
    p.add_argument("configs", nargs="+")
    p.add_argument("--limit", type=int, default=None, help="zero-shot: the first N held-out tasks")
    p.add_argument("--samples", type=int, default=1, help="zero-shot: sessions per task (pass@k needs k)")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--dump", metavar="DIR", default=None,
                   help="zero-shot: write DIR/<config>/sessions.jsonl and the gateway's call records")
    args = p.parse_args()
    rows = []
    engines = _Engines()
    try:
        for config in args.configs:
            row = zero_shot(config, args.limit, args.samples, args.override, engines, args.dump) if args.mode == "zero-shot" \
                else train(config, args.override)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        engines.close()
    keys = [k for k in rows[0] if k not in ("config", "grpo", "run_dir")]
    print("\n| config | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for row in rows:
        print(f"| {Path(row['config']).name} | " + " | ".join(str(row.get(k)) for k in keys) + " |")


if __name__ == "__main__":
    main()
