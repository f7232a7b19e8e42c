"""`train(config)`: wire queues, actor threads and the learner; always shut down.

The learner runs in the calling thread (so Ctrl-C reaches it directly); the
actors run in daemon threads. Whatever ends the run -- its last update, an
actor's exception, a starved learner, KeyboardInterrupt -- the stop signal is
set and every actor thread is joined before `train` returns or raises.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import pathlib
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.serialization
import jax
import numpy as np

from ppo_async.actor import (
    EVALUATOR_ID,
    ActorChannels,
    ActorFailure,
    ActorHandle,
    ActorProgram,
    ActorStart,
    Experience,
    make_actor_program,
    spawn_actor,
)
from ppo_async.checkpoint import load_latest_checkpoint, save_checkpoint
from ppo_async.compile_cache import enable_compilation_cache
from ppo_async.config import AsyncActorLearnerConfig, ConfigError, resolve_device
from ppo_async.envs import EnvCarry
from ppo_async.learner import (
    RECENT_EPISODES,
    Batch,
    LearnerChannels,
    LearnerReport,
    LearnerState,
    UpdateFn,
    broadcast,
    init_learner_state,
    learner_loop,
    make_update_fn,
    stack_experiences,
)
from ppo_async.networks import init_params
from ppo_async.policy_io import PolicyBroadcast, place

logger = logging.getLogger(__name__)

# Actors notice the stop signal within one chunk; a chunk is milliseconds, but
# the first one also compiles the rollout.
_JOIN_TIMEOUT_S = 60.0
_WARM_UP_TIMEOUT_S = 600.0  # compiling the update takes seconds; this means it is stuck
# How long a finished run waits for its outstanding evaluations.
_EVAL_DRAIN_TIMEOUT_S = 300.0


def _spawn_evaluator(config: AsyncActorLearnerConfig, channels: LearnerChannels,
                     stop: threading.Event) -> threading.Thread:
    """A thread that evaluates each `PolicyBroadcast` put on ``channels.evaluator_queue``.

    It receives the same bytes as the actors, so the learner never waits for
    it; results go back on ``channels.eval_results``, failures on the
    experience queue (which stops the run like an actor's). A ``None`` on the
    queue ends it once the evaluations before it are done; ``stop`` ends it
    after the current one.
    """
    from ppo_async.evaluate import Evaluator

    def run() -> None:
        try:
            evaluator = Evaluator(config, config.eval_episodes)
            while not stop.is_set():
                try:
                    message = channels.evaluator_queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                if message is None:
                    return
                # Seeded apart from training, and the same every time, so that
                # changes in the eval return come from the policy alone.
                result = evaluator.evaluate_broadcast(message, seed=config.seed + 1_000_003)
                channels.eval_results.put((message.version, result))
        except BaseException as error:  # noqa: BLE001 - reported, never swallowed
            channels.experience_queue.put(
                ActorFailure(EVALUATOR_ID, error, traceback.format_exc())
            )

    thread = threading.Thread(target=run, name="ppo-evaluator", daemon=True)
    thread.start()
    return thread


class TrainResult(NamedTuple):
    params: Any  # host (numpy) flax params pytree of the final policy
    report: LearnerReport


def _join_actors(handles: list[ActorHandle], timeout_s: float) -> list[int]:
    """Join every actor within ``timeout_s`` overall; the ids still alive."""
    deadline = time.monotonic() + timeout_s
    for handle in handles:
        handle.join(max(0.0, deadline - time.monotonic()))
    return [h.actor_id for h in handles if h.thread.is_alive()]


class _RunLog:
    """The per-update record of a run: metrics.jsonl, TensorBoard events, a progress bar.

    With a run directory, each update's metrics dict becomes one line of
    ``metrics.jsonl`` and, when tensorboardX is importable (``pip install
    'ppo-async[tb]'``; the ``dev`` extra has it), one TensorBoard event holding
    the same scalars under the same names, at step ``env_steps``, in an
    ``events.out.tfevents.*`` file beside it: ``tensorboard --logdir runs/``
    shows every run. Without tensorboardX only the JSON is written. A fresh run
    deletes the event files a previous run left in its directory (as it
    overwrites metrics.jsonl); a resumed run appends a new event file.
    """

    def __init__(self, config: AsyncActorLearnerConfig, run_dir: pathlib.Path | None,
                 progress: bool, append: bool = False):
        self.file = None
        self.events = None  # tensorboardX FileWriter
        self.summary = None  # tensorboardX's Summary proto class
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
            self.file = open(run_dir / "metrics.jsonl", "a" if append else "w", buffering=1)
            self._open_events(run_dir, append)
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=config.num_updates, unit="upd", desc=config.env_id)

    def _open_events(self, run_dir: pathlib.Path, append: bool) -> None:
        """Open a tensorboardX ``FileWriter`` on ``run_dir``, if tensorboardX is importable."""
        try:
            from tensorboardX import FileWriter
            from tensorboardX.proto.summary_pb2 import Summary
        except ImportError:
            return
        earlier = list(run_dir.glob("events.out.tfevents.*"))
        if not append:
            for stale in earlier:
                stale.unlink()
        # The file is named after the second it was opened and opened with "wb";
        # a resume within the same second would truncate the previous file.
        suffix = f".{len(earlier)}" if append else ""
        # One Summary proto per update through the FileWriter costs ~0.4 ms in
        # the learner thread; SummaryWriter.add_scalar per metric costs ~10x that.
        # The writer's own thread does the disk writes, flushed every few seconds
        # so a live TensorBoard keeps up.
        self.events = FileWriter(str(run_dir), flush_secs=5, filename_suffix=suffix)
        self.summary = Summary

    def __call__(self, metrics: dict[str, float]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(metrics) + "\n")
        if self.events is not None:
            values = [self.summary.Value(tag=name, simple_value=float(value))
                      for name, value in metrics.items()]
            self.events.add_summary(self.summary(value=values), int(metrics["env_steps"]))
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(
                sps=f"{metrics['env_steps_per_s']:.0f}",
                ret=f"{metrics['episode_return']:.1f}",
                lag=f"{metrics['policy_lag_max']:.0f}",
                refresh=False,
            )

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.events is not None:
            self.events.close()
        if self.bar is not None:
            self.bar.close()


CHECKPOINT_SUBDIR = "checkpoints"


class ResumePoint(NamedTuple):
    state: LearnerState  # host arrays
    report: LearnerReport
    actor_carries: tuple  # one env carry per actor, or () for host envs


def _checkpoint_contents(state: LearnerState, report: LearnerReport, carries) -> tuple:
    """(state pytree, integer counters) of one checkpoint."""
    recent = np.full(RECENT_EPISODES, np.nan, np.float32)
    recent[: len(report.recent_returns)] = report.recent_returns
    resumable = all(isinstance(carry, EnvCarry) for carry in carries)
    tree = {
        "learner": state,
        # Host-env carries hold live simulator objects; those actors restart their envs.
        "actor_carries": tuple(carries) if resumable else (),
        "recent_returns": recent,
    }
    counters = {
        "updates": report.updates,
        "env_steps": report.env_steps,
        "episodes": report.episodes,
        "recent_count": len(report.recent_returns),
        **{f"lag_{lag}": count for lag, count in report.policy_lag_counts.items()},
    }
    return tree, counters


def load_resume_point(config, program, run_dir: pathlib.Path, template_state) -> ResumePoint:
    """The newest valid checkpoint of ``run_dir`` (damaged newer ones are skipped with a warning)."""
    cpu = jax.devices("cpu")[0]
    carries_template = ()
    if isinstance(program.reset(jax.random.key(0), cpu), EnvCarry):
        carries_template = tuple(
            program.reset(jax.random.key(i), cpu) for i in range(config.num_actors)
        )
    template = {
        "learner": template_state,
        "actor_carries": carries_template,
        "recent_returns": np.zeros(RECENT_EPISODES, np.float32),
    }
    loaded = load_latest_checkpoint(
        run_dir / CHECKPOINT_SUBDIR, template, config_dict=config.to_dict()
    )
    if loaded is None:
        raise ConfigError(f"resume_from={str(run_dir)!r}: no checkpoint in {run_dir / CHECKPOINT_SUBDIR}")
    counters = loaded.counters
    report = LearnerReport(
        updates=counters["updates"], env_steps=counters["env_steps"],
        episodes=counters["episodes"],
        policy_lag_counts={
            int(name[4:]): count for name, count in counters.items() if name.startswith("lag_")
        },
        recent_returns=loaded.state["recent_returns"][: counters["recent_count"]].tolist(),
    )
    report.refresh_summaries()
    logger.info("resuming from %s (update %d)", loaded.path, report.updates)
    return ResumePoint(loaded.state["learner"], report, loaded.state["actor_carries"])


def _summary(report: LearnerReport) -> dict[str, Any]:
    """The report as JSON (actor stats as dicts)."""
    summary = dataclasses.asdict(report)
    summary["policy_lag_counts"] = {str(k): v for k, v in report.policy_lag_counts.items()}
    return summary


def _warm_up_batch(config: AsyncActorLearnerConfig, program: ActorProgram) -> Batch | None:
    """Zeros shaped like one learner batch, for compiling the update early.

    Built from ``program.chunk_spec`` (the traced shapes of one chunk) and
    stacked as the learner stacks real chunks. None where the program has no
    spec (host envs, whose rollout steps Python envs): their update compiles
    when the first batch arrives.
    """
    if program.chunk_spec is None:
        return None
    trajectory, bootstrap_obs, bootstrap_value = jax.tree.map(
        lambda s: np.zeros(s.shape, s.dtype), program.chunk_spec
    )
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
    """

    def __init__(
        self, config: AsyncActorLearnerConfig, program: ActorProgram, update: UpdateFn,
        device: jax.Device,
    ):
        self._done: concurrent.futures.Future = concurrent.futures.Future()
        batch = _warm_up_batch(config, program)
        self._thread = None
        if batch is None:
            self._done.set_result(None)
            return

        def run() -> None:
            try:
                state = init_learner_state(config, program.params_template, jax.random.key(0))
                jax.block_until_ready(update(place(state, device), place(batch, device)))
                self._done.set_result(None)
            except BaseException as error:  # re-raised on the caller's thread by result()
                self._done.set_exception(error)

        self._thread = threading.Thread(target=run, name="ppo-warm-up", daemon=True)
        self._thread.start()

    def result(self, timeout_s: float) -> None:
        self._done.result(timeout=timeout_s)

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


def train(
    config: AsyncActorLearnerConfig,
    *,
    run_dir: str | pathlib.Path | None = None,
    resume_from: str | pathlib.Path | None = None,
    progress: bool = True,
    on_update: Callable[[dict[str, float]], None] | None = None,
) -> TrainResult:
    """Run asynchronous actor-learner PPO as ``config`` says.

    Args:
      config: the run's configuration (validated on construction).
      run_dir: if given, write ``config.json``, ``metrics.jsonl`` (one JSON
        object per update), checkpoints (``checkpoints/``, every
        ``config.checkpoint_every_updates``) and the final ``params.msgpack``
        (flax bytes) there.
      resume_from: a run directory to continue from its newest valid
        checkpoint (params, optimizer state, keys, counters, and each actor's
        env state); also the default ``run_dir``. The config may change
        anything but the env and the network.
      progress: show a progress bar with env steps/s, return and lag.
      on_update: also called with each update's metrics dict; it may raise
        `StopTraining` to end the run early (train then returns normally).

    Raises:
      ConfigError: a device the config names does not exist, checkpoints
        without a run directory, nothing to resume, or a resume that changes
        the env or network.
      ActorError: an actor raised (chained to its exception).
      LearnerTimeoutError: no experience for ``config.learner_timeout_s``.
      NonFiniteError: an update produced NaN or inf (the last checkpoint stays).
    """
    enable_compilation_cache(config.compilation_cache_dir)  # before anything compiles
    learner_device = resolve_device(config.learner_device)
    actor_device = resolve_device(config.actor_device)
    if resume_from is not None:
        resume_from = pathlib.Path(resume_from)
        if not resume_from.is_dir():
            raise ConfigError(f"resume_from={str(resume_from)!r}: no such run directory")
        run_dir = run_dir if run_dir is not None else resume_from
    run_dir = pathlib.Path(run_dir) if run_dir is not None else None
    if config.checkpoint_every_updates and run_dir is None:
        raise ConfigError(
            f"checkpoint_every_updates={config.checkpoint_every_updates}: checkpoints "
            "need a run directory; pass run_dir (or set it to 0)"
        )

    program = make_actor_program(config)
    update = make_update_fn(config, program.network)
    warm_up = _UpdateWarmUp(config, program, update, learner_device)
    try:  # until the try/finally below, which joins it on every path
        params_key, learner_key = jax.random.split(jax.random.key(config.seed))
        params = init_params(program.network, params_key, program.observation_shape)
        state = init_learner_state(config, params, learner_key)
        report, actor_carries = None, ()
        if resume_from is not None:
            state, report, actor_carries = load_resume_point(config, program, resume_from, state)
        state = jax.device_put(state, learner_device)
        start_updates = report.updates if report is not None else 0

        experience_queue: queue.Queue = queue.Queue()
        broadcast_queues = [queue.Queue() for _ in range(config.num_actors)]
        stop = threading.Event()
        evaluating = config.eval_every_updates > 0
        learner_channels = LearnerChannels(
            experience_queue, broadcast_queues,
            queue.Queue() if evaluating else None, queue.Queue() if evaluating else None,
        )
        first_broadcast = broadcast(learner_channels, state.params, start_updates)

        def save(state: LearnerState, report: LearnerReport, carries: list) -> None:
            tree, counters = _checkpoint_contents(state, report, carries)
            save_checkpoint(
                run_dir / CHECKPOINT_SUBDIR, step=report.updates, state=tree, counters=counters,
                config_dict=config.to_dict(), keep=config.keep_checkpoints,
            )

        run_log = _RunLog(config, run_dir, progress, append=resume_from is not None)
    except BaseException:
        warm_up.join(_WARM_UP_TIMEOUT_S)
        raise

    def record(metrics: dict[str, float]) -> None:
        run_log(metrics)
        if on_update is not None:
            on_update(metrics)

    handles: list[ActorHandle] = []

    def channels_of(actor_id: int) -> ActorChannels:
        return ActorChannels(experience_queue, broadcast_queues[actor_id], stop)

    def restart_actor(failure: ActorFailure, produced_steps: int,
                      latest: PolicyBroadcast) -> bool:
        """The supervisor: replace a failed actor while its restart budget lasts."""
        if failure.actor_id == EVALUATOR_ID:
            return False
        old = handles[failure.actor_id]
        if old.stats.restarts >= config.max_actor_restarts:
            return False
        logger.warning(
            "actor %d failed; restarting it (restart %d of %d):\n%s", failure.actor_id,
            old.stats.restarts + 1, config.max_actor_restarts, failure.formatted_traceback,
        )
        old.join(_JOIN_TIMEOUT_S)  # it ended right after sending its failure
        old.stats.restarts += 1
        # The dead actor may have drained every broadcast; give its successor the newest.
        broadcast_queues[failure.actor_id].put(latest)
        start = ActorStart(restart=old.stats.restarts, produced_steps=produced_steps)
        handles[failure.actor_id] = spawn_actor(
            failure.actor_id, config, program, channels_of(failure.actor_id),
            actor_device, old.stats, start,
        )
        return True

    evaluator_thread = None
    try:
        if evaluating:
            evaluator_thread = _spawn_evaluator(config, learner_channels, stop)
        for actor_id in range(config.num_actors):
            start = ActorStart(
                produced_steps=start_updates * config.num_steps,
                carry=jax.device_put(actor_carries[actor_id], actor_device)
                if actor_carries else None,
            )
            handles.append(spawn_actor(
                actor_id, config, program, channels_of(actor_id), actor_device, None, start
            ))
        warm_up.result(_WARM_UP_TIMEOUT_S)
        state, report = learner_loop(
            config, program.network, state, learner_channels, learner_device, record,
            on_actor_failure=restart_actor, latest_broadcast=first_broadcast,
            checkpoint=save if config.checkpoint_every_updates else None, report=report,
            update=update,
        )
        if evaluator_thread is not None:
            # Let the evaluations already asked for finish, so the last one is reported.
            learner_channels.evaluator_queue.put(None)
            evaluator_thread.join(_EVAL_DRAIN_TIMEOUT_S)
    finally:
        stop.set()
        warm_up.join(_WARM_UP_TIMEOUT_S)
        alive = _join_actors(handles, _JOIN_TIMEOUT_S)
        if evaluator_thread is not None:
            evaluator_thread.join(_JOIN_TIMEOUT_S)
            if evaluator_thread.is_alive():
                alive.append(EVALUATOR_ID)
        run_log.close()
        if alive:
            # Only reached if an actor is stuck inside a single rollout; the
            # threads are daemons, so the process can still exit.
            logger.error("actor threads %s did not stop within %.0f s", alive, _JOIN_TIMEOUT_S)
    if alive:
        raise RuntimeError(f"actor threads {alive} did not stop within {_JOIN_TIMEOUT_S} s")

    report.actor_stats = [handle.stats for handle in handles]
    report.actor_restarts = sum(stats.restarts for stats in report.actor_stats)
    while evaluating and not learner_channels.eval_results.empty():
        version, result = learner_channels.eval_results.get_nowait()
        report.eval_returns.append((version, result.mean_return))
    params = jax.device_get(state.params)
    if run_dir is not None:
        (run_dir / "params.msgpack").write_bytes(flax.serialization.to_bytes(params))
        (run_dir / "summary.json").write_text(json.dumps(_summary(report), indent=2))
    return TrainResult(params, report)
