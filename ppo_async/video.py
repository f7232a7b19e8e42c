"""Watching a policy: greedy episodes rendered and written as a GIF or an MP4.

`record_episodes` plays whole episodes of one env with the policy's mode
(argmax, or the Gaussian mean) and returns their frames; `write_video` writes
them. ``ppo-async enjoy RUN`` is the two in a row. What can be rendered:

- gymnax envs that gymnax's own ``Visualizer`` draws (the classic-control
  envs, through gymnasium's pygame renderer; the MinAtar games, Catch and a
  few more, through matplotlib): the gymnax env the policy was trained on is
  stepped, and each of its states is drawn, titled with the return so far;
- ``gymnasium:`` and ``envpool:`` ids, made with ``render_mode="rgb_array"``;
  envpool's Atari games get the evaluation settings
  (`ppo_async.env_registry.ATARI_EVAL_KWARGS`: whole games, the game's own
  score, sticky actions), and the frames are the game's full-colour screen;
- ``host:`` envs whose batch has ``render() -> [E, H, W, 3]`` uint8.

Anything else raises `RenderError` before an episode is played. Auto-reset is
same-step in every backend, so an episode's last state (the one its final
action reached) is not drawn: the next frame is the next episode's first.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig, make_config_network, resolve_device
from ppo_async.env_registry import GYMNAX, split_env_id
from ppo_async.networks import is_recurrent

VIDEO_SUFFIXES = (".gif", ".mp4")
VIDEO_EXTRA = "pip install 'ppo-async[video]'"


class RenderError(RuntimeError):
    """An env that cannot be rendered, or a video that cannot be written; the message says why."""


class Recording(NamedTuple):
    """Frames of ``N`` greedy episodes played one after another."""

    frames: np.ndarray  # [F, H, W, 3] uint8
    episode_returns: np.ndarray  # [N] float32, undiscounted, the env's reward
    episode_lengths: np.ndarray  # [N] int32, env steps


def check_video_path(path: str | pathlib.Path) -> pathlib.Path:
    """``path`` if a video can be written there (.gif: imageio; .mp4: imageio-ffmpeg too), else `RenderError`."""
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
        raise RenderError(
            f"cannot write {str(path)!r}: unsupported video format {suffix or '(no suffix)'!r}; "
            "name it .gif or .mp4"
        )
    needed = ["imageio"] + (["imageio_ffmpeg"] if suffix == ".mp4" else [])
    for module in needed:
        if importlib.util.find_spec(module) is None:
            raise RenderError(f"writing {suffix} needs {module.replace('_', '-')}: {VIDEO_EXTRA}")
    return path


def write_video(frames: np.ndarray, path: str | pathlib.Path, fps: float = 30.0) -> pathlib.Path:
    """Write ``frames`` ``[F, H, W, 3]`` uint8 to ``path`` (.gif via pillow, .mp4 via ffmpeg)."""
    path = check_video_path(path)
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        # Pillow's GIF writer takes the duration of one frame in milliseconds.
        imageio.mimwrite(path, list(frames), duration=1000.0 / fps, loop=0)
    else:
        with warnings.catch_warnings():
            # imageio-ffmpeg runs ffmpeg in a subprocess; JAX warns on every fork,
            # harmless here: the child only execs ffmpeg.
            warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
            # H.264 wants sizes divisible by 2; macro_block_size=2 pads at most a pixel.
            imageio.mimwrite(path, list(frames), fps=fps, macro_block_size=2)
    return path


def record_episodes(config: AsyncActorLearnerConfig, params: Any, num_episodes: int = 3,
                    seed: int = 0) -> Recording:
    """Play ``num_episodes`` greedy episodes of ``config.env_id`` under ``params`` and render them.

    Raises `RenderError` (before playing) for an env that cannot be rendered.
    """
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes={num_episodes!r}: must be an integer >= 1")
    backend, name = split_env_id(config.env_id)
    player = _GymnaxPlayer(config, name, seed) if backend == GYMNAX else _HostPlayer(config, seed)
    try:
        return _play(player, params, num_episodes, seed)
    finally:
        player.close()


def _play(player: Any, params: Any, num_episodes: int, seed: int) -> Recording:
    """The episode loop every backend shares: act greedily, step, keep a snapshot per step."""
    from ppo_async.evaluate import make_host_act
    from ppo_async.normalization import NormalizationOptions

    network = player.network
    act = make_host_act(network, greedy=True,
                        normalization=NormalizationOptions.from_config(player.config))
    params = jax.device_put(params, resolve_device(player.config.actor_device))
    key = jax.random.key(seed)
    hidden = network.zero_hidden(1) if is_recurrent(network) else None
    obs = player.reset()
    snapshots, returns, lengths = [player.snapshot()], [], []
    episode_return, episode_length = 0.0, 0
    while len(returns) < num_episodes:
        key, action, hidden = act(params, obs, key, hidden, np.array([episode_length == 0]))
        obs, reward, done = player.step(np.asarray(action))
        episode_return += reward
        episode_length += 1
        if done:
            returns.append(episode_return)
            lengths.append(episode_length)
            episode_return, episode_length = 0.0, 0
            if len(returns) == num_episodes:
                break
        snapshots.append(player.snapshot())
    frames = np.stack(player.draw(snapshots, returns))
    return Recording(frames, np.asarray(returns, np.float32), np.asarray(lengths, np.int32))


class _GymnaxPlayer:
    """One gymnax env stepped with the policy; its states drawn by gymnax's ``Visualizer``."""

    def __init__(self, config: AsyncActorLearnerConfig, name: str, seed: int):
        from ppo_async.envs import BatchedEnv

        self.config = config
        self.env = BatchedEnv(name, 1)
        self.network = make_config_network(config, self.env.observation_shape,
                                           self.env.action_space)
        self._key = jax.random.key(seed + 1)
        self._step = jax.jit(self.env.step)
        self._carry = self.env.reset(self._key)
        self.state = self._carry.env_state
        self.draw([self.snapshot()], [])  # refuses an env gymnax cannot draw, before playing

    def reset(self) -> np.ndarray:
        return np.asarray(self._carry.obs)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        self._key, step_key = jax.random.split(self._key)
        obs, self.state, reward, terminated, truncated, _ = self._step(
            step_key, self.state, action)
        return np.asarray(obs), float(reward[0]), bool(terminated[0] | truncated[0])

    def snapshot(self) -> Any:
        return jax.tree.map(lambda leaf: leaf[0], self.state)

    def draw(self, states: list[Any], returns: list[float]) -> list[np.ndarray]:
        import gymnasium
        import matplotlib.pyplot as plt
        from gymnax.visualize import Visualizer

        del returns  # the Visualizer titles each frame with its step number
        # gymnasium's classic-control renderer calls pygame.init(), whose audio
        # probe prints ALSA errors once per frame on a machine without sound.
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        visualizer = Visualizer(self.env.env, self.env.env_params, states)
        try:
            try:
                visualizer.init()
            except gymnasium.error.DependencyNotInstalled as error:
                raise RenderError(f"{self.config.env_id}: drawing it needs pygame "
                                  f"({VIDEO_EXTRA}): {error}") from None
            if not hasattr(visualizer, "im"):
                raise RenderError(
                    f"{self.config.env_id}: gymnax has no renderer for this env, so it cannot "
                    "be watched (gymnax's Visualizer draws classic control, MinAtar, Catch, "
                    "mazes and PointRobot)")
            frames = []
            for index in range(len(states)):
                visualizer.update(index)
                visualizer.fig.canvas.draw()
                frames.append(np.asarray(visualizer.fig.canvas.buffer_rgba())[..., :3].copy())
            return frames
        finally:
            plt.close(visualizer.fig)

    def close(self) -> None:
        pass


class _HostPlayer:
    """One host env made to render (``render_mode="rgb_array"``); its frames kept as they come."""

    def __init__(self, config: AsyncActorLearnerConfig, seed: int):
        import gymnasium

        from ppo_async.host_envs import _close_envs, make_host_env

        self.config, self._seed, self._close = config, seed, _close_envs
        try:
            self.envs = make_host_env(config.env_id, 1, envpool_kwargs=config.envpool_kwargs,
                                      evaluation=True, render=True)
        except gymnasium.error.DependencyNotInstalled as error:
            raise RenderError(f"{config.env_id}: rendering it needs a package "
                              f"({VIDEO_EXTRA}): {error}") from None
        if not callable(getattr(self.envs, "render", None)):
            self.close()
            raise RenderError(
                f"{config.env_id}: this host env cannot be rendered (its batch has no "
                "render() returning [E, H, W, 3] uint8 frames)")
        self.observation_shape = tuple(int(d) for d in self.envs.observation_shape)
        self.network = make_config_network(config, self.observation_shape,
                                           self.envs.action_space)
        space = self.envs.action_space
        self._low = np.asarray(getattr(space, "low", -np.inf), np.float32)
        self._high = np.asarray(getattr(space, "high", np.inf), np.float32)
        self._continuous = not hasattr(space, "n")

    def reset(self) -> np.ndarray:
        return np.asarray(self.envs.reset(self._seed), np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        if self._continuous:
            action = np.clip(action, self._low, self._high)
        obs, reward, terminated, truncated, _ = self.envs.step(action)
        done = bool(np.asarray(terminated)[0] or np.asarray(truncated)[0])
        return np.asarray(obs, np.float32), float(np.asarray(reward)[0]), done

    def snapshot(self) -> np.ndarray:
        frames = np.asarray(self.envs.render())
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise RenderError(f"{self.config.env_id}: render() returned shape {frames.shape}, "
                              "expected [E, H, W, 3]")
        return frames[0].astype(np.uint8)

    def draw(self, frames: list[np.ndarray], returns: list[float]) -> list[np.ndarray]:
        del returns
        return frames

    def close(self) -> None:
        self._close(self.envs)
