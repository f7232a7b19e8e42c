"""The learner loop: it fills the rollout buffer, runs the update, publishes the params.

`RolloutBuffer` keeps one column per actor. When every column holds a chunk of
``num_steps`` rows, `learner_loop` takes one chunk per actor in fixed actor
order (so a lock-step run is reproducible), stacks them along the env axis
(`stack_experiences`) and runs the jitted update of `ppo_async.core.update`.
Every ``broadcast_every`` updates it hands the params to its transport's
publisher, which sends them to every actor as bytes. Which transport carries
the messages (threads, Ray processes) the loop does not know.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core.devices import LearnerPlacement, to_host
from ppo_async.core.update import Batch, LearnerState, UpdateFn, make_update_fn
from ppo_async.networks.actor_critic import ActorCritic
from ppo_async.runtime.actor import ActorError, ActorStats
from ppo_async.runtime.messages import (
    ActorFailure,
    Experience,
    PolicyBroadcast,
    serialize_policy,
)

if TYPE_CHECKING:  # the transport module builds on this one's callers, not on it
    from ppo_async.runtime.evaluate import EvalResult
    from ppo_async.runtime.transport import LearnerTransport


class LearnerTimeoutError(TimeoutError):
    """Actors the learner waits on sent nothing for ``learner_timeout_s``.

    ``actor_ids`` names them: the actors whose buffer column is empty and
    whose last chunk is older than the timeout, whatever the others sent.
    """

    def __init__(self, message: str, actor_ids: Sequence[int] = ()):
        super().__init__(message)
        self.actor_ids = tuple(actor_ids)


class StopTraining(Exception):
    """Raise from an ``on_update`` callback to end the run early, as if it had finished."""


class NonFiniteError(FloatingPointError):
    """An update produced a non-finite metric or parameter; the run stops before using it."""


class RolloutBuffer:
    """One FIFO column of `Experience` chunks per actor."""

    def __init__(self, num_actors: int):
        self.columns: list[collections.deque[Experience]] = [
            collections.deque() for _ in range(num_actors)
        ]
        self.empty_columns = num_actors  # kept as chunks come and go: ready() is O(1)

    def add(self, experience: Experience) -> None:
        column = self.columns[experience.actor_id]
        self.empty_columns -= not column
        column.append(experience)

    def ready(self) -> bool:
        """Every column holds at least one chunk (``num_steps`` rows)."""
        return self.empty_columns == 0

    def pop_batch(self) -> list[Experience]:
        """The oldest chunk of every column, in actor order."""
        if not self.ready():
            raise RuntimeError("pop_batch on a buffer with an empty column")
        batch = [column.popleft() for column in self.columns]
        self.empty_columns = sum(not column for column in self.columns)
        return batch


def stack_experiences(experiences: Sequence[Experience], lags: Sequence[int] | None = None,
                      xp: Any = np) -> Batch:
    """Concatenate chunks along the env axis, in the order given (numpy).

    ``lags``: each chunk's policy lag in learner updates (default 0), copied
    to every env of its chunk. ``xp=jax.numpy`` stacks traced chunks inside
    a jitted function instead (the same values).
    """

    def cat(arrays, axis):
        return xp.concatenate(arrays, axis=axis)

    trajectories = [e.trajectory for e in experiences]
    recurrent = trajectories[0].hidden is not None
    final_obs = trajectories[0].final_obs is not None
    lags = [0] * len(experiences) if lags is None else lags
    return Batch(
        obs=cat([t.obs for t in trajectories], 1),
        action=cat([t.action for t in trajectories], 1),
        reward=cat([t.reward for t in trajectories], 1),
        done=cat([t.terminated | t.truncated for t in trajectories], 1),
        behaviour_logp=cat([t.behaviour_logp for t in trajectories], 1),
        behaviour_value=cat([t.behaviour_value for t in trajectories], 1),
        bootstrap_obs=cat([e.bootstrap_obs for e in experiences], 0),
        bootstrap_value=cat([e.bootstrap_value for e in experiences], 0),
        # Only the state at the chunk's start crosses to the learner: it
        # re-unrolls the rest under its own params.
        reset=cat([t.reset for t in trajectories], 1) if recurrent else None,
        initial_hidden=cat([t.hidden[0] for t in trajectories], 0) if recurrent else None,
        policy_lag=cat([xp.full(t.reward.shape[1], lag, np.int32)
                        for t, lag in zip(trajectories, lags, strict=True)], 0),
        truncated=cat([t.truncated for t in trajectories], 1) if final_obs else None,
        final_obs=cat([t.final_obs for t in trajectories], 1) if final_obs else None,
        discounted_return=(cat([t.discounted_return for t in trajectories], 1)
                           if trajectories[0].discounted_return is not None else None),
    )


RECENT_EPISODES = 100  # episode_return_mean averages this many latest episodes


@dataclasses.dataclass
class LearnerReport:
    """Summary of a run, returned by `learner_loop` (and in `TrainResult`)."""

    updates: int = 0  # learner updates done
    env_steps: int = 0  # env steps consumed by the learner
    wall_time_s: float = 0.0  # from the learner's start to its last update (this segment)
    env_steps_per_s: float = 0.0  # segment_env_steps per second of wall_time_s
    policy_lag_mean: float = 0.0  # learner updates, averaged over every consumed step
    policy_lag_max: int = 0
    policy_lag_counts: dict[int, int] = dataclasses.field(default_factory=dict)  # lag -> chunks
    episode_return_mean: float = float("nan")  # mean of recent_returns
    recent_returns: list[float] = dataclasses.field(default_factory=list)  # last 100 episodes
    episodes: int = 0  # training episodes finished in consumed experience
    learner_wait_s: float = 0.0  # time the learner blocked on the experience queue
    actor_stats: list[ActorStats] = dataclasses.field(default_factory=list)
    actor_restarts: int = 0  # actors replaced by the supervisor after they raised
    eval_returns: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (version, mean)
    # evaluations replaced by a newer one before they started (free-running), or still
    # waiting when the run ended
    eval_requests_skipped: int = 0
    # This segment (a resumed run continues the counters above; these say what it added):
    start_update: int = 0  # updates already done when this segment started
    segment_env_steps: int = 0  # env steps consumed in this segment (env_steps_per_s divides these)
    # How this segment collected experience (`ppo_async.runtime.layout.Layout.to_dict`).
    layout: dict[str, Any] = dataclasses.field(default_factory=dict)

    def record_update(
        self, config: AsyncActorLearnerConfig, experiences: Sequence[Experience],
        lags: Sequence[int],
    ) -> None:
        """Count one update that consumed ``experiences`` with these policy lags."""
        self.updates += 1
        self.env_steps += config.batch_size
        for experience in experiences:
            finished = experience.trajectory.episode_length > 0
            self.recent_returns.extend(experience.trajectory.episode_return[finished].tolist())
            self.episodes += int(finished.sum())
        del self.recent_returns[:-RECENT_EPISODES]
        for lag in lags:
            self.policy_lag_counts[lag] = self.policy_lag_counts.get(lag, 0) + 1
        self.refresh_summaries()

    def refresh_summaries(self) -> None:
        """Recompute the means and maxima from ``recent_returns`` and ``policy_lag_counts``."""
        if self.recent_returns:
            self.episode_return_mean = float(np.mean(self.recent_returns))
        if self.policy_lag_counts:
            chunks = sum(self.policy_lag_counts.values())
            # Every chunk holds the same number of steps, so this is the per-step mean.
            self.policy_lag_mean = (
                sum(k * n for k, n in self.policy_lag_counts.items()) / chunks
            )
            self.policy_lag_max = max(self.policy_lag_counts)


class LearnerConnections(NamedTuple):
    """What the learner is connected to: the actors through its transport, the evaluator through two queues."""

    # Experience (and failures of any thread) in, broadcasts out; None: the learner's own
    # program collects the chunks (`ppo_async.runtime.in_learner`), nothing is sent.
    transport: LearnerTransport | None
    evaluator_queue: queue.Queue | None = None  # EvalRequests (None: the evaluator ends)
    eval_results: queue.Queue | None = None  # EvalOutcomes back


class EvalRequest(NamedTuple):
    """One evaluation asked of the evaluator thread."""

    broadcast: PolicyBroadcast  # the params after update ``broadcast.version``
    env_steps: int  # env steps consumed by that update


class EvalOutcome(NamedTuple):
    """One finished evaluation, back from the evaluator thread."""

    version: int  # the update whose params were evaluated
    env_steps: int  # env steps consumed by that update
    result: EvalResult


def drain_evaluations(channels: LearnerConnections, report: LearnerReport) -> list[dict[str, float]]:
    """The evaluations finished since the last call, each counted in ``report.eval_returns``.

    Each is a metrics line of its own, keyed by the ``update`` and
    ``env_steps`` it evaluated: an evaluation finishes updates after the one
    it belongs to, whose line is already written by then
    (`ppo_async.runs.analysis.read_metrics` merges it into that update's row).
    """
    lines = []
    while channels.eval_results is not None:
        try:
            outcome = channels.eval_results.get_nowait()
        except queue.Empty:
            break
        report.eval_returns.append((outcome.version, outcome.result.mean_return))
        lines.append({"update": outcome.version, "env_steps": outcome.env_steps,
                      "eval_return_mean": outcome.result.mean_return,
                      "eval_return_std": outcome.result.std_return,
                      "eval_policy_version": outcome.version})
    return lines


# on_actor_failure(failure, produced_steps) -> restarted?
ActorFailureHandler = Callable[[ActorFailure, int], bool]
# on_stuck_actors(actor_ids, produced_steps) -> every one of them killed and restarted?
StuckActorHandler = Callable[[list[int], int], bool]


def _check_finite(metrics: dict[str, float], update: int,
                  experiences: Sequence[Experience] = ()) -> None:
    """Raise `NonFiniteError` naming the first non-finite metric of ``update``, and where
    the chunks it consumed (``experiences``) held NaN or inf, if they did."""
    if metrics["params_finite"] != 1.0:
        problem = "the updated params contain NaN or inf"
    else:
        problem = next((f"metric {name} is {value}" for name, value in metrics.items()
                        if not np.isfinite(value)), None)
    if problem is not None:
        source = _non_finite_input(experiences)
        raise NonFiniteError(f"update {update}: {problem}"
                             + (f"; it trained on {source}" if source else ""))


def _non_finite_input(experiences: Sequence[Experience]) -> str | None:
    """The first NaN or inf in ``experiences``' float arrays, in words; None if there is none.

    Read only once an update has failed: an env that returned a NaN observation or
    reward is then named, where the update's own numbers cannot say where it came from.
    """
    for experience in experiences:
        arrays = {**{f"trajectory.{name}": value
                     for name, value in experience.trajectory._asdict().items()},
                  "bootstrap_obs": experience.bootstrap_obs,
                  "bootstrap_value": experience.bootstrap_value}
        for name, value in arrays.items():
            if value is None or not np.issubdtype(np.asarray(value).dtype, np.floating):
                continue
            bad = np.argwhere(~np.isfinite(np.asarray(value)))
            if len(bad):
                index = tuple(int(i) for i in bad[0])
                where = (f"env {index[0]}" if name.startswith("bootstrap")
                         else f"step {index[0]}, env {index[1]}")
                return (f"actor {experience.actor_id}'s chunk, which has "
                        f"{np.asarray(value)[index]} in {name} at {where}")
    return None


# after_update(state, report, actor_carries): called after every update with a
# state that passed the NaN check and the carries of each actor's last consumed
# chunk (where each actor resumes from): what a checkpoint saves.
AfterUpdate = Callable[[LearnerState, "LearnerReport", list[Any]], None]


def _request_evaluation(channels: LearnerConnections, message: EvalRequest,
                        replace: bool = True) -> bool:
    """Queue ``message`` for the evaluator, replacing a request it has not started.

    The evaluator may be slower than the learner; only the newest policy is
    worth evaluating, so at most one request waits. True if one was replaced.
    Without ``replace`` (``exact_policy_lag``: which policies are scored must
    not depend on timing) every request waits its turn.
    """
    if not replace:
        channels.evaluator_queue.put(message)
        return False
    try:
        channels.evaluator_queue.get_nowait()
        replaced = True
    except queue.Empty:
        replaced = False
    channels.evaluator_queue.put(message)
    return replaced


def _stuck_actors(buffer: RolloutBuffer, last_chunk_at: list[float], timeout_s: float,
                  now: float) -> list[int]:
    """Actors the learner waits on (empty column) that sent nothing for ``timeout_s``."""
    return [
        actor_id for actor_id, column in enumerate(buffer.columns)
        if not column and now - last_chunk_at[actor_id] >= timeout_s
    ]


class _InFlight(NamedTuple):
    """An update handed to the device that the learner has not read back yet."""

    state: LearnerState  # not yet checked for NaN: never published or saved before it is
    metrics: dict[str, jax.Array]
    experiences: list[Experience]
    lags: list[int]  # each chunk's policy lag


class LearnerHooks(NamedTuple):
    """What `learner_loop` calls out to (each optional; see `learner_loop`)."""

    on_update: Callable[[dict[str, float]], None] | None = None
    on_actor_failure: ActorFailureHandler | None = None
    on_stuck_actors: StuckActorHandler | None = None
    after_update: AfterUpdate | None = None
    on_evaluation: Callable[[dict[str, float]], None] | None = None
    heartbeat: Callable[[int], None] | None = None


class Learner:
    """The learner's state between its steps, and the steps: fed by `learner_loop` (the actors'
    chunks) or by `ppo_async.runtime.in_learner.in_learner_loop` (its own program's)."""

    def __init__(self, config: AsyncActorLearnerConfig, channels: LearnerConnections,
                 placement: LearnerPlacement, update: UpdateFn, report: LearnerReport,
                 end_update: int, hooks: LearnerHooks):
        self.config, self.channels, self.placement = config, channels, placement
        self.update, self.report, self.end_update, self.hooks = update, report, end_update, hooks
        self.buffer = RolloutBuffer(config.num_actors)
        self.start, self.start_env_steps = time.perf_counter(), report.env_steps
        report.start_update = report.updates
        # When each actor last delivered a chunk, started, or was last given a
        # chance to (a broadcast): the hang detector.
        self.last_chunk_at = [time.monotonic()] * config.num_actors
        self.dispatched = report.updates  # updates handed to the device: each consumed one chunk per actor
        # No actor the learner waits on can be stuck before this time (None: look).
        # Silences only shorten as chunks arrive, so it stays a safe bound until a
        # batch is popped: each chunk then costs O(1), not a look at every column.
        self.no_stuck_actor_before: float | None = None

    def beat(self) -> None:
        if self.hooks.heartbeat is not None:
            self.hooks.heartbeat(self.report.updates)

    def wait_budget(self) -> float | None:
        """How long the learner may wait for the actors it waits on.

        None if some had sent nothing for ``learner_timeout_s`` and were
        restarted; raises `LearnerTimeoutError` naming them if they cannot be.
        """
        config, timeout_s = self.config, self.config.learner_timeout_s
        now = time.monotonic()
        if self.no_stuck_actor_before is not None and now < self.no_stuck_actor_before:
            return max(self.no_stuck_actor_before - now, 1e-3)
        stuck = _stuck_actors(self.buffer, self.last_chunk_at, timeout_s, now)
        if stuck and self.hooks.on_stuck_actors is not None and self.hooks.on_stuck_actors(
            stuck, self.dispatched * config.num_steps  # their columns are empty
        ):
            for actor_id in stuck:
                self.last_chunk_at[actor_id] = time.monotonic()  # fresh actors
            return None
        if stuck:
            names = ", ".join(f"actor {i}" for i in stuck)
            others = [i for i in range(config.num_actors) if i not in stuck]
            raise LearnerTimeoutError(
                f"{names} sent no experience for learner_timeout_s={timeout_s} s while "
                f"the learner waited for it at update {self.report.updates + 1}"
                + (f" (actors {others} kept sending)" if others else "")
                + "; its env or rollout is stuck or far slower than the timeout allows",
                stuck,
            )
        waited_on = [self.last_chunk_at[i] for i, column in enumerate(self.buffer.columns)
                     if not column]
        self.no_stuck_actor_before = min(waited_on) + timeout_s
        return max(self.no_stuck_actor_before - now, 1e-3)

    def take_experience(self, wait: bool) -> None:
        """Move delivered chunks into the buffer until it is ready.

        Without ``wait``, only what has already arrived: the learner never
        blocks on the actors while an update's params are still unpublished.
        """
        while not self.buffer.ready():
            self.beat()
            wait_s = self.wait_budget() if wait else 0.0
            if wait_s is None:
                continue  # fresh actors
            wait_start = time.perf_counter()
            item = self.channels.transport.receive(wait_s)
            self.report.learner_wait_s += time.perf_counter() - wait_start
            if item is None:
                if not wait:
                    return
                continue  # the check above names the actor
            if isinstance(item, ActorFailure):
                self.actor_failed(item)
                continue
            self.last_chunk_at[item.actor_id] = time.monotonic()
            self.buffer.add(item)

    def actor_failed(self, failure: ActorFailure) -> None:
        """Restart the failed actor through ``on_actor_failure``, or raise its `ActorError`."""
        # Chunks the actor sent before failing were queued before this message,
        # so they are in the buffer and are kept. (The evaluator and publisher
        # threads report under negative ids and own no column.)
        buffered = len(self.buffer.columns[failure.actor_id]) if failure.actor_id >= 0 else 0
        produced = (self.dispatched + buffered) * self.config.num_steps
        handler = self.hooks.on_actor_failure
        if handler is None or not handler(failure, produced):
            raise ActorError(failure.actor_id, failure.formatted_traceback) from failure.error
        if failure.actor_id >= 0:
            self.last_chunk_at[failure.actor_id] = time.monotonic()  # a fresh actor

    def dispatch(self, state: LearnerState) -> _InFlight:
        """Start the update on the buffer's oldest batch; returns without waiting for it."""
        experiences = self.buffer.pop_batch()
        self.no_stuck_actor_before = None  # columns emptied again: look afresh
        lags = [self.dispatched - e.policy_version for e in experiences]
        self.dispatched += 1
        batch = self.placement.put_batch(stack_experiences(experiences, lags))
        new_state, metrics = self.update(state, batch)
        return _InFlight(new_state, metrics, experiences, lags)

    def finish(self, done: _InFlight) -> bool:
        """Read ``done`` back, check it, count it, publish it; False if ``on_update`` stopped the run."""
        # Waits for this update only: one dispatched after it may still be running.
        host_metrics = {k: float(v) for k, v in to_host(done.metrics).items()}
        _check_finite(host_metrics, self.report.updates + 1, done.experiences)
        self._count(done)
        broadcast_s = self._publish(done.state)
        self._evaluate(done.state)
        carries = [e.env_carry for e in done.experiences]
        on_update, after_update = self.hooks.on_update, self.hooks.after_update
        if on_update is None:
            if after_update is not None:
                after_update(done.state, self.report, carries)
            return True
        host_metrics.update(self._progress_metrics(done.lags), broadcast_s=broadcast_s)
        try:
            on_update(host_metrics)  # writes this update's metrics line...
        except StopTraining:
            return False
        finally:
            # ...before a checkpoint of it, so a run directory never holds a
            # checkpoint past its metrics; also when on_update stops the run.
            if after_update is not None:
                after_update(done.state, self.report, carries)
        return True

    def _count(self, done: _InFlight) -> None:
        report = self.report
        report.record_update(self.config, done.experiences, done.lags)
        report.wall_time_s = time.perf_counter() - self.start
        report.segment_env_steps = report.env_steps - self.start_env_steps
        report.env_steps_per_s = report.segment_env_steps / report.wall_time_s

    def _publish(self, state: LearnerState) -> float:
        """Hand the checked params to the transport when a broadcast is due; the seconds it took."""
        broadcast_s = 0.0
        updates = self.report.updates
        if updates % self.config.broadcast_every == 0 and updates < self.end_update:
            # Only params that passed the finiteness check are published; the
            # publisher thread serializes and delivers, so this is a hand-over.
            broadcast_start = time.perf_counter()
            if self.channels.transport is not None:
                self.channels.transport.publish(state.params, updates)
            broadcast_s = time.perf_counter() - broadcast_start
        # An actor held back by the valve could not send until this update (and
        # the broadcast after it), so every actor's silence counts from here.
        self.last_chunk_at[:] = [time.monotonic()] * self.config.num_actors
        return broadcast_s

    def _evaluate(self, state: LearnerState) -> None:
        """Ask for a periodic evaluation when one is due; pass on those that finished."""
        channels, config, report = self.channels, self.config, self.report
        if channels.evaluator_queue is not None and config.eval_every_updates and (
            report.updates % config.eval_every_updates == 0
        ):
            # Serialized here, apart from the publisher's bytes: evaluations are rare.
            eval_message = PolicyBroadcast(report.updates, serialize_policy(state.params))
            report.eval_requests_skipped += _request_evaluation(
                channels, EvalRequest(eval_message, report.env_steps),
                replace=config.exact_lag is None)
        for evaluation in drain_evaluations(channels, report):
            if self.hooks.on_evaluation is not None:
                self.hooks.on_evaluation(evaluation)

    def _progress_metrics(self, lags: list[int]) -> dict[str, float]:
        report = self.report
        return dict(
            update=report.updates,
            env_steps=report.env_steps,
            env_steps_per_s=report.env_steps_per_s,
            episode_return=report.episode_return_mean,
            policy_lag_mean=float(np.mean(lags)),
            policy_lag_max=max(lags),
            queue_depth=(0 if self.channels.transport is None
                         else self.channels.transport.queue_depth()),
            learner_wait_s=report.learner_wait_s,
        )

    def run(self, state: LearnerState, pipeline: bool) -> LearnerState:
        """Updates until ``end_update`` (or until ``on_update`` stops the run); the last good state."""
        in_flight: _InFlight | None = None
        while self.report.updates < self.end_update:
            if in_flight is None:
                self.take_experience(wait=True)
                in_flight = self.dispatch(state)
            # While that update runs, take what the actors have sent; if the next
            # batch is already complete, dispatch it on the new (not yet checked)
            # state before reading this update back, so that the device never
            # idles while the learner's Python catches up. If the check fails, the
            # next update's result is dropped with it.
            following = None
            if pipeline and self.report.updates + 1 < self.end_update:
                self.take_experience(wait=False)
                if self.buffer.ready():
                    following = self.dispatch(in_flight.state)
            going_on = self.finish(in_flight)
            self.beat()
            state, in_flight = in_flight.state, following
            if not going_on:
                break
        return state


def learner_loop(
    config: AsyncActorLearnerConfig,
    network: ActorCritic,
    state: LearnerState,
    channels: LearnerConnections,
    device: jax.Device | LearnerPlacement,
    hooks: LearnerHooks = LearnerHooks(),
    *,
    report: LearnerReport | None = None,
    update: UpdateFn | None = None,
    end_update: int | None = None,
    pipeline: bool = True,
    **callbacks: Any,
) -> tuple[LearnerState, LearnerReport]:
    """Consume experience until ``end_update`` (default ``config.num_updates``) updates are done.

    ``device``: the learner's device, or a `LearnerPlacement` over several
    (each batch is split along its envs over them; ``update`` must then be
    built with that placement's mesh). ``state`` must already be there
    (`LearnerPlacement.put_state`) and its params already published
    on ``channels.transport``. ``hooks`` (`LearnerHooks`, each optional):
    ``on_update`` receives each update's flat
    metrics dict (host floats). When an actor fails, ``on_actor_failure`` may
    restart it (returning True): it is told how many rows the learner counts as
    produced by that actor (consumed plus buffered). When actors the learner
    waits on send nothing for ``learner_timeout_s``, ``on_stuck_actors`` may
    kill and restart them (returning True; only a transport of processes can).
    ``after_update`` is called after every update with the good state (see
    `AfterUpdate`; `train` checkpoints from it). ``on_update`` may raise
    `StopTraining` to end the run there. A resumed run passes the saved
    ``report`` to continue counting. ``update`` is the jitted update to use
    (default: a new ``make_update_fn(config.update_options(), network)``); `train` passes one
    it has already compiled. ``pipeline``: when the next batch is complete
    by the time an update is dispatched, dispatch the next update before
    reading the first one back, so that the learner's Python (stacking the
    next batch, the metrics, the broadcast) runs while the device computes;
    False reads every update back before the next (``experiments/bench_learner.py``
    and ``experiments/bench_throughput.py`` measure both). ``heartbeat`` is
    called with the updates done so far on every wait and after every update
    (`train` re-arms its freeze watchdog there: `ppo_async.runtime.watchdog`).

    ``on_evaluation`` receives each periodic evaluation's metrics line
    (`drain_evaluations`) as it arrives, updates after the one it evaluated.
    The callbacks given one by one as keywords (``on_update=...``), as before
    `LearnerHooks`, still work for this release, with a DeprecationWarning.

    Raises `ActorError` (chained to the actor's exception) for a failure not
    restarted, `LearnerTimeoutError` naming the actors the learner waits on
    that sent nothing for ``learner_timeout_s`` (however busy the others
    are), and `NonFiniteError` when an update produces NaN or inf (before the
    bad params are broadcast or checkpointed).
    """
    hooks = _hooks_of(hooks, callbacks)
    report = report if report is not None else LearnerReport()
    placement = device if isinstance(device, LearnerPlacement) else LearnerPlacement((device,))
    learner = Learner(
        config, channels, placement,
        update if update is not None else make_update_fn(config.update_options(), network,
                                                          mesh=placement.mesh),
        report,
        config.num_updates if end_update is None else end_update,
        hooks,
    )
    return learner.run(state, pipeline), report


def _hooks_of(hooks: Any, callbacks: dict[str, Any]) -> LearnerHooks:
    """``hooks``, or the `LearnerHooks` of callbacks passed the old way (an ``on_update`` in
    its place, or each as a keyword), with a DeprecationWarning naming the new way."""
    if not isinstance(hooks, LearnerHooks):  # the old sixth argument: on_update
        callbacks = {"on_update": hooks, **callbacks}
        hooks = LearnerHooks()
    unknown = sorted(set(callbacks) - set(LearnerHooks._fields))
    if unknown:
        raise TypeError(f"learner_loop() got an unexpected keyword argument {unknown[0]!r}")
    if callbacks:
        warnings.warn(
            f"learner_loop({', '.join(f'{name}=...' for name in callbacks)}) is deprecated: pass "
            f"hooks=LearnerHooks({', '.join(f'{name}=...' for name in callbacks)})",
            DeprecationWarning, stacklevel=3)
    return hooks._replace(**callbacks)
