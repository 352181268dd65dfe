"""The deployable policy graph: raw observations in, env-ready actions out.

``PolicyGraph`` wraps a trained ``Policy`` (agent + observation normaliser) into one module with flat tensor
inputs and outputs, so that an ONNX or TorchScript trace of it needs nothing of polar to run:

- inputs: ``obs`` (or ``obs.<key>`` per Dict key, sorted), the recurrent state ``state.<i>``, and ``noise``;
- outputs: ``action`` (clipped to a Box, or squashed and scaled for SAC), the distribution parameters
  (``logits`` / ``mean`` + ``log_std`` / ``q_values``), ``value``, and ``next_state.<i>``.

Sampling is in the graph as a function of ``noise``: zeros give the deterministic action, standard normal
noise a Gaussian sample, Gumbel noise a categorical sample (Gumbel-max). So the exported graph has no random
op, and a sampled action can be checked against the eager policy with the same noise. DQN's epsilon-greedy
exploration is not part of the graph (``epsilon`` is in the manifest; the server applies it).

Only the agent's public ``act`` is used, except for SAC, whose pre-squash Gaussian is read through the
actor's ``_dist_params`` (``act`` gives only the squashed action).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.distributions import CategoricalDist, GaussianDist, MultiCategoricalDist, action_param_size
from polar.errors import DeployError

if TYPE_CHECKING:
    from polar.agents import AgentBase, State
    from polar.models.policy import Policy

# numpy dtype name -> Open Inference Protocol datatype
OIP_DATATYPES = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
                 "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
                 "float32": "FP32", "float64": "FP64"}
NUMPY_DTYPES = {v: k for k, v in OIP_DATATYPES.items()}


@dataclass
class TensorSpec:
    """One graph input or output: its name, numpy dtype name and shape (-1 = the batch dimension)."""

    name: str
    dtype: str
    shape: list[int]

    def oip(self) -> dict:
        return {"name": self.name, "datatype": OIP_DATATYPES[self.dtype], "shape": list(self.shape)}


@dataclass
class GraphSpec:
    """What a ``PolicyGraph`` takes and gives; written into the manifest, read back by the server."""

    kind: str  # categorical | multi_categorical | gaussian | squashed_gaussian | q_greedy
    obs_keys: list[str] | None  # Dict observation keys, in input order; None for a single observation
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    state: list[dict[str, Any]] = field(default_factory=list)  # [{"input": "state.0", "output": "next_state.0", "shape": [...]}]
    noise: dict | None = None  # {"input": "noise", "distribution": "normal" | "gumbel", "width": K}
    epsilon: float = 0.0  # DQN: the exploration rate sampled actions use (applied outside the graph)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> GraphSpec:
        d = dict(d)
        d["inputs"] = [TensorSpec(**t) for t in d["inputs"]]
        d["outputs"] = [TensorSpec(**t) for t in d["outputs"]]
        return cls(**d)

    @property
    def recurrent(self) -> bool:
        return bool(self.state)

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def require(self, name: str) -> TensorSpec:
        t = self.input(name)
        if t is None:
            raise KeyError(f"the graph has no input {name!r}")
        return t


def head_kind(agent: AgentBase) -> str:
    """Which action head ``agent`` has, as the graph post-processes it; a ``DeployError`` names the agent when
    none fits."""
    from polar.models.off_policy import QNetworkAgent, SquashedGaussianAgent

    if isinstance(agent, SquashedGaussianAgent):
        return "squashed_gaussian"
    if isinstance(agent, QNetworkAgent):
        return "q_greedy"
    try:
        dist = agent.action_dist
    except Exception as e:
        raise DeployError(f"cannot export {type(agent).__name__}: its action space {agent.action_space} has no "
                          f"action distribution ({e})") from None
    if isinstance(dist, CategoricalDist):
        return "categorical"
    if isinstance(dist, MultiCategoricalDist):
        return "multi_categorical"
    if isinstance(dist, GaussianDist):
        return "gaussian"
    raise DeployError(f"cannot export {type(agent).__name__}: {type(dist).__name__} actions are not supported "
                      "(Discrete, MultiDiscrete and Box are)")


def obs_spec(space: gym.Space, name: str) -> TensorSpec:
    """The input an observation space becomes: floats as float32, uint8 images as uint8, integers as int64."""
    if isinstance(space, gym.spaces.Discrete):
        return TensorSpec(name, "int64", [-1])
    if isinstance(space, gym.spaces.MultiDiscrete):
        return TensorSpec(name, "int64", [-1, *space.shape])
    if isinstance(space, gym.spaces.MultiBinary):
        return TensorSpec(name, "int64", [-1, *np.atleast_1d(space.shape)])
    if isinstance(space, gym.spaces.Box):
        if np.issubdtype(space.dtype, np.floating):
            dtype = "float32"
        elif space.dtype == np.uint8:
            dtype = "uint8"
        else:
            dtype = "int64"
        return TensorSpec(name, dtype, [-1, *space.shape])
    raise DeployError(f"observation space {space} cannot be exported; Box, Discrete, MultiDiscrete, MultiBinary "
                      "and a Dict of them can")


def _state_tensors(state: State, owner: str = "the agent") -> list[torch.Tensor]:
    if state is None:
        return []
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, (tuple, list)) and all(isinstance(s, torch.Tensor) for s in state):
        return list(state)
    raise DeployError(f"cannot export {owner}: its recurrent state is a {type(state).__name__}, and an exported graph "
                      "takes the state as positional tensors; return None, a tensor, or a tuple of tensors from "
                      "get_initial_state()")


class PolicyGraph(nn.Module):
    """``policy`` as one traceable function of flat tensors (see the module docstring)."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.policy = policy
        agent = policy.agent
        self.kind = head_kind(agent)
        obs_space, act_space = agent.observation_space, agent.action_space
        if obs_space is None or act_space is None:
            raise DeployError(f"cannot export {type(agent).__name__}: its spaces are not bound (bind_spaces())")
        self.observation_space: gym.Space = obs_space
        self.action_shape: tuple[int, ...] = tuple(act_space.shape or ())
        if isinstance(obs_space, gym.spaces.Dict):
            self.obs_keys: list[str] | None = sorted(obs_space.spaces)
            inputs = [obs_spec(obs_space.spaces[k], f"obs.{k}") for k in self.obs_keys]
        else:
            self.obs_keys = None
            inputs = [obs_spec(obs_space, "obs")]
        initial = agent.get_initial_state(1)
        self.state_is_tensor = isinstance(initial, torch.Tensor)
        init = _state_tensors(initial, type(agent).__name__)
        self.n_state = len(init)
        state: list[dict[str, Any]] = [{"input": f"state.{i}", "output": f"next_state.{i}",
                                        "shape": [-1, *t.shape[1:]]} for i, t in enumerate(init)]
        inputs += [TensorSpec(s["input"], "float32", s["shape"]) for s in state]
        self.width = action_param_size(act_space)
        noise = None
        if self.kind != "q_greedy":
            dist = "gumbel" if self.kind in ("categorical", "multi_categorical") else "normal"
            noise = {"input": "noise", "distribution": dist, "width": self.width}
            inputs.append(TensorSpec("noise", "float32", [-1, self.width]))
        if self.kind in ("gaussian", "squashed_gaussian"):
            low = torch.as_tensor(np.asarray(act_space.low, np.float32))
            high = torch.as_tensor(np.asarray(act_space.high, np.float32))
            self.register_buffer("act_low", low, persistent=False)
            self.register_buffer("act_high", high, persistent=False)
            outputs = [TensorSpec("action", "float32", [-1, *act_space.shape]),
                       TensorSpec("mean", "float32", [-1, self.width]), TensorSpec("log_std", "float32", [-1, self.width])]
        elif self.kind == "q_greedy":
            outputs = [TensorSpec("action", "int64", [-1]), TensorSpec("q_values", "float32", [-1, self.width])]
        else:
            outputs = [TensorSpec("action", "int64", [-1, *act_space.shape]), TensorSpec("logits", "float32", [-1, self.width])]
        self.nvec = [int(n) for n in np.asarray(act_space.nvec).reshape(-1)] if self.kind == "multi_categorical" else []
        self.has_value = self.kind != "squashed_gaussian" and self._probe_has_value()
        if self.has_value:
            outputs.append(TensorSpec("value", "float32", [-1]))
        outputs += [TensorSpec(s["output"], "float32", s["shape"]) for s in state]
        epsilon = float(getattr(agent, "epsilon", 0.0)) if self.kind == "q_greedy" else 0.0
        self.spec = GraphSpec(self.kind, self.obs_keys, inputs, outputs, state, noise, epsilon)

    def _probe_has_value(self) -> bool:
        with torch.inference_mode():
            _, _, info = self.policy.act(self._obs(self.example_inputs(1)), self._state(self.example_inputs(1)), True)
        return isinstance(info, dict) and ("values" in info or "value" in info)

    def example_inputs(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        """Zeros of every input for a batch (the tracing example)."""
        space = self.observation_space
        out: list[torch.Tensor] = []
        subs = [space.spaces[k] for k in self.obs_keys] if self.obs_keys is not None else [space]
        for sub in subs:
            sample = np.asarray(sub.sample())
            out.append(torch.as_tensor(np.stack([sample] * batch)).to(_torch_dtype(obs_spec(sub, "x").dtype)))
        for t in _state_tensors(self.policy.agent.get_initial_state(batch)):
            out.append(t.float())
        if self.kind != "q_greedy":
            out.append(torch.zeros(batch, self.width))
        return tuple(out)

    def _obs(self, xs: tuple[torch.Tensor, ...]) -> torch.Tensor | dict[str, torch.Tensor]:
        if self.obs_keys is None:
            return xs[0]
        return {k: xs[i] for i, k in enumerate(self.obs_keys)}

    def _state(self, xs: tuple[torch.Tensor, ...]) -> State:
        if not self.n_state:
            return None
        first = 1 if self.obs_keys is None else len(self.obs_keys)
        st = xs[first:first + self.n_state]
        return st[0] if self.state_is_tensor else tuple(st)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        obs, state = self._obs(xs), self._state(xs)
        noise = xs[-1] if self.kind != "q_greedy" else None
        agent = self.policy.agent
        if self.kind == "squashed_gaussian":
            mu, log_std = agent._dist_params(self.policy.normalize(obs))
            u = mu + log_std.exp() * noise
            action = torch.tanh(u) * agent.action_scale + agent.action_bias
            action = action.reshape(-1, *agent.action_shape)
            return action, mu, log_std
        _, new_state, info = self.policy.act(obs, state, True)
        outs: list[torch.Tensor]
        if self.kind == "q_greedy":
            q = info["q_values"]
            outs = [q.argmax(-1), q]
        elif self.kind == "gaussian":
            mean = info["mean"]
            log_std = info["log_std"].expand_as(mean)
            action = (mean + log_std.exp() * noise).reshape(-1, *self.action_shape)
            action = torch.maximum(torch.minimum(action, self.act_high), self.act_low)
            outs = [action, mean, log_std]
        elif self.kind == "categorical":
            logits = info["logits"]
            outs = [(logits + noise).argmax(-1), logits]
        else:
            logits = info["logits"]
            z = logits + noise
            parts = torch.split(z, self.nvec, dim=-1)
            outs = [torch.stack([p.argmax(-1) for p in parts], -1), logits]
        if self.has_value:
            v = info["values"] if "values" in info else info["value"]
            outs.append(v.reshape(v.shape[0], -1)[:, 0] if v.dim() > 1 else v)
        outs += [t.float() for t in _state_tensors(new_state)]
        return tuple(outs)


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)
