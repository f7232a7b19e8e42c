"""A host env that breaks at its 5th step, in a module of its own: an env worker that
imports it (to unpickle the factory) imports numpy and gymnasium, not the test module."""

import os
import signal
import time

import numpy as np


class Broken(RuntimeError):
    pass


class BreakingEnv:
    """Two envs that raise (``mode="raise"``), die or hang at their 5th step."""

    observation_shape = (2,)

    def __init__(self, num_envs, mode="raise"):
        import gymnasium

        self.action_space = gymnasium.spaces.Discrete(2)
        self.num_envs, self.mode, self.steps = num_envs, mode, 0

    def reset(self, seed):
        return np.zeros((self.num_envs, 2), np.float32)

    def step(self, actions):
        self.steps += 1
        if self.steps == 5:
            if self.mode == "raise":
                raise Broken("the simulator broke")
            if self.mode == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)
        obs = np.zeros((self.num_envs, 2), np.float32)
        zeros = np.zeros(self.num_envs, bool)
        return obs, np.ones(self.num_envs, np.float32), zeros, zeros, obs
