"""``ppo-async enjoy`` (`ppo_async.video`): greedy episodes written as a video, or a clear refusal."""

import json

import flax.serialization
import gymnasium
import numpy as np
import pytest

from ppo_async import AsyncActorLearnerConfig
from ppo_async.cli import main
from ppo_async.host_envs import register_host_env

imageio = pytest.importorskip("imageio.v3")


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
    main(["enjoy", str(cartpole_run), "--episodes", "2", "--out", str(out)])
    assert "wrote" in capsys.readouterr().out
    frames = imageio.imread(out, index=None)  # every frame: [F, H, W, 3]
    assert out.stat().st_size > 1000
    assert frames.ndim == 4 and frames.shape[0] > 1 and frames.shape[-1] in (3, 4)
    assert frames.std() > 0  # something was drawn


def test_enjoy_writes_an_mp4(cartpole_run, tmp_path):
    pytest.importorskip("pygame")
    pytest.importorskip("imageio_ffmpeg")
    from ppo_async.cli import load_run_config, load_run_params
    from ppo_async.video import record_episodes, write_video

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


def test_enjoy_says_when_an_env_cannot_be_rendered(tmp_path, capsys):
    from ppo_async.actor import make_actor_program
    from ppo_async.run_dir import PARAMS_FILE

    register_host_env("unrenderable", _Unrenderable)
    config = AsyncActorLearnerConfig(env_id="host:unrenderable", num_actors=1,
                                     envs_per_actor=1, num_minibatches=1)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    template = make_actor_program(config).params_template
    (tmp_path / PARAMS_FILE).write_bytes(flax.serialization.to_bytes(template))
    with pytest.raises(SystemExit) as info:
        main(["enjoy", str(tmp_path), "--out", str(tmp_path / "video.gif")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "host:unrenderable: this host env cannot be rendered" in err


def test_a_gymnax_env_without_a_renderer_is_refused_before_playing():
    from ppo_async.video import RenderError, record_episodes

    config = AsyncActorLearnerConfig(env_id="MemoryChain-bsuite")
    with pytest.raises(RenderError, match="gymnax has no renderer for this env"):
        record_episodes(config, params=None)  # refused before the params are needed
