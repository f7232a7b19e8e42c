"""The workers that train a sweep's jobs: local processes (`LocalPool`) or Ray tasks (`RayPool`).

A job is one run, or (``twin``) the pending seeds of one grid point; a worker
rebuilds the runs' configs from the sweep's table (`job_message`) and trains
them (`run_job`). Both pools start jobs, report those that ended
(`Finished`), and stop every worker on Ctrl-C so that asynchronous runs
checkpoint first.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ppo_async.config import ConfigError
from ppo_async.errors import one_line
from ppo_async.runs.run_dir import ERROR_FILE, write_atomically
from ppo_async.sweep.spec import MAX_LABEL, NAME_CHARS, SweepRun, SweepSpec, point_label
from ppo_async.sweep.table import run_state

LOGS_SUBDIR = "logs"
# A stopped asynchronous run writes a checkpoint before it exits; a twin job
# cannot be interrupted inside its one XLA call and has nothing to save.
STOP_TIMEOUT_S = 120.0
TWIN_STOP_TIMEOUT_S = 5.0
# The last line a worker writes to its log when it fails: the error the table records.
ERROR_PREFIX = "ppo-async sweep worker: "


class Job(NamedTuple):
    """What one worker trains: one run, or (twin) the pending seeds of one grid point."""

    name: str  # the log's name: the run's, or the grid point's
    runs: list[SweepRun]
    twin: bool

    def threads(self) -> int:
        """Threads one run keeps busy: the learner, each actor, the evaluator; a twin job: one."""
        if self.twin:
            return 1
        config = self.runs[0].config
        return 1 + config.num_actors + (1 if config.eval_every_updates else 0)


def make_jobs(pending: Sequence[SweepRun], twin: bool) -> list[Job]:
    if not twin:
        return [Job(run.name, [run], False) for run in pending]
    by_point: dict[str, list[SweepRun]] = {}
    for run in pending:
        by_point.setdefault(point_label(run.point) or "base", []).append(run)
    return [Job(NAME_CHARS.sub("_", label)[:MAX_LABEL] + "-twin", runs, True)
            for label, runs in by_point.items()]


def job_message(spec: SweepSpec, out: pathlib.Path, job: Job) -> dict[str, Any]:
    """A job as JSON: the sweep's table and the runs' names (the worker rebuilds the configs)."""
    return dict(sweep=spec.to_table(), source=spec.source, out=str(out), twin=job.twin,
                runs=[run.name for run in job.runs])


def run_job(message: Mapping[str, Any]) -> None:
    """Train one job's runs (`job_message`), in this process: a worker's whole work."""
    spec = SweepSpec.from_table(message["sweep"], message["source"])
    out = pathlib.Path(message["out"])
    by_name = {run.name: run for run in spec.runs()}
    runs = [by_name[name] for name in message["runs"]]
    if message["twin"]:
        from ppo_async.sync import train_twin_runs

        train_twin_runs([(out / run.name, run.config) for run in runs])
        return
    from ppo_async.train import train

    for run in runs:
        run_dir = out / run.name
        resume = run_dir if run_state(run_dir) == "resume" else None
        try:
            train(run.config, run_dir=run_dir, resume_from=resume, progress=False)
        except Exception:
            if run_dir.is_dir():
                write_atomically(run_dir / ERROR_FILE, traceback.format_exc().encode())
            raise


def _worker_main() -> None:
    """A local worker: ``python -c '...' JOB_JSON``; exit 130 when stopped, 1 when it failed."""
    try:
        run_job(json.loads(sys.argv[1]))
    except KeyboardInterrupt as interrupt:
        print(f"{ERROR_PREFIX}interrupted: {interrupt}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except BaseException as error:  # noqa: BLE001 - the log keeps the traceback, the table a line
        traceback.print_exc()
        print(f"{ERROR_PREFIX}{_one_line(error)}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _one_line(error: BaseException) -> str:
    text = one_line(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# The serial XLA scheduler: a vmapped twin can deadlock on a 2-core CPU without it
# (experiments/common.py says why); set before JAX starts in the worker.
TWIN_XLA_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def _worker_env(twin: bool) -> dict[str, str]:
    """A worker's environment: this one's, this process's compilation cache, the twin's flag."""
    from ppo_async.runtime.process_transport import inherited_cache_env

    env = {**os.environ, **inherited_cache_env()}
    if twin and TWIN_XLA_FLAG not in env.get("XLA_FLAGS", "").split():
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {TWIN_XLA_FLAG}".strip()
    return env


class Finished(NamedTuple):
    job: Job
    seconds: float
    error: str | None  # None when the worker returned
    interrupted: bool


class LocalPool:
    """Workers as processes of their own session (Ctrl-C at the terminal reaches only the sweep,
    which passes one SIGINT to each worker, so that no run is interrupted while checkpointing)."""

    def __init__(self, out: pathlib.Path):
        self.logs = out / LOGS_SUBDIR
        self.running: dict[int, tuple[Job, subprocess.Popen, float, pathlib.Path]] = {}

    def start(self, job: Job, message: dict[str, Any]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{job.name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-c",
                 "from ppo_async.sweep.pools import _worker_main; _worker_main()",
                 json.dumps(message)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=_worker_env(job.twin), start_new_session=True)
        self.running[process.pid] = (job, process, time.monotonic(), log_path)

    def finished(self, timeout_s: float) -> list[Finished]:
        deadline = time.monotonic() + timeout_s
        while True:
            done = [pid for pid, (_, process, _, _) in self.running.items()
                    if process.poll() is not None]
            if done or time.monotonic() >= deadline:
                return [self._outcome(pid) for pid in done]
            time.sleep(min(0.05, timeout_s))

    def _outcome(self, pid: int) -> Finished:
        job, process, started, log_path = self.running.pop(pid)
        seconds = time.monotonic() - started
        if process.returncode == 0:
            return Finished(job, seconds, None, False)
        return Finished(job, seconds, _log_error(log_path, process.returncode),
                         process.returncode in (130, -signal.SIGINT))

    def stop(self) -> list[Finished]:
        """SIGINT to every worker, a wait for their checkpoints, then SIGKILL; their outcomes."""
        for _, process, _, _ in self.running.values():
            _signal(process, signal.SIGINT)
        timeout = max((TWIN_STOP_TIMEOUT_S if job.twin else STOP_TIMEOUT_S)
                      for job, _, _, _ in self.running.values()) if self.running else 0.0
        deadline = time.monotonic() + timeout
        for _, process, _, _ in self.running.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(process, signal.SIGKILL)
                process.wait(timeout=10)
        outcomes = [self._outcome(pid) for pid in list(self.running)]
        return [o._replace(interrupted=True) for o in outcomes]

    def close(self) -> None:
        self.stop()


def _signal(process: subprocess.Popen, signum: int) -> None:
    try:
        process.send_signal(signum)
    except ProcessLookupError:  # it ended meanwhile
        pass


def _log_error(log_path: pathlib.Path, returncode: int) -> str:
    """The error line a worker wrote last, or its exit status."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX):]
    return f"worker exited with status {returncode} (its output: {log_path})"


class RayPool:
    """Workers as Ray tasks, each asking for the CPUs of its run's threads."""

    def __init__(self, address: str | None):
        try:
            import ray
        except ImportError:
            raise ConfigError("--backend ray: Ray is not installed; pip install "
                              "'ppo-async[ray]'") from None
        from ppo_async.runtime.ray_transport import connect

        self.ray = ray
        self.connected_here = connect(ray, address)
        self.task = ray.remote(max_retries=0)(run_job)
        self.running: dict[Any, tuple[Job, float]] = {}

    def check_fits(self, jobs: Sequence[Job]) -> None:
        """A job that asks for more CPUs than the cluster has would wait forever: refused."""
        cpus = self.ray.cluster_resources().get("CPU", 0)
        for job in jobs:
            if job.threads() > cpus:
                raise ConfigError(f"--backend ray: run {job.name} needs {job.threads()} CPUs "
                                  f"(learner and actors), the Ray cluster has {cpus:g}")

    def start(self, job: Job, message: dict[str, Any]) -> None:
        from ppo_async.runtime.process_transport import inherited_cache_env

        env_vars = inherited_cache_env()
        if job.twin:
            env_vars["XLA_FLAGS"] = _worker_env(True)["XLA_FLAGS"]
        options: dict[str, Any] = dict(num_cpus=job.threads())
        if env_vars:
            options["runtime_env"] = {"env_vars": env_vars}
        ref = self.task.options(**options).remote(message)
        self.running[ref] = (job, time.monotonic())

    def finished(self, timeout_s: float) -> list[Finished]:
        if not self.running:
            return []
        ready, _ = self.ray.wait(list(self.running), num_returns=len(self.running),
                                 timeout=timeout_s)
        return [self._outcome(ref) for ref in ready]

    def _outcome(self, ref: Any) -> Finished:
        job, started = self.running.pop(ref)
        seconds = time.monotonic() - started
        try:
            self.ray.get(ref, timeout=60)
        except self.ray.exceptions.TaskCancelledError:
            return Finished(job, seconds, "interrupted", True)
        except self.ray.exceptions.RayTaskError as error:
            cause = error.as_instanceof_cause()
            interrupted = isinstance(cause, KeyboardInterrupt)
            return Finished(job, seconds, one_line_cause(error), interrupted)
        except Exception as error:  # noqa: BLE001 - a lost worker, a timeout: recorded
            return Finished(job, seconds, _one_line(error), False)
        return Finished(job, seconds, None, False)

    def stop(self) -> list[Finished]:
        """Cancel every task (a KeyboardInterrupt inside: the run checkpoints), then force."""
        refs = list(self.running)
        for ref in refs:
            self.ray.cancel(ref)
        ready, left = self.ray.wait(refs, num_returns=len(refs), timeout=STOP_TIMEOUT_S) if refs \
            else ([], [])
        for ref in left:
            self.ray.cancel(ref, force=True)
        outcomes = [self._outcome(ref) for ref in refs]
        return [o._replace(interrupted=True) for o in outcomes]

    def close(self) -> None:
        self.stop()
        if self.connected_here:
            self.ray.shutdown()


def one_line_cause(error: Any) -> str:
    """A Ray task's error as the exception the task raised, on one line."""
    cause = getattr(error, "cause", None)
    return _one_line(cause) if isinstance(cause, BaseException) else _one_line(error)
