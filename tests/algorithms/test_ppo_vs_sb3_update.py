"""polar's PPO update is Stable-Baselines3's, step for step, on shared CartPole rollouts.

Issue 38 asked whether polar needs more env steps than SB3 to reach 475 on CartPole because the two PPOs
differ. Here both start from the same weights (polar's copied into SB3's ``MlpPolicy``, layer by layer;
both initialise them orthogonally with the same gains), both collect the same 32 x 8 rollout with their own
collectors (SB3 is made to take the actions polar's collector sampled, on identically seeded envs), and each
runs its own update on its own buffer. Compared:

- the buffers: observations, actions, episode starts, values, log-probs, and the rewards with the
  time-limit bootstrap (SB3 adds ``gamma * V(terminal_observation)`` to a truncated step's reward in
  ``collect_rollouts``; polar keeps ``trunc_values`` beside the reward and adds it in ``rollout_gae``);
  a 20-step time limit makes the rollout hold both terminations and truncations;
- GAE advantages and returns;
- the gradient (after the 0.5 global-norm clip) of every optimizer step of the update, in one minibatch
  order (SB3's buffer is made to yield polar's minibatches); the normalised advantages enter each step's
  surrogate gradient linearly, so this pins SB3's per-minibatch normalisation too;
- the loss terms of an update, the learning rate and clip range at every rollout of a run (polar's trainer
  against SB3's ``learn``), and the parameters after the whole update (n_epochs x minibatches Adam steps,
  eps 1e-5), and after three collect-update rounds in a row;
- for RL Zoo's CartPole hyperparameters (one 256-sample minibatch per epoch, 20 epochs) and for 64-sample
  minibatches with the entropy bonus and value clipping on; on the default fused path and on autograd;
- and end to end: what ``polar run`` composes from the example config (backend, collector, learner, loop),
  run for four rollouts and replayed through SB3, rollout by rollout.

Tolerances are float32's: the two sides sum in different orders (fused hand-derived gradients, numpy
acting), so values, log-probs, GAE, every step's gradient and the final parameters are compared to
``atol=1e-6, rtol=1e-5`` (measured: at most 1.5e-7 apart, where one update moves the weights by up to 0.02).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import stable_baselines3 as sb3
import torch
from stable_baselines3.common.callbacks import CallbackList
from stable_baselines3.common.env_util import make_vec_env

from polar.algorithms.ppo import PPOLearner
from polar.buffers.rollout_buffer import RolloutBuffer
from polar.config import load_config
from polar.harness import make_vector_env
from polar.models import build_policy
from polar.rollout.runner import EnvRunner
from polar.types import Batch, Fragment, Rollout

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole_ppo.yaml"
N_ENVS, N_STEPS, TOTAL, SEED, TIME_LIMIT = 8, 32, 100_000, 3, 20
# RL Zoo's CartPole-v1 PPO: SB3's side of benchmarks/ppo_vs_sb3.py (polar's is examples/cartpole_ppo.yaml)
ZOO = dict(n_steps=N_STEPS, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8, ent_coef=0.0,
           learning_rate=1e-3, clip_range=0.2)
# more minibatches per epoch: the minibatch order, per-minibatch advantage normalisation, entropy, value clip
SMALL_BATCHES = {**ZOO, "batch_size": 64, "n_epochs": 4, "ent_coef": 0.01, "clip_range_vf": 0.2}
POLAR_TO_SB3 = {"pi_encoder": "mlp_extractor.policy_net", "vf_encoder": "mlp_extractor.value_net",
                "pi_head": "action_net", "vf_head": "value_net"}
TOL = dict(rtol=1e-5, atol=1e-6)


def _sb3_name(polar_name: str) -> str:
    head, _, rest = polar_name.partition(".")
    return f"{POLAR_TO_SB3[head]}.{rest}"


def _lin(x: float):
    return lambda progress_remaining: progress_remaining * x


def _sb3_model(hp: dict, total: int = TOTAL, time_limit: int | None = TIME_LIMIT):
    env_kwargs = {"max_episode_steps": time_limit} if time_limit else None
    env = make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=SEED, env_kwargs=env_kwargs)
    kw = {k: v for k, v in hp.items() if k not in ("learning_rate", "clip_range", "clip_range_vf")}
    vf = hp.get("clip_range_vf")
    return sb3.PPO("MlpPolicy", env, learning_rate=_lin(hp["learning_rate"]), clip_range=_lin(hp["clip_range"]),
                   clip_range_vf=None if vf is None else (lambda _: vf), device="cpu", verbose=0, **kw)


def _polar_config(hp: dict, fused: str, total: int = TOTAL, time_limit: int | None = TIME_LIMIT, *extra: str):
    """``examples/cartpole_ppo.yaml`` (the benchmark's polar side), with ``hp``'s departures from RL Zoo's."""
    overrides = [f"seed={SEED}", f"total_env_steps={total}", f"policy.kwargs.fused={json.dumps(fused)}",
                 "stop_reward=null", *extra]
    overrides += [f"policy.kwargs.{k}={json.dumps(v)}" for k, v in hp.items() if ZOO.get(k) != v]
    if time_limit:
        overrides.append(f"harness.kwargs.max_episode_steps={time_limit}")
    return load_config(EXAMPLE, overrides)


def _copy_weights(agent: torch.nn.Module, policy: torch.nn.Module) -> None:
    sb3_params = dict(policy.named_parameters())
    with torch.no_grad():
        for name, p in agent.named_parameters():
            sb3_params[_sb3_name(name)].copy_(p)


def _flat_grads(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in params]).clone()


class Shared:
    """One rollout collected by both: polar's agent, fragment and buffer, and SB3's model with its buffer."""

    def __init__(self, hp: dict, fused: str) -> None:
        cfg = _polar_config(hp, fused)
        self.kw = cfg.policy.kwargs
        env = make_vector_env(cfg.harness, N_ENVS)
        torch.manual_seed(SEED)
        self.policy = build_policy(cfg, env.single_observation_space, env.single_action_space)
        self.agent = self.policy.agent
        self.runner = EnvRunner(env, self.policy, seed=SEED, gamma=self.kw.gamma)
        self.model = _sb3_model(hp)
        _copy_weights(self.agent, self.model.policy)
        _, self.callback = self.model._setup_learn(TOTAL, CallbackList([]))
        self.collect()

    def collect(self) -> None:
        """The next rollout: polar's collector samples the actions, SB3's ``collect_rollouts`` takes them."""
        self.frag = self.runner.collect(N_STEPS)
        _sb3_collect(self.model, self.callback, self.frag, TOTAL)


def _sb3_collect(model: sb3.PPO, callback, frag: Fragment, total: int) -> None:
    """SB3's ``collect_rollouts``, made to take the actions of polar's ``frag`` (its values, log-probs and
    time-limit bootstrap stay its own), then its schedules' progress, as SB3's ``learn()`` steps it."""
    policy = model.policy
    taken = iter(torch.as_tensor(frag.actions))

    def forward(obs: torch.Tensor, deterministic: bool = False):
        a = next(taken)
        values, log_prob, _ = policy.evaluate_actions(obs, a)
        return a, values, log_prob

    policy.forward = forward
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, N_STEPS)
    del policy.forward
    model._update_current_progress_remaining(model.num_timesteps, total)


def _run_polar(shared: Shared, learner: PPOLearner | None = None
               ) -> tuple[PPOLearner, dict, list[torch.Tensor], list[torch.Tensor], RolloutBuffer]:
    """polar's update (a new learner unless given); returns the learner, its stats, every step's clipped
    gradient, and each epoch's minibatch order."""
    learner = learner or PPOLearner(shared.agent, shared.kw, TOTAL)
    grads: list[torch.Tensor] = []
    step = learner.optimizer.step

    def recording_step():
        grads.append(learner.optimizer.flat_grad.clone())
        step()

    learner.optimizer.step = recording_step
    perms: list[torch.Tensor] = []
    randperm = torch.randperm

    def recording_randperm(n: int, *args, **kwargs):
        perms.append(randperm(n, *args, **kwargs))
        return perms[-1]

    buf = RolloutBuffer([shared.frag])
    torch.randperm = recording_randperm
    try:
        torch.manual_seed(SEED)
        stats = learner.update(Batch(Rollout([shared.frag], buffer=buf), env_steps=shared.frag.env_steps,
                                     run_env_steps=shared.runner.env_steps))  # the loop's progress
    finally:
        torch.randperm = randperm
    return learner, stats, grads, perms, buf


def _run_sb3(shared: Shared | sb3.PPO, polar_perms: list[torch.Tensor], batch_size: int) -> list[torch.Tensor]:
    """SB3's ``train()`` with its buffer yielding polar's minibatches (polar flattens time-major, SB3 env-major);
    returns every step's clipped gradient."""
    model = shared if isinstance(shared, sb3.PPO) else shared.model
    rb = model.rollout_buffer
    n = N_STEPS * N_ENVS
    orders = iter(polar_perms)
    get = rb.get

    def polar_order_get(size: int | None = None) -> Iterator:
        next(get(size))  # SB3's own get swaps and flattens its arrays on first use
        perm = next(orders, None)
        perm = torch.arange(n) if perm is None else perm  # polar takes the whole batch in order
        t, e = perm // N_ENVS, perm % N_ENVS
        sb3_idx = (e * N_STEPS + t).numpy()
        for start in range(0, n - batch_size + 1, batch_size):
            yield rb._get_samples(sb3_idx[start:start + batch_size])

    rb.get = polar_order_get
    grads: list[torch.Tensor] = []
    opt = model.policy.optimizer
    step = opt.step

    def recording_step(*args, **kwargs):
        grads.append(_flat_grads(list(model.policy.parameters())))
        return step(*args, **kwargs)

    opt.step = recording_step
    try:
        model.train()
    finally:
        del rb.get, opt.step
    return grads


CASES = [pytest.param(ZOO, "auto", id="rl_zoo-fused"), pytest.param(ZOO, "off", id="rl_zoo-autograd"),
         pytest.param(SMALL_BATCHES, "auto", id="minibatches-fused"),
         pytest.param(SMALL_BATCHES, "off", id="minibatches-autograd")]


@pytest.fixture(scope="module")
def shared_rollouts() -> dict:
    return {(case.id): Shared(*case.values) for case in CASES}


def test_the_example_config_is_rl_zoos():
    """The benchmark's polar config: RL Zoo's hyperparameters, linear schedules, 8 envs in the learner, separate
    64-64 tanh actor and critic (SB3's ``MlpPolicy``), no observation or reward normalisation."""
    cfg = _polar_config(ZOO, "auto", TOTAL, None)
    kw = cfg.policy.kwargs
    assert {k: getattr(kw, k) for k in ZOO} == ZOO
    assert (kw.lr_schedule, kw.clip_range_schedule, kw.vf_coef, kw.max_grad_norm, kw.adam_eps, kw.clip_range_vf,
            kw.target_kl, kw.normalize_advantage, kw.normalize_obs, kw.normalize_reward) == (
        "linear", "linear", 0.5, 0.5, 1e-5, None, None, True, False, False)
    assert cfg.distribution.num_envs == N_ENVS and cfg.distribution.rollout_workers == 0
    agent = cfg.agent
    assert (agent.hidden_sizes, agent.activation, agent.share_encoder, agent.ortho_init) == ([64, 64], "tanh", False, True)


def test_init_gains_are_sb3s():
    """Orthogonal init with SB3's gains (sqrt 2 hidden, 0.01 policy head, 1 value head), zero biases."""
    cfg = _polar_config(ZOO, "auto")
    env = make_vector_env(cfg.harness, 1)
    agent = build_policy(cfg, env.single_observation_space, env.single_action_space).agent
    sb3_params = dict(_sb3_model(ZOO).policy.named_parameters())
    for name, p in agent.named_parameters():
        q = sb3_params[_sb3_name(name)]
        assert p.shape == q.shape, name
        if p.ndim == 2:  # orthogonal: every singular value equals the gain
            torch.testing.assert_close(torch.linalg.svdvals(p.detach()), torch.linalg.svdvals(q.detach()),
                                       rtol=1e-4, atol=1e-5, msg=name)
        else:
            assert not p.any() and not q.any(), name


@pytest.mark.parametrize("case", [c.id for c in CASES])
def test_collected_rollout_and_gae_are_sb3s(shared_rollouts, case):
    shared = shared_rollouts[case]
    frag, rb = shared.frag, shared.model.rollout_buffer
    assert np.array_equal(frag.obs, rb.observations), "same seeds and actions must give the same observations"
    assert np.array_equal(frag.actions, rb.actions[..., 0])
    assert np.array_equal(frag.episode_starts, rb.episode_starts)
    assert frag.terminated.any() and frag.truncated.any(), "the rollout must hold both kinds of episode end"
    np.testing.assert_allclose(frag.values, rb.values, **TOL)
    np.testing.assert_allclose(frag.log_probs, rb.log_probs, **TOL)
    np.testing.assert_allclose(frag.rewards + shared.kw.gamma * frag.trunc_values, rb.rewards, **TOL)
    from polar.algorithms.advantages import rollout_gae

    adv, ret = rollout_gae(RolloutBuffer([frag]), shared.kw.gamma, shared.kw.gae_lambda)
    np.testing.assert_allclose(adv.numpy(), rb.advantages, **TOL)
    np.testing.assert_allclose(ret.numpy(), rb.returns, **TOL)


@pytest.mark.parametrize("case", [c.id for c in CASES])
def test_every_update_step_and_the_final_weights_are_sb3s(shared_rollouts, case):
    shared = copy.deepcopy(shared_rollouts[case])
    hp = SMALL_BATCHES if case.startswith("minibatches") else ZOO
    learner, stats, polar_grads, perms, _ = _run_polar(shared)
    assert learner.path.startswith("fused" if case.endswith("fused") else "autograd"), learner.path
    sb3_grads = _run_sb3(shared, perms, hp["batch_size"])
    steps = hp["n_epochs"] * (N_STEPS * N_ENVS // hp["batch_size"])
    assert len(polar_grads) == len(sb3_grads) == steps
    for i, (g, h) in enumerate(zip(polar_grads, sb3_grads, strict=True)):
        torch.testing.assert_close(g, h, **TOL, msg=f"gradient of step {i} (epoch {i // (steps // hp['n_epochs'])})")
    sb3_params = dict(shared.model.policy.named_parameters())
    for name, p in shared.agent.named_parameters():
        torch.testing.assert_close(p.detach(), sb3_params[_sb3_name(name)].detach(), **TOL, msg=f"{name} after the update")
    assert stats["learning_rate"] == pytest.approx(shared.model.policy.optimizer.param_groups[0]["lr"], rel=1e-12)
    assert stats["clip_range"] == pytest.approx(shared.model.clip_range(shared.model._current_progress_remaining),
                                                rel=1e-12)


@pytest.mark.parametrize("case", ["rl_zoo-fused", "minibatches-autograd"])
def test_one_epochs_loss_terms_are_sb3s(shared_rollouts, case):
    """With one epoch both report the mean over the same minibatches (polar averages the last epoch's, SB3 all
    epochs' except approx_kl, so only one epoch compares every term)."""
    shared = copy.deepcopy(shared_rollouts[case])
    shared.kw = shared.kw.model_copy(update={"n_epochs": 1})
    shared.model.n_epochs = 1
    hp = SMALL_BATCHES if case.startswith("minibatches") else ZOO
    _, stats, _, perms, _ = _run_polar(shared)
    _run_sb3(shared, perms, hp["batch_size"])
    logged = shared.model.logger.name_to_value
    assert stats["pg_loss"] == pytest.approx(logged["train/policy_gradient_loss"], abs=1e-6)
    assert stats["value_loss"] == pytest.approx(logged["train/value_loss"], rel=1e-5)
    assert -stats["entropy"] == pytest.approx(logged["train/entropy_loss"], rel=1e-5)
    assert stats["approx_kl"] == pytest.approx(logged["train/approx_kl"], abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(logged["train/clip_fraction"], abs=1e-6)
    assert stats["explained_variance"] == pytest.approx(logged["train/explained_variance"], rel=1e-4)


def test_lr_and_clip_schedules_step_like_sb3s_across_rollouts(tmp_path):
    """Both set the learning rate and clip range once per rollout, from the env steps counted so far including
    that rollout (SB3: ``progress_remaining = 1 - num_timesteps / total`` before ``train()``): no off-by-one."""
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    total = 3 * N_STEPS * N_ENVS
    hp = {**ZOO, "n_epochs": 1}
    cfg = _polar_config(hp, "auto", total, None, "eval.at_end=false", "logging.tensorboard=false",
                        "logging.checkpoint_freq=0", "logging.progress_bar=false")
    seen: list[dict] = []
    compose(cfg, RunDir.create("schedules", tmp_path / "run"), on_iteration=seen.append).train()
    model = _sb3_model(hp, total=total, time_limit=None)
    sb3_seen: list[tuple[float, float]] = []
    train = model.train

    def recording_train():
        train()
        sb3_seen.append((model.policy.optimizer.param_groups[0]["lr"], model.clip_range(model._current_progress_remaining)))

    model.train = recording_train
    model.learn(total)
    polar_seen = [(m["learning_rate"], m["clip_range"]) for m in seen]
    assert len(polar_seen) == len(sb3_seen) == 3 and sb3_seen[-1] == (0.0, 0.0)
    assert np.allclose(polar_seen, sb3_seen, rtol=1e-12, atol=0), (polar_seen, sb3_seen)


def test_three_rollouts_in_a_row_stay_sb3s(shared_rollouts):
    """Collect, update, collect with the updated weights, ...: Adam's state carries over, the schedules step, and
    polar's collector acts with the weights it just trained (SB3 takes the same actions, so the envs agree)."""
    shared = copy.deepcopy(shared_rollouts["rl_zoo-fused"])
    learner = PPOLearner(shared.agent, shared.kw, TOTAL)
    sb3_params = dict(shared.model.policy.named_parameters())
    for rollout in range(3):
        if rollout:
            shared.collect()
            rb = shared.model.rollout_buffer
            assert np.array_equal(shared.frag.obs, rb.observations)
            np.testing.assert_allclose(shared.frag.log_probs, rb.log_probs, **TOL, err_msg=f"rollout {rollout}")
            np.testing.assert_allclose(shared.frag.values, rb.values, **TOL, err_msg=f"rollout {rollout}")
        _, _, polar_grads, perms, _ = _run_polar(shared, learner)
        sb3_grads = _run_sb3(shared, perms, ZOO["batch_size"])
        torch.testing.assert_close(torch.stack(polar_grads), torch.stack(sb3_grads), **TOL, msg=f"rollout {rollout}")
        for name, p in shared.agent.named_parameters():
            torch.testing.assert_close(p.detach(), sb3_params[_sb3_name(name)].detach(), **TOL,
                                       msg=f"{name} after rollout {rollout}")
    assert learner.optimizer.step_count == 3 * ZOO["n_epochs"]


@pytest.mark.parametrize("hp", [pytest.param(ZOO, id="rl_zoo"), pytest.param(SMALL_BATCHES, id="minibatches")])
def test_what_polar_run_builds_is_sb3s_rollout_by_rollout(tmp_path, monkeypatch, hp):
    """The tests above wire polar's runner and learner by hand; this one runs what ``polar run --config
    examples/cartpole_ppo.yaml`` composes (the local backend's in-learner runner with the config's runner options,
    the collector's stacked buffer, the policy learner, the loop's progress counter) for four rollouts, recording
    each rollout, minibatch order and clipped gradient, and replays them through SB3 from the same initial weights:
    each rollout's observations, values, log-probs and bootstrapped rewards (acted with the weights trained so
    far), every optimizer step's gradient and the final weights must be SB3's.

    Not the last rollout's gradients: there the linear schedules reach 0 (as at the end of every run with them),
    and a clip range of exactly 0 makes each sample's surrogate gradient switch on or off with the last bit of
    its probability ratio. SB3's ratio is exactly 1 there (it computes the old and new log-probs with the same
    torch ops); polar's old log-probs come from its numpy acting, one float32 ulp off torch's for about a sixth
    of the samples here, and the gradients differ by up to 3.5e-4. The learning rate is 0 at that rollout, so
    neither side's weights move, and the final weights are still compared."""
    from polar.rollout.runner import EnvRunner
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    rollouts = 4
    total = rollouts * N_STEPS * N_ENVS  # the schedules reach 0 at the last rollout
    cfg = _polar_config(hp, "auto", total, TIME_LIMIT, "eval.at_end=false", "logging.tensorboard=false",
                        "logging.checkpoint_freq=0", "logging.progress_bar=false")
    loop = compose(cfg, RunDir.create("parity", tmp_path / "run"))
    ppo = loop.learner.algorithm
    assert isinstance(ppo, PPOLearner) and ppo.path.startswith("fused"), "polar run's CartPole path is the fused one"
    model = _sb3_model(hp, total=total)
    _copy_weights(ppo.agent, model.policy)
    _, callback = model._setup_learn(total, CallbackList([]))

    frags: list[Fragment] = []
    collect = EnvRunner.collect
    monkeypatch.setattr(EnvRunner, "collect", lambda self, *a: frags.append(copy.deepcopy(collect(self, *a))) or frags[-1])
    perms: list[torch.Tensor] = []
    randperm = torch.randperm
    monkeypatch.setattr(torch, "randperm", lambda n, *a, **k: perms.append(randperm(n, *a, **k)) or perms[-1])
    grads: list[torch.Tensor] = []
    step = ppo.optimizer.step
    monkeypatch.setattr(ppo.optimizer, "step", lambda: grads.append(ppo.optimizer.flat_grad.clone()) or step())
    loop.train()
    monkeypatch.undo()

    epochs, minibatches = hp["n_epochs"], N_STEPS * N_ENVS // hp["batch_size"]
    per_update = epochs if minibatches > 1 else 0  # one minibatch per epoch: the whole rollout, in order
    assert len(frags) == rollouts and len(perms) == rollouts * per_update
    assert len(grads) == rollouts * epochs * minibatches
    assert sum(f.truncated.sum() for f in frags) and sum(f.terminated.sum() for f in frags)
    for i, frag in enumerate(frags):
        _sb3_collect(model, callback, frag, total)
        rb = model.rollout_buffer
        assert np.array_equal(frag.obs, rb.observations), f"rollout {i}: observations"
        np.testing.assert_allclose(frag.values, rb.values, **TOL, err_msg=f"rollout {i}: values")
        np.testing.assert_allclose(frag.log_probs, rb.log_probs, **TOL, err_msg=f"rollout {i}: log-probs")
        np.testing.assert_allclose(frag.rewards + cfg.policy.kwargs.gamma * frag.trunc_values, rb.rewards, **TOL,
                                   err_msg=f"rollout {i}: rewards with the time-limit bootstrap")
        sb3_grads = _run_sb3(model, perms[i * per_update:(i + 1) * per_update], hp["batch_size"])
        steps = epochs * minibatches
        if i == rollouts - 1:
            assert model.clip_range(model._current_progress_remaining) == 0.0
            continue
        torch.testing.assert_close(torch.stack(grads[i * steps:(i + 1) * steps]), torch.stack(sb3_grads), **TOL,
                                   msg=f"rollout {i}: the update's clipped gradients")
    sb3_params = dict(model.policy.named_parameters())
    for name, p in ppo.agent.named_parameters():
        torch.testing.assert_close(p.detach(), sb3_params[_sb3_name(name)].detach(), **TOL, msg=f"{name} at the end")
