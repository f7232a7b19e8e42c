"""Actors: the loop that collects experience with a CPU copy of the policy.

An actor owns ``envs_per_actor`` envs (its `ActorProgram`). Per chunk it (1)
takes the newest `PolicyBroadcast` waiting for it without blocking, (2) asks
its `ActorThrottle` whether the chunk would run too far ahead of the learner,
waiting for a broadcast if so, (3) runs the rollout of ``num_steps`` steps,
and (4) sends one `Experience` to the learner. An exception inside an actor is
sent to the learner as an `ActorFailure` so that the run stops at once
instead of starving.

Where the actors' rollouts do not block their thread (jitted gymnax chunks),
one thread runs the loop for all the actors of a device (`ActorGroup`).

The loop (`run_actor`) is written once and talks to an `ActorEndpoint`:
how messages move is a transport's business. `QueueEndpoint` is the endpoint
of an actor thread (queues in the learner's process, `spawn_actor`);
`ppo_async.runtime.ray_transport` gives the same loop an endpoint in a process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core import keys
from ppo_async.core.devices import to_host
from ppo_async.envs.program import ActorProgram, AttachedCarry, Carry, ChunkClient, unattached
from ppo_async.runtime.inference import RolloutStopped
from ppo_async.runtime.messages import (
    ActorFailure,
    Experience,
    PolicyBroadcast,
    load_policy_from_broadcast,
    take_all,
    take_newest,
)

# How often a waiting actor looks at the stop signal.
_POLL_S = 0.05


EVALUATOR_ID = -1  # the actor_id an evaluator thread's failure is reported under
PUBLISHER_ID = -2  # the actor_id a publisher thread's failure is reported under


class ActorError(RuntimeError):
    """An actor (or the evaluator thread) raised; the original exception is the ``__cause__``."""

    def __init__(self, actor_id: int, formatted_traceback: str):
        who = {EVALUATOR_ID: "evaluator thread", PUBLISHER_ID: "publisher thread"}.get(
            actor_id, f"actor {actor_id}")
        super().__init__(f"{who} failed:\n{formatted_traceback}")
        self.actor_id = actor_id


@dataclasses.dataclass
class ActorStats:
    """Counters of one actor, returned when its thread ends."""

    actor_id: int
    env_steps: int = 0  # env steps collected (all envs of this actor)
    episodes: int = 0  # episodes finished
    rollouts_sent: int = 0  # Experience messages sent
    broadcasts_received: int = 0  # PolicyBroadcast messages taken off the queue
    pause_s: float = 0.0  # time spent held back by the staleness valve
    restarts: int = 0  # times the supervisor restarted this actor (after it raised, died or hung)
    active_s: float = 0.0  # time spent collecting (rollout and sending), first chunk excluded
    first_chunk_s: float = 0.0  # the first chunk's time, which includes compiling the rollout
    # CPU time of the actor's thread while collecting (the GIL caps threads' sum); a shared
    # sampler's thread and its env steppers are not counted.
    cpu_s: float = 0.0
    pid: int = 0  # the process the actor runs in (the learner's, for threads)
    node_id: str = ""  # the Ray node it runs on; "" for threads
    # The CPUs its thread may run on (its affinity, one where its process was pinned:
    # pin_actor_processes); () where the platform does not say.
    cpus: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class ActorThrottle:
    """The staleness valve of one actor.

    Each learner update consumes exactly ``num_steps`` rows from every actor,
    so a broadcast carrying ``learner_updates = U`` proves that the learner has
    consumed ``U * num_steps`` rows of this actor. A chunk may start only if,
    after it, the actor's lead over that would be at most ``max_lead_steps``.
    The newest params an actor can hold are those of update ``U``, and the chunk
    it may start is consumed at the latest by update ``U + lead_chunks``, so the
    policy lag of every consumed step is at most ``max_lead_steps // num_steps - 1``.
    """

    num_steps: int
    max_lead_steps: int

    @classmethod
    def from_config(cls, config: AsyncActorLearnerConfig) -> ActorThrottle:
        return cls(config.num_steps, config.lead_steps)

    def may_start_chunk(self, produced_steps: int, learner_updates: int) -> bool:
        """Whether a chunk may start after ``produced_steps`` rows, given ``learner_updates``."""
        consumed = learner_updates * self.num_steps
        return produced_steps + self.num_steps - consumed <= self.max_lead_steps


class ActorEndpoint(Protocol):
    """What the actor loop needs from a transport: the actor's end of its channels.

    Every method returns promptly (``wait_broadcast`` within its timeout), so
    the loop sees a stop signal within one poll.
    """

    def send(self, item: Experience | ActorFailure) -> None:
        """Deliver ``item`` to the learner, after every item sent before it."""

    def take_newest(self) -> tuple[PolicyBroadcast | None, int]:
        """The newest broadcast waiting (None if none), and how many were taken; never blocks."""

    def take_all(self) -> list[Any]:
        """Every broadcast waiting, each with its ``.version``, unloaded (`load`); never blocks."""

    def load(self, item: Any) -> PolicyBroadcast:
        """The `PolicyBroadcast` of an item of `take_all` (or of `wait_broadcast`)."""

    def wait_broadcast(self, timeout_s: float) -> PolicyBroadcast | None:
        """The next broadcast, waiting up to ``timeout_s``; None if none came."""

    def stopped(self) -> bool:
        """Whether the run has asked this actor to end."""


class QueueEndpoint(NamedTuple):
    """The `ActorEndpoint` of an actor thread: queue ends and stop signal in the learner's process."""

    experience_queue: queue.Queue  # shared by all actors -> learner (Experience | ActorFailure)
    broadcast_queue: queue.Queue  # learner -> this actor (PolicyBroadcast)
    stop: threading.Event  # set by train() to end the run

    def send(self, item: Experience | ActorFailure) -> None:
        self.experience_queue.put(item)

    def take_newest(self) -> tuple[PolicyBroadcast | None, int]:
        return take_newest(self.broadcast_queue)

    def take_all(self) -> list[PolicyBroadcast]:
        return take_all(self.broadcast_queue)

    def load(self, item: PolicyBroadcast) -> PolicyBroadcast:
        return item

    def wait_broadcast(self, timeout_s: float) -> PolicyBroadcast | None:
        try:
            return self.broadcast_queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def stopped(self) -> bool:
        return self.stop.is_set()


class ActorStart(NamedTuple):
    """Where an actor starts: fresh, after a restart, or from a checkpoint."""

    restart: int = 0  # restarts so far; a restarted actor folds it into its key
    produced_steps: int = 0  # rows (per env) the learner counts as already produced
    carry: Any = None  # env carry to continue from; None resets the envs
    # With exact_policy_lag: the oldest params version this actor will be sent (a
    # resumed or restarted actor is not sent again the versions before it).
    first_version: int = 0


def run_actor(
    actor_id: int,
    config: AsyncActorLearnerConfig,
    program: ActorProgram,
    channels: ActorEndpoint,
    device: jax.Device,
    stats: ActorStats | None = None,
    start: ActorStart = ActorStart(),
    load_params: Callable[[PolicyBroadcast], Any] | None = None,
    policy: Callable[..., Any] | None = None,
) -> ActorStats:
    """The actor loop; returns its `ActorStats` once ``channels.stopped()``.

    ``channels`` is any `ActorEndpoint` (`QueueEndpoint` for a thread). The
    first `PolicyBroadcast` must already wait there (or arrive): the actor
    never acts with params the learner did not send. ``load_params`` turns a
    broadcast into params (default: `load_policy_from_broadcast` onto
    ``device``; the thread transport shares one `SharedParams` among its
    actors). ``policy``: the actor's client of a call shared by the actors
    of its device (`ppo_async.runtime.inference.InferenceServer.client`),
    attached to its carry (`AttachedCarry`; the learner is sent the env
    carry alone); None: the rollout calls alone. Raises whatever the env,
    rollout or loading raises; the transport reports it (`spawn_actor`).
    """
    stats = stats if stats is not None else ActorStats(actor_id)
    _acting.actor_id = actor_id
    _note_cpus([stats])
    carry = _first_carry(actor_id, config, program, device, start)
    if policy is not None:
        carry = AttachedCarry(carry, policy)
    carries = [carry]
    try:
        if load_params is None:
            def load_params(broadcast: PolicyBroadcast) -> Any:
                return load_policy_from_broadcast(broadcast, program.params_template, device)

        def rollout(params: Any, carries: list[Carry], *next_params) -> list[tuple]:
            return [program.rollout(params, carries[0], *next_params)]
        # A lock-step sampler may begin the next chunk itself (`ChunkClient`): with an
        # exact lag, the params it needs are known before this one ends.
        follows = isinstance(policy, ChunkClient) and config.exact_lag is not None
        _collect([actor_id], config, rollout, channels, load_params, [stats], start, carries,
                 follows)
    finally:
        # Host envs hold simulators (processes, files, windows): released on every
        # way out, a restart included. The carry object owns them whatever it became.
        if program.close is not None:
            program.close(carries[0])
    return stats


class ActorGroup:
    """Actors ``actor_ids`` of one device whose chunks one thread collects (`run`).

    Each keeps its envs, keys, column and ``stats``; they take one params
    version together from ``channels`` (their shared endpoint), and their
    experience is sent in actor order. With ``fused``, every chunk of all of
    them is one call of ``program.rollout_group`` (one program: the calls an
    `ppo_async.runtime.inference.InferenceServer` makes for actor threads
    sharing their chunks, so the same bits); otherwise each actor's own
    ``rollout`` is called in turn, each a jitted program that returns before
    it has run, so the chunks compute side by side and the bits are those of
    actor threads rolling out alone. Either way no thread per actor wakes,
    loads, reads back and sends in turn between an update and the next chunks.

    `carries` holds each actor's carry after its last chunk sent, and
    `current` the actor whose rollout the thread is in, so that a transport
    can say which actor raised or hangs (`failed_actor`, `doing`) and restart
    the others where they were.
    """

    def __init__(self, actor_ids: list[int], config: AsyncActorLearnerConfig,
                 program: ActorProgram, channels: ActorEndpoint, device: jax.Device,
                 stats: list[ActorStats], load_params: Callable[[PolicyBroadcast], Any],
                 fused: bool):
        self.actor_ids, self.config, self.program = actor_ids, config, program
        self.channels, self.device, self.stats = channels, device, stats
        self.load_params, self.fused = load_params, fused
        self.carries: list[Carry | None] = [None] * len(actor_ids)
        self.current: int | None = None  # the actor whose rollout runs now

    def run(self, start: ActorStart, carries: list[Carry | None]) -> None:
        """Collect until the stop signal: ``carries[i]`` (None: fresh episodes, from
        ``start.restart``) is where actor ``actor_ids[i]`` starts; ``start`` holds for all."""
        _note_cpus(self.stats)
        self.carries = [_first_carry(actor_id, self.config, self.program, self.device, start)
                        if carry is None else carry
                        for actor_id, carry in zip(self.actor_ids, carries)]
        _collect(self.actor_ids, self.config, self._rollout, self.channels, self.load_params,
                 self.stats, start, self.carries)

    def _rollout(self, params: Any, carries: list[Carry]) -> list[tuple]:
        if self.fused:
            return self.program.rollout_group(params, carries)
        chunks = []
        for actor_id, carry in zip(self.actor_ids, carries):
            self.current = _acting.actor_id = actor_id
            chunks.append(self.program.rollout(params, carry))
        self.current = _acting.actor_id = None
        return chunks

    def failed_actor(self) -> int:
        """The actor to report a failure under: the one whose rollout raised, else the first."""
        return self.actor_ids[0] if self.current is None else self.current

    def doing(self) -> str:
        """Where the thread is: an actor's rollout, or the group's own loop."""
        if self.current is None:
            return "in its own loop"
        return f"in actor {self.current}'s chunk"


_acting = threading.local()  # .actor_id: the actor whose chunk this thread collects


def current_actor() -> int | None:
    """The actor whose chunk this thread is collecting: an actor thread's own, or in an
    `ActorGroup` the actor whose rollout it is calling; None elsewhere (and during a
    group's one call for all of its actors)."""
    return getattr(_acting, "actor_id", None)


def _note_cpus(stats: list[ActorStats]) -> None:
    if hasattr(os, "sched_getaffinity"):
        cpus = tuple(sorted(os.sched_getaffinity(0)))
        for one in stats:
            one.cpus = cpus


def _first_carry(actor_id: int, config: AsyncActorLearnerConfig, program: ActorProgram,
                 device: jax.Device, start: ActorStart) -> Carry:
    """Actor ``actor_id``'s carry to start from: ``start.carry``, else fresh episodes."""
    if start.carry is not None:
        return start.carry
    # Host-side keys (`ppo_async.core.keys`): JAX's bits, without compiling on the way to the reset.
    key = keys.fold_in(keys.key(config.seed), actor_id)
    if start.restart:
        key = keys.fold_in(key, start.restart)
    return program.reset(key, device)


def exact_version(chunk: int, lag: int, broadcast_every: int) -> int:
    """The params version an actor's chunk ``chunk`` (0-based) is collected with, at ``exact_policy_lag=lag``.

    The chunk feeds update ``chunk + 1``, which sees the params of update
    ``chunk - lag`` (0 for the first ``lag`` chunks), or the newest broadcast
    not above it when the learner broadcasts every ``broadcast_every`` updates.
    """
    return broadcast_every * (max(0, chunk - lag) // broadcast_every)


class _Chooser:
    """What both ways of choosing params share: the counters of the actors they choose for."""

    stats: list[ActorStats]

    def _count(self, received: int = 0, paused_s: float = 0.0) -> None:
        for stats in self.stats:
            stats.broadcasts_received += received
            stats.pause_s += paused_s


class _NewestParams(_Chooser):
    """Free-running: act with the newest params received, as far ahead as the valve allows."""

    def __init__(self, config: AsyncActorLearnerConfig, channels: ActorEndpoint,
                 load: Callable[[PolicyBroadcast], Any], stats: list[ActorStats]):
        self.throttle = ActorThrottle.from_config(config)
        self.channels, self.load, self.stats = channels, load, stats
        self.params, self.version = None, -1

    def params_for(self, produced: int) -> Any | None:
        """The params to collect the next chunk with; None: look again (waited, or newer arrived)."""
        newest, taken = self.channels.take_newest()
        self._count(received=taken)
        if newest is None and (
            self.params is None or not self.throttle.may_start_chunk(produced, self.version)
        ):
            # Held back (or not yet given params): wait for a broadcast, in
            # short waits so that a stop is seen promptly.
            pause_start = time.perf_counter()
            newest = self.channels.wait_broadcast(_POLL_S)
            self._count(int(newest is not None), time.perf_counter() - pause_start)
            if newest is None:
                return None
        if newest is not None and newest.version <= self.version:
            return None  # never step back to older params
        if newest is not None:
            self.params, self.version = self.load(newest), newest.version
            return None  # look again: more may have arrived, and the valve may now open
        return self.params


class _ExactParams(_Chooser):
    """``exact_policy_lag``: act on each chunk with exactly the version it needs (`exact_version`).

    Broadcasts of later versions wait until their chunk comes, never used
    early; earlier ones are dropped. Waiting for the version a chunk needs is
    the valve: the lead is fixed at ``exact_policy_lag + broadcast_every`` chunks.
    """

    def __init__(self, config: AsyncActorLearnerConfig, channels: ActorEndpoint,
                 load: Callable[[PolicyBroadcast], Any], stats: list[ActorStats],
                 first_version: int):
        self.lag, self.broadcast_every = config.exact_lag, config.broadcast_every
        self.num_steps, self.channels, self.load, self.stats = config.num_steps, channels, load, stats
        self.first_version = first_version
        self.waiting: dict[int, Any] = {}  # version -> a broadcast not yet needed (unloaded)
        self.params, self.version = None, -1
        self.failed: BaseException | None = None  # loading ahead raised: the next call raises it

    def params_for(self, produced: int, ahead: bool = False) -> Any | None:
        """The params of the version the chunk after ``produced`` steps needs; None while it
        has not arrived.

        ``ahead``: asked from a sampler's thread as the chunk before it ends
        (`ppo_async.runtime.inference.LockstepSampler`), while the actors'
        thread waits for that chunk: it does not wait for a broadcast, and an
        error loading one is raised by the next call, in the actors' thread.
        """
        if self.failed is not None:
            error, self.failed = self.failed, None
            raise error
        chunk = produced // self.num_steps
        target = max(exact_version(chunk, self.lag, self.broadcast_every), self.first_version)
        if self.version == target:
            return self.params
        self._receive(self.channels.take_all())
        if target not in self.waiting:
            if ahead:
                return None
            pause_start = time.perf_counter()
            arrived = self.channels.wait_broadcast(_POLL_S)
            self._count(paused_s=time.perf_counter() - pause_start)
            self._receive([arrived] if arrived is not None else [])
            if target not in self.waiting:
                return None
        item = self.waiting.pop(target)
        self.waiting = {v: b for v, b in self.waiting.items() if v > target}
        try:
            self.params, self.version = self.load(self.channels.load(item)), target
        except BaseException as error:
            if not ahead:
                raise
            self.failed = error
            return None
        return self.params

    def _receive(self, items: list[Any]) -> None:
        self._count(received=len(items))
        self.waiting.update((item.version, item) for item in items)


def _collect(actor_ids: list[int], config: AsyncActorLearnerConfig,
             rollout: Callable[[Any, list[Carry]], list[tuple]], channels: ActorEndpoint,
             load: Callable[[PolicyBroadcast], Any], stats: list[ActorStats],
             start: ActorStart, carries: list[Carry], follows: bool = False) -> None:
    """The loop of `run_actor` (one actor) and `ActorGroup`, until the stop signal.

    ``rollout(params, carries)`` collects one chunk of every actor of
    ``actor_ids``; ``carries`` is updated in place after each chunk, so the
    caller can release what the last ones hold. ``follows`` (exact lag only):
    ``rollout(params, carries, next_params)``, where ``next_params()`` gives
    the next chunk's params if they have arrived (else None), without waiting;
    it is called from a sampler's thread while this one waits for the chunk.
    """
    if config.exact_lag is None:
        chooser = _NewestParams(config, channels, load, stats)
    else:
        chooser = _ExactParams(config, channels, load, stats, start.first_version)
    produced = start.produced_steps
    share = 1.0 / len(actor_ids)
    while not channels.stopped():
        params = chooser.params_for(produced)
        if params is None:
            continue
        version = chooser.version  # next_params may move the chooser on to the next chunk's
        chunk_start, chunk_cpu_start = time.perf_counter(), time.thread_time()
        try:
            if follows:
                chunks = rollout(params, carries, functools.partial(
                    chooser.params_for, produced + config.num_steps, ahead=True))
            else:
                chunks = rollout(params, carries)
        except RolloutStopped:
            return  # stopped while waiting for a batched policy call: the chunk is not needed
        # to_host blocks until the rollout is done and reads it as numpy, so the
        # learner never touches an actor-device buffer.
        sent = to_host([chunk[1:] for chunk in chunks])
        for index, (actor_id, (carry, *_), (trajectory, bootstrap_obs, bootstrap_value)) in (
                enumerate(zip(actor_ids, chunks, sent))):
            carries[index] = carry
            channels.send(Experience(actor_id, version, trajectory, bootstrap_obs,
                                     bootstrap_value, unattached(carry)[0]))
            actor = stats[index]
            actor.env_steps += trajectory.reward.size
            actor.episodes += int(np.count_nonzero(trajectory.episode_length))
            actor.rollouts_sent += 1
        produced += config.num_steps
        elapsed = time.perf_counter() - chunk_start
        cpu = (time.thread_time() - chunk_cpu_start) * share
        for actor in stats:
            actor.cpu_s += cpu
            if actor.first_chunk_s == 0.0:
                actor.first_chunk_s = elapsed
            else:
                actor.active_s += elapsed


@dataclasses.dataclass
class ActorHandle:
    """A running actor thread, its live stats, and the error it died of (if any)."""

    actor_id: int
    thread: threading.Thread
    stats: ActorStats
    error: BaseException | None = None

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s; True if the thread has ended."""
        self.thread.join(timeout)
        return not self.thread.is_alive()


def spawn_actor(
    actor_id: int,
    config: AsyncActorLearnerConfig,
    program: ActorProgram,
    channels: QueueEndpoint,
    device: jax.Device,
    stats: ActorStats | None = None,
    start: ActorStart = ActorStart(),
    load_params: Callable[[PolicyBroadcast], Any] | None = None,
    policy: Callable[..., Any] | None = None,
) -> ActorHandle:
    """Start `run_actor` in a daemon thread and return its `ActorHandle`.

    An exception in the actor is stored on the handle and sent to the learner
    as an `ActorFailure` on the experience queue. ``stats`` carries counters
    over from an actor this one replaces.
    """
    stats = stats if stats is not None else ActorStats(actor_id)
    stats.pid, stats.node_id = os.getpid(), ""
    handle = ActorHandle(actor_id, None, stats)  # type: ignore[arg-type]

    def run() -> None:
        try:
            run_actor(actor_id, config, program, channels, device, handle.stats, start,
                      load_params, policy)
        except BaseException as error:  # noqa: BLE001 - reported, never swallowed
            handle.error = error
            channels.send(ActorFailure(actor_id, error, traceback.format_exc()))

    handle.thread = threading.Thread(target=run, name=f"ppo-actor-{actor_id}", daemon=True)
    handle.thread.start()
    return handle
