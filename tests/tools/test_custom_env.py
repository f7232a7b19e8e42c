"""The user's own env, end to end, each command in a fresh process as a user types it.

The guide's custom-env example (its module ``my_sim.py``, taken from
docs/guide/environments.md itself) is trained, evaluated, resumed and watched from the command
line, each command a new process that knows the env only from the run's
config.json; and the documented ``gymnasium:MODULE:NAME`` form is built in a
fresh process. (``plot`` reads config.json as a dict and builds no env.)
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What the ppo-async script runs: -P keeps Python from putting the current directory on
# sys.path itself (the script's directory is there instead), so main() must put it there.
PPO_ASYNC = [sys.executable, "-P", "-c",
             f"import ppo_async, sys; assert ppo_async.__file__.startswith({str(ROOT)!r}), "
             "ppo_async.__file__; from ppo_async.tools.cli import main; main()"]


def readme_module(first_line: str) -> str:
    """The environments guide's python block that starts with ``first_line``."""
    page = ROOT / "docs" / "guide" / "environments.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    (block,) = [b for b in blocks if b.startswith(first_line)]
    return block


def _child_env() -> dict[str, str]:
    from ppo_async.runtime.process_transport import inherited_cache_env

    return {**os.environ, **inherited_cache_env(), "PYTHONPATH": str(ROOT)}


def _ppo_async(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([*PPO_ASYNC, *args], cwd=cwd, env=_child_env(), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return done


def test_the_guide_env_trains_evaluates_resumes_and_is_drawn_from_the_command_line(tmp_path):
    (tmp_path / "my_sim.py").write_text(readme_module("# my_sim.py"))
    tiny = ["--num-actors", "1", "--envs-per-actor", "2", "--num-steps", "16",
            "--num-epochs", "1", "--num-minibatches", "1", "--no-progress"]
    _ppo_async(tmp_path, "train", "--env-module", "my_sim", "--env-id", "host:signsim", *tiny,
               "--total-env-steps", "256")
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "config.json").read_text())["env_modules"] == ["my_sim"]
    rel = str(run_dir.relative_to(tmp_path))
    evaluated = _ppo_async(tmp_path, "eval", rel, "--num-episodes", "2")
    assert "host:signsim: return" in evaluated.stdout
    resumed = _ppo_async(tmp_path, "train", "--resume", rel, "--total-env-steps", "320")
    assert "(64 in this segment, from update 8)" in resumed.stdout
    watched = _ppo_async(tmp_path, "enjoy", rel, "--episodes", "1", "--out", "signsim.gif")
    assert "1 greedy episode(s) of host:signsim" in watched.stdout
    assert (tmp_path / "signsim.gif").read_bytes()[:3] == b"GIF"
    # Damaged checkpoints: a resume says so in one line each (no Python warning format,
    # which shows only outside pytest's capture), then fails in one line, exit 2.
    for checkpoint in (run_dir / "checkpoints").iterdir():
        checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    lines = _refused(tmp_path, "train", "--resume", rel, "--total-env-steps", "400")
    assert all(line.startswith("ppo-async: ") for line in lines), lines
    assert lines[0].startswith("ppo-async: warning: skipping unusable checkpoint") and (
        lines[-1].startswith("ppo-async: no usable checkpoint in")), lines


def _refused(cwd: pathlib.Path, *args: str) -> list[str]:
    """The stderr lines of a command that must fail with exit code 2."""
    done = subprocess.run([*PPO_ASYNC, *args], cwd=cwd, env=_child_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    return done.stderr.strip().splitlines()


TOY_GYMNASIUM_MODULE = '''
import gymnasium as gym
import numpy as np


class Toy(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.ones(2, np.float32), 1.0, True, False, {}


gym.register("Toy-v0", entry_point=Toy, max_episode_steps=5)
'''


def test_the_documented_gymnasium_module_form_works_in_a_fresh_process(tmp_path):
    """``gymnasium:MODULE:NAME`` (split_env_id's docstring): MODULE registers NAME as it imports."""
    (tmp_path / "toy_envs.py").write_text(TOY_GYMNASIUM_MODULE)
    script = (
        "import ppo_async, sys\n"
        f"assert ppo_async.__file__.startswith({str(ROOT)!r}), ppo_async.__file__\n"
        "from ppo_async import AsyncActorLearnerConfig\n"
        "from ppo_async.envs.host import make_host_env\n"
        "config = AsyncActorLearnerConfig(env_id='gymnasium:toy_envs:Toy-v0')\n"
        "envs = make_host_env(config.env_id, 3)\n"
        "print(envs.reset(0).shape, envs.step([0, 1, 0])[1].tolist())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_child_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(3,", "2)", "[1.0,", "1.0,", "1.0]"]


@pytest.mark.parametrize("modules, expected", [
    (("no_such_module_here",), "cannot import 'no_such_module_here' (ModuleNotFoundError: No "
                               "module named 'no_such_module_here'); it must be importable here"),
    # Found but raised: where it is is not the problem.
    (("broken_envs",), "cannot import 'broken_envs' (ZeroDivisionError: division by zero); its "
                       "code raised it"),
    ("my_sim", "must be a tuple (or list) of module names"),
])
def test_a_module_that_cannot_be_imported_is_one_config_error(tmp_path, monkeypatch, modules,
                                                              expected):
    from ppo_async import AsyncActorLearnerConfig, ConfigError

    (tmp_path / "broken_envs.py").write_text("1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as error:
        AsyncActorLearnerConfig(env_id="host:anything", env_modules=modules)
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_env_modules_are_imported_before_the_env_id_is_looked_up(tmp_path, monkeypatch):
    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.envs.registry import registered_host_envs

    (tmp_path / "registers_late.py").write_text(
        readme_module("# my_sim.py").replace('"signsim"', '"late_signsim"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "late_signsim" not in registered_host_envs()
    config = AsyncActorLearnerConfig(env_id="host:late_signsim", env_modules=["registers_late"])
    assert config.env_modules == ("registers_late",)  # a list, as config.json holds it
    assert "late_signsim" in registered_host_envs()


def test_a_module_the_cli_cannot_import_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from ppo_async.tools.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main puts the current directory on it
    (tmp_path / "typo_sim.py").write_text("import gymnasium_typo\n")
    for module, error in [("no_such_sim", "ModuleNotFoundError: No module named 'no_such_sim'"),
                          ("typo_sim", "No module named 'gymnasium_typo'")]:
        with pytest.raises(SystemExit) as info:
            main(["train", "--env-module", module, "--env-id", "host:nosim",
                  "--run-root", str(tmp_path / "runs")])
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and line.startswith(
            f"ppo-async: invalid configuration: env_modules=('{module}',): cannot import "
            f"'{module}' (") and error in line, line
    assert str(tmp_path) in sys.path and not (tmp_path / "runs").exists()
