"""Host envs that break at their 5th step, in a module of their own: an env worker that
imports it (to unpickle the factory) imports numpy and gymnasium, not the test module."""

import os
import signal
import time

import gymnasium
import numpy as np


class Broken(RuntimeError):
    pass


class BreakingEnv:
    """Envs that raise (``mode="raise"``), die, hang or return int8 flags (``"flags"``) at
    their 5th step; ``"raise-once"`` raises only where the file ``marker`` is not there yet,
    and makes it."""

    observation_shape = (2,)

    def __init__(self, num_envs, mode="raise", marker=None):
        self.action_space = gymnasium.spaces.Discrete(2)
        self.num_envs, self.mode, self.marker, self.steps = num_envs, mode, marker, 0

    def reset(self, seed):
        return np.zeros((self.num_envs, 2), np.float32)

    def step(self, actions):
        self.steps += 1
        obs = np.zeros((self.num_envs, 2), np.float32)
        zeros = np.zeros(self.num_envs, bool)
        if self.steps == 5:
            if self.mode == "raise-once" and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                raise Broken("the simulator broke")
            if self.mode == "raise":
                raise Broken("the simulator broke")
            if self.mode == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "flags":
                return obs, np.ones(self.num_envs, np.float32), zeros.astype(np.int8), zeros, obs
            if self.mode == "hang":
                time.sleep(3600)
        return obs, np.ones(self.num_envs, np.float32), zeros, zeros, obs


class ShapeShifting(gymnasium.Env):
    """One env of observation shape (2,); every 4th made in a process (env 3 of an actor's
    4) returns observations of shape (3,) from its 5th step."""

    observation_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)
    made = 0

    def __init__(self):
        self.breaks = ShapeShifting.made % 4 == 3
        ShapeShifting.made += 1
        self.steps = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        obs = np.zeros(3 if self.breaks and self.steps >= 5 else 2, np.float32)
        return obs, 1.0, False, False, {}
