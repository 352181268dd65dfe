"""The newcomer's tests: an edit to the PPO code a reader finds changes what a default-config run does.

A default PPO run (``policy: {type: ppo}``, the built-in MLP) takes the fused path: a hand-derived
gradient in place of ``autograd_step`` and numpy acting in place of ``act``. Each test here edits the
*source* of one function the way a newcomer would, in a copy of its module file (``_edit``), installs the
edited function where the run looks it up, and checks the default run now does exactly what the edited
code does under ``fused: off``, and something different from the unedited run:

- (a) the clipped surrogate (``clipped_surrogate``);
- (b) a term added to the loss where ``ppo_loss`` is called (``PPOLearner.update`` before this change,
  ``autograd_step`` now);
- (c) ``ActorCriticAgent.evaluate_actions``;
- (d) ``ActorCriticAgent.act``, which rollouts act through;
- and a helper those call by name (``_run_layers``).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

import polar.algorithms.ppo as ppo_mod
import polar.models.actor_critic as ac_mod
from polar.algorithms.ppo import PPOLearner
from polar.config import RunConfig, validate
from polar.models.policy import build_policy
from polar.rollout.backends.base import make_backend
from polar.types import Fragment
from tests.algorithms.ppo_support import DEFAULT, one_rollout, update_grads


def _default_config() -> RunConfig:
    return validate(RunConfig, DEFAULT)


def _rollout() -> tuple[RunConfig, torch.nn.Module, Fragment]:
    """One real rollout of the default config (8 CartPole envs stepped in this process, 128 steps each)."""
    cfg = _default_config()
    policy, frag = one_rollout(cfg)
    return cfg, policy, frag


@pytest.fixture(scope="module")
def default_rollout():
    cfg, policy, frag = _rollout()
    return cfg, policy, {k: v.clone() for k, v in policy.state_dict().items()}, frag


# --- editing a function's source, as a newcomer would -------------------------------------------------

Edit = Callable[[ast.Module], tuple[str, int, str]]  # -> (qualname of the edited function, line index, text)


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef]]:
    """Every function and method of a module with its qualname."""
    out: list[tuple[str, ast.FunctionDef]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef):
                out.append((f"{prefix}{child.name}", child))
                walk(child, f"{prefix}{child.name}.<locals>.")

    walk(tree, "")
    return out


def at_top_of(qualname: str, statement: str) -> Edit:
    """Insert ``statement`` as the first statement of ``qualname``'s body (after its docstring)."""

    def edit(tree: ast.Module) -> tuple[str, int, str]:
        fn = dict(_functions(tree))[qualname]
        body = fn.body
        first = body[1] if (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                            and isinstance(body[0].value.value, str) and len(body) > 1) else body[0]
        return qualname, first.lineno - 1, " " * first.col_offset + statement + "\n"

    return edit


def after_the_ppo_loss_call(term: str) -> Edit:
    """Add ``term`` to the loss right after the statement ``loss, ... = ppo_loss(logp, ent, values, ...)``,
    wherever it is (``{loss}`` and ``{values}`` name that call's loss and value variables)."""

    def edit(tree: ast.Module) -> tuple[str, int, str]:
        hits = []
        for qualname, fn in _functions(tree):
            for node in ast.walk(fn):
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                        and isinstance(node.value.func, ast.Name) and node.value.func.id == "ppo_loss"):
                    hits.append((qualname, node))
        qualname, node = hits[-1]  # the innermost function holding it (ast.walk lists nested ones too)
        target = node.targets[0]
        loss = ast.unparse(target.elts[0] if isinstance(target, ast.Tuple) else target)
        values = ast.unparse(node.value.args[2])
        line = f"{loss} = {loss} + " + term.format(values=values)
        return qualname, node.end_lineno, " " * node.col_offset + line + "\n"

    return edit


def _lookup(root: object, qualname: str) -> tuple[object, str]:
    parts = qualname.split(".")
    for part in parts[:-1]:
        root = getattr(root, part)
    return root, parts[-1]


def _edit(module: ModuleType, edit: Edit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Apply ``edit`` to a copy of ``module``'s file, import the copy, and install the edited function where
    the run looks it up (the module attribute, or the class's method). Returns the edited function's qualname."""
    src = Path(module.__file__).read_text()
    qualname, index, text = edit(ast.parse(src))
    lines = src.splitlines(keepends=True)
    lines.insert(index, text)
    name = f"edited_{module.__name__.replace('.', '_')}"
    path = tmp_path / f"{name}.py"
    path.write_text("".join(lines))
    spec = importlib.util.spec_from_file_location(name, path)
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, copy)
    spec.loader.exec_module(copy)
    owner, attr = _lookup(copy, qualname)
    edited = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    assert text.strip() in "".join(lines) and edited.__code__.co_filename == str(path)
    target, attr = _lookup(module, qualname)
    monkeypatch.setattr(target, attr, edited)
    return qualname


def _assert_the_edit_is_what_runs(default_rollout, changed: str) -> None:
    """The default run (fused: auto) leaves the fused path, names the edit, and takes exactly the gradients of
    the edited code under fused: off; those differ from the unedited code's."""
    learner, edited = update_grads(default_rollout, "auto")
    _, edited_off = update_grads(default_rollout, "off")
    assert len(edited) == len(edited_off) == 160
    assert all(torch.equal(a, b) for a, b in zip(edited, edited_off, strict=True)), (
        f"the default run did not run the edit: {_max_diff(edited, edited_off):.2g} off")
    assert not learner.fused and f"{changed} changed" in learner.path, learner.path  # and the run log says why


@pytest.fixture(scope="module")
def unedited(default_rollout):
    """Every step's gradient of the unedited code (fused: off: no float drift between the two paths)."""
    return update_grads(default_rollout, "off")[1]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def test_editing_the_clipped_surrogate_changes_the_default_runs_gradients(default_rollout, unedited, tmp_path,
                                                                           monkeypatch):
    _edit(ppo_mod, at_top_of("clipped_surrogate", "clip_range = 0.5 * clip_range"), tmp_path, monkeypatch)
    _assert_the_edit_is_what_runs(default_rollout, "clipped_surrogate")
    assert _max_diff(update_grads(default_rollout)[1], unedited) > 1e-3


def test_a_term_added_after_the_loss_changes_the_default_runs_gradients(default_rollout, unedited, tmp_path,
                                                                         monkeypatch):
    where = _edit(ppo_mod, after_the_ppo_loss_call("0.5 * {values}.pow(2).mean()"), tmp_path, monkeypatch)
    _assert_the_edit_is_what_runs(default_rollout, where)
    assert where == "autograd_step"  # the one function the fused path replaces
    assert _max_diff(update_grads(default_rollout)[1], unedited) > 1e-3


def test_a_term_added_in_update_after_the_gradient_step_runs_on_the_fused_path(default_rollout, unedited, tmp_path,
                                                                                monkeypatch):
    """What ``update`` does around the gradient step is shared: an extra penalty there runs on both paths."""
    fn = dict(_functions(ast.parse(Path(ppo_mod.__file__).read_text())))["PPOLearner.update"]
    step_call = next(n for n in ast.walk(fn) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                     and isinstance(n.value.func, ast.Name) and n.value.func.id == "step")
    penalty = "(1e-2 * sum(p.pow(2).sum() for p in self.params)).backward()"

    def edit(tree: ast.Module) -> tuple[str, int, str]:
        return "PPOLearner.update", step_call.end_lineno, " " * step_call.col_offset + penalty + "\n"

    _edit(ppo_mod, edit, tmp_path, monkeypatch)
    learner, fused = update_grads(default_rollout, "auto")
    assert learner.fused  # update is not pinned: the fused path replaces autograd_step only
    _, off = update_grads(default_rollout, "off")
    torch.testing.assert_close(fused[0], off[0], atol=1e-6, rtol=1e-4)  # the same edit on both paths
    assert _max_diff(fused, unedited) > 1e-3


def test_editing_evaluate_actions_changes_the_default_runs_gradients(default_rollout, unedited, tmp_path,
                                                                      monkeypatch):
    _edit(ac_mod, at_top_of("ActorCriticAgent.evaluate_actions", "observation = observation * 1.5"), tmp_path,
          monkeypatch)
    _assert_the_edit_is_what_runs(default_rollout, "ActorCriticAgent.evaluate_actions")
    assert _max_diff(update_grads(default_rollout)[1], unedited) > 1e-3


def test_editing_a_helper_of_the_agent_changes_the_default_runs_gradients(default_rollout, unedited, tmp_path,
                                                                          monkeypatch):
    _edit(ac_mod, at_top_of("_run_layers", "x = 1.5 * x"), tmp_path, monkeypatch)
    _assert_the_edit_is_what_runs(default_rollout, "_run_layers")
    assert _max_diff(update_grads(default_rollout)[1], unedited) > 1e-3


def test_editing_act_changes_the_default_runs_actions(tmp_path, monkeypatch):
    """A greedy ``act``: every action of the default run's rollout is then the argmax of the policy's logits
    at the observation it saw (sampled ones are not: CartPole's untrained policy is near uniform)."""
    _, policy, frag = _rollout()
    with torch.no_grad():
        greedy = policy.agent.pi_head(policy.agent.pi_encoder(torch.from_numpy(frag.obs.reshape(-1, 4)))).argmax(-1)
    assert (frag.actions.reshape(-1) != greedy.numpy()).mean() > 0.2  # the unedited default run samples

    _edit(ac_mod, at_top_of("ActorCriticAgent.act", "deterministic = True"), tmp_path, monkeypatch)
    cfg, policy, frag = _rollout()
    with torch.no_grad():  # the actor network itself, not act or its twin
        logits = policy.agent.pi_head(policy.agent.pi_encoder(torch.from_numpy(frag.obs.reshape(-1, 4))))
    np.testing.assert_array_equal(frag.actions.reshape(-1), logits.argmax(-1).numpy())
    learner = PPOLearner(policy.agent, cfg.policy.kwargs, cfg.total_env_steps)
    assert not learner.fused and "ActorCriticAgent.act changed" in learner.path, learner.path  # the run log says why


def test_a_new_activation_in_the_plain_mlp_takes_autograd_and_act(monkeypatch):
    """Adding GELU to the activations the plain-MLP path knows (``_ACT_FNS``) must not reach the fused
    gradient or the numpy twin, which differentiate and run tanh and relu only (they would treat GELU as
    the identity and as relu): the run trains by autograd and acts through ``act``, which calls GELU itself."""
    from gymnasium import spaces

    from polar.config.agent import BuiltinAgentConfig
    from polar.models import encoders

    monkeypatch.setitem(encoders.ACTIVATIONS, "gelu", torch.nn.GELU)
    monkeypatch.setitem(ac_mod._ACT_FNS, torch.nn.GELU, torch.nn.functional.gelu)
    cfg = BuiltinAgentConfig.model_construct(**{**BuiltinAgentConfig().model_dump(), "activation": "gelu"})
    agent = ac_mod.ActorCriticAgent(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2), cfg)
    assert agent._fast is not None  # the plain-MLP path takes it (act and evaluate_actions run GELU)
    assert not agent.supports_act_numpy()
    from polar.algorithms.ppo import fused_path

    fused, why = fused_path(agent, "auto")
    assert not fused and "not the built-in MLP" in why


@pytest.mark.parametrize("fused", ["auto", "off"])
def test_rollouts_act_through_act_unless_on_the_fused_path(fused):
    """``fused: off`` runs the torch code end to end: rollouts call ``act``, not its numpy twin."""
    cfg = validate(RunConfig, {**DEFAULT, "policy": {"type": "ppo", "kwargs": {"fused": fused}}})
    backend = make_backend(cfg, 4, seed=0)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    try:
        backend.start(policy.state_dict(), 0, policy=policy)
        runner = backend.runner
        assert (runner.fast_act is not None) == (fused == "auto")
        calls = []
        act = policy.agent.act
        policy.agent.act = lambda *a, **k: calls.append(1) or act(*a, **k)
        backend.next_fragment()
    finally:
        backend.close()
    assert len(calls) == (4 + 1 if fused == "off" else 1)  # off: each of the 4 steps; both: the bootstrap value
