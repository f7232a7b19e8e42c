"""Watching a policy: greedy episodes rendered and written as a GIF or an MP4.

`record_episodes` plays whole episodes of one env with the policy's mode
(argmax, or the Gaussian mean) and returns their frames; `write_video` writes
them. ``ppo-async enjoy RUN`` is the two in a row. What can be rendered:

- gymnax envs that gymnax can draw: the gymnax env the policy was trained on
  is stepped, and each of its states drawn. The classic-control envs are
  drawn by gymnasium's own pygame renderer (one env made once, its state set
  to each gymnax state); the MinAtar games, Catch
  and a few more by gymnax's matplotlib ``Visualizer``, titled with the step;
- ``gymnasium:`` and ``envpool:`` ids, made with ``render_mode="rgb_array"``;
  envpool's Atari games get the evaluation settings
  (`ppo_async.envs.registry.ATARI_EVAL_KWARGS`: whole games, the game's own
  score, sticky actions), and the frames are the game's full-colour screen;
  envpool's copies of gymnasium's MuJoCo tasks (``envpool:Hopper-v4``) are
  played and drawn by gymnasium's env of the same id (envpool's renderer
  cannot run without a display; the run's ``envpool_kwargs`` do not apply);
- ``host:`` envs whose batch has ``render() -> [E, H, W, 3]`` uint8.

Anything else raises `RenderError` before an episode is played, as does a
renderer that fails (a MuJoCo env with no OpenGL it can use). Without a
display (Linux, neither ``DISPLAY`` nor ``WAYLAND_DISPLAY`` set), headless
backends are chosen before anything renders (`headless_backends`): SDL's
dummy video driver for pygame, and EGL (else OSMesa) for MuJoCo; a variable
the user set is left as it is. Auto-reset is
same-step in every backend, so an episode's last state (the one its final
action reached) is not drawn: the next frame is the next episode's first.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import pathlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core.devices import resolve_device
from ppo_async.envs.registry import GYMNASIUM, GYMNAX, is_envpool_gym_mujoco, split_env_id
from ppo_async.networks.actor_critic import is_recurrent

VIDEO_SUFFIXES = (".gif", ".mp4")
VIDEO_EXTRA = "pip install 'ppo-async[video]'"


class RenderError(RuntimeError):
    """An env that cannot be rendered, or a video that cannot be written; the message says why."""


class Recording(NamedTuple):
    """Frames of ``N`` greedy episodes played one after another."""

    frames: np.ndarray  # [F, H, W, 3] uint8
    episode_returns: np.ndarray  # [N] float32, undiscounted, the env's reward
    episode_lengths: np.ndarray  # [N] int32, env steps


def headless_backends(environ: Mapping[str, str], platform: str = sys.platform,
                      find_library: Callable[[str], str | None] = ctypes.util.find_library,
                      ) -> dict[str, str]:
    """The environment variables (name -> value) rendering needs set, given ``environ``.

    A recording never plays sound, so pygame's audio is always the dummy
    driver (its probe prints errors on a machine without sound). On Linux
    without a display, pygame gets SDL's dummy video driver (else SDL prints
    a warning per frame) and MuJoCo a headless OpenGL: EGL if libEGL is
    installed, else OSMesa if libOSMesa is (MuJoCo's default, GLFW, needs a
    display). A variable already in ``environ`` is never overridden.
    """
    chosen = {"SDL_AUDIODRIVER": "dummy"}
    if platform.startswith("linux") and not (environ.get("DISPLAY")
                                             or environ.get("WAYLAND_DISPLAY")):
        chosen["SDL_VIDEODRIVER"] = "dummy"
        if "MUJOCO_GL" not in environ and "PYOPENGL_PLATFORM" not in environ:
            opengl = next((backend for backend, library in (("egl", "EGL"), ("osmesa", "OSMesa"))
                           if find_library(library)), None)
            if opengl is not None:
                # PyOpenGL must agree with MuJoCo, and reads this when first imported.
                chosen.update(MUJOCO_GL=opengl, PYOPENGL_PLATFORM=opengl)
    return {name: value for name, value in chosen.items() if name not in environ}


def use_headless_backends() -> dict[str, str]:
    """Set `headless_backends` in ``os.environ`` (before pygame or MuJoCo start); what it set."""
    chosen = headless_backends(os.environ)
    os.environ.update(chosen)
    return chosen


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
    use_headless_backends()
    backend, name = split_env_id(config.env_id)
    player = _GymnaxPlayer(config, name, seed) if backend == GYMNAX else _HostPlayer(config, seed)
    try:
        return _play(player, params, num_episodes, seed)
    finally:
        player.close()


def _play(player: Any, params: Any, num_episodes: int, seed: int) -> Recording:
    """The episode loop every backend shares: act greedily, step, keep a snapshot per step."""
    from ppo_async.runtime.evaluate import make_host_act

    network = player.network
    act = make_host_act(network, greedy=True,
                        normalization=player.config.normalization_options())
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
    """One gymnax env stepped with the policy; its states drawn by `_ClassicControlCanvas`
    or gymnax's ``Visualizer``."""

    def __init__(self, config: AsyncActorLearnerConfig, name: str, seed: int):
        from ppo_async.envs.gymnax_env import BatchedEnv

        self.config = config
        self.env = BatchedEnv(name, 1)
        self.network = config.make_network(self.env.observation_shape, self.env.action_space)
        self._key = jax.random.key(seed + 1)
        self._step = jax.jit(self.env.step)
        self._carry = self.env.reset(self._key)
        self.state = self._carry.env_state
        self._canvas: _ClassicControlCanvas | None = None
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
        from gymnax.visualize import vis_gym

        del returns
        states = jax.device_get(states)  # one transfer, not one per field per frame
        if self.env.env.name not in vis_gym.SUPPORTED_GYM_ENVS:
            return self._draw_with_matplotlib(states)
        if self._canvas is None:
            try:
                self._canvas = _ClassicControlCanvas(self.env.env.name, self.env.env_params)
            except gymnasium.error.DependencyNotInstalled as error:
                raise RenderError(f"{self.config.env_id}: drawing it needs pygame "
                                  f"({VIDEO_EXTRA}): {error}") from None
        return [self._canvas.draw(state) for state in states]

    def _draw_with_matplotlib(self, states: list[Any]) -> list[np.ndarray]:
        """gymnax's ``Visualizer`` (MinAtar, Catch, mazes, PointRobot), titled with the step."""
        import matplotlib.pyplot as plt
        from gymnax.visualize import Visualizer

        visualizer = Visualizer(self.env.env, self.env.env_params, states)
        try:
            visualizer.init()
            if not hasattr(visualizer, "im"):
                raise RenderError(
                    f"{self.config.env_id}: gymnax has no renderer for this env, so it cannot "
                    "be watched (gymnax draws classic control, MinAtar, Catch, mazes and "
                    "PointRobot)")
            frames = []
            for index in range(len(states)):
                visualizer.update(index)
                visualizer.fig.canvas.draw()
                frames.append(np.asarray(visualizer.fig.canvas.buffer_rgba())[..., :3].copy())
            return frames
        finally:
            plt.close(visualizer.fig)

    def close(self) -> None:
        if self._canvas is not None:
            self._canvas.close()


class _ClassicControlCanvas:
    """gymnasium's pygame renderer of a classic-control env, fed gymnax states.

    gymnax's own adapter makes, resets and closes a gymnasium env for every
    frame (pygame started and stopped each time); this keeps one env and only
    sets its state, with gymnax's mappings of the env's parameters and state
    onto gymnasium's (``experiments/bench_render.py`` times both).
    """

    def __init__(self, name: str, env_params: Any):
        import gymnasium
        from gymnax.visualize import vis_gym

        self._name, self._vis_gym = name, vis_gym
        self._env = gymnasium.make(name, render_mode="rgb_array")
        self._env.reset(seed=0)  # gymnasium renders only after a reset
        vis_gym.set_gym_params(self._env.unwrapped, name, env_params)

    def draw(self, state: Any) -> np.ndarray:
        unwrapped = self._env.unwrapped
        unwrapped.state = self._vis_gym.get_gym_state(state, self._name)
        if self._name == "Pendulum-v1":
            unwrapped.last_u = np.asarray(state.last_u, dtype=np.float64)
        return np.asarray(self._env.render(), np.uint8)

    def close(self) -> None:
        self._env.close()


class _HostPlayer:
    """One host env made to render (``render_mode="rgb_array"``); its frames kept as they come."""

    def __init__(self, config: AsyncActorLearnerConfig, seed: int):
        import gymnasium

        from ppo_async.envs.host import close_envs, make_host_env

        self.config, self._seed, self._close = config, seed, close_envs
        env_id, envpool_kwargs = config.env_id, config.envpool_kwargs
        if is_envpool_gym_mujoco(env_id):
            # envpool's MuJoCo renderer makes no OpenGL context of its own without a
            # display, and MuJoCo then ends the process; gymnasium's env of the same id
            # is the same model with the same observations, and renders headless.
            env_id, envpool_kwargs = f"{GYMNASIUM}:{split_env_id(env_id)[1]}", ()
        try:
            self.envs = make_host_env(env_id, 1, envpool_kwargs=envpool_kwargs,
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
        self.network = config.make_network(self.observation_shape, self.envs.action_space)
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
        try:
            frames = np.asarray(self.envs.render())
        except Exception as error:  # noqa: BLE001 - any renderer's failure, said in one line
            raise RenderError(_render_failure(self.config.env_id, error)) from error
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise RenderError(f"{self.config.env_id}: render() returned shape {frames.shape}, "
                              "expected [E, H, W, 3]")
        return frames[0].astype(np.uint8)

    def draw(self, frames: list[np.ndarray], returns: list[float]) -> list[np.ndarray]:
        del returns
        return frames

    def close(self) -> None:
        self._close(self.envs)


def _render_failure(env_id: str, error: Exception) -> str:
    """One line: what the renderer raised and, without a display, what MuJoCo needs."""
    message = " ".join(str(error).split()) or "(no message)"
    line = f"{env_id}: rendering failed: {type(error).__name__}: {message}"
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        line += (f" (no display; MUJOCO_GL={os.environ.get('MUJOCO_GL', '')!r}: a MuJoCo env "
                 "renders headless with MUJOCO_GL=egl (libEGL) or MUJOCO_GL=osmesa (libOSMesa))")
    return line
