"""Every example config, and every run config shown in the docs, validates with the typed config as the kind of
run it is meant to be (an env run or an agent run: polar.config.run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from polar.config import AgentRunConfig, EnvRunConfig, load_config, validate_run_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))

# The kind each example is meant to be, with its harness and algorithm: a new example gets a line here.
EXPECTED = {
    "agentic/calculator_command.yaml": ("agent", "agent", "grpo"),
    "agentic/calculator_grpo.yaml": ("agent", "agent", "grpo"),
    "agentic/real_model_grpo.yaml": ("agent", "agent", "grpo"),
    "agentic/sums_distill.yaml": ("agent", "agent", "grpo"),  # GRPO with policy.kwargs.teacher: on-policy distillation
    "atari/breakout_ppo.yaml": ("env", "gymnasium", "ppo"),
    "cartpole_appo_ray.yaml": ("env", "gymnasium", "appo"),
    "cartpole_dqn.yaml": ("env", "gymnasium", "dqn"),
    "cartpole_ppo.yaml": ("env", "gymnasium", "ppo"),
    "cartpole_ppo_envpool.yaml": ("env", "envpool", "ppo"),  # the same run, EnvPool stepping the envs
    "continual/cartpole_dqn_from_iql.yaml": ("env", "gymnasium", "dqn"),
    "continual/cartpole_iql.yaml": ("env", "gymnasium", "iql"),
    "continual/cartpole_ppo_from_iql.yaml": ("env", "gymnasium", "ppo"),
    "imitation/cartpole_gail.yaml": ("env", "gymnasium", "gail"),  # docs/imitation.md
    "imitation/inverted_pendulum_gail.yaml": ("env", "gymnasium", "gail"),
    "imitation/inverted_pendulum_ppo.yaml": ("env", "gymnasium", "ppo"),  # its expert
    "keydoor/curriculum.yaml": ("env", "custom", "ppo"),  # levels 1 -> 3 (docs/exploration.md)
    "keydoor/curriculum_wide.yaml": ("env", "custom", "ppo"),
    "keydoor/curriculum_cnn.yaml": ("env", "custom", "ppo"),  # the one that reaches level 3 (docs/exploration.md)
    "distill/cartpole_student.yaml": ("env", "gymnasium", "distill"),
    "keydoor/demo.yaml": ("env", "custom", "ppo"),
    "hierarchy/keydoor_flat_ppo.yaml": ("env", "gymnasium", "ppo"),  # the flat baseline of docs/hierarchy.md
    "hierarchy/keydoor_hierarchical.yaml": ("env", "gymnasium", "hierarchical"),  # manager + skills (docs/hierarchy.md)
    "hierarchy/keydoor_two_skills.yaml": ("env", "gymnasium", "hierarchical"),  # its two-skill variant
    "hierarchy/keydoor_apart_flat_ppo.yaml": ("env", "gymnasium", "ppo"),  # the key-apart variant's flat baseline
    "hierarchy/keydoor_apart_hierarchical.yaml": ("env", "gymnasium", "hierarchical"),  # ... and its manager + skills
    "llm_frozenlake.yaml": ("agent", "gymnasium", "grpo"),  # the LLM agent playing an env harness
    "llm_humaneval.yaml": ("agent", "agent", "grpo"),
    "llm_planner/controller_ppo.yaml": ("env", "gymnasium", "ppo"),  # the planner's goal-conditioned controller
    "llm_reasoning_gym.yaml": ("agent", "agent", "grpo"),
    "llm_textarena.yaml": ("agent", "gymnasium", "grpo"),  # TextArena/TicTacToe-v0, a Gymnasium id
    "minigrid/doorkey_ppo.yaml": ("env", "gymnasium", "ppo"),
    "minigrid/doorkey_rnd.yaml": ("env", "gymnasium", "ppo"),  # PPO + RND (docs/exploration.md)
    "minigrid/doorkey6_sparse_ppo.yaml": ("env", "gymnasium", "ppo"),  # the sparse comparison's baseline
    "minigrid/doorkey6_sparse_rnd.yaml": ("env", "gymnasium", "ppo"),  # ... and its PPO + RND run
    "mbpo/inverted_pendulum_mbpo.yaml": ("env", "gymnasium", "mbpo"),  # docs/model-based.md
    "mbpo/pendulum_mbpo.yaml": ("env", "gymnasium", "mbpo"),
    "mujoco/halfcheetah_sac.yaml": ("env", "gymnasium", "sac"),
    "mujoco/hopper_ppo.yaml": ("env", "gymnasium", "ppo"),
    "keydoor/polar_train_config.yaml": ("env", "custom", "ppo"),
    "node_connector/line_walk.yaml": ("env", "custom", "ppo"),
    "node_connector/nim_selfplay.yaml": ("env", "pettingzoo", "ppo"),  # a JavaScript 2-player game (protocol 2)
    "pendulum_ppo.yaml": ("env", "gymnasium", "ppo"),
    "pendulum_sac.yaml": ("env", "gymnasium", "sac"),
    "swe_mini/grpo.yaml": ("agent", "agent", "grpo"),
    "tictactoe_selfplay.yaml": ("env", "pettingzoo", "ppo"),  # multi-agent self-play (docs/multi-agent.md)
    "simple_spread.yaml": ("env", "pettingzoo", "ppo"),  # cooperative, parameter sharing (docs/multi-agent.md)
}


def _name(p: Path) -> str:
    return p.relative_to(ROOT / "examples").as_posix()


def _is_run_config(p: Path) -> bool:
    """Suites and task files are YAML too, but not run configs: those have a harness section."""
    data = yaml.safe_load(p.read_text())
    return isinstance(data, dict) and "harness" in data


def test_every_example_has_an_expected_kind():
    run_configs = {_name(p) for p in EXAMPLES if _is_run_config(p)}
    assert run_configs, "no example configs found"
    missing = run_configs - set(EXPECTED)
    assert not missing, f"add these examples to EXPECTED with their kind: {sorted(missing)}"
    gone = set(EXPECTED) - run_configs
    assert not gone, f"EXPECTED names examples that no longer exist: {sorted(gone)}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_validates_as_its_kind(name):
    cfg = load_config(ROOT / "examples" / name)
    kind, harness, policy = EXPECTED[name]
    assert (cfg.kind, cfg.harness.type, cfg.policy.type) == (kind, harness, policy)
    assert isinstance(cfg, EnvRunConfig if kind == "env" else AgentRunConfig)
    assert cfg.config_dir == (ROOT / "examples" / name).parent
    # each kind has only its own sections
    for section in ("gateway", "tasks", "model", "sessions") if kind == "env" else ("eval", "total_env_steps", "nonfinite"):
        assert not hasattr(cfg, section), f"{name}: an {kind} run has no '{section}'"


@pytest.mark.parametrize("pair", ["doorkey", "doorkey6_sparse"])
def test_each_rnd_example_is_its_ppo_baseline_with_only_the_intrinsic_reward_switched_on(pair):
    """docs/exploration.md compares PPO + RND with plain PPO "at the same settings": the two configs differ in
    their name and ``policy.kwargs.intrinsic`` alone."""
    ppo, rnd = (yaml.safe_load((ROOT / "examples" / "minigrid" / f"{pair}_{s}.yaml").read_text()) for s in ("ppo", "rnd"))
    assert rnd["policy"]["kwargs"].pop("intrinsic")["type"] == "rnd"
    assert "intrinsic" not in ppo["policy"]["kwargs"]
    assert {**rnd, "name": None} == {**ppo, "name": None}


def _doc_run_configs() -> list[tuple[str, int, dict]]:
    out = []
    docs = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", *sorted((ROOT / "examples").rglob("*.md"))]
    for doc in docs:
        for i, m in enumerate(re.finditer(r"```ya?ml\n(.*?)```", doc.read_text(), re.S)):
            try:
                data = yaml.safe_load(m.group(1))
            except yaml.YAMLError:
                continue  # a fragment with placeholders, not a config
            if isinstance(data, dict) and "harness" in data:
                out.append((doc.relative_to(ROOT).as_posix(), i, data))
    return out


DOC_CONFIGS = _doc_run_configs()


def test_the_docs_show_run_configs():
    assert len(DOC_CONFIGS) >= 3


@pytest.mark.parametrize(("doc", "block", "data"), DOC_CONFIGS, ids=[f"{d}#{i}" for d, i, _ in DOC_CONFIGS])
def test_doc_run_config_validates(doc, block, data):
    """A full config validates as written; a snippet (harness and friends, no policy) validates once the default
    algorithm of its kind is added, so each of its sections belongs to that kind of run."""
    if "policy" not in data:
        agent = data.get("harness", {}).get("type") == "agent" or (data.get("agent") or {}).get("type") == "llm"
        data = {**data, "policy": {"type": "grpo" if agent else "ppo"}}
    cfg = validate_run_config(data, source=f"{doc} yaml block {block}")
    assert cfg.kind in ("env", "agent")
