"""The AgentBase contract: built-in encoders/heads, user agents from YAML, and clear errors on bad output."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from polar import AgentBase
from polar.config.agent import BuiltinAgentConfig, CustomAgentConfig
from polar.errors import AgentError, ConfigError
from polar.models import build_agent
from polar.models.encoders import CNNEncoder, DictEncoder


def _batch(space, n):
    return {k: torch.as_tensor(np.stack([s.sample() for _ in range(n)])) for k, s in space.spaces.items()} \
        if isinstance(space, spaces.Dict) else torch.as_tensor(np.stack([space.sample() for _ in range(n)]))


@pytest.mark.parametrize("action_space", [spaces.Discrete(4), spaces.MultiDiscrete([3, 2]),
                                          spaces.Box(-1, 1, shape=(2,), dtype=np.float32)])
def test_builtin_heads_act_on_a_batch_and_agree_with_evaluate_actions(action_space):
    obs_space = spaces.Box(-1, 1, shape=(5,), dtype=np.float32)
    agent = build_agent(BuiltinAgentConfig(), obs_space, action_space)
    obs = _batch(obs_space, 6)
    action, state, info = agent.act(obs)
    assert state is None
    assert tuple(action.shape) == (6, *action_space.shape)
    logp, ent, values = agent.evaluate_actions(obs, action)
    torch.testing.assert_close(logp, info["log_prob"])
    torch.testing.assert_close(values, info["values"])
    assert ent.shape == (6,) and torch.all(ent > 0)
    det, _, _ = agent.act(obs, deterministic=True)
    det2, _, _ = agent.act(obs, deterministic=True)
    assert torch.equal(det, det2)


def test_dict_observations_get_one_encoder_per_key_and_images_a_cnn():
    obs_space = spaces.Dict({"pixels": spaces.Box(0, 255, shape=(12, 12, 3), dtype=np.uint8),
                             "inventory": spaces.Box(0, 1, shape=(3,), dtype=np.float32)})
    agent = build_agent(BuiltinAgentConfig(type="cnn"), obs_space, spaces.Discrete(3))
    enc = agent.pi_encoder
    assert isinstance(enc, DictEncoder) and set(enc.encoders) == {"pixels", "inventory"}
    assert any(isinstance(m, CNNEncoder) for m in enc.encoders["pixels"].modules())
    action, _, info = agent.act(_batch(obs_space, 4))
    assert action.shape == (4,) and info["values"].shape == (4,)


def test_dict_keys_torch_cannot_name_a_module_still_get_their_encoder_and_normalizer():
    # "keys" is a ModuleDict method and "a.b" holds a dot: both crashed the build with a KeyError
    from polar.models.normalization import ObsNormalizer

    obs_space = spaces.Dict({"keys": spaces.Box(0, 1, shape=(2,), dtype=np.float32),
                             "a.b": spaces.Box(-1, 1, shape=(3,), dtype=np.float32),
                             "pos": spaces.Box(-1, 1, shape=(1,), dtype=np.float32)})
    agent = build_agent(BuiltinAgentConfig(), obs_space, spaces.Discrete(3))
    assert "pos" in agent.pi_encoder.encoders  # an ordinary key keeps its name (and checkpoints theirs)
    action, _, info = agent.act(_batch(obs_space, 4))
    assert action.shape == (4,) and info["values"].shape == (4,)
    norm = ObsNormalizer(obs_space, clip=10.0)
    batch = {k: np.full((8, *s.shape), 3.0, np.float32) for k, s in obs_space.spaces.items()}
    norm.update_from_moments({k: (v.mean(0), v.var(0) + 1.0, 8) for k, v in batch.items()})
    out = norm({k: torch.as_tensor(v) for k, v in batch.items()})
    assert set(out) == set(obs_space.spaces) and all(torch.allclose(v, torch.zeros_like(v), atol=1e-3)
                                                     for v in out.values())


def test_lstm_state_is_batched_and_changes_with_input():
    obs_space = spaces.Box(-1, 1, shape=(3,), dtype=np.float32)
    agent = build_agent(BuiltinAgentConfig(type="lstm", lstm_hidden_size=8), obs_space, spaces.Discrete(2))
    h, c = agent.get_initial_state(5)
    assert h.shape == (5, 8) and torch.count_nonzero(h) == 0
    _, (h1, _c1), _ = agent.act(_batch(obs_space, 5), (h, c))
    assert h1.shape == (5, 8) and torch.count_nonzero(h1) > 0
    # sequence replay reproduces step-by-step log-probs, including a reset mid-sequence
    obs = torch.randn(4, 5, 3)
    starts = torch.zeros(4, 5)
    starts[2, 1] = 1
    state = agent.get_initial_state(5)
    logps, acts = [], []
    for t in range(4):
        if starts[t].any():
            init = agent.get_initial_state(5)
            m = starts[t].unsqueeze(-1)
            state = tuple(s * (1 - m) + i * m for s, i in zip(state, init, strict=True))
        a, state, info = agent.act(obs[t], state)
        logps.append(info["log_prob"])
        acts.append(a)
    logp, _, _ = agent.evaluate_actions(obs, torch.stack(acts), agent.get_initial_state(5), starts)
    torch.testing.assert_close(logp, torch.stack(logps))


def test_custom_agent_loads_from_the_config_dir(tmp_path):
    (tmp_path / "my_agents.py").write_text(
        "import torch\nfrom polar import AgentBase\n"
        "class Tiny(AgentBase):\n"
        "    def __init__(self, n_out):\n        super().__init__()\n        self.l = torch.nn.Linear(4, n_out)\n        self.v = torch.nn.Linear(4, 1)\n"
        "    def act(self, observation, internal_state=None, deterministic=False):\n"
        "        logits = self.l(observation)\n"
        "        return logits.argmax(-1), None, {'logits': logits, 'values': self.v(observation).squeeze(-1)}\n"
    )
    cfg = CustomAgentConfig(module="my_agents", class_name="Tiny", kwargs={"n_out": 2})
    agent = build_agent(cfg, spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2), config_dir=tmp_path)
    obs = torch.randn(3, 4)
    logp, _ent, v = agent.evaluate_actions(obs, torch.tensor([0, 1, 1]))  # the default path, from extra_info
    assert logp.shape == (3,) and v.requires_grad
    with pytest.raises(ConfigError, match=r"did you mean: Tiny"):
        build_agent(CustomAgentConfig(module="my_agents", class_name="Tinny"), spaces.Box(-1, 1, (4,)), spaces.Discrete(2), tmp_path)
    with pytest.raises(ConfigError, match="not found"):
        build_agent(CustomAgentConfig(module="no_such_module", class_name="X"), spaces.Box(-1, 1, (4,)), spaces.Discrete(2), tmp_path)
    with pytest.raises(ConfigError, match="n_out"):
        build_agent(CustomAgentConfig(module="my_agents", class_name="Tiny", kwargs={"n_outs": 2}), spaces.Box(-1, 1, (4,)), spaces.Discrete(2), tmp_path)


class WrongShapeAgent(AgentBase):
    def __init__(self):
        super().__init__()
        self.v = torch.nn.Linear(4, 1)

    def act(self, observation, internal_state=None, deterministic=False):
        b = observation.shape[0]
        return torch.zeros(b, 3, dtype=torch.long), None, {"logits": torch.zeros(b, 2), "values": self.v(observation).squeeze(-1)}


class DetachedAgent(WrongShapeAgent):
    def act(self, observation, internal_state=None, deterministic=False):
        b = observation.shape[0]
        return torch.zeros(b, dtype=torch.long), None, {"logits": torch.zeros(b, 2), "values": self.v(observation).squeeze(-1).detach()}


def test_wrong_action_shape_names_the_agent_with_expected_and_actual(tmp_path):
    from polar.models.policy import Policy
    from polar.rollout.runner import EnvRunner

    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    agent = WrongShapeAgent()
    agent.bind_spaces(env.single_observation_space, env.single_action_space)
    runner = EnvRunner(env, Policy(agent), seed=0)
    with pytest.raises(AgentError) as e:
        runner.collect(4)
    msg = str(e.value)
    assert "WrongShapeAgent" in msg and "(3, 3)" in msg and "expected (3,)" in msg
    env.close()


def test_detached_extra_info_is_reported_when_training():
    agent = DetachedAgent()
    agent.bind_spaces(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))
    with pytest.raises(AgentError, match=r"DetachedAgent.*detached"):
        agent.evaluate_actions(torch.randn(2, 4), torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("action_space", [spaces.Discrete(3), spaces.Box(-1, 1, shape=(2,), dtype=np.float32)])
def test_numpy_rollout_path_matches_the_torch_agent(action_space):
    from polar.algorithms.optim import Adam

    obs_space = spaces.Box(-1, 1, shape=(4,), dtype=np.float32)
    agent = build_agent(BuiltinAgentConfig(), obs_space, action_space)
    assert agent.supports_act_numpy()
    obs = np.random.default_rng(0).uniform(-1, 1, (16, 4)).astype(np.float32)
    for _ in range(2):  # also after the optimizer moves the weights into its flat buffer and updates them
        a, logp, v = agent.act_numpy(obs)
        ref_logp, _, ref_v = agent.evaluate_actions(torch.from_numpy(obs), torch.as_tensor(a))
        np.testing.assert_allclose(logp, ref_logp.detach().numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(v, ref_v.detach().numpy(), rtol=1e-4, atol=1e-5)
        det, _, _ = agent.act_numpy(obs, deterministic=True)
        ref_det, _, _ = agent.act(torch.from_numpy(obs), deterministic=True)
        np.testing.assert_allclose(det, ref_det.detach().numpy(), rtol=1e-5, atol=1e-6)
        opt = Adam(agent.parameters(), lr=0.1)
        opt.zero_grad()
        agent.evaluate_actions(torch.from_numpy(obs), torch.as_tensor(a))[2].sum().backward()
        opt.step()
