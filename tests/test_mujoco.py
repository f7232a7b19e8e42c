"""MuJoCo locomotion end to end: the presets learn in a few updates, envpool's MuJoCo
ids run, evaluation reports the env's own return, and ``enjoy`` writes a video headless.

Needs the mujoco extra (``make test`` installs it). Each preset trains its own
config for 4 updates (8192 env steps, a few seconds each); the 1M-step results
are a slow experiment (experiments/mujoco_results.py), not a test.
"""

import os
import pathlib
import platform
import subprocess
import sys

import chex
import gymnasium
import jax
import numpy as np
import pytest

from ppo_async import train
from ppo_async.presets import preset
from ppo_async.runtime.evaluate import evaluate

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
UPDATES = 4
EPISODES = 8


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Preset name -> (config, final params, run dir) of a 4-update run, trained on first use."""
    trained = {}

    def run(name):
        if name not in trained:
            config = preset(name)
            # Thread actors: the preset's actor processes give the same bytes at its exact
            # lag (tests/runtime/test_processes.py), and starting them costs seconds a run.
            config = preset(name, total_env_steps=UPDATES * config.batch_size,
                            actor_backend="threads")
            run_dir = tmp_path_factory.mktemp(name) / "run"
            result = train(config, run_dir=run_dir, progress=False)
            assert result.report.updates == UPDATES
            trained[name] = (config, result.params, run_dir)
        return trained[name]

    return run


def random_policy(params):
    """The trained policy with its network's weights zeroed: actions ~ N(0, I), as at init."""
    return params._replace(params=jax.tree.map(np.zeros_like, params.params))


@pytest.mark.parametrize("name", ["hopper", "walker2d"])
def test_a_few_updates_of_hopper_and_walker2d_beat_a_random_policy(runs, name):
    """Sampled actions, the same seeded episodes for both policies (seed 0, 2 cores:
    Hopper about 31 against 7, Walker2d about 14 against -2)."""
    config, params, _ = runs(name)
    trained = evaluate(config, params, num_episodes=EPISODES, greedy=False)
    random = evaluate(config, random_policy(params), num_episodes=EPISODES, greedy=False)
    assert np.all(np.isfinite(trained.episode_returns))
    assert trained.mean_return > random.mean_return + 10.0, (trained, random)


def test_a_few_updates_of_ant_run_and_count_its_episodes(runs):
    """4 updates say little about Ant, whose preset starts from a small std that
    already beats N(0, I) actions (its cost), so here it is only trained and
    evaluated with the preset's 27 observations; whether it learns is the
    1M-step experiment's question (experiments/mujoco_results.py)."""
    config, params, _ = runs("ant")
    chex.assert_tree_all_finite(params)
    assert params.obs_stats.mean.shape == (27,)  # Ant-v4's observation, contact forces left out
    result = evaluate(config, params, num_episodes=2, greedy=False)
    assert np.all(np.isfinite(result.episode_returns)) and np.all(result.episode_lengths > 0)


def test_evaluation_reports_the_envs_own_return_not_the_normalized_one(runs):
    """Reward normalization is on in the run; evaluation must still sum the env's rewards."""
    config, params, _ = runs("hopper")
    assert config.normalize_rewards and float(params.return_stats.var) > 0
    # Zero weights act with the Gaussian's mean, 0: a deterministic episode to replay.
    result = evaluate(config, random_policy(params), num_episodes=1, seed=0, greedy=True)
    env = gymnasium.make("Hopper-v5")
    env.reset(seed=0)
    expected, done = 0.0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(np.zeros(env.action_space.shape))
        expected, done = expected + reward, terminated or truncated
    assert result.mean_return == pytest.approx(expected, rel=1e-5)


ENVPOOL_WHEELS = sys.platform.startswith("linux") and platform.machine() == "x86_64"


@pytest.fixture(scope="module")
def envpool_run(tmp_path_factory):
    """Two small updates of the hopper preset on envpool's Hopper-v4: (result, run dir)."""
    if not ENVPOOL_WHEELS:
        pytest.skip("envpool ships wheels for Linux x86_64 only")
    config = preset("hopper", env_id="envpool:Hopper-v4", envs_per_actor=2, num_steps=16,
                    num_epochs=1, num_minibatches=2, total_env_steps=2 * 64,
                    actor_backend="threads")  # envpool steps in its own C++ threads
    run_dir = tmp_path_factory.mktemp("envpool") / "run"
    return train(config, run_dir=run_dir, progress=False), run_dir


def test_an_envpool_mujoco_id_trains_with_the_hopper_preset(envpool_run):
    from ppo_async.envs.registry import is_envpool_gym_mujoco

    # enjoy draws these with gymnasium's env of the same id; DeepMind Control's are not among them.
    assert is_envpool_gym_mujoco("envpool:Hopper-v4") and is_envpool_gym_mujoco("envpool:Ant-v5")
    for env_id in ("envpool:HopperHop-v1", "envpool:Pong-v5", "gymnasium:Hopper-v5",
                   "Pendulum-v1"):
        assert not is_envpool_gym_mujoco(env_id), env_id
    result, _ = envpool_run
    assert result.report.updates == 2 and result.report.env_steps == 128
    # Random-like Hopper episodes last about 20 steps: some ended, with finite returns.
    assert result.report.episodes > 0 and np.isfinite(result.report.episode_return_mean)
    chex.assert_tree_all_finite(result.params)


def test_enjoy_writes_mujoco_videos_without_a_display(runs, envpool_run, tmp_path):
    """One fresh process with no display and no MUJOCO_GL: enjoy picks a headless OpenGL
    (EGL, else OSMesa) before MuJoCo is imported, for a gymnasium run and an envpool one
    (drawn by gymnasium's Hopper-v4). Needs libEGL with Mesa, or OSMesa, on the machine
    (Debian: libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri): pip cannot install it."""
    imageio = pytest.importorskip("imageio.v3")  # the dev and video extras install it
    videos = {runs("hopper")[2]: tmp_path / "hopper.mp4", envpool_run[1]: tmp_path / "envpool.mp4"}
    enjoy = "; ".join(f"main(['enjoy', {str(run)!r}, '--episodes', '1', '--out', {str(out)!r}])"
                      for run, out in videos.items())
    env = {k: v for k, v in os.environ.items() if k not in (
        "DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", f"from ppo_async.tools.cli import main; {enjoy}"], env=env,
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("wrote ") == 2, run.stdout
    for out in videos.values():
        frames = imageio.imread(out, index=None)
        assert frames.ndim == 4 and frames.shape[0] > 1 and frames.std() > 0, out
