"""The opt-in persistent compilation cache: compile a run's programs once per machine.

A run compiles a few dozen XLA programs (the initializers, the update, each
actor's reset and rollout, and small ones dispatched op by op): on a CPU
most of the seconds before its first update (``experiments/bench_startup.py``). With
``AsyncActorLearnerConfig.compilation_cache_dir`` set, `train` and the
synchronous twin point JAX's persistent compilation cache there, so a later
process running the same config loads the compiled programs from disk instead.

The setting is process-wide (JAX keeps one cache per process) and stays after
the run returns. A directory is trusted code: do not share one with users you
do not trust (JAX's warning on ``jax.config.jax_compilation_cache_dir``).
"""

from __future__ import annotations

import logging
import os
import pathlib

logger = logging.getLogger(__name__)

DEFAULT_CACHE = "default"  # the config value that picks `default_cache_dir()`

# Cache every program, however fast it compiled: JAX's default (1 s) would
# skip the dozens of small ones that add up, and the 0.1-0.5 s ones (reset,
# rollout, initializers) that dominate a warm start.
MIN_COMPILE_TIME_S = 0.0


def default_cache_dir() -> pathlib.Path:
    """``$XDG_CACHE_HOME/ppo_async/jax``, by default ``~/.cache/ppo_async/jax``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "ppo_async" / "jax"


def resolve_cache_dir(setting: str | None) -> pathlib.Path | None:
    """The directory a ``compilation_cache_dir`` setting names (None: no cache).

    ``"default"`` is `default_cache_dir`; any other string is a path (``~`` expanded).
    """
    if setting is None:
        return None
    if setting == DEFAULT_CACHE:
        return default_cache_dir()
    return pathlib.Path(setting).expanduser()


def enable_compilation_cache(setting: str | None) -> pathlib.Path | None:
    """Point JAX's persistent compilation cache at ``setting``'s directory; None does nothing.

    Returns the directory. A cache this process already had open elsewhere is
    closed first (JAX opens its cache once, at the first compile after the
    directory is set, and would otherwise keep the old one).
    """
    directory = resolve_cache_dir(setting)
    if directory is None:
        return None
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    directory.mkdir(parents=True, exist_ok=True)
    current = jax.config.jax_compilation_cache_dir
    if current is not None and pathlib.Path(current).expanduser() != directory:
        logger.info("compilation cache: %s replaces %s", directory, current)
        jax_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    return directory
