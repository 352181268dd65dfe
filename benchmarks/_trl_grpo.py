"""TRL's side of benchmarks/grpo_vs_trl.py, run in ``.trl-venv`` (``make trl``): never imports polar.

    .trl-venv/bin/python benchmarks/_trl_grpo.py SPEC.json

SPEC (written by grpo_vs_trl.py): model folder, train and held-out JSONL, reward ``module:function`` (with the
folders to import it from), steps, group size, tasks per step, learning rate, LoRA r/alpha, max_tokens,
temperature, seed, threads and the output path. It evaluates the held-out tasks (one sample each, the training
temperature and max_tokens, exact success = reward >= 1), trains ``GRPOTrainer`` for ``steps`` optimizer steps,
evaluates again, and writes ``before``, ``after``, ``wall_s`` and the timings as JSON.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any


def _reward_fn(spec: str, paths: list[str]) -> Any:
    for p in paths:
        sys.path.insert(0, p)
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _messages(task: dict[str, Any]) -> list[dict[str, str]]:
    out = [{"role": "system", "content": task["system_prompt"]}] if task.get("system_prompt") else []
    return [*out, {"role": "user", "content": task["prompt"]}]


def evaluate(model: Any, tok: Any, tasks: list[dict[str, Any]], reward: Any, spec: dict[str, Any]) -> dict[str, float]:
    """Exact success over ``tasks``: one sampled reply each, as in training (temperature, max_tokens)."""
    import torch

    model.eval()
    tok.padding_side = "left"
    scores: list[float] = []
    batch = 32
    with torch.no_grad():
        for i in range(0, len(tasks), batch):
            chunk = tasks[i:i + batch]
            texts = [tok.apply_chat_template(_messages(t), tokenize=False, add_generation_prompt=True) for t in chunk]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(**enc, max_new_tokens=spec["max_tokens"], do_sample=True,
                                 temperature=spec["temperature"], top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)
            replies = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            scores.extend(float(reward(t, r)) for t, r in zip(chunk, replies, strict=True))
    return {"success": sum(s >= 1.0 for s in scores) / max(1, len(scores)),
            "reward_mean": sum(scores) / max(1, len(scores)), "sessions": len(scores)}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    t0 = time.monotonic()
    import torch

    torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(int(spec["seed"]))
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    reward = _reward_fn(spec["reward"], spec["import_paths"])
    tasks = [json.loads(line) for line in Path(spec["tasks"]).read_text().splitlines() if line.strip()]
    heldout = [json.loads(line) for line in Path(spec["heldout"]).read_text().splitlines() if line.strip()]
    tok = AutoTokenizer.from_pretrained(spec["model"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    result: dict[str, Any] = {"framework": "trl", "versions": {}}
    import peft
    import transformers
    import trl

    result["versions"] = {"trl": trl.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                          "torch": torch.__version__}
    result["before"] = evaluate(model, tok, heldout, reward, spec)
    wall = {"before": round(time.monotonic() - t0, 1)}

    def reward_fn(prompts: list[Any], completions: list[Any], task: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        return [float(reward(json.loads(t), x)) for t, x in zip(task, texts, strict=True)]

    data = Dataset.from_list([{"prompt": _messages(t), "task": json.dumps(t)} for t in tasks])
    g, k = int(spec["group_size"]), int(spec["tasks_per_step"])
    args = GRPOConfig(
        output_dir=spec["work_dir"], max_steps=int(spec["steps"]), learning_rate=float(spec["learning_rate"]),
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        per_device_train_batch_size=g, gradient_accumulation_steps=k,  # one generation of k x g per step
        num_generations=g, max_completion_length=int(spec["max_tokens"]), temperature=float(spec["temperature"]),
        top_p=1.0, top_k=0, beta=0.0, epsilon=0.2, num_iterations=1, scale_rewards="group", loss_type="dapo",
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,  # as polar's defaults (TRL's: on)
        report_to="none", save_strategy="no", logging_steps=1,
        seed=int(spec["seed"]), remove_unused_columns=False, disable_dropout=True, dataloader_num_workers=0)
    lora = LoraConfig(r=int(spec["lora_r"]), lora_alpha=float(spec["lora_alpha"]), lora_dropout=0.0,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=data,
                          processing_class=tok, peft_config=lora)

    gen = {"s": 0.0, "tokens": 0}
    inner = trainer.model.generate

    def timed_generate(*a: Any, **kw: Any) -> Any:
        t = time.monotonic()
        out = inner(*a, **kw)
        gen["s"] += time.monotonic() - t
        prompt = kw.get("input_ids", a[0] if a else None)
        new = out[:, prompt.shape[1]:] if prompt is not None else out
        gen["tokens"] += int((new != tok.pad_token_id).sum())
        return out

    trainer.model.generate = timed_generate
    steps: list[float] = []

    class StepTimes(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            self.t = time.monotonic()

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            steps.append(time.monotonic() - self.t)

    trainer.add_callback(StepTimes())
    trainer.train()
    wall["train_end"] = round(time.monotonic() - t0, 1)
    result["after"] = evaluate(trainer.model, tok, heldout, reward, spec)
    wall["after"] = round(time.monotonic() - t0, 1)
    result["wall_s"] = wall
    result["steps"] = len(steps)
    result["sampled_tokens_per_s"] = round(gen["tokens"] / gen["s"], 2) if gen["s"] else None
    result["learner_s_per_step"] = round((sum(steps) - gen["s"]) / max(1, len(steps)), 2) if steps else None
    result["train_rewards"] = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    Path(spec["out"]).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
