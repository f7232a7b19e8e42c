"""``ppo-async enjoy`` (`ppo_async.tools.video`): greedy episodes written as a video, or a clear refusal."""

import io
import json
import os
import pathlib
import subprocess
import sys

import flax.serialization
import gymnasium
import numpy as np
import pytest

from ppo_async import AsyncActorLearnerConfig
from ppo_async.envs.host import register_single_env
from ppo_async.envs.registry import register_host_env
from ppo_async.tools.cli import main

imageio = pytest.importorskip("imageio.v3")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    run_root = tmp_path_factory.mktemp("runs")
    main(["train", "--num-actors", "1", "--envs-per-actor", "2", "--num-steps", "8",
          "--num-epochs", "1", "--num-minibatches", "1", "--total-env-steps", "32",
          "--no-progress", "--run-root", str(run_root)])
    (run_dir,) = run_root.iterdir()
    return run_dir


def test_enjoy_writes_a_gif_of_greedy_cartpole_episodes(cartpole_run, tmp_path, capsys):
    pytest.importorskip("pygame")  # gymnasium's classic-control renderer
    out = tmp_path / "video.gif"
    main(["enjoy", str(cartpole_run), "--num-episodes", "2", "--out", str(out)])  # as eval's
    assert "wrote" in capsys.readouterr().out
    frames = imageio.imread(out, index=None)  # every frame: [F, H, W, 3]
    assert out.stat().st_size > 1000
    assert frames.ndim == 4 and frames.shape[0] > 1 and frames.shape[-1] in (3, 4)
    assert frames.std() > 0  # something was drawn


def test_enjoy_writes_an_mp4(cartpole_run, tmp_path):
    pytest.importorskip("pygame")
    pytest.importorskip("imageio_ffmpeg")
    from ppo_async.resume import load_run_config, load_run_params
    from ppo_async.tools.video import record_episodes, write_video

    config = load_run_config(cartpole_run)
    recording = record_episodes(config, load_run_params(cartpole_run, config), num_episodes=1)
    # One frame per step of the episode; the state its last action reached is not drawn.
    assert len(recording.frames) == recording.episode_lengths[0] > 1
    assert recording.frames.dtype == np.uint8 and recording.frames.shape[-1] == 3
    out = write_video(recording.frames, tmp_path / "video.mp4", fps=20)
    assert out.stat().st_size > 1000


def test_enjoy_refuses_an_unsupported_format_in_one_line(cartpole_run, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["enjoy", str(cartpole_run), "--out", str(tmp_path / "video.avi")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unsupported video format '.avi'" in err
    assert not (tmp_path / "video.avi").exists()


class _Unrenderable:
    """A host env with no render(): two actions, episodes of 5 steps."""

    observation_shape = (3,)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, num_envs):
        self.num_envs, self.t = num_envs, 0

    def reset(self, seed):
        self.t = 0
        return np.zeros((self.num_envs, 3), np.float32)

    def step(self, actions):
        self.t += 1
        obs = np.full((self.num_envs, 3), self.t, np.float32)
        done = np.full(self.num_envs, self.t % 5 == 0)
        return obs, np.ones(self.num_envs, np.float32), done, np.zeros_like(done), obs


class _OneEnvWithoutRenderMode(gymnasium.Env):
    """One gymnasium env whose constructor takes no ``render_mode``."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 1.0, True, False, {}


def _enjoy_error(name, env_class, run_dir, capsys, register=register_host_env,
                 command="enjoy") -> str:
    """The one stderr line of ``ppo-async enjoy`` (or ``eval``) on a saved run of ``host:name``
    (exit 2)."""
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.runs.run_dir import PARAMS_FILE

    register(name, env_class)
    config = AsyncActorLearnerConfig(env_id=f"host:{name}", num_actors=1,
                                     envs_per_actor=1, num_minibatches=1)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    template = make_actor_program(config).params_template
    (run_dir / PARAMS_FILE).write_bytes(flax.serialization.to_bytes(template))
    with pytest.raises(SystemExit) as info:
        main([command, str(run_dir)] + (["--out", str(run_dir / "video.gif")]
                                        if command == "enjoy" else []))
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_enjoy_says_when_an_env_cannot_be_rendered(tmp_path, capsys):
    err = _enjoy_error("unrenderable", _Unrenderable, tmp_path, capsys)
    assert "host:unrenderable: this host env cannot be rendered" in err
    err = _enjoy_error("no-render-mode", _OneEnvWithoutRenderMode, tmp_path, capsys,
                       register_single_env)
    assert ("host:no-render-mode: this env cannot be rendered: <class 'test_video."
            "_OneEnvWithoutRenderMode'> takes no render_mode argument") in err


class _Endless(_Unrenderable):
    """A host env whose episodes never end (no time limit), with 4 x 4 frames."""

    def step(self, actions):
        obs, reward, _, truncated, final_obs = super().step(actions)
        return obs, reward, np.zeros_like(truncated), truncated, final_obs

    def render(self):
        return np.zeros((self.num_envs, 4, 4, 3), np.uint8)


def test_eval_and_enjoy_of_an_env_whose_episodes_never_end_stop_saying_so(tmp_path, capsys,
                                                                           monkeypatch):
    # gymnasium:CliffWalking-v1 (no time limit) under a policy that never reaches
    # the goal: eval stepped on for good, enjoy held frames until the OOM killer came.
    from ppo_async.envs import episodes
    from ppo_async.tools import video

    monkeypatch.setattr(episodes, "MAX_EPISODE_STEPS", 40)
    err = _enjoy_error("endless", _Endless, tmp_path, capsys, command="eval")
    assert "host:endless: an episode ran 40 steps without ending" in err
    assert "gymnasium_kwargs max_episode_steps" in err
    monkeypatch.setattr(episodes, "MAX_EPISODE_STEPS", 10**6)
    monkeypatch.setattr(video, "MAX_VIDEO_BYTES", 48 * 30)  # 30 frames of 48 bytes
    err = _enjoy_error("endless", _Endless, tmp_path, capsys)
    assert "host:endless: the 3 episode(s) filled" in err and "with 30 frames without ending" in err


def test_a_gymnax_env_without_a_renderer_is_refused_before_playing():
    from ppo_async.tools.video import RenderError, record_episodes

    config = AsyncActorLearnerConfig(env_id="MemoryChain-bsuite")
    with pytest.raises(RenderError, match="gymnax has no renderer for this env"):
        record_episodes(config, params=None)  # refused before the params are needed


def test_headless_backends_are_chosen_without_a_display_and_a_users_choice_is_kept():
    from ppo_async.tools.video import headless_backends

    def libraries(*present):
        return lambda name: f"lib{name}.so" if name in present else None

    egl = headless_backends({}, "linux", libraries("EGL", "OSMesa"))
    assert egl == {"SDL_AUDIODRIVER": "dummy", "SDL_VIDEODRIVER": "dummy",
                   "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
    osmesa = headless_backends({}, "linux", libraries("OSMesa"))
    assert osmesa["MUJOCO_GL"] == "osmesa" and osmesa["PYOPENGL_PLATFORM"] == "osmesa"
    assert "MUJOCO_GL" not in headless_backends({}, "linux", libraries())  # nothing to pick
    # A display, or another platform: only the (silent) audio driver.
    for environ, platform in (({"DISPLAY": ":0"}, "linux"), ({"WAYLAND_DISPLAY": "w"}, "linux"),
                              ({}, "darwin")):
        assert headless_backends(environ, platform, libraries("EGL")) == {
            "SDL_AUDIODRIVER": "dummy"}
    users = {"MUJOCO_GL": "glfw", "SDL_VIDEODRIVER": "x11", "SDL_AUDIODRIVER": "alsa"}
    assert headless_backends(users, "linux", libraries("EGL")) == {}
    # PyOpenGL chosen by the user: MuJoCo is left to agree with it.
    assert headless_backends({"PYOPENGL_PLATFORM": "glx"}, "linux", libraries("EGL")) == {
        "SDL_AUDIODRIVER": "dummy", "SDL_VIDEODRIVER": "dummy"}


def test_enjoy_without_a_display_writes_cartpole_quietly(cartpole_run, tmp_path):
    pytest.importorskip("pygame")
    out = tmp_path / "video.gif"
    env = {k: v for k, v in os.environ.items() if k not in (
        "DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER", "XDG_RUNTIME_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-m", "ppo_async.tools.cli", "enjoy", str(cartpole_run), "--episodes", "1",
         "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    frames = imageio.imread(out, index=None)
    assert frames.shape[0] > 1 and frames.std() > 0
    # Not a line per frame (SDL's "XDG_RUNTIME_DIR is invalid", ALSA's probe).
    assert "XDG_RUNTIME_DIR" not in run.stderr and "ALSA" not in run.stderr, run.stderr
    assert len(run.stderr.splitlines()) < 5, run.stderr


class _Drawable(_Unrenderable):
    """A host env with 4 x 4 frames, one shade per step."""

    def render(self):
        return np.full((self.num_envs, 4, 4, 3), 40 * (self.t % 5), np.uint8)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_enjoy_shows_progress_on_a_terminal_and_writes_the_same_gif(tmp_path, monkeypatch):
    # A long episode showed nothing for a minute: playing, drawing and (most of it) the GIF.
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.tools.video import record_episodes, write_video

    register_host_env("drawable", _Drawable)
    config = AsyncActorLearnerConfig(env_id="host:drawable", num_actors=1, envs_per_actor=1,
                                     num_minibatches=1)
    params = make_actor_program(config).params_template
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    frames = record_episodes(config, params, num_episodes=2, progress=True).frames
    write_video(frames, tmp_path / "v.gif", fps=10, progress=True)
    shown = terminal.getvalue()
    count = len(frames)
    assert count == 10, count  # two episodes of 5 steps, the last state undrawn, a reset drawn
    for bar in (f"playing 2 episode(s): {count}frame", "drawing: 100%", "writing v.gif: 100%"):
        assert bar in shown, shown
    assert shown.count(f"| {count}/{count} ") == 2, shown
    # The bytes imageio wrote before the bar was added.
    pytest.importorskip("imageio.v2").mimwrite(tmp_path / "before.gif", list(frames),
                                                 duration=100.0, loop=0)
    assert (tmp_path / "v.gif").read_bytes() == (tmp_path / "before.gif").read_bytes()
    # Not on a terminal (a log, a pipe): no bar.
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    write_video(record_episodes(config, params, num_episodes=1, progress=True).frames,
                tmp_path / "quiet.gif", progress=True)
    assert log.getvalue() == ""


class _BrokenRenderer(_Unrenderable):
    """Renders like MuJoCo without an OpenGL it can load."""

    def render(self):
        raise RuntimeError("an OpenGL platform library has not been loaded\ninto this process")


def test_a_renderer_that_fails_is_one_line(tmp_path, capsys):
    err = _enjoy_error("broken-renderer", _BrokenRenderer, tmp_path, capsys)
    assert ("host:broken-renderer: rendering failed: RuntimeError: an OpenGL platform library "
            "has not been loaded into this process") in err


def test_a_video_that_cannot_be_written_is_one_line_and_the_old_one_stays_whole(
        cartpole_run, tmp_path, capsys, monkeypatch):
    pytest.importorskip("pygame")
    import errno

    from PIL import Image

    out = tmp_path / "video.gif"
    out.write_bytes(b"the previous video")

    def disk_full(image, path, *args, **options):  # Pillow writes the GIF
        pathlib.Path(path).write_bytes(b"part of a video")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Image.Image, "save", disk_full)
    with pytest.raises(SystemExit) as info:
        main(["enjoy", str(cartpole_run), "--episodes", "1", "--out", str(out)])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 1
    assert line == f"ppo-async: writing {out} failed: [Errno 28] No space left on device", line
    assert out.read_bytes() == b"the previous video" and [p.name for p in tmp_path.iterdir()] == [
        "video.gif"]
