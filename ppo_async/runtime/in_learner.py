"""``sampler='learner'``: gymnax actors whose chunks the learner's own program collects.

What ``sampler='auto'`` chooses where it can run
(`ppo_async.runtime.layout.collects_in_learner`): on a machine without a GPU,
the default config.

The layout the Podracer paper calls Anakin (Hessel et al. 2021), with the
runtime's bits. One jitted call runs up to ``max_updates`` updates; in each,
every actor collects its next chunk with the params of the version its exact
lag names (`ppo_async.runtime.actor.exact_version`, the learner's own at lag
0), and the update trains on that batch. Those are the chunks, params
versions, keys and columns that thread actors collect at the same exact lag,
stacked as the learner stacks them, so a run gives the bits of the same config
with thread actors sharing one rollout program (``batch_inference=True``; with
``batch_inference=False``, of thread actors calling alone,
`ppo_async.runtime.layout.rolls_out_together`),
tests/runtime/test_in_learner.py. What it leaves out is everything between
the two programs: no actor thread, no broadcast bytes, no queue, and one
program launch for many updates.

The host reads each call's metrics and finished episodes back at once and
passes every update through the learner's own bookkeeping (`Learner.finish`):
the metrics lines, progress, ``on_update`` and evaluations are those of any
run. A call ends where a checkpoint (``checkpoint_every_updates``) or an
evaluation is due, so both see the params of their update; a checkpoint due by
time (``checkpoint_every_s``) and a Ctrl-C while the call runs take effect at
its end. ``StopTraining`` (or any exception) from ``on_update`` ends the run
with that update, as with thread actors: the call is run again from its start
up to it (the same bits), and its state is the one returned and checkpointed;
the call's later updates are dropped. An update whose params or metrics are
not finite ends its call with the params before it kept, and raises
`NonFiniteError` as the learner does.
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core.devices import LearnerPlacement, host_zeros, to_host
from ppo_async.core.update import Batch, LearnerState, ScheduledUpdate, UpdateFn
from ppo_async.envs.program import ActorProgram
from ppo_async.runtime.actor import ActorStart, ActorStats, _first_carry, exact_version
from ppo_async.runtime.layout import rolls_out_together
from ppo_async.runtime.learner import (
    LearnerConnections,
    LearnerHooks,
    Learner,
    LearnerReport,
    _InFlight,
    stack_experiences,
)
from ppo_async.runtime.messages import ActorFailure, Experience

MAX_UPDATES_PER_CALL = 64
_CALL_S = 0.2  # what a call aims to last once its updates are timed: the progress stays live
_EPISODE_ROWS_PER_CALL = 1 << 20  # bounds the episodes read back per call (rows x envs x updates)

# after_call(state, report, carries, history): `AfterUpdate` with the params of the
# versions before the state's (oldest first) that a checkpoint keeps, from the program.
AfterCall = Callable[[LearnerState, LearnerReport, list[Any], list[tuple[int, Any]]], None]


class _Chunks(NamedTuple):
    """Every actor's chunk of one update, collected and stacked."""

    batch: Batch
    episodes: tuple  # per actor: (episode_return [T, E], episode_length [T, E])
    carries: tuple  # each actor's carry after its chunk


class _Loop(NamedTuple):
    """The carry of one call's loop, and what it returns."""

    count: jax.Array  # updates run (the last not finite where ``good`` is False)
    good: jax.Array
    state: LearnerState  # after the last update
    carries: tuple  # each actor's carry after the chunk of the last update
    history: tuple  # params of the versions before ``state``'s, oldest first
    metrics: dict  # name -> [max_updates]
    episodes: tuple  # per actor: ([max_updates, T, E], [max_updates, T, E])


class _Call(NamedTuple):
    """One call of the loop: the loop it ``start``-ed from after ``done`` updates, its
    result (``loop``, not waited for) and when it was ``launched``."""

    start: _Loop
    done: int
    loop: _Loop
    launched: float


class _Episodes(NamedTuple):
    """The parts of a chunk's trajectory the learner counts (`LearnerReport.record_update`)."""

    episode_return: np.ndarray
    episode_length: np.ndarray


def _collector(config: AsyncActorLearnerConfig, program: ActorProgram):
    """``collect(params, carries, lag) -> _Chunks``: every actor's next chunk, traced
    (together or in turn: `rolls_out_together`)."""
    grouped = rolls_out_together(config)

    def collect(params: Any, carries: tuple, lag: Any) -> _Chunks:
        chunks = (program.rollout_group(params, list(carries)) if grouped
                  else [program.rollout(params, carry) for carry in carries])
        experiences = [Experience(actor_id, 0, trajectory, bootstrap_obs, bootstrap_value)
                       for actor_id, (_, trajectory, bootstrap_obs, bootstrap_value)
                       in enumerate(chunks)]
        return _Chunks(
            stack_experiences(experiences, [lag] * len(chunks), xp=jnp),
            tuple((e.trajectory.episode_return, e.trajectory.episode_length)
                  for e in experiences),
            tuple(chunk[0] for chunk in chunks))

    return collect


def _shapes(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _loop_program(config: AsyncActorLearnerConfig, collect: Callable[..., _Chunks],
                  update_program: Callable[..., Any], max_updates: int):
    """The jitted ``run(state, carries, history, n, done, first_version, rate) -> _Loop``:
    up to ``n`` updates (at most ``max_updates``), stopping after one that is not finite.

    ``update_program(state, batch, rate)`` is the learner's update, its learning-rate
    piece ``rate`` an argument (`ScheduledUpdate`), so that runs that differ only in
    their budget or learning rate run one loop program (one entry of a compilation
    cache).

    The update after ``u`` done (0-based chunk ``u``) trains on chunks collected with
    the params of version ``max(u - exact_lag, first_version)``: ``history[0]``, where
    ``history`` holds the ``exact_lag`` versions before the state's (padded at the
    front with the oldest there is), or the state's own params at lag 0.
    """
    lag = config.exact_lag

    def run(state, carries, history, n, done, first_version, rate):
        def update(state, batch):
            return update_program(state, batch, rate)

        chunk_spec = jax.eval_shape(collect, _shapes(state.params), _shapes(carries), 0)
        _, metrics_spec = jax.eval_shape(update, _shapes(state), chunk_spec.batch)

        def buffer(spec):
            return jnp.zeros((max_updates, *spec.shape), spec.dtype)

        def step(loop: _Loop) -> _Loop:
            i = loop.count
            chunk_lag = jnp.minimum(lag, done + i - first_version)
            acting = loop.history[0] if lag else loop.state.params
            chunks = collect(acting, loop.carries, chunk_lag)
            state, metrics = update(*jax.lax.optimization_barrier((loop.state, chunks.batch)))
            good = metrics["params_finite"] == 1.0
            for value in metrics.values():
                good &= jnp.all(jnp.isfinite(value))
            # A bad update's state is returned as it is: the host runs the call again up
            # to the update before it (`in_learner_loop`), which is cheaper than selecting
            # the last good state here on every update (0.1 s of the loop's compile).
            return _Loop(
                i + 1, good, state, chunks.carries, (*loop.history, loop.state.params)[1:],
                {name: loop.metrics[name].at[i].set(value) for name, value in metrics.items()},
                jax.tree.map(lambda rows, x: rows.at[i].set(x), loop.episodes,
                             chunks.episodes))

        start = _Loop(jnp.int32(0), jnp.bool_(True), state, carries, history,
                      jax.tree.map(buffer, metrics_spec), jax.tree.map(buffer, chunk_spec.episodes))
        return jax.lax.while_loop(lambda loop: (loop.count < n) & loop.good, step, start)

    return jax.jit(run)


class ProgramActors:
    """The actors of ``sampler='learner'``, which run nowhere but in the learner's program:
    where each starts (``starts``: a resumed run's carries and versions), their counters
    (``stats``: the chunks the updates consumed; none is collected ahead), and the
    evaluator's failures, for the loop to raise. Nothing is sent: no transport."""

    def __init__(self, config: AsyncActorLearnerConfig, starts: Sequence[ActorStart]):
        self.starts = list(starts)
        self.stats = [ActorStats(actor_id, pid=os.getpid()) for actor_id in
                      range(config.num_actors)]
        self._failures: queue.Queue = queue.Queue()

    def report_failure(self, failure: ActorFailure) -> None:
        self._failures.put(failure)

    def take_failures(self) -> list[ActorFailure]:
        """The failures reported since the last look, oldest first."""
        failures = []
        while True:
            try:
                failures.append(self._failures.get_nowait())
            except queue.Empty:
                return failures


def max_updates_per_call(config: AsyncActorLearnerConfig) -> int:
    """How many updates one call can run: `MAX_UPDATES_PER_CALL`, fewer for large batches
    (each update's episodes are read back, ``num_steps x envs`` rows)."""
    return max(1, min(MAX_UPDATES_PER_CALL, _EPISODE_ROWS_PER_CALL // config.batch_size))


class LoopProgram(NamedTuple):
    """The jitted loop of a run (`_loop_program`), built once so that a warm-up compiles it;
    ``rate``: its learning-rate argument."""

    run: Callable[..., _Loop]
    max_updates: int
    rate: Any


def loop_program(config: AsyncActorLearnerConfig, program: ActorProgram,
                 update: UpdateFn) -> LoopProgram:
    """The loop of ``sampler='learner'`` for ``config``, ``program`` and the learner's ``update``."""
    max_updates = max_updates_per_call(config)
    if isinstance(update, ScheduledUpdate):
        update_program, rate = update.program, update.rate
    else:
        def update_program(state, batch, _):
            return update(state, batch)
        rate = None
    key = (program.identity, config.num_actors, rolls_out_together(config), config.exact_lag,
           max_updates, update_program)
    run = _LOOPS.get(key) if program.identity is not None else None
    if run is None:
        run = _loop_program(config, _collector(config, program), update_program, max_updates)
        if program.identity is not None:
            _LOOPS[key] = run
            while len(_LOOPS) > _LOOPS_KEPT:
                del _LOOPS[next(iter(_LOOPS))]  # the oldest
    return LoopProgram(run, max_updates, rate)


# Held for the process, like the programs they call (`ppo_async.envs.gymnax_env`):
# a notebook's next run, a sweep's next seed or learning rate or a resumed run calls
# the loop the first one traced and compiled. The key is everything the loop is built
# from; the update program is the same object for runs that differ only in their
# budget or learning rate, which are its argument.
_LOOPS: dict[tuple, Callable[..., _Loop]] = {}
_LOOPS_KEPT = 32


class LoopWarmUp(NamedTuple):
    """A call of ``loop`` that runs no update (`lower_loop`): its arguments, and the
    loop lowered for them, to compile (`warm_up_loop`)."""

    loop: LoopProgram
    args: tuple
    lowered: Any


def lower_loop(loop: LoopProgram, config: AsyncActorLearnerConfig, program: ActorProgram,
               state: LearnerState, device: jax.Device) -> LoopWarmUp:
    """Trace and lower ``loop`` for a call that runs no update, on ``state`` (on
    ``device``: the learner's, where the run's own state is) and fresh carries of the
    real shapes.

    Done in the caller's thread before anything else of the run's start: tracing and
    lowering are Python and take the GIL, and beside the initializers' compile they
    took 0.8 s where alone they take 0.45 s, on the way to the XLA compile that the
    first update waits for (``experiments/startup_timeline.py``)."""
    if program.carry_spec is not None:  # zeros: the reset compiles beside the loop, not before
        carries = (jax.device_put(host_zeros(program.carry_spec), device),) * config.num_actors
    else:
        carries = tuple(_first_carry(actor_id, config, program, device, ActorStart())
                        for actor_id in range(config.num_actors))
    history = (state.params,) * config.exact_lag
    args = (state, carries, history, jnp.int32(0), jnp.int32(0), jnp.int32(0), loop.rate)
    return LoopWarmUp(loop, args, loop.run.trace(*args).lower())


def warm_up_loop(warm_up: LoopWarmUp) -> None:
    """Compile the lowered loop and call it once: the run's calls find the compiled
    program in the loop's cache."""
    warm_up.lowered.compile()
    jax.block_until_ready(warm_up.loop.run(*warm_up.args).count)


def in_learner_loop(
    config: AsyncActorLearnerConfig, program: ActorProgram, loop_program: LoopProgram,
    state: LearnerState, channels: LearnerConnections, placement: LearnerPlacement,
    update: UpdateFn, report: LearnerReport, end_update: int,
    published: list[tuple[int, Any]], hooks: LearnerHooks, actors: ProgramActors,
    after_call: AfterCall | None = None, before_first_call: Callable[[], None] | None = None,
    pipeline: bool = True,
) -> tuple[LearnerState, LearnerReport]:
    """`ppo_async.runtime.learner.learner_loop` for ``sampler='learner'``: the updates and
    the actors' chunks in one program (module docstring), until ``end_update``.

    ``published``: (version, params) of the versions a resumed run's first chunks
    need, ending with ``state``'s own; the actors start where ``actors`` says, and
    count there what the updates consumed. ``after_call`` checkpoints after the last good
    update of each call (``hooks.after_update`` is not called). ``pipeline=False``
    launches a call only once the last one's updates are passed on (to measure what
    launching it before them gives: ``experiments/bench_throughput.py``).
    """
    lag, device = config.exact_lag, placement.device
    learner = Learner(config, channels, placement, update, report, end_update,
                      hooks._replace(after_update=None))
    run, max_updates, rate = loop_program
    first_version = published[0][0]

    def version_of(chunk: int) -> int:  # the params a thread actor collects ``chunk`` with
        return max(exact_version(chunk, lag, 1), first_version)

    carries = jax.device_put(
        tuple(_first_carry(actor_id, config, program, device, actors.starts[actor_id])
              for actor_id in range(config.num_actors)), device)
    # The versions before the state's that the chunks need and a checkpoint keeps
    # (`ppo_async.resume.params_history_size`: exact_lag + broadcast_every - 1, here exact_lag).
    size = lag
    before = [params for _, params in published[:-1]][-size:] if size else []
    history = tuple([before[0] if before else state.params] * (size - len(before)) + before)
    updates_per_call, compiled = 1, False

    def launch(start: _Loop, done: int) -> _Call:
        n = min(updates_per_call, _next_stop(config, done, end_update) - done, max_updates)
        return _Call(start, done, run(start.state, start.carries, start.history, jnp.int32(n),
                                      jnp.int32(done), jnp.int32(first_version), rate),
                     time.perf_counter())

    def rerun(call: _Call, i: int) -> _Loop:
        """``call`` run again from its start up to its update ``i`` (the same bits)."""
        if i < 0:
            return call.start
        return run(call.start.state, call.start.carries, call.start.history,
                   jnp.int32(i + 1), jnp.int32(call.done), jnp.int32(first_version), rate)

    def kept(loop: _Loop) -> _Loop:
        """``loop``, checkpointed."""
        if after_call is not None:
            after_call(loop.state, report, list(loop.carries),
                       _history_versions(report.updates, size, first_version, loop.history))
        return loop

    loop = _Loop(None, None, state, carries, history, None, None)
    if report.updates < end_update and before_first_call is not None:
        before_first_call()
    pending = launch(loop, report.updates) if report.updates < end_update else None
    while pending is not None:
        call, pending = pending, None
        count, good, metrics, episodes = to_host((call.loop.count, call.loop.good,
                                                  call.loop.metrics, call.loop.episodes))
        count, good = int(count), bool(good)
        if compiled:  # the first call compiles: its time says nothing
            updates_per_call = int(max(1, min(max_updates, _CALL_S * count /
                                              (time.perf_counter() - call.launched))))
        compiled = True
        last_good = count - 1 if good else count - 2
        # The loop after the last good update: the call's own, or (the last not finite)
        # the call run again up to the one before it.
        loop = call.loop if good else rerun(call, last_good)
        if pipeline and good and call.done + count < end_update:
            # The next call computes while this one's updates are passed on below (one
            # program at a time on the device; the host's part on another core). A run
            # that stops in them drops it.
            pending = launch(loop, call.done + count)
        stopped = False
        for i in range(count):
            chunk = call.done + i
            experiences = [
                Experience(actor_id, version_of(chunk),
                           _Episodes(*(np.asarray(rows[i]) for rows in episodes[actor_id])),
                           None, None)
                for actor_id in range(config.num_actors)]
            _count_consumed(config, actors.stats, experiences)
            in_flight = _InFlight(loop.state if i == last_good else None,
                                  {name: value[i] for name, value in metrics.items()},
                                  experiences, [chunk - version_of(chunk)] * config.num_actors)
            try:
                going = learner.finish(in_flight)  # raises for the update not finite
            except BaseException:
                # From on_update (Ctrl-C, the user's error): this update is the one
                # kept, as thread actors' learner keeps it.
                if i <= last_good:
                    kept(loop if i == last_good else rerun(call, i))
                raise
            if not going:  # StopTraining: the run ends with this update
                loop = kept(loop if i == last_good else rerun(call, i))
                pending, stopped = None, True
                break
            if i == last_good:
                kept(loop)
        learner.beat()
        for failure in actors.take_failures():  # the evaluator's, reported while the call ran
            learner.actor_failed(failure)
        if not (pipeline or stopped) and report.updates < end_update:
            pending = launch(loop, report.updates)
    return loop.state, report


def _next_stop(config: AsyncActorLearnerConfig, done: int, end_update: int) -> int:
    """The update after ``done`` where a call must end: the run's end, or the next
    checkpoint or evaluation due by count (they need that update's params)."""
    stops = [end_update]
    for every in (config.checkpoint_every_updates, config.eval_every_updates):
        if every:
            stops.append((done // every + 1) * every)
    return min(stops)


def _history_versions(updates: int, size: int, first_version: int,
                      history: tuple) -> list[tuple[int, Any]]:
    """(version, params) of the program's history after ``updates`` updates, oldest first."""
    return [(max(updates - size + i, first_version), params)
            for i, params in enumerate(history)]


def _count_consumed(config: AsyncActorLearnerConfig, stats: list[ActorStats],
                    experiences: list[Experience]) -> None:
    """Each actor's counters after an update consumed its chunk (``experiences``)."""
    for actor_stats, experience in zip(stats, experiences, strict=True):
        actor_stats.rollouts_sent += 1
        actor_stats.env_steps += config.num_steps * config.envs_per_actor
        actor_stats.episodes += int((experience.trajectory.episode_length > 0).sum())
