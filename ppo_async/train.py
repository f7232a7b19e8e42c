"""`train(config)`: decide the layout, wire the actors and the learner; always shut down.

The layout is decided once (`ppo_async.runtime.layout.resolve_layout`) and
pinned into the config. The learner runs in the calling thread (so Ctrl-C
reaches it directly); the actors run where the layout puts them: inside the
learner's own program (`ppo_async.runtime.in_learner`, no transport), daemon
threads of this process (`ppo_async.runtime.transport.ThreadTransport`), actor
processes (`ppo_async.runtime.process_transport.ProcessTransport`) or Ray
processes (`ppo_async.runtime.ray_transport.RayTransport`). Whatever ends the run -- its last
update, an actor's exception, a stuck actor, KeyboardInterrupt -- the
transport stops every actor within ``config.shutdown_timeout_s``, and, with a
run directory, the newest good state is checkpointed before `train` returns or
raises. A finished run writes its final params and summary before it reports
any thread that would not stop. A thread stuck inside an env cannot be killed:
it is named in the error (with where it is stuck) and left behind as a daemon;
a process is killed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import pathlib
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

import flax.serialization
import jax
from jax.sharding import Mesh

from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.core import keys
from ppo_async.core.devices import LearnerPlacement, host_zeros, place, resolve_device
from ppo_async.core.normalization import wrap_params
from ppo_async.core.update import (
    Batch,
    LearnerState,
    LearningRateSchedule,
    UpdateFn,
    default_schedule,
    init_learner_state,
    make_update_fn,
    with_normalization,
)
from ppo_async.envs.backends import make_actor_program
from ppo_async.envs.program import ActorProgram
from ppo_async.networks.actor_critic import init_params
from ppo_async.runs.checkpoint import save_checkpoint
from ppo_async.runs.compile_cache import enable_compilation_cache
from ppo_async.resume import (
    CheckpointPolicy,
    ResumePoint,
    checkpoint_contents,
    load_resume_point,
    params_history_size,
)
from ppo_async.runs.run_dir import (
    ERROR_FILE,
    PARAMS_FILE,
    SUMMARY_FILE,
    append_to_log,
    check_fresh,
    checkpoint_dir,
    prepare_fresh,
    read_segments,
    record_segment,
    remove_stale_temps,
    write_atomically,
    write_json,
)
from ppo_async.runs.run_lock import RunLock
from ppo_async.runs.run_log import RunLog
from ppo_async.runs.wandb_log import WandbSettings
from ppo_async.runtime.actor import EVALUATOR_ID, ActorError, ActorStart, exact_version
from ppo_async.runtime.in_learner import (
    LoopProgram,
    ProgramActors,
    in_learner_loop,
    loop_program,
    lower_loop,
    warm_up_loop,
)
from ppo_async.runtime.layout import Layout, resolve_layout
from ppo_async.runtime.learner import (
    EvalOutcome,
    LearnerConnections,
    LearnerHooks,
    LearnerReport,
    drain_evaluations,
    learner_loop,
    stack_experiences,
)
from ppo_async.runtime.messages import ActorFailure, Experience, take_all
from ppo_async.runtime.supervisor import Supervisor
from ppo_async.runtime.transport import LearnerTransport, ThreadTransport, stop_threads
from ppo_async.runtime.watchdog import FreezeWatchdog

logger = logging.getLogger(__name__)

_WARM_UP_TIMEOUT_S = 600.0  # compiling the update takes seconds; this means it is stuck


class TrainResult(NamedTuple):
    # host (numpy) flax params pytree of the final policy; with normalization, a
    # NormalizedPolicy: its .params and the statistics the policy acts on
    params: Any
    report: LearnerReport


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a KeyboardInterrupt from ``on_update``) stopped the run.

    ``updates`` is the last update completed; with a run directory its state
    was checkpointed (``checkpoint``), and the run resumes with
    ``train(config, resume_from=run_dir)`` or ``ppo-async train --resume RUN_DIR``.
    ``checkpoint`` is None when nothing was saved: no run directory, or no update finished.
    """

    def __init__(self, updates: int, run_dir: pathlib.Path | None,
                 checkpoint: pathlib.Path | None):
        # Not "update 0": it read as if a checkpoint of it could be resumed.
        message = (f"stopped at update {updates}" if updates
                   else "stopped before the first update finished")
        if checkpoint is not None:
            message += f"; resume with: ppo-async train --resume {run_dir}"
        else:
            message += "; nothing was saved" + (" (no run directory)" if run_dir is None else "")
        super().__init__(message)
        self.updates, self.run_dir, self.checkpoint = updates, run_dir, checkpoint


class ShutdownTimeoutError(RuntimeError):
    """Threads that did not stop within ``shutdown_timeout_s`` after a run that finished.

    The run's params and summary were written first; ``result`` holds its
    `TrainResult`. ``threads`` names the threads still running.
    """

    def __init__(self, message: str, threads: list[str], result: TrainResult | None):
        super().__init__(message)
        self.threads, self.result = threads, result


def _make_transport(config: AsyncActorLearnerConfig, program: ActorProgram,
                    actor_device: jax.Device) -> LearnerTransport:
    """The transport of the layout pinned in ``config`` (Ray is imported only when asked for)."""
    if config.actor_backend == "ray":
        from ppo_async.runtime.ray_transport import RayTransport

        return RayTransport(config, program)
    if config.actor_backend == "processes":
        from ppo_async.runtime.process_transport import ProcessTransport

        return ProcessTransport(config, program)
    return ThreadTransport(config, program, actor_device)


def _spawn_evaluator(config: AsyncActorLearnerConfig, program: ActorProgram,
                     channels: LearnerConnections, stop: threading.Event,
                     report_failure: Callable[[ActorFailure], None]) -> threading.Thread:
    """A thread that evaluates each `EvalRequest` put on ``channels.evaluator_queue``.

    It receives the same bytes as the actors, so the learner never waits for
    it; results go back on ``channels.eval_results``, failures to ``report_failure``
    (the transport's or the learner's program's: it stops the run like an actor's). A ``None`` on the
    queue ends it once the evaluations before it are done; ``stop`` ends it
    after the current one.
    """
    from ppo_async.runtime.evaluate import Evaluator

    def run() -> None:
        try:
            # The actors' network and params template; its own envs (any backend's).
            evaluator = Evaluator(config, config.eval_episodes, program=program)
            while not stop.is_set():
                try:
                    message = channels.evaluator_queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                if message is None:
                    return
                # Seeded apart from training, and the same every time, so that
                # changes in the eval return come from the policy alone.
                result = evaluator.evaluate_broadcast(message.broadcast,
                                                      seed=config.seed + 1_000_003)
                channels.eval_results.put(
                    EvalOutcome(message.broadcast.version, message.env_steps, result))
        except BaseException as error:  # noqa: BLE001 - reported, never swallowed
            report_failure(ActorFailure(EVALUATOR_ID, error, traceback.format_exc()))

    thread = threading.Thread(target=run, name="ppo-evaluator", daemon=True)
    thread.start()
    return thread


def _warm_up_batch(config: AsyncActorLearnerConfig, program: ActorProgram) -> Batch | None:
    """Zeros shaped like one learner batch, for compiling the update early.

    Built from ``program.chunk_spec`` (the traced shapes of one chunk) and
    stacked as the learner stacks real chunks. None where the program has no
    spec (host envs, whose rollout steps Python envs): their update compiles
    when the first batch arrives.
    """
    if program.chunk_spec is None:
        return None
    trajectory, bootstrap_obs, bootstrap_value = host_zeros(program.chunk_spec)
    chunk = Experience(0, 0, trajectory, bootstrap_obs, bootstrap_value)
    return stack_experiences([chunk] * config.num_actors)


class _UpdateWarmUp:
    """Compiles the learner's update in a background thread ("ppo-warm-up").

    The update runs once on a zero state and a zero batch of the real shapes,
    on the learner's device, and the result is dropped: what is kept is the
    compiled program in ``update``'s cache. It starts before the initializers
    compile and may run on while the actors compile their first chunk; the
    learner waits for it only before its first update. `result` re-raises
    whatever the thread raised; `join` bounds the wait.

    Given ``actor_device`` (thread actors), it first compiles the placement of
    a broadcast's params there (`ppo_async.core.devices.place`): a program of
    milliseconds alone, that takes up to half a second on an actor's way to
    its first chunk when it compiles beside the update (XLA's compiles wait on each
    other).

    Given ``loop`` (``sampler='learner'``), it compiles that loop instead, by a
    call of no update on that state and fresh carries, traced and lowered in the
    caller's thread before it returns (`ppo_async.runtime.in_learner.lower_loop`)
    and compiled in the thread while the caller builds the run's own state.
    """

    def __init__(
        self, config: AsyncActorLearnerConfig, program: ActorProgram, update: UpdateFn,
        placement: LearnerPlacement, actor_device: jax.Device | None = None,
        loop: LoopProgram | None = None,
    ):
        self._done: concurrent.futures.Future = concurrent.futures.Future()
        # With ``loop`` the update compiles inside the program that collects the chunks.
        batch = _warm_up_batch(config, program) if loop is None else None
        self._thread = None
        if batch is None and loop is None:
            self._done.set_result(None)
            return

        def zero_state() -> LearnerState:
            return placement.put_state(init_learner_state(
                config.update_options(), program.params_template, keys.key(0)))

        # The loop is traced and lowered here, the XLA compile left to the thread.
        lowered = (lower_loop(loop, config, program, zero_state(), placement.device)
                   if loop is not None else None)

        def run() -> None:
            try:
                if lowered is not None:
                    warm_up_loop(lowered)
                else:
                    if actor_device is not None:
                        place(program.params_template, actor_device)
                    jax.block_until_ready(update(zero_state(), placement.put_batch(batch)))
                self._done.set_result(None)
            except BaseException as error:  # re-raised on the caller's thread by result()
                self._done.set_exception(error)

        self._thread = threading.Thread(target=run, name="ppo-warm-up", daemon=True)
        self._thread.start()

    def result(self, timeout_s: float) -> None:
        self._done.result(timeout=timeout_s)

    def before(self, update: UpdateFn) -> UpdateFn:
        """``update`` that waits for the warm-up before its first call.

        The learner meets this wait only once its first batch is ready, so an
        actor that fails during start-up is reported without waiting for the
        compile, and the update is never compiled twice at once.
        """
        waited = False

        def first_waits(state: LearnerState, batch: Batch):
            nonlocal waited
            if not waited:
                self.result(_WARM_UP_TIMEOUT_S)
                waited = True
            return update(state, batch)

        return first_waits

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


def learner_update(config: AsyncActorLearnerConfig, program: ActorProgram,
                   schedule: LearningRateSchedule, mesh: Mesh | None = None) -> UpdateFn:
    """The learner's jitted update as `train` runs it: ``schedule``'s learning rate, the
    normalization statistics folded in where the config normalizes."""
    return with_normalization(
        make_update_fn(config.update_options(), program.network, schedule=schedule, mesh=mesh),
        config.normalization_options())


def initial_learner_state(config: AsyncActorLearnerConfig, program: ActorProgram) -> LearnerState:
    """A fresh run's learner state: the params and optimizer state that ``config.seed`` gives."""
    params_key, learner_key = keys.split(keys.key(config.seed))
    params = wrap_params(init_params(program.network, params_key, program.observation_shape),
                         program.observation_shape, config.normalization_options())
    return init_learner_state(config.update_options(), params, learner_key)


def _summary(report: LearnerReport, not_reproducible: str | None) -> dict[str, Any]:
    """The report as JSON (actor stats as dicts), and whether the run is fixed by its seed."""
    summary = dataclasses.asdict(report)
    summary["policy_lag_counts"] = {str(k): v for k, v in report.policy_lag_counts.items()}
    summary["reproducible"] = not_reproducible is None
    if not_reproducible is not None:
        summary["not_reproducible_because"] = not_reproducible
    return summary


class _Checkpoints:
    """The run's checkpoints: when (`CheckpointPolicy`), what (`checkpoint_contents`),
    and the newest good state, which every way out of the run saves."""

    def __init__(self, config: AsyncActorLearnerConfig, run_dir: pathlib.Path | None,
                 schedule: LearningRateSchedule, published: list[tuple[int, Any]]):
        self.config, self.schedule = config, schedule
        self.directory = checkpoint_dir(run_dir) if run_dir is not None else None
        self.policy = CheckpointPolicy(config.checkpoint_every_updates, config.checkpoint_every_s)
        self.latest: tuple[int, Any, dict[str, int]] | None = None  # (update, tree, counters)
        self.last_path: pathlib.Path | None = None
        # exact_policy_lag: (version, params) of the versions actors may still need
        size = params_history_size(config)
        self.history = collections.deque(published[-size:] if size else (), maxlen=size)

    def after_update(self, state: LearnerState, report: LearnerReport, carries: list) -> None:
        """Called by the learner after each good update: remember it; save it when due."""
        if self.directory is None:
            return
        history = list(self.history)
        if history and len(history) < self.history.maxlen:  # a young run: pad with the oldest
            history = [history[0]] * (self.history.maxlen - len(history)) + history
        self.latest = (report.updates, *checkpoint_contents(state, report, carries, self.schedule,
                                                            history))
        if self.history.maxlen:
            self.history.append((report.updates, state.params))
        if self.policy.due(report.updates):
            self.save_latest()

    def after_call(self, state: LearnerState, report: LearnerReport, carries: list,
                   history: list[tuple[int, Any]]) -> None:
        """`after_update` for ``sampler='learner'``, whose program keeps the versions before
        ``state``'s (``history``, oldest first) where the learner would have seen each."""
        self.history.clear()
        self.history.extend(history)
        self.after_update(state, report, carries)

    def save_latest(self) -> pathlib.Path | None:
        """Write the newest good state unless it is already on disk; the newest checkpoint's path."""
        if self.latest is not None and self.latest[0] != self.policy.last_saved_update:
            updates, tree, counters = self.latest
            self.last_path = save_checkpoint(
                self.directory, step=updates, state=tree, counters=counters,
                config_dict=self.config.to_dict(), keep=self.config.keep_checkpoints,
            )
            self.policy.saved(updates)
        return self.last_path


class _RunDirectories(NamedTuple):
    run_dir: pathlib.Path | None  # where this run writes
    resume_from: pathlib.Path | None  # where it reads its checkpoint
    fresh: bool  # run_dir is a new or empty directory, made only once every check has passed
    lock: RunLock | None  # run_dir's writer lock: taken here if it exists, else by `_open_run`


def _run_directories(
    config: AsyncActorLearnerConfig, run_dir: str | pathlib.Path | None,
    resume_from: str | pathlib.Path | None, cleanup: contextlib.ExitStack,
) -> _RunDirectories:
    """The run's directories, checked and locked; nothing but the lock file is created here
    (see `_open_run`). ``cleanup`` releases the lock once the run's last file is written."""
    if run_dir is not None or resume_from is not None:
        lock = RunLock(pathlib.Path(run_dir if run_dir is not None else resume_from))
        cleanup.callback(lock.release)
        if lock.path.parent.is_dir():  # first: a directory being written is refused as busy
            lock.acquire()
    else:
        lock = None
    fresh = run_dir is not None
    if resume_from is not None:
        resume_from = pathlib.Path(resume_from)
        if not resume_from.is_dir():
            raise ConfigError(f"resume_from={str(resume_from)!r}: no such run directory")
        run_dir = pathlib.Path(run_dir) if run_dir is not None else resume_from
        fresh = run_dir.resolve() != resume_from.resolve()  # a continuation into a new directory
        if not fresh:
            read_segments(run_dir)  # a damaged segments.json is refused before anything is written
    run_dir = pathlib.Path(run_dir) if run_dir is not None else None
    if fresh:
        check_fresh(run_dir)
    if config.checkpoint_every_updates and run_dir is None:
        raise ConfigError(
            f"checkpoint_every_updates={config.checkpoint_every_updates}: checkpoints "
            "need a run directory; pass run_dir (or set it to 0)"
        )
    return _RunDirectories(run_dir, resume_from, fresh, lock)


def _open_run(config: AsyncActorLearnerConfig, directories: _RunDirectories, progress: bool,
              report: LearnerReport, end_update: int, resume: ResumePoint | None,
              wandb: WandbSettings | None) -> RunLog:
    """Create the run directory and open its log; called once every check has passed, so
    that a refused config leaves no directory and a refused resume leaves its run as it was."""
    run_dir = directories.run_dir
    made = directories.fresh and not run_dir.exists()
    try:
        if directories.fresh:
            prepare_fresh(run_dir)
            directories.lock.acquire()  # a no-op where `_run_directories` took it
            check_fresh(run_dir)  # again, locked: another writer may have begun meanwhile
        # W&B first (RunLog opens it before any file): a login failure writes no run file.
        run_log = RunLog(config, run_dir, progress, start_update=report.updates,
                         end_update=end_update, wandb=wandb)
    except BaseException:
        if made and directories.lock.held:
            directories.lock.release()
            if not any(run_dir.iterdir()):
                run_dir.rmdir()
        raise
    if run_dir is not None:
        try:
            remove_stale_temps(run_dir)  # a killed writer's, left in a resumed run's directory
            record_segment(run_dir, config, start_update=report.updates,
                           start_env_steps=report.env_steps,
                           resumed_from=str(resume.path) if resume is not None else None)
        except BaseException:
            run_log.close(failed=True)
            raise
    return run_log


def train(
    config: AsyncActorLearnerConfig,
    *,
    run_dir: str | pathlib.Path | None = None,
    resume_from: str | pathlib.Path | None = None,
    progress: bool = True,
    on_update: Callable[[dict[str, float]], None] | None = None,
    wandb: WandbSettings | None = None,
) -> TrainResult:
    """Run asynchronous actor-learner PPO as ``config`` says.

    Args:
      config: the run's configuration (validated on construction).
      run_dir: if given (it must be empty or new), write ``config.json``,
        ``segments.json`` (provenance), ``metrics.jsonl`` (one JSON object
        per update), checkpoints (``checkpoints/``: every
        ``checkpoint_every_s`` seconds or ``checkpoint_every_updates``
        updates, at the end, and when the run stops early) and the final
        ``params.msgpack`` and ``summary.json`` there. It is created (and a
        resumed run's files touched) only once every check has passed: a
        refused config leaves no directory behind.
      resume_from: a run directory to continue from its newest valid
        checkpoint (params, optimizer state, keys, counters, learning-rate
        schedule, and each actor's env state); also the default ``run_dir``.
        The config may change anything but the env and the network.
      progress: show a progress bar with env steps/s, return and lag.
      on_update: also called with each update's metrics dict; it may raise
        `StopTraining` to end the run early (train then returns normally).
      wandb: also log the config, metrics and figure to Weights & Biases (`ppo_async.runs.wandb_log`).

    Raises:
      ConfigError: a device the config names does not exist, a non-empty
        ``run_dir`` for a fresh run, checkpoints without a run directory,
        nothing to resume, a resume that changes the env or network or whose
        budget is already spent, a Ray cluster without room for the actors,
        W&B refusing the run.
      ActorError: an actor or the evaluator raised (chained to its exception).
      LearnerTimeoutError: an actor the learner waits on sent nothing for
        ``config.learner_timeout_s`` (its id is in ``actor_ids``).
      NonFiniteError: an update produced NaN or inf (the last good state is
        checkpointed).
      TrainingInterrupted: Ctrl-C; a `KeyboardInterrupt` that says the update
        reached and how to resume.
      ShutdownTimeoutError: the run finished, but a thread did not stop within
        ``config.shutdown_timeout_s`` (the params and summary were written).

    With thread actors, a learner that cannot run for ``2 x learner_timeout_s``
    (a thread holds the GIL) ends the process instead (`ppo_async.runtime.watchdog`).
    """
    if not isinstance(config, AsyncActorLearnerConfig):
        raise TypeError(
            f"train(config): config must be an AsyncActorLearnerConfig "
            f"(AsyncActorLearnerConfig(**fields), or ppo_async.preset(NAME)), not "
            f"{type(config).__name__}")
    with contextlib.ExitStack() as cleanup:  # what must be undone on every way out
        return _train(config, cleanup, run_dir=run_dir, resume_from=resume_from,
                      progress=progress, on_update=on_update, wandb=wandb)


def _train(
    config: AsyncActorLearnerConfig,
    cleanup: contextlib.ExitStack,
    *,
    run_dir: str | pathlib.Path | None,
    resume_from: str | pathlib.Path | None,
    progress: bool,
    on_update: Callable[[dict[str, float]], None] | None,
    wandb: WandbSettings | None,
) -> TrainResult:
    """`train`'s body; ``cleanup`` is closed whenever it returns or raises."""
    enable_compilation_cache(config.compilation_cache_dir)  # before anything compiles
    directories = _run_directories(config, run_dir, resume_from, cleanup)
    layout = resolve_layout(config)  # the one place a layout field is decided
    run = _Run(layout.pin(config), layout, directories)
    run.ctrl_c = _CtrlC.install(cleanup)
    run.prepare()
    run.watch(cleanup)
    error: BaseException | None = None
    try:
        run.learn(progress, on_update, wandb)
    except BaseException as caught:  # noqa: BLE001 - re-raised below, after the shutdown
        error = caught
    return run.finish(run.shut_down(error), error)


class _CtrlC:
    """Ctrl-C that is not lost: Python raises `KeyboardInterrupt` wherever the main thread
    is, and where that is a garbage-collector callback (JAX has one) the exception is
    printed and dropped. `install` (main thread, default handler only) notes each SIGINT
    before raising as the default does, and keeps a dropped one off stderr (the
    traceback of a callback the user never wrote); `check`, once per update, raises it
    again if it was dropped. The handler and the hook are restored when the run ends."""

    def __init__(self):
        self.pending = False

    @classmethod
    def install(cls, cleanup: contextlib.ExitStack) -> _CtrlC:
        ctrl_c = cls()
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            def handler(signum, frame):
                ctrl_c.pending = True
                signal.default_int_handler(signum, frame)

            previous_hook = sys.unraisablehook

            def unraisable(report):
                if not (ctrl_c.pending and isinstance(report.exc_value, KeyboardInterrupt)):
                    previous_hook(report)  # a dropped Ctrl-C is raised again by `check`

            signal.signal(signal.SIGINT, handler)
            sys.unraisablehook = unraisable
            cleanup.callback(signal.signal, signal.SIGINT, signal.default_int_handler)
            cleanup.callback(setattr, sys, "unraisablehook", previous_hook)
        return ctrl_c

    def check(self) -> None:
        """Raise the `KeyboardInterrupt` of a SIGINT whose own was dropped."""
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt


class _Shutdown(NamedTuple):
    """What stopping a run left: threads that did not stop, late failures, the last checkpoint."""

    stragglers: list[str]
    late: list[ActorFailure]
    saved: pathlib.Path | None


class _Run:
    """One `train` call's parts, made in order (`prepare`, `watch`, `learn`) and stopped on every way out."""

    def __init__(self, config: AsyncActorLearnerConfig, layout: Layout,
                 directories: _RunDirectories):
        self.config, self.layout, self.directories = config, layout, directories
        self.run_dir = directories.run_dir
        self.learner = config.learner_placement()
        self.actor_device = resolve_device(config.actor_device)
        self.evaluating = config.eval_every_updates > 0
        self.stop = threading.Event()  # the evaluator's
        self.ctrl_c = _CtrlC()  # inert until `_CtrlC.install`
        self.watchdog: FreezeWatchdog | None = None
        self.transport: LearnerTransport | None = None  # None: the learner's program collects
        self.actors: ProgramActors | None = None  # ... and these are its actors
        self.supervisor: Supervisor | None = None
        self.channels: LearnerConnections | None = None
        self.run_log: RunLog | None = None
        self.evaluator_thread: threading.Thread | None = None

    def prepare(self) -> None:
        """The actor program, the state to start from (fresh or resumed), the update compiling."""
        config = self.config
        self.program = make_actor_program(config)
        # The actors' chunks in the learner's program (`ppo_async.runtime.in_learner`).
        self.in_learner = self.layout.collection == "learner"
        self.resume: ResumePoint | None = None
        if self.directories.resume_from is not None:
            self.resume = load_resume_point(config, self.program,
                                            checkpoint_dir(self.directories.resume_from))
        resume = self.resume
        self.schedule = (resume.schedule if resume is not None
                         else default_schedule(config.update_options()))
        self.update = learner_update(config, self.program, self.schedule, self.learner.mesh)
        self.loop = (loop_program(config, self.program, self.update) if self.in_learner
                     else None)
        self.warm_up = _UpdateWarmUp(
            config, self.program, self.update, self.learner,
            actor_device=self.actor_device if config.actor_backend == "threads" else None,
            loop=self.loop)
        try:  # until the shutdown, which joins it on every path
            if resume is None:
                state = initial_learner_state(config, self.program)
                self.report = LearnerReport()
                self.carries = (None,) * config.num_actors
            else:
                state, self.report, self.carries = resume.state, resume.report, resume.actor_carries
            self.report.layout = self.layout.to_dict()
            self.end_update = resume.end_update if resume is not None else config.num_updates
            self.state = self.learner.put_state(state)
        except BaseException:
            self.warm_up.join(config.shutdown_timeout_s)
            raise
        self.start_updates = self.report.updates
        # What is published before the actors start: with exact_policy_lag, the earlier
        # versions a resumed run's actors still need, then the state's own.
        history = list(resume.params_history) if resume is not None and params_history_size(
            config) else []
        self.published = [*history, (self.start_updates, self.state.params)]
        self.checkpoints = _Checkpoints(config, self.run_dir, self.schedule, self.published)

    def watch(self, cleanup: contextlib.ExitStack) -> None:
        """Arm the freeze watchdog (thread actors), disarmed when ``cleanup`` closes."""
        self.watchdog = FreezeWatchdog.for_run(
            self.config, self.run_dir, self.start_updates,
            self.run_dir / ERROR_FILE if self.run_dir is not None else None)
        if self.watchdog is not None:
            cleanup.callback(self.watchdog.close)

    def learn(self, progress: bool, on_update: Callable[[dict[str, float]], None] | None,
              wandb: WandbSettings | None) -> None:
        """Start the actors' side (a transport, or the learner's program), the run's files, the
        evaluator and the actors; run the learner."""
        config, watchdog = self.config, self.watchdog
        # Said once the run's state is ready (a refused resume says only why).
        if progress:
            print(f"layout: {self.layout.describe()}", file=sys.stderr, flush=True)
        logger.info("layout: %s", self.layout.describe())
        starts = [ActorStart(
            produced_steps=self.start_updates * config.num_steps,
            carry=jax.device_put(carry, self.actor_device) if carry is not None else None,
            first_version=self.published[0][0]) for carry in self.carries]
        if self.in_learner:
            self.actors = ProgramActors(config, starts)
            report_failure = self.actors.report_failure
        else:
            # Before any run file: Ray refuses a cluster without room for the actors here.
            self.transport = _make_transport(config, self.program, self.actor_device)
            run_dir = self.run_dir
            self.supervisor = Supervisor(config, self.transport, watchdog, None if run_dir is None
                                         else lambda text: append_to_log(run_dir, text))
            report_failure = self.transport.report_failure
        self.channels = LearnerConnections(
            self.transport, *(queue.Queue() if self.evaluating else None for _ in range(2)))
        run_log = self.run_log = _open_run(config, self.directories, progress, self.report,
                                           self.end_update, self.resume, wandb)

        def record(metrics: dict[str, float]) -> None:
            self.ctrl_c.check()
            run_log(metrics)
            if on_update is not None:
                on_update(metrics)

        if self.transport is not None:
            for version, params in self.published:
                self.transport.publish(params, version)
        if self.evaluating:
            self.evaluator_thread = _spawn_evaluator(config, self.program, self.channels,
                                                     self.stop, report_failure)
        if self.transport is not None:
            for actor_id, start in enumerate(starts):
                self.transport.start_actor(actor_id, start)
            self.transport.wait_started()  # processes take seconds to start; threads none
        if watchdog is not None:
            watchdog.name_threads()
        hooks = LearnerHooks(record, on_evaluation=run_log.evaluation,
                             heartbeat=watchdog.heartbeat if watchdog is not None else None)
        if self.in_learner:
            self.state, self.report = in_learner_loop(
                config, self.program, self.loop, self.state, self.channels, self.learner,
                self.update, self.report, self.end_update, self.published, hooks, self.actors,
                after_call=self.checkpoints.after_call,
                before_first_call=lambda: self.warm_up.result(_WARM_UP_TIMEOUT_S))
        else:
            self.state, self.report = learner_loop(
                config, self.program.network, self.state, self.channels, self.learner,
                hooks._replace(on_actor_failure=self.supervisor.on_failure,
                               on_stuck_actors=self.supervisor.on_stuck,
                               after_update=self.checkpoints.after_update),
                report=self.report, update=self.warm_up.before(self.update),
                end_update=self.end_update)
        if self.evaluator_thread is not None:
            # Let the evaluations asked for finish, so that they are reported and logged.
            self.channels.evaluator_queue.put(None)
            self.evaluator_thread.join(config.shutdown_timeout_s)

    def shut_down(self, error: BaseException | None) -> _Shutdown:
        """Stop the actors and threads, log what is left, keep the newest good state; on every path."""
        config = self.config
        if self.watchdog is not None:
            self.watchdog.allow(self.watchdog.timeout_s + config.shutdown_timeout_s)
        self.stop.set()
        deadline = time.monotonic() + config.shutdown_timeout_s
        stragglers = stop_threads(
            [t for t in (self.warm_up.thread, self.evaluator_thread) if t],
            config.shutdown_timeout_s)
        self._count_unrun_evaluations()
        late: list[ActorFailure] = []
        if self.transport is not None:
            stragglers += self.transport.stop(max(0.0, deadline - time.monotonic()),
                                              known_stuck=getattr(error, "actor_ids", ()))
            late = self.transport.late_failures()
            if self.supervisor is not None:
                self.supervisor.annotate(error)
        elif self.actors is not None:  # the evaluator's, after the loop's last look
            late = self.actors.take_failures()
        return _Shutdown(stragglers, late, None)

    def _count_unrun_evaluations(self) -> None:
        """Evaluations still queued when the evaluator stopped: counted as skipped, and said."""
        if self.channels is None or self.channels.evaluator_queue is None:
            return
        left = [m for m in take_all(self.channels.evaluator_queue) if m is not None]
        if left:
            self.report.eval_requests_skipped += len(left)
            logger.warning(
                "%d periodic evaluation(s) asked for were not run before the run ended (updates "
                "%s): the evaluator was slower than eval_every_updates=%d allows",
                len(left), ", ".join(str(m.broadcast.version) for m in left),
                self.config.eval_every_updates)

    def finish(self, shutdown: _Shutdown, error: BaseException | None) -> TrainResult:
        """Close the log and save the newest good state; then raise ``error`` or return the result."""
        if error is None and self.evaluating and self.run_log is not None:
            try:  # evaluations that finished after the last update: the shutdown waited for them
                for evaluation in drain_evaluations(self.channels, self.report):
                    self.run_log.evaluation(evaluation)
            except Exception as caught:  # noqa: BLE001 - raised below, like the run's own errors
                error = caught
        error, saved = self._close_and_checkpoint(error)
        if error is not None:
            self._reraise(error, shutdown._replace(saved=saved))
        return self._result(shutdown)

    def _close_and_checkpoint(
            self, error: BaseException | None) -> tuple[BaseException | None, pathlib.Path | None]:
        """Close the log and save the newest good state: (the run's error, the newest checkpoint).

        A write the disk refuses (`ppo_async.errors.RunFileError`) becomes the run's
        error, or a note on the one it already has, which says more.
        """
        refused: list[str] = []
        if self.run_log is not None:
            try:
                self.run_log.close(failed=error is not None)
            except OSError as failed:
                error = error if error is not None else failed
                refused.append(f"the log was not closed cleanly: {failed}")
        saved = None
        if self.run_dir is not None:
            try:
                saved = self.checkpoints.save_latest()
            except OSError as failed:
                error = error if error is not None else failed
                refused.append(f"the newest state was not checkpointed: {failed}")
                saved = self.checkpoints.last_path
        for note in refused:
            if str(error) not in note:  # the error itself needs no note repeating it
                error.add_note(note)
        return error, saved

    def _reraise(self, error: BaseException, shutdown: _Shutdown) -> NoReturn:
        """Raise ``error`` with what the shutdown left noted on it (Ctrl-C: as `TrainingInterrupted`)."""
        if shutdown.stragglers:
            error.add_note("threads still running (they cannot be killed): "
                           f"{'; '.join(shutdown.stragglers)}")
        for failure in shutdown.late:
            error.add_note(f"also failed while stopping:\n{failure.formatted_traceback}")
        if isinstance(error, KeyboardInterrupt) and not isinstance(error, TrainingInterrupted):
            latest, saved = self.checkpoints.latest, shutdown.saved
            if saved is None and self.resume is not None and self.run_dir is not None and (
                    self.run_dir.resolve() == self.directories.resume_from.resolve()):
                saved = self.resume.path  # no update since the resume: its checkpoint still holds
            raise TrainingInterrupted(latest[0] if latest else self.start_updates,
                                      self.run_dir, saved) from error
        raise error

    def not_reproducible(self) -> str | None:
        """Why another run with this seed could differ (None: it is fixed by its seed)."""
        config = self.config
        if config.exact_lag is None and not config.lock_step:
            return ("free-running actors (exact_policy_lag=None): which params each chunk "
                    "was collected with depends on thread timing")
        if self.report.actor_restarts:
            return (f"{self.report.actor_restarts} actor restart(s): a restarted actor's "
                    "envs and keys differ from the uninterrupted run's")
        lag = config.exact_lag
        if lag is not None and self.published[0][0] > exact_version(
                self.start_updates, lag, config.broadcast_every):
            return ("resumed from a checkpoint without the earlier params versions the "
                    "actors needed (written by a run without exact_policy_lag)")
        return None

    def _result(self, shutdown: _Shutdown) -> TrainResult:
        """The finished run's params and report, written to the run directory."""
        config, report = self.config, self.report
        report.actor_stats = (self.transport.actor_stats() if self.transport is not None
                              else self.actors.stats)
        report.actor_restarts = sum(stats.restarts for stats in report.actor_stats)
        result = TrainResult(jax.device_get(self.state.params), report)
        if self.run_dir is not None:
            write_atomically(self.run_dir / PARAMS_FILE, flax.serialization.to_bytes(result.params))
            write_json(self.run_dir / SUMMARY_FILE, _summary(report, self.not_reproducible()))
        late, stragglers = shutdown.late, shutdown.stragglers
        if late:
            raise ActorError(late[0].actor_id, late[0].formatted_traceback + (
                "\n(it failed while the finished run was stopping; the final params and "
                "summary were written)")) from late[0].error
        if stragglers:
            raise ShutdownTimeoutError(
                f"the run finished, but threads did not stop within shutdown_timeout_s="
                f"{config.shutdown_timeout_s} s: {'; '.join(stragglers)}. The final params and "
                "summary were written; the threads are daemons and end with the process.",
                stragglers, result,
            )
        return result
