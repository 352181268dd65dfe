"""Adding an algorithm is what docs/DEVELOPING.md says ("Adding an algorithm"): four library files, nothing else.

The test copies the package, adds a toy policy-gradient algorithm in exactly those files (its config, one union
line, its learner, one registry row), checks that nothing else changed, and trains it with `polar run` in a
subprocess on the copy: the toy learner's updates, checkpoints, evaluation and run kind come out as for any
built-in algorithm.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polar

TOY_CONFIG = '''"""Toy policy-gradient hyperparameters (``policy: {type: toy}``)."""

from typing import Literal

from pydantic import Field

from polar.config.base import StrictModel


class ToyKwargs(StrictModel):
    n_steps: int = Field(16, ge=1, description="env steps per env in one fragment")
    learning_rate: float = Field(0.01, gt=0)
    gamma: float = Field(0.99, ge=0, le=1)


class ToyPolicyConfig(StrictModel):
    type: Literal["toy"] = "toy"
    kwargs: ToyKwargs = Field(default_factory=ToyKwargs)
'''

TOY_LEARNER = '''"""A toy policy gradient: log-probability of each action weighted by its reward, one SGD step per batch."""

from typing import Any

import torch

from polar.types import Batch, Metrics, Rollout


class ToyLearner:
    def __init__(self, agent: torch.nn.Module, kwargs: Any) -> None:
        self.agent = agent
        self.optimizer = torch.optim.SGD(agent.parameters(), lr=kwargs.learning_rate)
        self.updates = 0

    def update(self, batch: Batch[Rollout]) -> Metrics:
        losses = []
        for frag in batch.data.fragments:
            obs = torch.as_tensor(frag.obs).flatten(0, 1)
            actions = torch.as_tensor(frag.actions).flatten(0, 1)
            rewards = torch.as_tensor(frag.rewards, dtype=torch.float32).flatten(0, 1)
            log_prob, _, _ = self.agent.evaluate_actions(obs, actions)
            losses.append(-(log_prob * rewards).mean())
        loss = torch.stack(losses).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        return {"toy_loss": float(loss.detach()), "toy_updates": self.updates}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
'''

REGISTRY_ROW = ('    "toy": Algorithm(ToyKwargs, lambda parts: PolicyLearner(parts, ToyLearner(parts.train_agent, '
                'parts.cfg.policy.kwargs)), lambda parts, learner: env_collector(parts, lambda: 1), '
                'steps_per_env=lambda cfg: cfg.policy.kwargs.n_steps),\n')


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: expected one {old!r}"
    path.write_text(text.replace(old, new))


def _add_toy_algorithm(pkg: Path) -> None:
    """The four files of docs/DEVELOPING.md's "Adding an algorithm", and nothing else."""
    (pkg / "config" / "toy.py").write_text(TOY_CONFIG)
    _edit(pkg / "config" / "run.py", "EnvPolicyConfig = Annotated[\n", "EnvPolicyConfig = Annotated[\n    ToyPolicyConfig |")
    _edit(pkg / "config" / "run.py", "from polar.config.sections import",
          "from polar.config.toy import ToyPolicyConfig\nfrom polar.config.sections import")
    (pkg / "algorithms" / "toy.py").write_text(TOY_LEARNER)
    registry = pkg / "trainers" / "registry.py"
    rows = "\nALGORITHMS: dict[str, Algorithm] = {\n"
    _edit(registry, rows, rows + REGISTRY_ROW)
    _edit(registry, "from polar.algorithms.sac import SACLearner\n",
          "from polar.algorithms.sac import SACLearner\nfrom polar.algorithms.toy import ToyLearner\n")
    _edit(registry, "from polar.config.sac import SACKwargs\n",
          "from polar.config.sac import SACKwargs\nfrom polar.config.toy import ToyKwargs\n")


def _changed(a: Path, b: Path, rel: Path = Path()) -> set[str]:
    """Files of ``b`` that ``a`` does not have or that differ, relative to the package root."""
    cmp = filecmp.dircmp(a / rel, b / rel, ignore=["__pycache__"])
    out = {str(rel / n) for n in cmp.right_only + cmp.diff_files}
    for sub in cmp.common_dirs:
        out |= _changed(a, b, rel / sub)
    return out


def test_a_new_algorithm_in_the_four_documented_files_trains_through_polar_run(tmp_path):
    original = Path(polar.__file__).parent
    pkg = tmp_path / "src" / "polar"
    shutil.copytree(original, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    _add_toy_algorithm(pkg)
    assert _changed(original, pkg) == {"config/toy.py", "config/run.py", "algorithms/toy.py", "trainers/registry.py"}

    config = tmp_path / "toy.yaml"
    config.write_text(json.dumps({
        "name": "toy", "seed": 0, "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "policy": {"type": "toy", "kwargs": {"n_steps": 16}}, "total_env_steps": 256,
        "distribution": {"envs_per_worker": 2},
        "logging": {"tensorboard": False, "checkpoint_freq": 2, "progress_bar": False},
        "eval": {"at_end": True, "episodes": 2, "num_envs": 1},
    }))
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(config), "--run-dir", str(run),
                        "--no-progress"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in rows] == [32 * i for i in range(1, 9)]  # 16 steps x 2 envs per batch
    assert [r["toy_updates"] for r in rows] == list(range(1, 9)) == [r["policy_version"] for r in rows]
    assert all(isinstance(r["toy_loss"], float) for r in rows)
    import torch

    ckpt = torch.load(run / "checkpoints" / "ckpt_00000008.pt", weights_only=False)
    assert ckpt["learner"]["updates"] == 8 and ckpt["env_steps"] == 256 and "policy" in ckpt
    assert json.loads((run / "eval" / "final.json").read_text())["episodes"] == 2
    assert json.loads((run / "run.json").read_text())["kind"] == "toy"
