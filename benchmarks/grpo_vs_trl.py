"""polar's GRPO beside TRL's ``GRPOTrainer``: same model, tasks, reward, completions per step, steps, LoRA and
learning rate, same cores.

    make trl                                   # .trl-venv: trl 1.16.0, transformers 5.24.0, peft 0.21.2, torch 2.13.0
    nice .venv/bin/python benchmarks/grpo_vs_trl.py \\
        --tasks benchmarks/grpo_vs_trl_tasks/chain_sum_train.jsonl \\
        --heldout benchmarks/grpo_vs_trl_tasks/chain_sum_heldout.jsonl \\
        --reward rewards:last_number --steps 30 --json runs/grpo_vs_trl/chain_sum.json

- **Model**: ``smollm2-135m``, the HF folder polar converts from the preset (``resolve_model_folder``); TRL loads
  the same folder, fp32 on CPU.
- **Tasks and reward**: single-turn JSONL tasks (``id``, ``prompt``, ``answer``; ``system_prompt`` optional), the
  prompt sent as the user message through the model's chat template on both sides. ``--reward module:function``
  is ``reward(task, output) -> float`` (importable from the current folder, ``benchmarks/`` or
  ``benchmarks/grpo_vs_trl_tasks/``); polar calls it as its verifier, TRL as its reward function.
- **Budget**: ``--steps`` optimizer steps of ``--tasks-per-step`` x ``--group-size`` completions (TRL:
  ``per_device_train_batch_size = group size``, ``gradient_accumulation_steps = tasks per step``, one generation
  per step), at most ``--max-tokens`` each, temperature ``--temperature``; LoRA r/alpha on every linear layer,
  dropout 0; AdamW at ``--learning-rate``, constant, no KL (``beta 0``), clip 0.2, advantages ``(r - mean) /
  std`` over the group, the loss's token mean over the batch (TRL's ``loss_type: dapo``, polar's
  ``token_mean``). polar runs with its own defaults otherwise (``--polar-kwargs`` overrides): its dynamic
  sampling may draw more than ``tasks_per_step`` groups in a step where some had no signal; the table says how
  many sessions each side sampled.
- **Held-out**: the first ``--heldout-limit`` tasks (default 200), one sample each at the training temperature and
  ``max_tokens``, before and after; exact success is ``reward >= 1``.
- **Cores**: each side runs alone, with ``--threads`` torch threads (default 2) and ``OMP_NUM_THREADS`` set.
- **Engine**: polar samples on its default (embedded) engine, or on a polar-launched vLLM CPU replica with
  ``--polar-engine vllm``; TRL on transformers' ``generate``.
- **Sides apart**: ``--json`` is written after each side; ``--only trl`` (or ``polar``) merges into the file's
  other side, and ``--polar-run-dir`` reads a finished polar side from its run folder instead of training.

Prints one table (held-out exact success before and after, wall seconds to each evaluation point, sampled tokens
per second, learner seconds per step) and writes ``--json``: ``{"polar": {...}, "trl": {...}}``, each with
``before``, ``after`` and ``wall_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
TASKS_DIR = BENCH / "grpo_vs_trl_tasks"
TRL_PYTHON = ROOT / ".trl-venv" / "bin" / "python"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", required=True, help="training tasks, JSONL")
    p.add_argument("--heldout", required=True, help="held-out tasks, JSONL")
    p.add_argument("--reward", required=True, help="module:function, reward(task, output) -> float")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--json", required=True, help="where the results go")
    p.add_argument("--heldout-limit", type=int, default=200, help="held-out tasks evaluated (the first N)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--tasks-per-step", type=int, default=6)
    p.add_argument("--learning-rate", type=float, default=4e-4)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=float, default=32.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--model", default="smollm2-135m", help="a polar preset or an HF folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--polar-kwargs", default="{}", help="JSON merged into polar's policy.kwargs")
    p.add_argument("--polar-engine", choices=["embedded", "vllm"], default="embedded",
                   help="polar's rollout engine: its default (embedded) or a polar-launched vLLM CPU replica (fp32, "
                        "both cores: the `.vllm-venv` of `make vllm`)")
    p.add_argument("--only", choices=["polar", "trl"], default=None,
                   help="run one side only; its numbers are merged into --json if that file holds the other side's")
    p.add_argument("--polar-run-dir", default=None,
                   help="read the polar side from this finished run folder of an earlier run instead of training")
    p.add_argument("--work-dir", default=None, help="run folders (default: next to --json)")
    return p.parse_args(argv)


def _import_paths() -> list[str]:
    return [os.getcwd(), str(BENCH), str(TASKS_DIR)]


def _read(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _limited_heldout(args: argparse.Namespace, work: Path) -> Path:
    rows = _read(args.heldout)[:args.heldout_limit]
    path = work / "heldout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _polar_model(args: argparse.Namespace) -> dict[str, Any]:
    if args.polar_engine == "embedded":
        return {"name_or_path": args.model}
    threads = str(args.threads)
    return {"name_or_path": args.model, "engine": "vllm",
            "engine_kwargs": {"dtype": "float32", "env": {"OMP_NUM_THREADS": threads,
                                                          "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}"}}}


def run_polar(args: argparse.Namespace, work: Path, heldout: Path) -> dict[str, Any]:
    """polar's GRPO on the tasks, in this process (torch limited to ``--threads``)."""
    import torch

    torch.set_num_threads(args.threads)
    for p in _import_paths():
        sys.path.insert(0, p)
    from polar.config import validate_run_config
    from polar.trainers.build import train_agentic
    from polar.trainers.run_dir import RunDir

    kwargs = {"group_size": args.group_size, "tasks_per_step": args.tasks_per_step, "total_steps": args.steps,
              "learning_rate": args.learning_rate, "max_tokens": args.max_tokens, "temperature": args.temperature,
              "lora": {"r": args.lora_r, "alpha": args.lora_alpha, "dropout": 0.0}, "kl_coef": 0.0,
              "clip_range": 0.2, **json.loads(args.polar_kwargs)}
    cfg = validate_run_config({
        "name": "grpo_vs_trl", "seed": args.seed,
        "harness": {"type": "agent", "callable": "polar.harness.benchmarks.chat:answer", "timeout_s": 600},
        "tasks": str(Path(args.tasks).resolve()), "eval_tasks": str(heldout.resolve()),
        "verifier": {"type": "_grpo_vs_trl_verify:verify", "kwargs": {"reward": args.reward}},
        "model": _polar_model(args),
        "policy": {"type": "grpo", "kwargs": kwargs},
        "logging": {"tensorboard": False},
    })
    cfg._config_dir = BENCH
    run_dir = RunDir.create("polar", work / "polar")
    t0 = time.monotonic()
    start_wall = time.time()
    train_agentic(cfg, run_dir)
    return polar_result(run_dir.path, start_wall, time.monotonic() - t0)


def polar_result(run_dir: Path, start_wall: float, total_s: float) -> dict[str, Any]:
    """The polar side's numbers, read from its run folder: held-out success before and after (``eval/``), wall
    seconds from ``start_wall`` to each evaluation, and the per-step means of ``metrics.jsonl``."""
    from polar.metrics.logger import read_metrics

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward_mean" in r]

    def evaluation(name: str) -> dict[str, Any]:
        f = run_dir / "eval" / f"{name}.json"
        return dict(json.loads(f.read_text())) if f.is_file() else {}

    def at(name: str) -> float | None:
        f = run_dir / "eval" / f"{name}.json"
        return round(f.stat().st_mtime - start_wall, 1) if f.is_file() else None

    def mean(key: str) -> float | None:
        vals = [float(r[key]) for r in rows if r.get(key) is not None]
        return round(sum(vals) / len(vals), 2) if vals else None

    return {"framework": "polar", "before": evaluation("before_grpo"), "after": evaluation("after_grpo"),
            "wall_s": {"before": at("before_grpo"), "after": at("after_grpo"), "total": round(total_s, 1)},
            "steps": len(rows), "sampled_tokens_per_s": mean("sessions/sampled_tokens_per_s"),
            "learner_s_per_step": mean("learn_s"), "sessions": int(rows[-1]["env_steps"]) if rows else 0,
            "train_rewards": [r["reward_mean"] for r in rows], "run_dir": str(run_dir)}


def read_polar_run(run_dir: Path) -> dict[str, Any]:
    """``--polar-run-dir``: a finished polar side of an earlier run of this script, read rather than rerun; its
    clock starts when the run folder was created and stops at its last evaluation."""
    meta = json.loads((run_dir / "run.json").read_text())
    after = run_dir / "eval" / "after_grpo.json"
    if not after.is_file():
        raise SystemExit(f"--polar-run-dir {run_dir}: no eval/after_grpo.json, so the run did not finish")
    start = float(meta["created"])
    return polar_result(run_dir, start, after.stat().st_mtime - start)


def run_trl(args: argparse.Namespace, work: Path, heldout: Path) -> dict[str, Any]:
    """TRL's GRPOTrainer in ``.trl-venv`` (a subprocess: its own transformers and peft)."""
    if not TRL_PYTHON.is_file():
        raise SystemExit(f"{TRL_PYTHON} is missing; run `make trl` first (TRL's own venv)")
    from polar.inference.vllm_launcher import resolve_model_folder

    out = work / "trl.json"
    spec = {"model": str(resolve_model_folder(args.model, "--model")), "tasks": str(Path(args.tasks).resolve()),
            "heldout": str(heldout.resolve()), "reward": args.reward, "import_paths": _import_paths(),
            "steps": args.steps, "group_size": args.group_size, "tasks_per_step": args.tasks_per_step,
            "learning_rate": args.learning_rate, "lora_r": args.lora_r, "lora_alpha": args.lora_alpha,
            "max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed,
            "threads": args.threads, "out": str(out), "work_dir": str(work / "trl")}
    spec_path = work / "trl_spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # TRL's venv alone: polar stays out of it
    t0 = time.monotonic()
    proc = subprocess.run([str(TRL_PYTHON), str(BENCH / "_trl_grpo.py"), str(spec_path)], env=env)
    if proc.returncode != 0 or not out.is_file():
        raise SystemExit(f"the TRL side failed (exit {proc.returncode}); its output is above")
    res: dict[str, Any] = json.loads(out.read_text())
    res["wall_s"]["total"] = round(time.monotonic() - t0, 1)
    res["sessions"] = res["steps"] * args.group_size * args.tasks_per_step
    return res


def table(results: dict[str, dict[str, Any]]) -> str:
    head = ("side", "before", "after", "wall s (before / after)", "sessions", "sampled tok/s", "learner s/step")
    rows = [head]
    for side, r in results.items():
        w = r.get("wall_s", {})
        rows.append((side, f"{r['before'].get('success', float('nan')):.3f}",
                     f"{r['after'].get('success', float('nan')):.3f}", f"{w.get('before')} / {w.get('after')}",
                     str(r.get("sessions")), str(r.get("sampled_tokens_per_s")), str(r.get("learner_s_per_step"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)) for row in rows)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(args.work_dir) if args.work_dir else out.parent / (out.stem + "_runs")
    work.mkdir(parents=True, exist_ok=True)
    heldout = _limited_heldout(args, work)
    results: dict[str, dict[str, Any]] = {}
    if args.only is not None and out.is_file():  # the other side, from an earlier run of this script
        results = {k: v for k, v in json.loads(out.read_text()).items() if k != args.only}
    results["settings"] = {k: v for k, v in vars(args).items()}

    def save() -> None:  # after each side: a side that fails or is stopped later loses nothing already measured
        out.write_text(json.dumps(results, indent=1))

    if args.only in (None, "polar"):
        results["polar"] = (read_polar_run(Path(args.polar_run_dir)) if args.polar_run_dir
                            else run_polar(args, work, heldout))
        save()
    if args.only in (None, "trl"):
        results["trl"] = run_trl(args, work, heldout)
        save()
    print(table({k: v for k, v in results.items() if k in ("polar", "trl")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
