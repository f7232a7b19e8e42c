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


def test_every_public_name_still_imports_from_the_package():
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
    # Config validation and the env factory import gymnax on first use.
    out = run_python(f"""
        import sys
        import ppo_async
        from ppo_async.envs import BatchedEnv
        config = ppo_async.AsyncActorLearnerConfig(env_id={env_id!r})
        print("gymnax" in sys.modules, BatchedEnv("CartPole-v1", 2).observation_shape)
    """)
    assert out.split() == ["True", "(4,)"]
