"""Running a sweep: plan it (`plan_sweep`), run its jobs on a pool of workers, record each run.

`run_sweep` (a pandas DataFrame) and `execute_sweep` (row dicts, what
``ppo-async sweep`` prints) write ``sweep.toml``, keep ``runs.csv`` current as
runs start and end, and write the summary. Ctrl-C stops every worker and
raises `SweepInterrupted` with the command that continues.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ppo_async.config import ConfigError
from ppo_async.runs.run_dir import write_atomically
from ppo_async.runs.run_lock import RunLock
from ppo_async.sweep.pools import Finished, Job, LocalPool, RayPool, job_message, make_jobs
from ppo_async.sweep.spec import SWEEP_FILE, SweepRun, SweepSpec, load_sweep, point_label
from ppo_async.sweep.table import RunsTable, finished_figures, run_state, write_summary

BACKENDS = ("local", "ray")
POLL_S = 0.2


class SweepWarning(UserWarning):
    """More workers than the cores hold, and similar advice that does not stop the sweep."""


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the sweep: ``finished`` of ``total`` runs done; ``command`` continues it."""

    def __init__(self, finished: int, total: int, command: str):
        super().__init__(f"sweep stopped: {finished} of {total} runs finished; "
                         f"continue with: {command}")
        self.finished, self.total, self.command = finished, total, command


# --- planning a sweep -------------------------------------------------------------------------


def default_workers(jobs: Sequence[Job], cpus: int | None = None) -> int:
    """As many workers as the cores hold: ``cpu_count // threads of the largest job``, >= 1."""
    cpus = cpus or os.cpu_count() or 1
    return max(1, cpus // max((job.threads() for job in jobs), default=1))


def _checked_workers(workers: int | None, jobs: Sequence[Job], backend: str) -> int | None:
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ConfigError(f"--workers {workers!r}: must be an integer >= 1")
    if backend == "ray":
        return workers  # Ray places the tasks by their CPUs; workers only caps those in flight
    cpus = os.cpu_count() or 1
    if workers is None:
        threads = max((job.threads() for job in jobs), default=1)
        if cpus < threads and len(jobs) > 1:  # default_workers rounds the 0 up to 1
            warnings.warn(
                f"{len(jobs)} runs one at a time: a run keeps {threads} threads busy (its "
                f"learner and actors) and this machine has {cpus} cores, so two at once would "
                "slow each other down (--workers N runs N at once all the same)",
                SweepWarning, stacklevel=3)
        return default_workers(jobs, cpus)
    at_once = min(workers, len(jobs))
    threads = at_once * max((job.threads() for job in jobs), default=1)
    if at_once > default_workers(jobs, cpus):
        warnings.warn(
            f"--workers {workers}: {at_once} runs at once, up to {threads} threads of actors "
            f"and learners on "
            f"{cpus} cores; runs will slow each other down (the default is "
            f"{default_workers(jobs)})", SweepWarning, stacklevel=3)
    return workers


def _check_twin(runs: Sequence[SweepRun], spec: SweepSpec) -> None:
    from ppo_async.envs.registry import env_backend

    for run in runs:
        label = point_label(run.point) or "(base)"
        if not env_backend(run.config.env_id).runs_in_twin:
            raise ConfigError(f"{spec.source}, grid point {label}: --twin runs gymnax envs only "
                              f"(backends whose envs jit), not env_id={run.config.env_id!r}; "
                              "run it without --twin")
        if run.config.exact_lag is None:
            raise ConfigError(
                f"{spec.source}, grid point {label}: --twin simulates an exact policy lag; "
                "free-running actors (max_lead_steps without exact_policy_lag) have none. "
                "Run it without --twin, or set exact_policy_lag")


def _check_sweep_dir(spec: SweepSpec, out: pathlib.Path) -> None:
    """Refuse a directory that holds another sweep (another preset or [base])."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r}: exists and is not a directory")
    recorded = out / SWEEP_FILE
    if not recorded.is_file():
        return
    old = load_sweep(recorded)
    if old.base_config().to_dict() != spec.base_config().to_dict():
        raise ConfigError(
            f"--out {str(out)!r} holds another sweep ({recorded} starts from another preset or "
            "[base]): its run names would not say what differs. Sweep into another directory, "
            "or keep the preset and [base] and change only [grid], [[points]] and seeds")


class SweepPlan(NamedTuple):
    """What a sweep would do: every run and its state in the directory (`run_state`)."""

    spec: SweepSpec
    runs: list[SweepRun]
    states: dict[str, str]  # run name -> done | resume | fresh | restart


def plan_sweep(sweep: str | os.PathLike | Mapping[str, Any] | SweepSpec,
               out: str | os.PathLike, *, twin: bool = False) -> SweepPlan:
    """Load and validate the sweep, check the directory, and find each run's state; writes nothing."""
    spec = load_sweep(sweep)
    out = pathlib.Path(out)
    runs = spec.runs()
    if twin:
        _check_twin(runs, spec)
    _check_sweep_dir(spec, out)
    return SweepPlan(spec, runs, {run.name: run_state(out / run.name) for run in runs})


def continue_command(sweep: Any, out: pathlib.Path, *, workers: int | None, backend: str,
                     ray_address: str | None, twin: bool) -> str:
    """The ``ppo-async sweep`` command that continues this sweep."""
    path = sweep if isinstance(sweep, (str, os.PathLike)) else out / SWEEP_FILE
    argv = ["ppo-async", "sweep", str(path), "--out", str(out)]
    argv += ["--workers", str(workers)] if workers is not None else []
    argv += ["--backend", backend] if backend != "local" else []
    argv += ["--ray-address", ray_address] if ray_address else []
    argv += ["--twin"] if twin else []
    return shlex.join(argv)


# --- running a sweep --------------------------------------------------------------------------


def execute_sweep(sweep: str | os.PathLike | Mapping[str, Any] | SweepSpec,
                  out: str | os.PathLike, *, workers: int | None = None, backend: str = "local", ray_address: str | None = None,
                  twin: bool = False, progress: bool = True) -> list[dict[str, Any]]:
    """`run_sweep` without pandas: the summary as a list of row dicts (what the CLI prints)."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}: must be one of {', '.join(BACKENDS)}")
    if ray_address is not None and backend != "ray":
        raise ConfigError("--ray-address needs --backend ray")
    out = pathlib.Path(out)
    plan = plan_sweep(sweep, out, twin=twin)
    pending = [run for run in plan.runs if plan.states[run.name] != "done"]
    jobs = make_jobs(pending, twin)
    workers = _checked_workers(workers, jobs, backend)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / SWEEP_FILE, plan.spec.to_toml().encode())
    table = RunsTable(out, plan.runs, plan.spec.fields())
    for run in pending:
        if plan.states[run.name] == "restart":  # no checkpoint to resume from: start again
            with RunLock(out / run.name):  # refused if another process is writing it
                shutil.rmtree(out / run.name)
        table.set(run.name, status="pending")
    table.write()
    command = continue_command(sweep, out, workers=workers if backend == "local" else None,
                               backend=backend, ray_address=ray_address, twin=twin)
    if not jobs:  # every run is done: no worker, no Ray instance
        warnings.warn(f"all {len(plan.runs)} runs in {out} are done already: skipped them all, "
                      "trained nothing (the summary is of the runs as they are; delete a run's "
                      "directory to train it again)", SweepWarning, stacklevel=2)
        return write_summary(out, table)
    pool = RayPool(ray_address) if backend == "ray" else LocalPool(out)
    try:
        if isinstance(pool, RayPool):
            pool.check_fits(jobs)
        _execute(plan.spec, out, jobs, pool, table, workers, progress, command)
    finally:
        pool.close()
        table.write()
        summary = write_summary(out, table)
    return summary


def _execute(spec: SweepSpec, out: pathlib.Path, jobs: Sequence[Job], pool: Any, table: RunsTable,
             workers: int | None, progress: bool, command: str) -> None:
    """Start jobs as workers free up; record each as it ends; on Ctrl-C stop every worker."""
    from ppo_async.runs.run_log import progress_bar

    total = len(table.rows)
    bar = progress_bar(total, table.count("done"), "sweep", unit="run") if progress else None
    waiting = list(jobs)

    def record(outcomes: Sequence[Finished]) -> None:
        for outcome in outcomes:
            _record(out, table, outcome)
        if outcomes:
            table.write()
            if bar is not None:
                bar.update(sum(len(o.job.runs) for o in outcomes))
                bar.set_postfix(running=sum(len(j.runs) for j in _running_jobs(pool)),
                                failed=table.count("failed"))

    try:
        while waiting or pool.running:
            while waiting and (workers is None or len(pool.running) < workers):
                job = waiting.pop(0)
                for run in job.runs:
                    table.set(run.name, status="running")
                pool.start(job, job_message(spec, out, job))
                table.write()
            record(pool.finished(POLL_S))
    except KeyboardInterrupt:
        record(pool.stop())
        table.write()
        raise SweepInterrupted(table.count("done"), total, command) from None
    finally:
        if bar is not None:
            bar.close()


def _running_jobs(pool: Any) -> list[Job]:
    return [entry[0] for entry in pool.running.values()]


def _record(out: pathlib.Path, table: RunsTable, outcome: Finished) -> None:
    """A finished job's runs in the table: done (their ``summary.json``), interrupted or failed."""
    for run in outcome.job.runs:
        table.add_wall_time(run.name, outcome.seconds)
        if run_state(out / run.name) == "done":
            table.set(run.name, status="done", error="", **finished_figures(out / run.name))
        elif outcome.interrupted:
            table.set(run.name, status="interrupted", error="")
        else:
            table.set(run.name, status="failed",
                      error=outcome.error or "the worker ended without finishing the run")


def run_sweep(sweep: str | os.PathLike | Mapping[str, Any] | SweepSpec, out: str | os.PathLike,
              *, workers: int | None = None, backend: str = "local",
              ray_address: str | None = None, twin: bool = False, dry_run: bool = False,
              progress: bool = True):
    """Run a sweep into ``out``; its summary as a pandas DataFrame, one row per grid point.

    Args:
      sweep: a sweep file (TOML, or YAML with pyyaml), a dict of the same
        table (``{"seeds": [0, 1], "base": {...}, "grid": {...}}``), or a `SweepSpec`.
      out: the sweep directory (made if missing); the same call again continues it.
      workers: runs at once (``local``: default `default_workers`; ``ray``: default
        every run, placed by its CPUs).
      backend: ``"local"`` (a process per run) or ``"ray"`` (a Ray task per run).
      ray_address: a Ray cluster to run on (default: a private local instance).
      twin: train all seeds of a grid point in one vmapped synchronous twin (gymnax envs).
      dry_run: check everything and return the runs (name, grid values, seed,
        state) without writing or training anything.
      progress: show a progress bar of the sweep (runs done, running, failed, time left).

    Raises `ConfigError` for a bad sweep (before anything runs), and
    `SweepInterrupted` on Ctrl-C. A run that fails does not raise: the
    summary's ``failed`` column counts it and ``runs.csv`` holds its error.
    Needs pandas for the DataFrame (``ppo-async sweep`` needs none).
    """
    import pandas as pd

    if dry_run:
        plan = plan_sweep(sweep, out, twin=twin)
        return pd.DataFrame([{"run": run.name, **run.point, "seed": run.seed,
                              "state": plan.states[run.name]} for run in plan.runs])
    summary = execute_sweep(sweep, out, workers=workers, backend=backend,
                            ray_address=ray_address, twin=twin, progress=progress)
    return pd.DataFrame(summary)
