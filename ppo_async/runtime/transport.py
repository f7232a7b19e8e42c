"""Transports: how `Experience` and `PolicyBroadcast` messages move between actors and learner.

The actor loop (`ppo_async.runtime.actor.run_actor`) talks to an `ActorEndpoint`;
the learner and the supervisor talk to a `LearnerTransport`. A transport
implements both ends; nothing on either side knows which one runs:

- `ThreadTransport` (here): actors are threads of the learner's process, and
  messages are `queue.Queue` items. Jitted gymnax rollouts drop the GIL, so
  threads suffice there.
- `ppo_async.runtime.ray_transport.RayTransport`: actors are processes (a local Ray
  instance or a cluster); the learner's side is the same.

Publishing: the learner hands its params to a `Publisher` thread and goes
on; the publisher serializes them (`serialize_policy`) and delivers the bytes
to every actor. One publisher delivers in order, so versions never go
backwards; if the learner hands over a newer version before the last one was
serialized, only the newer one is sent (an actor keeps only the newest
anyway). The learner publishes only params that passed its finiteness check.
"""

from __future__ import annotations

import collections
import logging
import os
import pathlib
import queue
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.envs.program import ActorProgram
from ppo_async.runtime.layout import collects_as_group, shares_calls, uses_shared_sampler
from ppo_async.runtime.actor import (
    PUBLISHER_ID,
    ActorEndpoint,
    ActorGroup,
    ActorHandle,
    ActorStart,
    ActorStats,
    QueueEndpoint,
    spawn_actor,
)
from ppo_async.runtime.inference import InferenceServer, LockstepSampler, SharedParams
from ppo_async.runtime.messages import ActorFailure, Experience, PolicyBroadcast, serialize_policy

logger = logging.getLogger(__name__)

__all__ = ["ActorEndpoint", "LearnerTransport", "Publisher", "ThreadTransport",
           "PUBLISHER_ID", "stop_threads", "where"]



class LearnerTransport(Protocol):
    """The learner's (and the supervisor's) side of a transport.

    Actor ids are ``0 .. num_actors - 1``; experience of one actor arrives in
    the order it was sent. Every method returns within its timeout.
    """

    where_killed: dict[int, str]
    """Actor processes killed for a hung actor: pid -> where their threads in env code
    were (`note_where_killed`); empty for thread actors, which cannot be killed."""

    def start_actor(self, actor_id: int, start: ActorStart) -> None:
        """Start actor ``actor_id`` from ``start``; it waits for a broadcast before acting."""

    def restart_actor(self, actor_id: int, start: ActorStart) -> None:
        """Replace actor ``actor_id`` (which failed, or was killed) with a fresh one.

        The new actor keeps the old one's `ActorStats` and is handed the
        newest published broadcast.
        """

    def wait_started(self) -> None:
        """Return once every started actor is up, so that the learner's hang clock starts
        after start-up; raises `LearnerTimeoutError` naming actors not up in time."""

    def kill_actor(self, actor_id: int) -> bool:
        """End actor ``actor_id`` at once, whatever it is doing; False if this transport cannot."""

    def receive(self, timeout_s: float) -> Experience | ActorFailure | None:
        """The next message from any actor (or a reported failure); None after ``timeout_s``."""

    def report_failure(self, failure: ActorFailure) -> None:
        """Put a failure of a helper thread (the evaluator) in the learner's stream."""

    def publish(self, params: Any, learner_updates: int) -> None:
        """Hand ``params`` (version ``learner_updates``) to the publisher; returns at once."""

    def queue_depth(self) -> int:
        """Messages received and not yet taken by the learner (what it is behind by)."""

    def actor_stats(self) -> list[ActorStats]:
        """Live counters of every actor, in actor order."""

    def stop(self, timeout_s: float, known_stuck: Sequence[int] = ()) -> list[str]:
        """Stop every actor and the publisher within ``timeout_s``; what would not stop, named.

        Actors in ``known_stuck`` (found hung by the learner) are not waited for.
        """

    def late_failures(self) -> list[ActorFailure]:
        """Failures reported after the learner stopped reading (call after `stop`)."""


class Publisher:
    """A thread ("ppo-publisher") that serializes params and delivers the bytes.

    `publish` drops ``(params, learner_updates)`` in a one-slot mailbox (a
    newer hand-over replaces one not yet taken) and returns; with
    ``every_version`` (``exact_policy_lag``, whose actors need each version)
    the mailbox keeps every hand-over, in order. The thread makes
    one `PolicyBroadcast` of it, calls ``deliver(message)`` and records it as
    `latest`. ``deliver`` runs under `lock`, which a restart holds while it
    re-delivers `latest`, so a restarted actor never sees versions out of
    order. ``on_idle`` (if given) runs under `lock` every ``poll_s`` that
    nothing new arrives: a transport's retries. A failure is reported through
    ``on_failure`` and ends the thread.
    """

    def __init__(self, deliver: Callable[[PolicyBroadcast], None],
                 on_failure: Callable[[ActorFailure], None],
                 on_idle: Callable[[], None] | None = None, poll_s: float = 0.05,
                 every_version: bool = False):
        self._deliver, self._on_failure, self._poll_s = deliver, on_failure, poll_s
        self._every_version = every_version
        self._on_idle = on_idle
        self.lock = threading.Lock()
        self.latest: PolicyBroadcast | None = None
        self.serialize_s = 0.0  # time spent serializing, off the learner's thread
        self.published = 0  # broadcasts delivered
        self._mailbox: collections.deque[tuple[Any, int]] = collections.deque()
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ppo-publisher", daemon=True)
        self.thread.start()

    def publish(self, params: Any, learner_updates: int) -> None:
        with self._wake:
            if not self._every_version:
                self._mailbox.clear()
            self._mailbox.append((params, learner_updates))
            self._wake.notify()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._wake:
                    if not self._mailbox:
                        self._wake.wait(self._poll_s)
                    taken = self._mailbox.popleft() if self._mailbox else None
                if taken is None:
                    if self._on_idle is not None:
                        with self.lock:
                            self._on_idle()
                    continue
                params, learner_updates = taken
                start = time.perf_counter()
                message = PolicyBroadcast(learner_updates, serialize_policy(params))
                self.serialize_s += time.perf_counter() - start
                with self.lock:
                    self._deliver(message)
                    self.latest = message
                    self.published += 1
        except BaseException as error:  # noqa: BLE001 - reported, never swallowed
            self._on_failure(ActorFailure(PUBLISHER_ID, error, traceback.format_exc()))

    def stop(self) -> None:
        self._stop.set()


def shared_caller(config: AsyncActorLearnerConfig, program: ActorProgram, num_actors: int,
                  stopped: Callable[[], bool], first_actor: int = 0,
                  background_clients: bool = False) -> InferenceServer | LockstepSampler | None:
    """What ``num_actors`` thread actors of one process share, unstarted: a `LockstepSampler`
    (`ppo_async.runtime.layout.uses_shared_sampler`; its ``background_clients`` as given), an
    `InferenceServer` (`ppo_async.runtime.layout.shares_calls`), or None: each calls alone."""
    shared = program.inference
    if shared is None:
        return None
    if shared.lockstep and uses_shared_sampler(config, num_actors):
        return LockstepSampler(shared.fn, num_actors, stopped, first_actor=first_actor,
                               background_clients=background_clients)
    if shares_calls(config, num_actors):
        return InferenceServer(shared.fn, num_actors, stopped, shared.gather_s)
    return None


class ThreadTransport:
    """Actors as threads of this process (`spawn_actor`), or all of them one thread
    (`ppo_async.runtime.layout.collects_as_group`); queues carry the messages."""

    def __init__(self, config: AsyncActorLearnerConfig, program: ActorProgram,
                 device: jax.Device):
        self.config, self.program, self.device = config, program, device
        self.experience_queue: queue.Queue = queue.Queue()
        self.group = program.rollout_group is not None and collects_as_group(config)
        # A group takes its broadcasts from one queue.
        self.delivery_queues = [queue.Queue()
                                for _ in range(1 if self.group else config.num_actors)]
        self.stop_event = threading.Event()
        self.handles: list[ActorHandle | None] = [None] * config.num_actors
        self.where_killed: dict[int, str] = {}  # never filled: threads are not killed
        self.publisher = Publisher(self._deliver, self.report_failure,
                                   every_version=config.exact_lag is not None)
        # One load of each version for all actors (they then share batched calls).
        self.load_params = SharedParams(program.params_template, device)
        self.inference = None if self.group else shared_caller(
            config, program, config.num_actors, self.stop_event.is_set)
        self._group_starts: dict[int, ActorStart] = {}  # the group's, until all have one
        self.actor_group: ActorGroup | None = None  # the group's collector, once started

    def _deliver(self, message: PolicyBroadcast) -> None:
        for broadcast_queue in self.delivery_queues:
            broadcast_queue.put(message)

    def _broadcast_queue(self, actor_id: int) -> queue.Queue:
        return self.delivery_queues[0 if self.group else actor_id]

    def _channels(self, actor_id: int) -> QueueEndpoint:
        return QueueEndpoint(self.experience_queue, self._broadcast_queue(actor_id),
                             self.stop_event)

    def start_actor(self, actor_id: int, start: ActorStart, stats: ActorStats | None = None) -> None:
        if self.group:  # the group's thread starts once every actor has its start
            self.handles[actor_id] = ActorHandle(actor_id, None, stats or ActorStats(actor_id))
            self._group_starts[actor_id] = start
            if len(self._group_starts) == self.config.num_actors:
                starts = [self._group_starts.pop(i) for i in range(len(self.handles))]
                self._start_group(starts[0], [s.carry for s in starts])
            return
        if self.inference is not None and self.inference.thread.ident is None:
            self.inference.start()
        policy = None if self.inference is None else self.inference.client(actor_id)
        self.handles[actor_id] = spawn_actor(
            actor_id, self.config, self.program, self._channels(actor_id),
            self.device, stats, start, self.load_params, policy,
        )

    def _start_group(self, start: ActorStart, carries: list[Any]) -> None:
        """One thread for every actor (`ActorGroup`), each from its carry (None: fresh)."""
        handles = self.handles
        ids = [handle.actor_id for handle in handles]
        group = self.actor_group = ActorGroup(
            ids, self.config, self.program, self._channels(ids[0]), self.device,
            [h.stats for h in handles], self.load_params,
            fused=shares_calls(self.config, len(ids)))

        def run() -> None:
            try:
                group.run(start._replace(carry=None), carries)
            except BaseException as error:  # noqa: BLE001 - reported, never swallowed
                # Under the actor whose rollout raised; its restart starts the group's thread
                # again (`restart_actor`), the other actors from where they were.
                failed = group.failed_actor()
                handles[failed].error = error
                self.report_failure(ActorFailure(failed, error, traceback.format_exc()))

        thread = threading.Thread(target=run, name=f"ppo-actors-{ids[0]}-{ids[-1]}", daemon=True)
        for handle in handles:
            handle.stats.pid, handle.stats.node_id = os.getpid(), ""
            handle.thread, handle.error = thread, None
        thread.start()

    def restart_actor(self, actor_id: int, start: ActorStart) -> None:
        old = self.handles[actor_id]
        old.join(self.config.shutdown_timeout_s)  # it ended right after sending its failure
        with self.publisher.lock:
            # The dead actor may have drained every broadcast; its successor gets the newest
            # (with exact_policy_lag, the oldest version it will have).
            latest = self.publisher.latest
            if latest is not None:
                self._broadcast_queue(actor_id).put(latest)
                start = start._replace(first_version=latest.version)
        if self.group:  # the others go on from their carries; this one from fresh episodes
            carries = list(self.actor_group.carries)
            carries[actor_id] = None
            self._start_group(start, carries)
            return
        self.start_actor(actor_id, start, old.stats)

    def wait_started(self) -> None:
        pass  # a thread is up as soon as it is started

    def kill_actor(self, actor_id: int) -> bool:
        return False  # a thread cannot be killed

    def receive(self, timeout_s: float) -> Experience | ActorFailure | None:
        try:
            return self.experience_queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def report_failure(self, failure: ActorFailure) -> None:
        self.experience_queue.put(failure)

    def publish(self, params: Any, learner_updates: int) -> None:
        self.publisher.publish(params, learner_updates)

    def queue_depth(self) -> int:
        return self.experience_queue.qsize()

    def actor_stats(self) -> list[ActorStats]:
        return [handle.stats for handle in self.handles if handle is not None]

    def threads(self) -> list[threading.Thread]:
        """Every thread of the transport: publisher, shared caller, actors, env steppers."""
        server = [] if self.inference is None or self.inference.thread.ident is None else [
            self.inference.thread]
        steppers = self.inference.env_threads if isinstance(
            self.inference, LockstepSampler) else []
        actors = dict.fromkeys(h.thread for h in self.handles if h is not None and h.thread)
        return [self.publisher.thread, *server, *actors, *steppers]

    def stop(self, timeout_s: float, known_stuck: Sequence[int] = ()) -> list[str]:
        self.stop_event.set()
        self.publisher.stop()
        doing = {self.inference.thread: self.inference.doing} if isinstance(
            self.inference, LockstepSampler) else {}
        if self.actor_group is not None:
            doing[self.handles[0].thread] = self.actor_group.doing
        # A stuck actor's thread (its group's, where one collects them all) is not waited for.
        stuck = {self.handles[i].thread.name for i in known_stuck
                 if self.handles[i] is not None and self.handles[i].thread is not None}
        return stop_threads(self.threads(), timeout_s, stuck, doing)

    def late_failures(self) -> list[ActorFailure]:
        failures = []
        while True:
            try:
                item = self.experience_queue.get_nowait()
            except queue.Empty:
                return failures
            if isinstance(item, ActorFailure):
                failures.append(item)


def where(thread: threading.Thread) -> str:
    """The innermost frames a live thread is executing, to say where it is stuck."""
    frame = sys._current_frames().get(thread.ident)
    if frame is None:
        return "not started"
    frames = traceback.extract_stack(frame)[-3:]
    return " <- ".join(
        f"{pathlib.Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames)
    )


_RUNTIME_DIR = str(pathlib.Path(__file__).resolve().parents[1]) + os.sep  # ppo_async's
_STDLIB_DIR = sysconfig.get_paths()["stdlib"]
_PACKAGE_DIRS = (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])


def _is_stdlib(filename: str) -> bool:
    return filename.startswith(_STDLIB_DIR) and not filename.startswith(_PACKAGE_DIRS)


def threads_outside_the_runtime(
    doing: Mapping[threading.Thread, Callable[[], str]] | None = None,
) -> list[str]:
    """The runtime's threads (named ``ppo-...``) of this process now in code that is not
    the runtime's (an env's, a library's), each as ``name (at frames)``: where a hung actor
    is stuck.

    A thread counts when its innermost frame outside the standard library lies
    outside the ``ppo_async`` package; the caller and threads waiting inside
    the runtime (for a chunk, a call, a message) do not, nor do threads of
    other libraries (Ray's own). ``doing[thread]()`` is put before the
    frames, as in `stop_threads`.
    """
    doing = doing or {}
    frames = sys._current_frames()
    found = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident)
        if frame is None or thread is threading.current_thread() or not thread.name.startswith(
                "ppo-"):
            continue
        inner = next((f for f in reversed(traceback.extract_stack(frame))
                      if not _is_stdlib(os.path.abspath(f.filename))), None)
        if inner is None or os.path.abspath(inner.filename).startswith(_RUNTIME_DIR):
            continue
        found.append(f"{thread.name} ({doing[thread]() + ', ' if thread in doing else ''}"
                     f"at {where(thread)})")
    return found


WHERE_TIMEOUT_S = 1.0  # how long a process about to be killed may take to say where it is


def note_where_killed(where_killed: dict[int, str], pid: int, threads: list[str] | None,
                      process: str) -> None:
    """Keep where the threads of ``process`` (pid ``pid``, about to be killed for a hung
    actor) are in env code (its `threads_outside_the_runtime`; None: no answer within
    ``WHERE_TIMEOUT_S``), in ``where_killed``, and say it in a warning."""
    if threads is None:
        text = "no answer: a thread may hold its GIL"
    else:
        text = "; ".join(threads) if threads else "no thread in env code"
    where_killed[pid] = text
    logger.warning("killing %s, hung; its threads in env code: %s", process, text)


def stop_threads(threads: Sequence[threading.Thread], timeout_s: float,
                 known_stuck: set[str] = frozenset(),
                 doing: Mapping[threading.Thread, Callable[[], str]] | None = None) -> list[str]:
    """Join ``threads`` within ``timeout_s`` overall; each one still alive, with where it is.

    Threads in ``known_stuck`` (actors the learner already found hung) are not
    waited for: nothing will end them. ``doing[thread]()`` says what a thread
    still alive was doing (a lock-step sampler: whose chunk), before its frames.
    """
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        if thread.name not in known_stuck:
            thread.join(max(0.0, deadline - time.monotonic()))
    doing = doing or {}
    return [f"{t.name} ({doing[t]() + ', ' if t in doing else ''}at {where(t)})"
            for t in threads if t.is_alive()]
