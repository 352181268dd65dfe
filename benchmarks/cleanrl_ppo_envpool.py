"""CleanRL-style PPO on EnvPool CartPole-v1: the reference point for polar's ``harness: {type: envpool}``.

One file, one loop, in the shape of CleanRL's ``ppo_envpool.py`` / ``ppo_atari_envpool.py`` (written here,
not copied): torch storage tensors, ``get_action_and_value`` per step, GAE, minibatch epochs. The
hyperparameters are RL Zoo's CartPole ones that ``benchmarks/ppo_vs_sb3.py`` uses (8 envs, 32 steps,
batch 256, 20 epochs, gamma 0.98, lambda 0.8, ent 0, lr linear from 1e-3, clip linear from 0.2), with
SB3's network (separate 64-64 tanh actor and critic). Like CleanRL's EnvPool scripts, it keeps EnvPool's
NEXT_STEP autoreset as it is: the step after an episode ends is recorded as a transition (reward 0,
its action ignored) and a truncation is treated as a termination (no bootstrap); polar does neither.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cleanrl_ppo_envpool.py --seed 0      # train to 475
    ppo_vs_sb3.py imports rollout_throughput for its rollout table.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from dataclasses import dataclass

import envpool
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical


@dataclass
class Args:
    seed: int = 0
    num_envs: int = 8
    num_steps: int = 32
    total_timesteps: int = 100_000
    learning_rate: float = 1e-3
    gamma: float = 0.98
    gae_lambda: float = 0.8
    update_epochs: int = 20
    minibatch_size: int = 256
    clip_coef: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target: float = 475.0


def layer(i: int, o: int, std: float = 2**0.5) -> nn.Linear:
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, 0.0)
    return lin


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
        self.actor = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, n_actions, 0.01))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        dist = Categorical(logits=self.actor(x))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(x)


def make_envs(args: Args):
    return envpool.make_gymnasium("CartPole-v1", num_envs=args.num_envs, batch_size=args.num_envs, seed=args.seed)


def rollout(agent: Agent, envs, args: Args, next_obs: torch.Tensor, next_done: torch.Tensor, storage: dict,
            ep_ret: np.ndarray, returns: deque) -> tuple[torch.Tensor, torch.Tensor]:
    """``args.num_steps`` steps into ``storage``, CleanRL's rollout loop."""
    for step in range(args.num_steps):
        storage["obs"][step] = next_obs
        storage["dones"][step] = next_done
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(next_obs)
        storage["values"][step] = value.flatten()
        storage["actions"][step] = action
        storage["logprobs"][step] = logprob
        obs, reward, term, trunc, _ = envs.step(action.numpy())
        done = np.logical_or(term, trunc)
        storage["rewards"][step] = torch.from_numpy(reward)
        next_obs, next_done = torch.from_numpy(obs), torch.from_numpy(done.astype(np.float32))
        ep_ret += reward
        for i in np.flatnonzero(done):
            returns.append(float(ep_ret[i]))
            ep_ret[i] = 0.0
    return next_obs, next_done


def new_storage(args: Args, obs_dim: int) -> dict:
    shape = (args.num_steps, args.num_envs)
    return {"obs": torch.zeros((*shape, obs_dim)), "actions": torch.zeros(shape, dtype=torch.long),
            "logprobs": torch.zeros(shape), "rewards": torch.zeros(shape), "dones": torch.zeros(shape),
            "values": torch.zeros(shape)}


def rollout_throughput(num_envs: int, steps: int, num_steps: int = 250) -> tuple[float, float]:
    """Wall and CPU seconds for ``steps`` vector steps of an untrained agent through ``rollout`` (after a
    warm-up one)."""
    torch.set_num_threads(1)
    args = Args(num_envs=num_envs, num_steps=num_steps)
    envs = make_envs(args)
    obs_dim = envs.single_observation_space.shape[0]
    agent = Agent(obs_dim, envs.single_action_space.n)
    storage, ep_ret, returns = new_storage(args, obs_dim), np.zeros(num_envs), deque(maxlen=100)
    next_obs, next_done = torch.from_numpy(envs.reset()[0]), torch.zeros(num_envs)
    next_obs, next_done = rollout(agent, envs, args, next_obs, next_done, storage, ep_ret, returns)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps // num_steps):
        next_obs, next_done = rollout(agent, envs, args, next_obs, next_done, storage, ep_ret, returns)
    return time.perf_counter() - t, time.process_time() - c


def train(args: Args) -> dict:
    t0 = time.time()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    envs = make_envs(args)
    obs_dim = envs.single_observation_space.shape[0]
    agent = Agent(obs_dim, envs.single_action_space.n)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size
    storage, ep_ret, returns = new_storage(args, obs_dim), np.zeros(args.num_envs), deque(maxlen=100)
    next_obs, next_done = torch.from_numpy(envs.reset()[0]), torch.zeros(args.num_envs)
    global_step = 0
    for iteration in range(num_iterations):
        frac = 1.0 - iteration / num_iterations
        optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        clip = frac * args.clip_coef
        next_obs, next_done = rollout(agent, envs, args, next_obs, next_done, storage, ep_ret, returns)
        global_step += batch_size
        if len(returns) == 100 and np.mean(returns) >= args.target:
            return {"seed": args.seed, "steps": global_step, "wall_s": time.time() - t0, "reached": True}
        with torch.no_grad():  # GAE, done flags as CleanRL keeps them (NEXT_STEP: dones[t] = episode ended before t)
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(storage["rewards"])
            lastgaelam = torch.zeros(args.num_envs)
            for t in reversed(range(args.num_steps)):
                nonterminal = 1.0 - (next_done if t == args.num_steps - 1 else storage["dones"][t + 1])
                nextvalues = next_value if t == args.num_steps - 1 else storage["values"][t + 1]
                delta = storage["rewards"][t] + args.gamma * nextvalues * nonterminal - storage["values"][t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns_t = advantages + storage["values"]
        b_obs = storage["obs"].reshape(-1, obs_dim)
        b_actions, b_logprobs = storage["actions"].reshape(-1), storage["logprobs"].reshape(-1)
        b_adv, b_ret = advantages.reshape(-1), returns_t.reshape(-1)
        for _ in range(args.update_epochs):
            perm = torch.randperm(batch_size)
            for start in range(0, batch_size, args.minibatch_size):
                mb = perm[start:start + args.minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                adv = b_adv[mb]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                v_loss = 0.5 * ((newvalue.view(-1) - b_ret[mb]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
    return {"seed": args.seed, "steps": global_step, "wall_s": time.time() - t0, "reached": False}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--total-timesteps", type=int, default=Args.total_timesteps)
    a = ap.parse_args()
    print(json.dumps(train(Args(seed=a.seed, total_timesteps=a.total_timesteps))))
