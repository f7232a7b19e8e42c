"""The host backends (``gymnasium:``, ``envpool:``, ``host:``): simulators stepped from Python.

Actors step their envs in a Python loop with one jitted policy call per step
(`ppo_async.envs.host_rollout`); evaluation and videos step them in the
shared episode loop (`ppo_async.envs.episodes.run_episodes`) through
`HostEpisodes`. The three prefixes differ only in how an env batch is made
(`ppo_async.envs.host.make_host_env`) and how an id is checked.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ppo_async.envs.backends import VIDEO_EXTRA, EnvBackend, RenderError
from ppo_async.envs.registry import (
    ENVPOOL,
    GYMNASIUM,
    BackendNotInstalledError,
    import_envpool,
    is_envpool_gym_mujoco,
    registered_host_envs,
    split_env_id,
)

class HostBackend(EnvBackend):
    """One host prefix: ``gymnasium``, ``envpool`` or ``host`` (`register_host_env`)."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def id_problem(self, name: str) -> str | None:
        if self.prefix == GYMNASIUM:
            import gymnasium

            module, sep, env_name = name.rpartition(":")
            if sep:  # 'module:Name-v0': the module registers Name-v0 when imported
                try:
                    importlib.import_module(module)
                except ImportError as error:
                    return (f"cannot import {module!r}, the module of {name!r} ({error}); it must "
                            "be importable here (on PYTHONPATH, or in the current directory "
                            "for ppo-async)")
            try:
                gymnasium.spec(env_name)
            except gymnasium.error.Error as error:
                return f"not a registered gymnasium environment ({error})"
            return None
        if self.prefix == ENVPOOL:
            try:
                envpool = import_envpool()
            except BackendNotInstalledError as error:
                return str(error)
            if name not in envpool.list_all_envs():
                return "not an envpool environment (envpool.list_all_envs() lists them)"
            return None
        if name not in registered_host_envs():
            registered = ", ".join(registered_host_envs()) or "none yet"
            return (
                f"no host env registered as {name!r} (registered: {registered}); register "
                "it (ppo_async.register_single_env or register_host_env) in a module and "
                "name that module in env_modules (ppo-async train --env-module MODULE), or "
                "call it before building the config"
            )
        return None

    def actor_program(self, config):
        from ppo_async.envs.host_rollout import make_host_actor_program

        return make_host_actor_program(config)

    def episode_env(self, config, num_envs: int) -> HostEpisodes:
        """envpool Atari games are played with the evaluation settings
        (`ppo_async.envs.registry.ATARI_EVAL_KWARGS`: whole games, unclipped
        score, sticky actions), not the training ones."""
        return HostEpisodes(config.env_id, num_envs, config.env_make_kwargs())

    def player(self, config, seed: int) -> HostPlayer:
        del seed
        env_id, make_kwargs = config.env_id, config.env_make_kwargs()
        if is_envpool_gym_mujoco(env_id):
            # envpool's MuJoCo renderer makes no OpenGL context of its own without a
            # display, and MuJoCo then ends the process; gymnasium's env of the same id
            # is the same model with the same observations, and renders headless.
            env_id, make_kwargs = f"{GYMNASIUM}:{split_env_id(env_id)[1]}", {}
        return HostPlayer(config.env_id, env_id, make_kwargs)


def backend(prefix: str) -> HostBackend:
    return HostBackend(prefix)


class HostEpisodes:
    """``B`` host envs for whole episodes, made with the evaluation settings.

    The batch is made afresh by each `reset` (seeded) and released by `close`,
    so an evaluator holds no simulator between evaluations.
    """

    def __init__(self, env_id: str, num_envs: int, make_kwargs: Mapping[str, Any] | None = None,
                 *, render: bool = False):
        # make_kwargs: the config's env_make_kwargs() (envpool_kwargs, gymnasium_kwargs)
        self.env_id, self.num_envs = env_id, num_envs
        self._make_kwargs = dict(make_kwargs or {}, evaluation=True, render=render)
        self.envs = self._make()
        self.observation_shape = tuple(int(d) for d in self.envs.observation_shape)
        space = self.action_space = self.envs.action_space
        self._continuous = not hasattr(space, "n")
        self._low = np.asarray(getattr(space, "low", -np.inf), np.float32)
        self._high = np.asarray(getattr(space, "high", np.inf), np.float32)

    def _make(self):
        from ppo_async.envs.host import make_host_env

        return make_host_env(self.env_id, self.num_envs, **self._make_kwargs)

    def reset(self, seed: int) -> np.ndarray:
        from ppo_async.envs.host import checked_array

        if self.envs is None:
            self.envs = self._make()
        return checked_array(self.env_id, "reset obs", self.envs.reset(seed),
                             (self.num_envs, *self.observation_shape), np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from ppo_async.envs.host import checked_array

        if self._continuous:
            action = np.clip(action, self._low, self._high)
        step = self.envs.step(action)
        obs = checked_array(self.env_id, "obs", step[0], (self.num_envs, *self.observation_shape),
                            np.float32)
        done = np.asarray(step[2], bool) | np.asarray(step[3], bool)
        return obs, np.asarray(step[1], np.float32), done

    def close(self) -> None:
        from ppo_async.envs.host import close_envs

        if self.envs is not None:
            close_envs(self.envs)
            self.envs = None


class HostPlayer(HostEpisodes):
    """One host env made to render (``render_mode="rgb_array"``); its frames kept as they come."""

    def __init__(self, run_env_id: str, env_id: str, make_kwargs: Mapping[str, Any]):
        from ppo_async.envs.host import SingleEnvFactory
        from ppo_async.envs.registry import HOST, host_env_factory, split_env_id

        self.run_env_id = run_env_id
        backend, name = split_env_id(env_id)
        factory = host_env_factory(name) if backend == HOST else None
        if isinstance(factory, SingleEnvFactory) and not factory.takes_render_mode():
            raise RenderError(
                f"{run_env_id}: this env cannot be rendered: {factory.make_env!r} takes no "
                "render_mode argument (a gymnasium.Env that can be watched takes "
                "render_mode='rgb_array' and then returns an [H, W, 3] uint8 frame from render())")
        try:
            super().__init__(env_id, 1, make_kwargs, render=True)
        except BackendNotInstalledError as error:  # gymnasium's DependencyNotInstalled (pygame)
            raise RenderError(f"{run_env_id}: rendering it needs a package "
                              f"({VIDEO_EXTRA}): {error.__cause__ or error}") from None
        if not callable(getattr(self.envs, "render", None)):
            self.close()
            raise RenderError(
                f"{run_env_id}: this host env cannot be rendered (its batch has no "
                "render() returning [E, H, W, 3] uint8 frames)")

    def snapshot(self) -> np.ndarray:
        try:
            frames = np.asarray(self.envs.render())
        except Exception as error:  # noqa: BLE001 - any renderer's failure, said in one line
            raise RenderError(_render_failure(self.run_env_id, error)) from error
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise RenderError(f"{self.run_env_id}: render() returned shape {frames.shape}, "
                              "expected [E, H, W, 3]")
        return frames[0].astype(np.uint8)

    def draw(self, snapshots: list[np.ndarray]) -> list[np.ndarray]:
        return snapshots


def _render_failure(env_id: str, error: Exception) -> str:
    """One line: what the renderer raised and, without a display, what MuJoCo needs."""
    message = " ".join(str(error).split()) or "(no message)"
    line = f"{env_id}: rendering failed: {type(error).__name__}: {message}"
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        line += (f" (no display; MUJOCO_GL={os.environ.get('MUJOCO_GL', '')!r}: a MuJoCo env "
                 "renders headless with MUJOCO_GL=egl (libEGL) or MUJOCO_GL=osmesa (libOSMesa))")
    return line
