"""Helpers shared by the experiment scripts: where results go, how they are written.

Every script writes under ``experiments/out/<name>/`` (gitignored) unless
``--out`` says otherwise, writes CSV and JSON beside its PNGs, and prints the
command that reproduces them. Nothing here imports JAX at module level, so a
``--dry-run`` stays instant.
"""

from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ppo_async.runs.run_dir import write_json  # noqa: F401 - the scripts import it from here

EXPERIMENTS_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = EXPERIMENTS_DIR.parent


def out_dir(name: str, override: str | os.PathLike | None = None) -> pathlib.Path:
    """``experiments/out/<name>/`` (or ``override``), created."""
    path = pathlib.Path(override) if override is not None else EXPERIMENTS_DIR / "out" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def reproduce_command(script: str, argv: Sequence[str]) -> str:
    """``python experiments/<script>.py <args>``, shell-quoted, run from the repo root."""
    return shlex.join(["python", f"experiments/{pathlib.Path(script).stem}.py", *argv])


def print_reproduce(script: str, argv: Sequence[str]) -> str:
    command = reproduce_command(script, argv)
    print(f"\nreproduce (from the repo root): {command}")
    return command


# Episodes behind every "recent return", as in LearnerReport.episode_return_mean.
MIN_EPISODES = 100

# jaxlib 0.10.2 on CPU: under ``jax.vmap`` the orthogonal initializer's QR is a
# batched LAPACK call that splits its batch over XLA's intra-op thread pool and
# waits for the parts. XLA's concurrency-optimized scheduler may run two such
# calls at once; on a 2-core machine they then hold both pool threads while
# waiting for parts that no free thread can run, and the program never finishes
# (seen with ``jax.jit(jax.vmap(ppo_async.sync.make_train(cfg)))``: a native
# stack shows both ``tf_XLAEigen`` threads in ``jax::ParallelBatchMap`` under
# ``lapack_sgeqrf_ffi`` / ``lapack_sorgqr_ffi``). The plain scheduler does not
# overlap them.
SERIAL_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def avoid_vmapped_qr_deadlock() -> None:
    """Add `SERIAL_SCHEDULER_FLAG` to ``XLA_FLAGS``; call before JAX starts its CPU backend.

    XLA reads ``XLA_FLAGS`` when the first backend starts (the first array or
    compile), not when JAX is imported, so importing ``ppo_async`` first is
    fine. Too late (a backend already started), it warns instead.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if SERIAL_SCHEDULER_FLAG in flags.split():
        return
    # jax's private registry of started backends: empty until the first one starts
    if getattr(sys.modules.get("jax._src.xla_bridge"), "_backends", None):
        import warnings

        warnings.warn(
            f"JAX's CPU backend has started, so {SERIAL_SCHEDULER_FLAG} does not apply: a "
            "vmapped synchronous twin can hang on a 2-core CPU (see experiments/common.py)",
            RuntimeWarning, stacklevel=2,
        )
    os.environ["XLA_FLAGS"] = f"{flags} {SERIAL_SCHEDULER_FLAG}".strip()


def configure_jax() -> None:
    """Entry-point JAX settings: a persistent compilation cache.

    Every ``train`` builds its jitted functions afresh, so a sweep would
    otherwise recompile the same programs for each cell (seconds each on a
    2-core machine). The cache directory is the test suite's.
    """
    import jax

    jax.config.update(
        "jax_compilation_cache_dir",
        os.environ.get("PPO_ASYNC_JAX_CACHE",
                       os.path.join(tempfile.gettempdir(), "ppo_async_jax_cache")),
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


# What gives a fresh process's JAX a persistent compilation cache: JAX's own
# variables and the suite's (`configure_jax`).
CACHE_VARIABLES = ("JAX_COMPILATION_CACHE_DIR", "JAX_ENABLE_COMPILATION_CACHE", "PPO_ASYNC_JAX_CACHE")


def env_without_compile_cache() -> dict[str, str]:
    """This process's environment for a child whose figures include compiling."""
    return {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}


def machine_info() -> dict[str, Any]:
    """Where the figures were measured: results from another machine are not comparable."""
    import jax

    return {
        # What else ran: figures taken under load are not comparable with quiet ones.
        "load_average_1_5_15_min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
    }


def check_seeds_and_budget(parser, args) -> None:
    """``parser.error`` unless ``--seeds`` >= 1 and ``--budget-scale`` is finite and > 0."""
    if args.seeds < 1 or not (args.budget_scale > 0 and math.isfinite(args.budget_scale)):
        parser.error("--seeds must be >= 1 and --budget-scale > 0")


def run_child(argv: Sequence[str], what: str, env: Mapping[str, str] | None = None,
              timeout_s: float = 1800) -> dict[str, Any]:
    """Run ``[python, *argv]`` in a fresh process; the JSON object its last stdout line prints.

    A timed figure that includes compiling must come from a fresh process;
    ``what`` names the measurement in the error if the child fails.
    """
    completed = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                               timeout=timeout_s, env=None if env is None else dict(env))
    if completed.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def rows_per_seed_and_mode(seeds: Sequence[int], modes: Sequence[str],
                           measure: Callable[[str, int], dict[str, Any]],
                           line: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """One row per (seed, mode), seeds outermost so that the modes alternate:
    ``measure(mode, seed)`` stamped with the mode, seed and 1-minute load
    average it ran at; ``line(row)`` is printed as each row arrives."""
    rows = []
    for seed in seeds:
        for mode in modes:
            row = {"mode": mode, "seed": seed, "load_average_1_min": os.getloadavg()[0],
                   **measure(mode, seed)}
            rows.append(row)
            print(line(row), flush=True)
    return rows


def median_rate_by_mode(rows: Sequence[Mapping[str, Any]],
                        modes: Sequence[str]) -> dict[str, float]:
    """The median ``env_steps_per_s`` of each mode's rows."""
    import statistics

    return {mode: statistics.median(r["env_steps_per_s"] for r in rows if r["mode"] == mode)
            for mode in modes}


def cpu_seconds(children: bool = False) -> float:
    """CPU seconds of this process so far (all its threads); with ``children``, plus those
    of its live child processes (actor processes)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    if children:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                times = child.cpu_times()
                total += times.user + times.system
            except psutil.Error:  # ended meanwhile
                pass
    return total


SAME_CALL_S = 5e-4


def collects_in_learner(config) -> bool:
    """Whether a run of ``config`` collects its chunks in the learner's program (the layout
    `train` resolves: ``sampler="learner"``, or what ``"auto"`` chooses where it can run)."""
    from ppo_async.runtime.layout import resolve_layout

    return resolve_layout(config).collection == "learner"


def steady_span(config, marks: Sequence[tuple], total_env_steps: int) -> tuple[tuple, tuple]:
    """The first and last of the ``on_update`` marks ``(time, env steps, ...)`` of a run
    of ``config`` that a steady rate runs between: from the first mark at or past a
    quarter of the budget (start-up and compiles excluded) to the last, counting only
    `last_mark_of_each_call` where the learner's program collected the chunks (its
    updates are passed on a call at a time). In a run so short that the learner's
    program passes the quarter only in its last call, from the call before it.
    ``config`` None: marks taken once per program call already."""
    in_calls = config is not None and collects_in_learner(config)
    marks = last_mark_of_each_call(marks) if in_calls else list(marks)
    first = next(i for i, mark in enumerate(marks) if mark[1] >= total_env_steps / 4)
    return marks[max(0, min(first, len(marks) - 2))], marks[-1]


def last_mark_of_each_call(marks: Sequence[tuple]) -> list[tuple]:
    """``on_update`` marks ``(time, ...)`` of a ``sampler="learner"`` run, one per program call.

    Its updates are passed on one after the other once their call returns (tens of
    microseconds apart, where calls take milliseconds), so a mark less than
    `SAME_CALL_S` before the next is one of the same call's, and the env steps done
    by its time are the next one's; a rate from such a mark would count them twice.
    """
    return [mark for mark, after in zip(marks, [*marks[1:], None])
            if after is None or after[0] - mark[0] >= SAME_CALL_S]


def median_time(fn, repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn``."""
    import statistics
    import time

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def save_result(
    name: str, out_override: str | os.PathLike | None, script: str, argv: Sequence[str],
    result: dict[str, Any], filename: str = "results.json",
) -> pathlib.Path:
    """Stamp ``result`` with the machine and the command that reproduces it (printed), and
    write it as JSON to ``out_dir(name, out_override) / filename``; returns the path."""
    result["machine"] = machine_info()
    result["command"] = print_reproduce(script, argv)
    return write_json(out_dir(name, out_override) / filename, result)


def save_with_load(name: str, out_override: str | os.PathLike | None, script: str,
                   argv: Sequence[str], result: dict[str, Any],
                   load_before: float) -> pathlib.Path:
    """`save_result` with the 1-minute load average before the runs and now, printed too."""
    result.update(load_average_before=load_before, load_average_after=os.getloadavg()[0])
    print(f"load average: {load_before:.2f} before, {result['load_average_after']:.2f} after")
    return save_result(name, out_override, script, argv, result)


def _child_processes() -> list:
    """This process's children (actor or env worker processes; not multiprocessing's
    resource tracker), as `psutil.Process` objects."""
    import psutil

    return [c for c in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(c.cmdline())]


def rss_mb() -> dict:
    """RSS of this process and of each of its children (actor or env worker processes), in MiB."""
    import psutil

    children = [c.memory_info().rss / 2**20 for c in _child_processes()]
    return {"process": psutil.Process().memory_info().rss / 2**20, "children": children}


def children_cpu_s() -> dict[int, float]:
    """CPU seconds (user and system) each child process of this one (`rss_mb`'s) has used
    so far, by pid."""
    import psutil

    cpu = {}
    for child in _child_processes():
        try:
            times = child.cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        cpu[child.pid] = times.user + times.system
    return cpu


def read_csv(path: pathlib.Path) -> list[dict[str, str]]:
    """Rows of a CSV as dicts of strings ([] if the file does not exist)."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path: pathlib.Path, rows: Iterable[Mapping[str, Any]],
              fieldnames: Sequence[str]) -> pathlib.Path:
    """Write ``rows`` (a fresh file)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fieldnames))
        writer.writeheader()
        for row in rows:
            writer.writerow(dict(row))
    return path


def append_csv_row(path: pathlib.Path, row: Mapping[str, Any], fieldnames: Sequence[str]) -> None:
    """Append one row (header first if the file is new), flushed at once.

    A sweep appends after every run, so a killed sweep loses at most the run
    in progress and resumes from the rest.
    """
    new = not path.is_file() or path.stat().st_size == 0
    if not new:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if header != list(fieldnames):
            raise ValueError(
                f"{path} has columns {header}, this script writes {list(fieldnames)}; "
                "move the old file aside (or pass another --out)"
            )
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fieldnames))
        if new:
            writer.writeheader()
        writer.writerow(dict(row))
        f.flush()
        os.fsync(f.fileno())


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and population std of the finite values (nan, nan if none)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return float("nan"), float("nan")
    mean = sum(finite) / len(finite)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite))


def format_mean_std(mean: float, std: float, digits: int = 1) -> str:
    if not math.isfinite(mean):
        return "n/a"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError("the experiments plot with matplotlib: pip install 'ppo-async[plot]'") from error
    return plt


def real_chunks(config, program, params) -> list:
    """One `Experience` per actor (host arrays), collected with ``params`` as a run would."""
    import jax

    from ppo_async.runtime.messages import Experience

    cpu = jax.devices("cpu")[0]
    carry = program.reset(jax.random.key(0), cpu)
    experiences = []
    for actor_id in range(config.num_actors):
        carry, trajectory, bootstrap_obs, bootstrap_value = program.rollout(params, carry)
        experiences.append(Experience(actor_id, 0, *jax.device_get(
            (trajectory, bootstrap_obs, bootstrap_value)), env_carry=carry))
    return experiences


def one_real_batch(config):
    """``(program, host params, numpy Batch)``: one chunk per actor, collected as a run would.

    The benchmarks time the learner's pieces on this batch, away from the
    running system.
    """
    import jax

    from ppo_async.envs.backends import make_actor_program
    from ppo_async.runtime.learner import stack_experiences

    program = make_actor_program(config)
    params = jax.device_put(program.params_template, jax.devices("cpu")[0])
    return program, params, stack_experiences(real_chunks(config, program, params))


def finished_sweep_runs(sweep_dir: pathlib.Path) -> list[dict[str, Any]]:
    """The finished runs of a sweep directory (`ppo_async.sweep`): for each ``done`` row of its
    ``runs.csv``, the row (grid fields, ``seed``, the worker's ``wall_time_s``, ...) and the
    loaded run directory under ``"run_data"`` (`ppo_async.runs.analysis.load_run`: metrics per
    update, ``wall_time_s`` of the learner among them)."""
    from ppo_async.runs.analysis import load_run

    return [{**row, "run_data": load_run(sweep_dir / row["run"])}
            for row in read_csv(sweep_dir / "runs.csv") if row["status"] == "done"]


def steady_rate(env_steps: Sequence[float], wall_time_s: Sequence[float]) -> float:
    """Env steps per second of a run's metrics from the first update at or past a quarter of
    its env steps (start-up and compiles left out) to its last; NaN with fewer than two."""
    total = env_steps[-1] if len(env_steps) else 0
    first = next((i for i, steps in enumerate(env_steps) if steps >= total / 4), 0)
    first = max(0, min(first, len(env_steps) - 2))
    if len(env_steps) < 2 or wall_time_s[-1] <= wall_time_s[first]:
        return math.nan
    return float((env_steps[-1] - env_steps[first]) / (wall_time_s[-1] - wall_time_s[first]))


def value_at(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """``ys`` at the last point whose ``xs`` is at most ``x`` (a curve read at ``x`` as it
    stood then: NaN before its first point)."""
    last = math.nan
    for xi, yi in zip(xs, ys):
        if xi > x:
            break
        last = float(yi)
    return last
