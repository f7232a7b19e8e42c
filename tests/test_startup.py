"""Startup: what ``import ppo_async`` loads, and the opt-in persistent compilation cache.

Each check runs in a fresh subprocess: this process has long since imported
everything, and the suite's conftest has set its own compilation cache.
"""

import subprocess
import sys
import textwrap

import pytest

import ppo_async

# Imported only where they are used: each costs import time that most users of
# the library (a notebook calling train, a test) never need.
HEAVY_OPTIONAL_MODULES = ("gymnax", "tyro", "matplotlib", "tqdm", "tensorboardX", "seaborn")


def run_python(script: str, timeout: float = 240, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_ppo_async_leaves_the_heavy_optional_modules_unimported():
    out = run_python(f"""
        import sys
        import ppo_async
        print(sorted(m for m in {HEAVY_OPTIONAL_MODULES!r} if m in sys.modules))
    """)
    assert out.strip() == "[]"


# Every name the package exported before its modules moved into subpackages.
EARLIER_PUBLIC_NAMES = {
    "ActorChannels", "ActorError", "ActorHandle", "ActorStats", "ActorThrottle",
    "AsyncActorLearnerConfig", "ConfigError", "Experience", "LearnerReport",
    "LearnerTimeoutError", "NonFiniteError", "PolicyBroadcast", "PolicyLoadError",
    "RolloutBuffer", "StopTraining", "ShutdownTimeoutError", "TrainResult",
    "TrainingInterrupted", "VTraceOutput", "actor_thread", "gae", "learner_loop",
    "load_policy_from_broadcast", "ppo_loss", "serialize_policy", "spawn_actor", "train",
    "vtrace",
}


def test_every_public_name_still_imports_from_the_package():
    assert EARLIER_PUBLIC_NAMES <= set(ppo_async.__all__)
    out = run_python("""
        import ppo_async
        from ppo_async import *  # noqa: F403
        missing = [name for name in ppo_async.__all__ if name not in globals()]
        print(missing)
    """)
    assert out.strip() == "[]"
    for name in ppo_async.__all__:
        assert getattr(ppo_async, name) is not None


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_building_a_gymnax_env_still_works_after_a_lazy_import(env_id):
    # Config validation and the env factory import gymnax on first use; the
    # plotting modules its renderers import load only when first read.
    out = run_python(f"""
        import sys
        import ppo_async
        from ppo_async.envs.gymnax_env import BatchedEnv
        config = ppo_async.AsyncActorLearnerConfig(env_id={env_id!r})
        print("gymnax" in sys.modules, BatchedEnv("CartPole-v1", 2).observation_shape)
        print("seaborn.palettes" in sys.modules, "matplotlib.figure" in sys.modules)
        import seaborn, matplotlib.pyplot as plt
        print(len(seaborn.color_palette("cubehelix", 3)), type(plt.figure()).__name__)
        print("seaborn.palettes" in sys.modules, sys.modules["matplotlib"].pyplot is sys.modules[
            "matplotlib.pyplot"], type(sys.modules["seaborn"]).__name__)
    """)
    assert out.split() == ["True", "(4,)", "False", "False", "3", "Figure", "True", "True",
                           "module"]


# --- the opt-in persistent compilation cache ---


@pytest.mark.parametrize("value", ["", "  ", 3])
def test_compilation_cache_dir_must_name_a_directory(value):
    with pytest.raises(ppo_async.ConfigError, match="compilation_cache_dir"):
        ppo_async.AsyncActorLearnerConfig(compilation_cache_dir=value)


def test_compilation_cache_dir_refuses_a_file(tmp_path):
    a_file = tmp_path / "not-a-directory"
    a_file.write_text("")
    with pytest.raises(ppo_async.ConfigError, match="is a file"):
        ppo_async.AsyncActorLearnerConfig(compilation_cache_dir=str(a_file))
    # A directory that does not exist yet is fine: train() creates it.
    ppo_async.AsyncActorLearnerConfig(compilation_cache_dir=str(tmp_path / "new" / "cache"))


def test_default_cache_dir_is_under_the_user_cache(monkeypatch, tmp_path):
    from ppo_async.runs.compile_cache import resolve_cache_dir

    assert resolve_cache_dir(None) is None
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_cache_dir("default") == tmp_path / ".cache" / "ppo_async" / "jax"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_cache_dir("default") == tmp_path / "xdg" / "ppo_async" / "jax"
    assert resolve_cache_dir("~/c") == tmp_path / "c"


def test_the_cli_has_the_flag(capsys):
    from ppo_async.tools.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--compilation-cache-dir" in out and "~/.cache/ppo_async/jax" in out


_TINY_RUN = """
    import sys
    import jax
    from ppo_async import AsyncActorLearnerConfig, train
    cache_dir = sys.argv[1] if sys.argv[1] != "none" else None
    config = AsyncActorLearnerConfig(
        num_actors=1, envs_per_actor=2, num_steps=8, num_epochs=1, num_minibatches=1,
        hidden_sizes=(8,), total_env_steps=16, compilation_cache_dir=cache_dir)
    train(config, progress=False)
    print("cache", jax.config.jax_compilation_cache_dir)
"""


def _run_tiny(cache_dir: str, env: dict) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_TINY_RUN), cache_dir],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _entries(directory) -> set[str]:
    return {p.name for p in directory.rglob("*") if p.is_file()}


def test_a_second_run_finds_every_program_in_the_cache(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    cache = tmp_path / "cache"
    assert f"cache {cache}" in _run_tiny(str(cache), env)
    first = _entries(cache)
    # Small programs too (the threshold is 0 s): the initializers, reset, the
    # learner's loop of rollouts and updates (the default without a GPU), and the
    # op-by-op dispatches.
    names = {entry.split("-")[0] for entry in first}
    assert {"jit_init", "jit_reset_from", "jit_run", "jit_negative"} <= names, names
    _run_tiny(str(cache), env)
    assert _entries(cache) == first  # nothing compiled anew, so nothing written

    # Off by default: a run without the field leaves no cache behind.
    assert "cache None" in _run_tiny("none", env)


def test_the_twin_uses_the_cache_too(tmp_path):
    script = f"""
        import jax
        from ppo_async import AsyncActorLearnerConfig
        from ppo_async.sync import make_train
        config = AsyncActorLearnerConfig(
            num_actors=1, envs_per_actor=2, num_steps=8, num_epochs=1, num_minibatches=1,
            hidden_sizes=(8,), total_env_steps=16, compilation_cache_dir={str(tmp_path)!r})
        jax.jit(make_train(config))(jax.random.key(0))
    """
    run_python(script)
    assert _entries(tmp_path)


@pytest.mark.parametrize("thread_actors", [True, False])
def test_the_warm_up_compiles_the_placement_of_thread_actors_params(thread_actors):
    # So that it does not compile on an actor's way to its first chunk, beside the update.
    import importlib

    import jax

    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.core import devices
    from ppo_async.core.update import make_update_fn
    from ppo_async.envs.backends import make_actor_program

    train_module = importlib.import_module("ppo_async.train")
    # Shapes of their own (batch and params): no earlier test placed them.
    config = AsyncActorLearnerConfig(num_actors=1, envs_per_actor=2, num_steps=5 + thread_actors,
                                     num_epochs=1, num_minibatches=1,
                                     hidden_sizes=(7 + thread_actors,))
    program = make_actor_program(config)
    cpu = jax.devices("cpu")[0]
    placer = devices._device_placer(cpu)
    before = placer._cache_size()
    warm_up = train_module._UpdateWarmUp(
        config, program, make_update_fn(config.update_options(), program.network),
        devices.LearnerPlacement([cpu]), actor_device=cpu if thread_actors else None)
    warm_up.result(120)
    warm_up.join(10)
    # The batch's placement always; the params' only for thread actors.
    assert placer._cache_size() == before + 1 + thread_actors
    devices.place(program.params_template, cpu)  # what an actor's first broadcast does
    assert placer._cache_size() == before + 2
