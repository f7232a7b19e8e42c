"""Test-wide JAX settings.

Implicit rank promotion is an error, as in rlax, so a shape slip in the
library fails here instead of broadcasting silently. Compiled programs are
cached on disk: many runtime tests build the same rollout and update
functions afresh, and recompiling each costs seconds on a 2-core machine.
"""

import os
import tempfile
import threading

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("PPO_ASYNC_JAX_CACHE", os.path.join(tempfile.gettempdir(), "ppo_async_jax_cache")),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def run_threads_alive() -> list[str]:
    """Threads the runtime started (actors, evaluator) that are still alive."""
    return [t.name for t in threading.enumerate() if t.name.startswith("ppo-")]


@pytest.fixture(autouse=True)
def no_thread_leaks():
    """Every test leaves no actor or evaluator thread running."""
    yield
    assert run_threads_alive() == []


@pytest.fixture(autouse=True)
def thread_actors_for_host_envs(request, monkeypatch):
    """actor_backend='auto' runs a host env's actors in processes, each importing JAX (seconds
    a run). The suite's runs of host envs keep thread actors, as before 'auto', unless a test
    is marked ``real_layout`` (tests/runtime/test_layout.py and the processes' own tests)."""
    if request.node.get_closest_marker("real_layout") is not None:
        return
    from ppo_async.runtime import layout

    monkeypatch.setattr(layout, "_host_backend", lambda config, machine, probe: (
        "threads", "host env: thread actors in the test suite", None))


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def maybe_jit(request):
    """The function under test as it is, then jitted: a pure kernel must agree both ways."""
    return jax.jit if request.param else (lambda fn: fn)


@pytest.fixture
def recorded_updates(monkeypatch):
    """``(updates, calls)``: every jitted update `train` builds, and the batch
    shapes and dtypes of every call to it (the warm-up's included). The
    update programs the process holds are dropped first, so the test's run
    compiles its own and ``_cache_size()`` counts its calls' shapes alone."""
    import importlib

    from ppo_async.core import update as update_module

    update_module._update_program.cache_clear()
    train_module = importlib.import_module("ppo_async.train")  # shadowed by train()
    original = train_module.make_update_fn
    updates, calls = [], []

    def make_update_fn(config, network, *schedule, **mesh):
        update = original(config, network, *schedule, **mesh)
        updates.append(update)

        def counted(state, batch):
            calls.append(jax.tree.map(lambda x: (x.shape, x.dtype), batch))
            return update(state, batch)

        return counted

    monkeypatch.setattr(train_module, "make_update_fn", make_update_fn)
    return updates, calls
