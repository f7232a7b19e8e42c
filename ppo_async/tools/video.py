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

import contextlib
import ctypes.util
import importlib.util
import os
import pathlib
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core.devices import resolve_device
from ppo_async.envs.backends import VIDEO_EXTRA, RenderError
from ppo_async.envs.episodes import EpisodePolicy, run_episodes
from ppo_async.envs.registry import env_backend
from ppo_async.runs.run_dir import TEMP_PREFIX, RunFileError

VIDEO_SUFFIXES = (".gif", ".mp4")
# What a recording may hold in memory before it is refused (an episode that did not end
# filled 24 GiB with frames): about 6,000 frames of 600 x 400 (CartPole's), 42,000 of
# 210 x 160 (Atari's).
MAX_VIDEO_BYTES = 4 * 2**30
__all__ = ["RenderError", "Recording", "check_video_path", "headless_backends",
           "record_episodes", "use_headless_backends", "write_video"]


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


def _progress_bar(shown: bool, desc: str, total: int | None = None) -> Any:
    """A tqdm bar of frames on stderr, drawn only if ``shown`` and stderr is a terminal."""
    from tqdm.std import tqdm

    try:
        terminal = sys.stderr.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed file
        terminal = False
    # Disabled, tqdm takes every call and draws nothing: a log keeps no redraws.
    return tqdm(total=total, desc=desc, unit="frame", disable=not (shown and terminal))


def write_video(frames: np.ndarray, path: str | pathlib.Path, fps: float = 30.0, *,
                progress: bool = False) -> pathlib.Path:
    """Write ``frames`` ``[F, H, W, 3]`` uint8 to ``path`` (.gif via pillow, .mp4 via ffmpeg).

    Written to a temporary file beside ``path`` and renamed, so a failure (a
    `RunFileError` naming ``path``) leaves no part of a video, and any old one whole.
    ``progress``: a bar of the frames written, on a terminal.
    """
    path = check_video_path(path)
    import imageio.v2 as imageio

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # The suffix picks imageio's writer.
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{path.stem}.",
                                    suffix=path.suffix)
        os.close(fd)
    except OSError as error:
        raise RunFileError.of(path, error) from error
    bar = _progress_bar(progress, f"writing {path.name}", len(frames))
    try:
        if path.suffix.lower() == ".gif":
            from PIL import Image

            def rest() -> Any:  # one at a time: Pillow converts each as it takes it
                for frame in frames[1:]:
                    yield Image.fromarray(frame)
                    bar.update()
                bar.update()  # the last one is converted by now

            # What imageio.mimwrite does (the same bytes), with a bar; the duration of
            # one frame is in milliseconds.
            Image.fromarray(frames[0]).save(temp, format="GIF", save_all=len(frames) > 1,
                                            append_images=rest(), duration=1000.0 / fps,
                                            loop=0)
        else:
            with warnings.catch_warnings():
                # imageio-ffmpeg runs ffmpeg in a subprocess; JAX warns on every fork,
                # harmless here: the child only execs ffmpeg.
                warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
                # H.264 wants sizes divisible by 2; macro_block_size=2 pads at most a pixel.
                with imageio.get_writer(temp, fps=fps, macro_block_size=2) as writer:
                    for frame in frames:
                        writer.append_data(frame)
                        bar.update()
        os.replace(temp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(error, OSError):
            raise RunFileError.of(path, error) from error
        raise
    finally:
        bar.close()
    return path


def record_episodes(config: AsyncActorLearnerConfig, params: Any, num_episodes: int = 3,
                    seed: int = 0, *, progress: bool = False) -> Recording:
    """Play ``num_episodes`` greedy episodes of ``config.env_id`` under ``params`` and render them.

    The env's backend gives the player (`ppo_async.envs.backends.EnvBackend.player`);
    the episodes are played in the loop evaluation uses
    (`ppo_async.envs.episodes.run_episodes`), one env, a snapshot per step.
    ``progress``: bars of the frames played and drawn, on a terminal.
    Raises `RenderError` (before playing) for an env that cannot be rendered.
    """
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes={num_episodes!r}: must be an integer >= 1")
    use_headless_backends()
    player = env_backend(config.env_id).player(config, seed)
    try:
        network = config.make_network(player.observation_shape, player.action_space)
        policy = EpisodePolicy(network, greedy=True, normalization=config.normalization_options())
        params = jax.device_put(params, resolve_device(config.actor_device))
        snapshots: list[Any] = []
        held = 0  # bytes of the snapshots so far (a frame, or a gymnax state's arrays)

        def observe() -> None:
            nonlocal held
            snapshot = player.snapshot()
            held += sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree.leaves(snapshot))
            if held > MAX_VIDEO_BYTES:
                raise RenderError(
                    f"{config.env_id}: the {num_episodes} episode(s) filled "
                    f"{MAX_VIDEO_BYTES / 2**30:.3g} GiB with {len(snapshots):,} frames "
                    "without ending; watch fewer episodes (--num-episodes 1), or give the env "
                    "a time limit")
            snapshots.append(snapshot)
            playing.update()

        with _progress_bar(progress, f"playing {num_episodes} episode(s)") as playing:
            returns, lengths, _ = run_episodes(player, policy, params, seed,
                                               np.array([num_episodes], np.int32),
                                               observe=observe)
        # The player draws them all in one call: the bar says what is under way, and ends.
        with _progress_bar(progress, "drawing", len(snapshots)) as drawing:
            frames = np.stack(player.draw(snapshots))
            drawing.update(len(snapshots))
    finally:
        player.close()
    return Recording(frames, returns, lengths)
