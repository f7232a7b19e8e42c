"""Startup figures, each measured in a fresh Python process.

(a) ``import ppo_async`` against ``import jax, flax.linen, optax, chex`` (what
    it cannot do without): the median of ``--import-repeats`` processes each,
    and their ratio;
(b) cold start: from the `train()` call to the first completed update, with
    the persistent compilation cache off (every program compiles), the
    default CartPole config unless overridden;
(c) warm start: the same with ``compilation_cache_dir`` set to a fresh
    temporary directory, run twice; the second run finds every program
    compiled by the first;
(d) a sweep point: a third run from the same cache with another
    ``learning_rate`` and half the budget (``SWEEP_POINT``), as the next
    point of a learning-rate sweep; it too should compile nothing;
(e) the next run in the same process: after each cold run, a run with
    ``SWEEP_POINT``'s overrides, without a disk cache (a notebook's or an
    in-process sweep's next run); it finds the programs the first compiled.

A run ends right after its first update (``on_update`` raises
`StopTraining`). The config is built before the clock starts (its validation
imports gymnax), and its build time is reported beside. The machine's load
average is printed and saved: figures from a busy machine are slower.

    python experiments/bench_startup.py [--import-repeats 7] [--train-repeats 3] [--sampler learner]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import textwrap

import common

BASELINE_MODULES = "jax, flax.linen, optax, chex"
# What the third run of a warm pair changes: the learning rate and the budget.
SWEEP_POINT = {"learning_rate": 1e-3, "total_env_steps": 250_000}

_IMPORT_CHILD = """
import time
start = time.perf_counter()
import {modules}
print(time.perf_counter() - start)
"""

# One run until its first update, in a process of its own.
_TRAIN_CHILD = """
import json, time
start = time.perf_counter()
import jax
if {cache_dir!r} is None:
    jax.config.update("jax_enable_compilation_cache", False)
from ppo_async import AsyncActorLearnerConfig, StopTraining, train
imported = time.perf_counter()
config = AsyncActorLearnerConfig(compilation_cache_dir={cache_dir!r}, **{overrides!r})
built, built_cpu = time.perf_counter(), time.process_time()
marks = {{"import_s": imported - start, "config_s": built - imported}}

def on_update(metrics):
    marks["first_update_s"] = time.perf_counter() - built
    # CPU seconds of all threads: on an idle machine with C cores the wall
    # time cannot be below cpu / C, so this says what a busy machine hides.
    marks["first_update_cpu_s"] = time.process_time() - built_cpu
    raise StopTraining

train(config, progress=False, on_update=on_update)
marks["train_returned_s"] = time.perf_counter() - built
marks["process_to_first_update_s"] = marks["import_s"] + marks["config_s"] + marks["first_update_s"]

if {then!r} is not None:  # the next run in this process, with these overrides
    config = AsyncActorLearnerConfig(compilation_cache_dir={cache_dir!r}, **{{**{overrides!r}, **{then!r}}})
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: compiles.append(secs)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    started = time.perf_counter()

    def on_next_update(metrics):
        marks["next_run_first_update_s"] = time.perf_counter() - started
        marks["next_run_compiles"] = len(compiles)
        raise StopTraining

    train(config, progress=False, on_update=on_next_update)
print("MARKS " + json.dumps(marks))
"""


def _run_child(code: str, timeout_s: float) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=timeout_s, env=common.env_without_compile_cache(), cwd=common.REPO_ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"child process failed:\n{done.stderr[-4000:]}")
    return done.stdout


def time_import(modules: str, timeout_s: float = 120) -> float:
    """Seconds to import ``modules`` in a fresh process (the interpreter's own start excluded)."""
    return float(_run_child(_IMPORT_CHILD.format(modules=modules), timeout_s).split()[-1])


def time_first_update(overrides: dict, cache_dir: str | None, then: dict | None = None,
                      timeout_s: float = 600) -> dict:
    """Marks of one fresh process's run until its first update (see ``_TRAIN_CHILD``).

    ``then``: overrides of a next run in the same process, timed the same way
    (``next_run_first_update_s``), with the XLA compiles it started counted.
    """
    out = _run_child(_TRAIN_CHILD.format(cache_dir=cache_dir, overrides=overrides, then=then),
                     timeout_s)
    line = [line for line in out.splitlines() if line.startswith("MARKS ")][-1]
    return json.loads(line[len("MARKS "):])


def cache_entries(directory: pathlib.Path) -> int:
    """Compiled programs stored in a cache directory."""
    return sum(1 for path in directory.rglob("*") if path.is_file())


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--import-repeats", type=int, default=7)
    parser.add_argument("--train-repeats", type=int, default=3,
                        help="cold runs, and warm pairs (each with a fresh cache)")
    parser.add_argument("--num-steps", type=int, default=None, help="override the config's")
    parser.add_argument("--envs-per-actor", type=int, default=None, help="override the config's")
    parser.add_argument("--sampler", default=None, choices=["actors", "shared", "learner"],
                        help="override the config's (learner: the chunks in the learner's program)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    overrides = {name: getattr(args, name) for name in ("num_steps", "envs_per_actor", "sampler")
                 if getattr(args, name) is not None}

    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} (1 min) on {os.cpu_count()} cores")

    # Interleaved, so that a change in the machine's load hits both alike.
    baseline, package = [], []
    for _ in range(args.import_repeats):
        baseline.append(time_import(BASELINE_MODULES))
        package.append(time_import("ppo_async"))
    imports = {
        "baseline_modules": BASELINE_MODULES,
        "baseline_s": baseline,
        "ppo_async_s": package,
        "baseline_median_s": statistics.median(baseline),
        "ppo_async_median_s": statistics.median(package),
    }
    imports["ratio"] = imports["ppo_async_median_s"] / imports["baseline_median_s"]
    print(f"import {BASELINE_MODULES}: {imports['baseline_median_s']:.2f} s, "
          f"import ppo_async: {imports['ppo_async_median_s']:.2f} s, "
          f"ratio {imports['ratio']:.2f} (medians of {args.import_repeats})")

    cold = [time_first_update(overrides, None, then=SWEEP_POINT) for _ in range(args.train_repeats)]
    cold_first = [run["first_update_s"] for run in cold]
    print(f"cold: train() to first update {statistics.median(cold_first):.2f} s "
          f"(median of {[round(t, 2) for t in cold_first]}; CPU "
          f"{[round(run['first_update_cpu_s'], 2) for run in cold]} s)")
    next_runs = [run["next_run_first_update_s"] for run in cold]
    print(f"next run in the same process ({SWEEP_POINT}), no disk cache: train() to first "
          f"update {statistics.median(next_runs):.2f} s (median of "
          f"{[round(t, 2) for t in next_runs]}; XLA compiles {[run['next_run_compiles'] for run in cold]})")

    warm = []
    for _ in range(args.train_repeats):
        with tempfile.TemporaryDirectory(prefix="ppo_async_cache_") as directory:
            first = time_first_update(overrides, directory)
            entries_first = cache_entries(pathlib.Path(directory))
            second = time_first_update(overrides, directory)
            entries_second = cache_entries(pathlib.Path(directory))
            sweep_point = time_first_update({**overrides, **SWEEP_POINT}, directory)
            warm.append({
                "first_run": first, "second_run": second, "cache_entries_after_first": entries_first,
                "cache_entries_after_second": entries_second, "sweep_point_run": sweep_point,
                "cache_entries_after_sweep_point": cache_entries(pathlib.Path(directory)),
            })
    warm_second = [pair["second_run"]["first_update_s"] for pair in warm]
    print(f"warm cache: train() to first update {statistics.median(warm_second):.2f} s "
          f"(second runs, median of {[round(t, 2) for t in warm_second]}; CPU "
          f"{[round(pair['second_run']['first_update_cpu_s'], 2) for pair in warm]} s; the first runs took "
          f"{[round(pair['first_run']['first_update_s'], 2) for pair in warm]})")
    sweep_points = [pair["sweep_point_run"]["first_update_s"] for pair in warm]
    new_programs = [pair["cache_entries_after_sweep_point"] - pair["cache_entries_after_second"]
                    for pair in warm]
    print(f"sweep point from the same cache ({SWEEP_POINT}): train() to first update "
          f"{statistics.median(sweep_points):.2f} s (median of {[round(t, 2) for t in sweep_points]}; "
          f"new cache entries {new_programs})")

    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} (1 min)")
    result = {
        "overrides": overrides,
        "imports": imports,
        "cold_runs": cold,
        "cold_first_update_median_s": statistics.median(cold_first),
        "next_run_first_update_median_s": statistics.median(next_runs),
        "warm_pairs": warm,
        "warm_first_update_median_s": statistics.median(warm_second),
        "sweep_point": SWEEP_POINT,
        "sweep_point_first_update_median_s": statistics.median(sweep_points),
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    common.save_result("bench_startup", args.out, __file__, argv, result)
    return result


if __name__ == "__main__":
    main()
