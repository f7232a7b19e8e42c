"""MuJoCo side by side: the runtime against cleanrl, stable-baselines3 and sample-factory.

Every library trains the same task with the same settings: gymnasium's
``Hopper-v5`` or ``Walker2d-v5``, 2048 env steps per update, 10 epochs x 32
minibatches of 64, lr 3e-4 annealed to 0, gamma 0.99, GAE lambda 0.95, clip
0.2 (ratio and value), no entropy bonus, observations and rewards (returns, for
sample-factory) normalized, separate 64x64 tanh actor and critic:

- ``cleanrl``: ``ppo_continuous_action.py`` from cleanrl 1.2.0's wheel, its
  defaults (1 env x 2048 steps), through ``cleanrl_bridge.py`` (what was
  bridged for gymnasium 1.x is listed there);
- ``sb3``: stable-baselines3's ``PPO``, 1 env x 2048 steps (``run_sb3.py``);
- ``sample_factory``: sample-factory's APPO, asynchronous, 2 rollout workers x
  4 envs (``run_sample_factory.py``);
- ``ppo_async``: the runtime's ``hopper`` / ``walker2d`` preset as it is, 2
  actor processes x 4 envs x 256 steps (``run_ppo_async.py``).

Each run is a fresh process of that library's own venv
(``experiments/peers/.venvs/<library>/``, made by ``make_venvs.sh``; the
runtime runs in the interpreter running this script, the project's venv), in
a process group of its own that is killed when it ends or times out. None of
the peers is a dependency of the package.

``--torch-threads``: ``default`` runs each library as it starts (torch's
intra-op pool at its default size: 2 threads on 2 cores; sample-factory sets 1
in its own processes whatever is asked); ``1`` sets ``OMP_NUM_THREADS=1`` and
``MKL_NUM_THREADS=1`` for the run and ``torch.set_num_threads(1)`` in it; for
the runtime, which has no torch, ``1`` means XLA's single-threaded CPU ops
(``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false``).

Two parts, scheduled apart (``--parts``):

- ``rate``: ``--rate-env-steps`` (100k) per run, runs one at a time, libraries
  alternating within each (seed, env, threads) so that load drifts spread
  over all. The steady rate: env steps over wall time from the first update
  mark at or past ``--warmup-fraction`` (a quarter) of the budget to the last
  (start-up, imports and the runtime's compiles excluded, as in
  ``common.steady_span``). A mark is taken once per update, after the update's
  env steps were trained on: cleanrl's ``charts/SPS`` scalar (written after
  each update's epochs), sb3's rollout start and training end callbacks,
  sample-factory's ``learner_env_steps`` report after each training iteration,
  the runtime's ``on_update``.
- ``return``: ``--return-env-steps`` (1M) per run, the training return at the
  end: the mean undiscounted return of the last 100 finished training
  episodes (the figure cleanrl reports). At one thread unless
  ``--torch-threads`` says otherwise: the thread setting does not change what
  is learnt, and one thread keeps two runs at once from oversubscribing 2
  cores. Not timed, so ``--jobs 2`` runs two at once.

Writes under ``experiments/out/peers/`` (or ``--out``): ``runs.csv`` (a row per
run, appended as each ends; a rerun skips the runs it holds, so a killed
schedule resumes), ``raw/<run>.json`` (each run's marks, returns and package
versions), ``logs/<run>.log`` (its output), ``summary.json`` (both tables,
every row, the machine and load, the command), and prints the tables: steady
rates with the runtime's default rate over each, and returns beside the
peers' mean.

    bash experiments/peers/make_venvs.sh
    # 4 libraries x 2 envs x 3 seeds x 2 thread settings, 100k env steps each:
    .venv/bin/python experiments/peers/run_peers.py --parts rate
    # 4 libraries x 2 envs x 3 seeds at one thread, 1M env steps each, two at once:
    .venv/bin/python experiments/peers/run_peers.py --parts return --jobs 2
    # a smoke run, and a list of the runs with their commands:
    .venv/bin/python experiments/peers/run_peers.py --library sb3 ppo_async --env Hopper-v5 \
        --seeds 1 --parts rate --total-env-steps 4096
    .venv/bin/python experiments/peers/run_peers.py --dry-run
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import common  # noqa: E402

LIBRARIES = ("cleanrl", "sb3", "sample_factory", "ppo_async")
PEERS = LIBRARIES[:-1]
ENVS = ("Hopper-v5", "Walker2d-v5")
THREADS = ("1", "default")
PARTS = ("rate", "return")
VENVS = HERE / ".venvs"
CHILD_SCRIPTS = {"cleanrl": "cleanrl_bridge.py", "sb3": "run_sb3.py",
                 "sample_factory": "run_sample_factory.py", "ppo_async": "run_ppo_async.py"}
SINGLE_THREAD_XLA_FLAG = "--xla_cpu_multi_thread_eigen=false"
FIELDS = ("part", "library", "env_id", "seed", "torch_threads", "total_env_steps", "env_steps",
          "steady_env_steps_per_s", "steady_from_env_steps", "final_return", "episodes",
          "wall_time_s", "jobs", "load_average_1_min_before", "load_average_1_min_after",
          "versions")


def run_name(part: str, library: str, env_id: str, seed: int, threads: str, steps: int) -> str:
    """The name of one run's files: ``rate_sb3_Hopper-v5_s0_t1_100000``."""
    return f"{part}_{library}_{env_id}_s{seed}_t{threads}_{steps}"


def python_for(library: str) -> pathlib.Path:
    """The interpreter a library's runs use: its venv's, or this one for the runtime."""
    if library == "ppo_async":
        return pathlib.Path(sys.executable)
    return VENVS / library / "bin" / "python"


def missing_venvs(libraries: Sequence[str]) -> list[str]:
    """The peers among ``libraries`` whose venv ``make_venvs.sh`` has not completed."""
    return [lib for lib in libraries
            if lib != "ppo_async" and not (VENVS / lib / ".complete").is_file()]


def child_command(library: str, env_id: str, seed: int, threads: str, steps: int,
                  result: pathlib.Path) -> list[str]:
    return [str(python_for(library)), str(HERE / CHILD_SCRIPTS[library]), "--result", str(result),
            "--env", env_id, "--seed", str(seed), "--total-env-steps", str(steps),
            "--torch-threads", threads]


def child_environment(library: str, threads: str,
                      base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a run: ``base`` (this process's) with the thread setting applied.

    ``default`` drops any thread cap inherited from here; ``1`` sets OpenMP's and
    MKL's to one thread, and for the runtime XLA's single-threaded CPU ops.
    """
    env = dict(os.environ if base is None else base)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if f != SINGLE_THREAD_XLA_FLAG]
    if threads == "1":
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        if library == "ppo_async":
            flags.append(SINGLE_THREAD_XLA_FLAG)
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    if library != "ppo_async":  # the peers' venvs hold their own packages only
        env.pop("PYTHONPATH", None)
    return env


def steady_rate(marks: Sequence[Sequence[float]], total_env_steps: int,
                warmup_fraction: float = 0.25) -> tuple[float, int]:
    """``(env steps/s, env steps at the first mark used)`` from per-update marks ``(s, steps)``.

    From the first mark at or past ``warmup_fraction`` of ``total_env_steps``
    (clamped to the second-last mark, for runs too short to have one) to the
    last mark; NaN with fewer than two marks.
    """
    marks = sorted((float(t), int(s)) for t, s in marks)
    if len(marks) < 2:
        return math.nan, 0
    first = next((i for i, (_, steps) in enumerate(marks)
                  if steps >= warmup_fraction * total_env_steps), len(marks) - 1)
    first = min(first, len(marks) - 2)
    (t0, s0), (t1, s1) = marks[first], marks[-1]
    return ((s1 - s0) / (t1 - t0) if t1 > t0 else math.nan), s0


def run_child(command: Sequence[str], env: Mapping[str, str], log: pathlib.Path,
              timeout_s: float) -> int:
    """Run ``command`` in a process group of its own, output to ``log``; its exit code.

    The group is killed when the command ends or times out: sample-factory's
    worker processes (and multiprocessing's resource tracker) would otherwise
    outlive a failed or killed run.
    """
    with open(log, "w") as out, tempfile.TemporaryDirectory(prefix="peers_run_") as cwd:
        # cwd: cleanrl writes its TensorBoard files under runs/ where it is started
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=dict(env),
                                   cwd=cwd, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = -signal.SIGKILL
            out.write(f"\nrun_peers: killed after {timeout_s:.0f} s\n")
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
    return code


def measure(part: str, library: str, env_id: str, seed: int, threads: str, steps: int,
            out: pathlib.Path, warmup_fraction: float, jobs: int,
            timeout_s: float) -> dict[str, Any]:
    """One run in a fresh process of the library's venv: its row of ``runs.csv``."""
    name = run_name(part, library, env_id, seed, threads, steps)
    result_path, log = out / "raw" / f"{name}.json", out / "logs" / f"{name}.log"
    result_path.unlink(missing_ok=True)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    code = run_child(child_command(library, env_id, seed, threads, steps, result_path),
                     child_environment(library, threads), log, timeout_s)
    if code != 0 or not result_path.is_file():
        tail = log.read_text()[-3000:] if log.is_file() else ""
        raise RuntimeError(f"{name} failed (exit code {code}); the end of {log}:\n{tail}")
    result = json.loads(result_path.read_text())
    rate, rate_from = steady_rate(result["marks"], steps, warmup_fraction)
    return dict(part=part, library=library, env_id=env_id, seed=seed, torch_threads=threads,
                total_env_steps=steps, env_steps=result["env_steps"],
                steady_env_steps_per_s=rate, steady_from_env_steps=rate_from,
                final_return=result["final_return"], episodes=result["episodes"],
                wall_time_s=time.perf_counter() - start, jobs=jobs,
                load_average_1_min_before=load_before,
                load_average_1_min_after=os.getloadavg()[0],
                versions=json.dumps(result["versions"], sort_keys=True))


def planned_runs(args) -> list[tuple]:
    """``(part, library, env, seed, threads, steps)`` of every run asked for, in run order:
    for the rate, seeds outermost and the libraries alternating innermost."""
    runs = []
    for part in args.parts:
        steps = args.rate_env_steps if part == "rate" else args.return_env_steps
        thread_settings = args.torch_threads or (THREADS if part == "rate" else ("1",))
        for seed in range(args.seeds):
            for env_id in args.env:
                for threads in thread_settings:
                    runs += [(part, library, env_id, seed, threads, steps)
                             for library in args.library]
    return runs


def row_key(row: Mapping[str, Any]) -> tuple:
    return (row["part"], row["library"], row["env_id"], int(row["seed"]),
            str(row["torch_threads"]), int(row["total_env_steps"]))


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The rate and return tables from ``runs.csv`` rows (strings or numbers).

    Rates: mean ± std over the rate part's runs of each (env, library,
    threads), and the runtime's default mean rate on that env over it. Returns:
    mean ± std over the return part's runs of each (env, library, env steps),
    whatever their thread setting (threads do not change what is learnt), and
    per env the peers' mean: the mean of the peers' means.
    """
    rates, returns = [], []
    by_env_default: dict[str, float] = {}
    for env_id in ENVS:
        default = [_number(r["steady_env_steps_per_s"]) for r in rows
                   if r["part"] == "rate" and r["env_id"] == env_id
                   and r["library"] == "ppo_async" and str(r["torch_threads"]) == "default"]
        by_env_default[env_id] = common.mean_std(default)[0]
        for library in LIBRARIES:
            for threads in THREADS:
                runs = [r for r in rows if r["part"] == "rate" and r["env_id"] == env_id
                        and r["library"] == library and str(r["torch_threads"]) == threads]
                if not runs:
                    continue
                mean, std = common.mean_std(_number(r["steady_env_steps_per_s"]) for r in runs)
                rates.append(dict(
                    env_id=env_id, library=library, torch_threads=threads, runs=len(runs),
                    env_steps_per_s=mean, env_steps_per_s_std=std,
                    load_average_1_min=common.mean_std(
                        _number(r["load_average_1_min_before"]) for r in runs)[0],
                    ppo_async_default_over_this=by_env_default[env_id] / mean
                    if mean > 0 else math.nan))
        peer_means = []
        for library in LIBRARIES:
            for steps in sorted({int(r["total_env_steps"]) for r in rows
                                 if r["part"] == "return" and r["env_id"] == env_id
                                 and r["library"] == library}):
                runs = [r for r in rows if r["part"] == "return" and r["env_id"] == env_id
                        and r["library"] == library and int(r["total_env_steps"]) == steps]
                mean, std = common.mean_std(_number(r["final_return"]) for r in runs)
                returns.append(dict(env_id=env_id, library=library, total_env_steps=steps,
                                    runs=len(runs), final_return=mean, final_return_std=std))
                if library in PEERS:
                    peer_means.append(mean)
        if peer_means:
            returns.append(dict(env_id=env_id, library="peers' mean", total_env_steps="",
                                runs="", final_return=common.mean_std(peer_means)[0],
                                final_return_std=math.nan))
    return {"rates": rates, "returns": returns}


def tables(summary: Mapping[str, Any]) -> str:
    """Both tables of `summarize` in markdown."""
    def ratio(value: float) -> str:
        return f"{value:.2f}x" if math.isfinite(value) else "n/a"

    rate_table = common.markdown_table(
        ["env", "library", "torch threads", "steady env steps/s", "runs", "load (1 min)",
         "ppo_async default / this"],
        [[r["env_id"], r["library"], r["torch_threads"],
          common.format_mean_std(r["env_steps_per_s"], r["env_steps_per_s_std"], 0), r["runs"],
          f"{r['load_average_1_min']:.2f}", ratio(r["ppo_async_default_over_this"])]
         for r in summary["rates"]])
    return_table = common.markdown_table(
        ["env", "library", "env steps", "training return (last 100 episodes)", "runs"],
        [[r["env_id"], r["library"], f"{r['total_env_steps']:,}" if r["total_env_steps"] else "",
          common.format_mean_std(r["final_return"], r["final_return_std"])
          if math.isfinite(r["final_return_std"]) else f"{r['final_return']:.1f}", r["runs"]]
         for r in summary["returns"]])
    return "\n\n".join(table for table, rows in ((rate_table, summary["rates"]),
                                                 (return_table, summary["returns"])) if rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", nargs="+", choices=LIBRARIES, default=list(LIBRARIES),
                        help="which libraries run (default: all four)")
    parser.add_argument("--env", nargs="+", choices=ENVS, default=list(ENVS), help="which tasks")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 of each run")
    parser.add_argument("--torch-threads", nargs="+", choices=THREADS, default=None,
                        help="thread settings, each a run of its own (default: both for the "
                             "rate, 1 for the return)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="rate: short runs for the steady rate; return: the return at the end")
    parser.add_argument("--rate-env-steps", type=int, default=100_000,
                        help="env steps of a rate run")
    parser.add_argument("--return-env-steps", type=int, default=1_000_000,
                        help="env steps of a return run")
    parser.add_argument("--total-env-steps", type=int, default=None,
                        help="both budgets at once (for a smoke run)")
    parser.add_argument("--warmup-fraction", type=float, default=0.25,
                        help="the steady rate starts at the first update past this share of a run")
    parser.add_argument("--jobs", type=int, default=1,
                        help="return runs at once (rate runs always run one at a time)")
    parser.add_argument("--timeout-s", type=float, default=6 * 3600, help="limit of one run")
    parser.add_argument("--out", default=None, help="default experiments/out/peers/")
    parser.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    args = parser.parse_args(argv)
    if args.total_env_steps is not None:
        args.rate_env_steps = args.return_env_steps = args.total_env_steps
    if args.seeds < 1 or args.jobs < 1 or not 0 <= args.warmup_fraction < 1:
        parser.error("--seeds and --jobs must be >= 1, --warmup-fraction in [0, 1)")
    missing = missing_venvs(args.library)
    if missing and not args.dry_run:
        parser.error(f"no venv for {', '.join(missing)}: run bash experiments/peers/make_venvs.sh")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = common.out_dir("peers", args.out)
    done = {row_key(row) for row in common.read_csv(out / "runs.csv")}
    todo = [run for run in planned_runs(args) if run not in done]
    if args.dry_run:
        for run in todo:
            command = child_command(*run[1:], result=out / "raw" / f"{run_name(*run)}.json")
            print(f"{run_name(*run)}: {shlex.join(command)}")
        print(f"{len(todo)} runs to do, {len(planned_runs(args)) - len(todo)} done")
        return {"todo": todo}
    (out / "raw").mkdir(exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    load_before = os.getloadavg()[0]
    write_lock = threading.Lock()  # --jobs: rows end from two threads

    def one(run: tuple, jobs: int) -> dict[str, Any]:
        row = measure(*run, out=out, warmup_fraction=args.warmup_fraction, jobs=jobs,
                      timeout_s=args.timeout_s)
        with write_lock:
            common.append_csv_row(out / "runs.csv", row, FIELDS)
            print(f"{run_name(*run)}: {row['steady_env_steps_per_s']:.0f} env steps/s steady, "
                  f"return {row['final_return']:.1f} after {row['env_steps']} steps "
                  f"({row['wall_time_s']:.0f} s, load {row['load_average_1_min_before']:.2f})",
                  flush=True)
        return row

    for run in [run for run in todo if run[0] == "rate"]:
        one(run, 1)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(one, run, args.jobs): run for run in todo if run[0] == "return"}
        for future in concurrent.futures.as_completed(futures):
            if future.exception() is not None:  # the others go on; reported at the end
                print(future.exception(), file=sys.stderr, flush=True)
                failed.append(run_name(*futures[future]))

    rows = common.read_csv(out / "runs.csv")
    summary = summarize(rows)
    print()
    print(tables(summary))
    command = shlex.join(["python", "experiments/peers/run_peers.py", *argv])
    load_after = os.getloadavg()[0]
    common.write_json(out / "summary.json", {
        **summary, "runs": rows, "warmup_fraction": args.warmup_fraction,
        "load_average_before": load_before, "load_average_after": load_after,
        "machine": common.machine_info(), "command": command})
    print(f"load average: {load_before:.2f} before, {load_after:.2f} after")
    print(f"\nreproduce (from the repo root): {command}")
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")
    return summary


if __name__ == "__main__":
    main()
