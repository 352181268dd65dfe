"""``tests.distributed.slow_env:SlowCartPole-v0``: CartPole whose step sleeps, so rollouts are the bottleneck.

Used by the autoscaling test: a learner that waits on fragments is the signal the rule scales up on.
"""

import time

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class SlowCartPole(CartPoleEnv):
    def __init__(self, step_delay_s: float = 0.002, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step_delay_s = step_delay_s

    def step(self, action):
        time.sleep(self.step_delay_s)
        return super().step(action)


if "SlowCartPole-v0" not in gym.registry:
    gym.register("SlowCartPole-v0", entry_point=SlowCartPole, max_episode_steps=500)
