"""Batched inference: one jitted policy call for every thread actor of a device that waits for actions.

An actor of a host env calls its policy once per env step. With many actors
of few envs each, those calls (a dispatch, a device-to-host copy and the GIL
each) cost more than the envs. An `InferenceServer` runs on its own thread
(``ppo-inference``): actors hand it their inputs and wait; the server takes
every request waiting, makes ONE call of a function vmapped over the actor
axis, and hands each actor its row. The actors keep everything else of their
own: envs, columns, keys, valve, stats. Host envs batch each env step's
policy call this way; gymnax envs batch whole chunks (the rollouts of all
actors as one program).

Determinism: the call always has every actor's row (``[num_actors, ...]``);
rows of actors not waiting hold the inputs they last sent and their outputs
are dropped. The policy works row by row, so an actor's output does not
depend on which other actors were in its call
(tests/runtime/test_inference.py checks it bit for bit), and a run with an
exact policy lag stays fixed by its seed -- though not bit-equal to one
where each actor calls alone (a call of another shape rounds differently).
Requests holding different params (free-running actors between broadcasts)
are served by one call per params object, in actor order.

`SharedParams` loads each broadcast version once per device for all actors,
so those of one version hold the same params object (and share a call).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

from ppo_async.envs.program import ChunkClient
from ppo_async.runtime.messages import PolicyBroadcast, load_policy_from_broadcast

# How often a waiting actor (or the idle server) looks at the stop signal.
_POLL_S = 0.05


class RolloutStopped(Exception):
    """The run stopped while an actor waited for its actions: its chunk is abandoned."""


class InferenceError(RuntimeError):
    """The batched policy call raised; the original exception is the ``__cause__``."""


class InferenceServer:
    """Serves ``act(actor_id, params, *inputs)`` of ``num_actors`` actor threads with batched calls.

    ``fn(params, per_actor)`` takes one ``inputs`` tuple per actor, in actor
    order (always all of them: an actor not waiting gives the inputs it last
    sent, or another actor's before its first), and returns something whose
    ``[i]`` is actor ``i``'s result. After a first request the server waits
    up to ``gather_s`` for every actor's before it calls (0: it calls with
    whatever is waiting). ``stopped()`` ends the server and every wait.
    """

    def __init__(self, fn: Callable[..., Any], num_actors: int, stopped: Callable[[], bool],
                 gather_s: float = 0.0, name: str = "ppo-inference"):
        self.fn, self.num_actors, self.stopped = fn, num_actors, stopped
        self.gather_s = gather_s
        self.calls = 0  # batched calls made
        self.requests = 0  # actor requests served
        # C-level primitives only: a Python Condition or Event costs several GIL
        # hand-offs per wait, as much as the policy call saved.
        self._requests: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._ready = [threading.Lock() for _ in range(num_actors)]  # released: result ready
        for ready in self._ready:
            ready.acquire()
        self._inputs: list[tuple | None] = [None] * num_actors  # each actor's latest
        self._results: list[Any] = [None] * num_actors
        self._errors: list[BaseException | None] = [None] * num_actors
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def start(self) -> InferenceServer:
        self.thread.start()
        return self

    def client(self, actor_id: int) -> Callable[..., Any]:
        """``act(params, *inputs)`` of actor ``actor_id``: its result of the batched call."""
        return lambda params, *inputs: self.act(actor_id, params, *inputs)

    def act(self, actor_id: int, params: Any, *inputs: Any) -> Any:
        """Actor ``actor_id``'s result of ``fn`` on its ``inputs``; blocks until the server made it.

        Raises `RolloutStopped` once the run stops, and `InferenceError` if the call raised.
        """
        self._inputs[actor_id] = inputs
        self._requests.put((actor_id, params))
        ready = self._ready[actor_id]
        while not ready.acquire(timeout=_POLL_S):
            if self.stopped():
                raise RolloutStopped
            if not self.thread.is_alive():
                raise InferenceError(f"{self.thread.name} ended while actor {actor_id} waited")
        error = self._errors[actor_id]
        if error is not None:
            self._errors[actor_id] = None
            raise InferenceError(f"the batched policy call of actor {actor_id} failed") from error
        result, self._results[actor_id] = self._results[actor_id], None
        return result

    def _take_pending(self) -> list[tuple[int, Any]]:
        """The requests waiting (at least one), or [] after a poll without any."""
        try:
            pending = [self._requests.get(timeout=_POLL_S)]
        except queue.Empty:
            return []
        deadline = time.perf_counter() + self.gather_s
        while len(pending) < self.num_actors:
            try:
                wait = deadline - time.perf_counter()
                pending.append(self._requests.get(timeout=wait) if wait > 0 else
                               self._requests.get_nowait())
            except queue.Empty:
                break
        return pending

    def _serve(self) -> None:
        while not self.stopped():
            pending = self._take_pending()
            if not pending:
                continue
            # A snapshot: actors not in this call may send newer inputs meanwhile.
            inputs = list(self._inputs)
            sent = next(x for x in inputs if x is not None)
            inputs = [sent if x is None else x for x in inputs]
            for group in _by_params(pending):
                params = group[0][1]
                try:
                    out = self.fn(params, inputs)
                except BaseException as error:  # noqa: BLE001 - each waiting actor raises it
                    out = None
                    for actor_id, _ in group:
                        self._errors[actor_id] = error
                else:
                    self.calls += 1
                    self.requests += len(group)
                for actor_id, _ in group:
                    if out is not None:
                        self._results[actor_id] = out[actor_id]
                    self._ready[actor_id].release()


def _by_params(pending: list[tuple]) -> list[list[tuple]]:
    """``pending`` grouped by params object (first seen first), each group in actor order."""
    groups: dict[int, list[tuple[int, Any]]] = {}
    for request in pending:
        groups.setdefault(id(request[1]), []).append(request)
    return [sorted(group, key=lambda r: r[0]) for group in groups.values()]


# A `LockstepSampler`'s cohorts: an env waits, after its step, for the rest of its
# cohort's envs, their one policy call and the starts of those before it, so smaller
# cohorts shorten that wait; but every call holds all the actors' rows, so each cohort
# more costs one more call of every row (docs/benchmarks.md, "A shared sampler").
COHORT_ACTORS = 8  # actors a cohort holds at most, up to MAX_COHORTS cohorts
MAX_COHORTS = 4


def cohorts_for(num_actors: int) -> int:
    """How many cohorts a `LockstepSampler` of ``num_actors`` splits its chunks into:
    two at least (one steps while the other's actions are computed), more from
    ``2 * COHORT_ACTORS`` actors on, so that none holds more than `COHORT_ACTORS`,
    up to `MAX_COHORTS`."""
    return min(MAX_COHORTS, max(2, -(-num_actors // COHORT_ACTORS)))


def lower_thread_priority() -> None:
    """Put the calling thread alone at the OS's lowest CPU priority (Linux: nice 19 for its
    thread id; the threads and processes it starts from then on inherit it, and it cannot be
    raised again without privileges). Elsewhere, or where the OS refuses, nothing changes."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class _Chunk:
    """One actor's chunk in a `LockstepSampler`: its generator and where it stands."""

    __slots__ = ("index", "params", "steps", "lineage", "request", "result", "error", "done",
                 "next_params", "abandoned")

    def __init__(self, index: int, params: Any, steps: Generator, lineage: Any = None,
                 next_params: Callable[[], Any] | None = None):
        self.index, self.params, self.steps, self.lineage = index, params, steps, lineage
        self.request: tuple | None = None  # its next policy call's inputs; None: envs stepping
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Lock()  # released once result or error is set
        self.done.acquire()
        # () -> the params of the actor's next chunk, or None: asked as this one ends
        self.next_params = next_params
        self.abandoned = False  # begun for an actor that did not take it over: dropped


class LockstepSampler:
    """One thread ("ppo-sampler") that steps the envs of ``num_actors`` actor threads.

    An actor hands its chunk over as a generator (``drive(params, steps)``,
    through its `ChunkClient`; `ppo_async.envs.host_rollout.HostRollout.chunk_steps`):
    it yields the inputs of each policy call, takes back its row, starts its
    envs (which step in threads or processes of their own) and yields None.
    The sampler runs every chunk handed over, one env step at a time: for a
    cohort of chunks it waits for each one's envs, makes ONE call of ``fn``
    for all of them (one per params object, as `InferenceServer`), and
    starts their envs again. Chunks are split into cohorts (`cohorts_for`), so
    that some cohorts' envs step while another's actions are computed (double
    buffering across actors). An actor arriving mid-chunk joins at the next
    step. The actor threads wake once per chunk, not once per env step.

    Where the params of an actor's next chunk are at hand as its chunk ends
    (``next_params`` of `drive`) and the generator returns a `ChunkEnd`,
    the sampler begins that next chunk (``follow``) in the same step, in the
    same cohort: the envs go on at once, while the actor's thread finishes and
    sends the chunk that ended (a follower). Its calls and rows are those the
    actor's thread would have started, so the run's bits do not change.

    Rows: as `InferenceServer`, each call has all ``num_actors`` rows (an actor
    not in it gives the inputs it last sent), so an actor's actions do not
    depend on which actors shared its call, and equal those of a run with
    batched per-step calls bit for bit. A chunk whose env raises ends with
    that error in its own actor's thread; the others go on.

    With ``background_clients`` (actor processes, whose actor threads share
    one pinned core with the sampler) each thread that hands chunks over is
    put below the sampler at its first `drive` (`lower_thread_priority`): its
    own work, once a chunk (finishing and sending it), then runs while the
    sampler waits for envs rather than in its way. Where every actor's chunk
    ends in the same step, 32 actors' work (about 0.4 ms each) held the
    sampler for 8-15 ms (docs/benchmarks.md). Threads started after that
    inherit the priority: an actor starts its envs' stepper threads before
    its first `drive` (`ppo_async.envs.host_rollout.HostRollout.rollout`).
    """

    def __init__(self, fn: Callable[..., Any], num_actors: int, stopped: Callable[[], bool],
                 name: str = "ppo-sampler", first_actor: int = 0,
                 background_clients: bool = False):
        self.fn, self.num_actors, self.stopped = fn, num_actors, stopped
        self.first_actor = first_actor  # the actor id of row 0 (in errors)
        # Marks each thread put below the sampler (None: none are); a thread's own, not its
        # id, which a thread started later may reuse.
        self._background = threading.local() if background_clients else None
        self.calls = 0  # batched calls made
        self.requests = 0  # chunk steps served
        self.followed = 0  # chunks begun by the sampler where the actor's last one ended
        self.env_threads: list[threading.Thread] = []  # its chunks' stepper threads
        self.current: int | None = None  # the row whose chunk the thread is running
        self._arrivals: queue.SimpleQueue[_Chunk] = queue.SimpleQueue()
        self._cohorts: list[list[_Chunk]] = [[] for _ in range(cohorts_for(num_actors))]
        self._inputs: list[tuple | None] = [None] * num_actors  # each actor's latest
        self._followers: dict[int, _Chunk] = {}  # row -> its actor's next chunk, begun
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> LockstepSampler:
        self.thread.start()
        return self

    def client(self, index: int) -> ChunkClient:
        """Actor ``index``'s (its row in every call) `ChunkClient`."""
        return ChunkClient(functools.partial(self.drive, index), self.stopped,
                           self.env_threads.extend)

    def doing(self) -> str:
        """What the sampler's thread is in: an actor's chunk (its envs), or its own loop."""
        if self.current is None:
            return "in its own loop"
        return f"in actor {self.first_actor + self.current}'s chunk"

    def drive(self, index: int, params: Any, steps: Generator,
              next_params: Callable[[], Any] | None = None, lineage: Any = None) -> Any:
        """What the generator ``steps`` returns, run among the other actors' chunks; blocks.

        If the sampler has begun this actor's chunk with ``params`` where its
        last one ended (a follower of the same ``lineage``), that chunk is the
        one run, and ``steps`` is left unused. ``next_params()`` gives the
        params of the chunk after this one if they are at hand (else None);
        the sampler's thread asks it once, as the chunk ends, while this thread
        waits, and begins that chunk if it got them.

        Raises what the chunk raised, `RolloutStopped` once the run stops, and
        `InferenceError` if a policy call raised.
        """
        if self._background is not None and not getattr(self._background, "lowered", False):
            self._background.lowered = True
            lower_thread_priority()
        chunk = self._followers.pop(index, None)
        if chunk is not None and (chunk.params is not params or chunk.lineage is not lineage):
            chunk.abandoned = True  # not this actor's next chunk (it restarted): dropped
            chunk = None
        if chunk is None:
            chunk = _Chunk(index, params, steps, lineage, next_params)
            self._arrivals.put(chunk)
        else:
            chunk.next_params = next_params
        while not chunk.done.acquire(timeout=_POLL_S):
            if self.stopped():
                raise RolloutStopped
            if not self.thread.is_alive():
                raise InferenceError(f"{self.thread.name} ended while "
                                     f"{threading.current_thread().name} waited")
        if chunk.error is not None:
            if self.stopped():  # e.g. its envs' step abandoned on the stop: not a failure
                raise RolloutStopped from chunk.error
            raise chunk.error
        return chunk.result

    def _run(self) -> None:
        while not self.stopped():
            self._admit(wait=not any(self._cohorts))
            for cohort in self._cohorts:
                if cohort:
                    self._advance(cohort)

    def _admit(self, wait: bool) -> None:
        """Chunks handed over since the last step, each into the smaller cohort."""
        try:
            chunk = self._arrivals.get(timeout=_POLL_S) if wait else self._arrivals.get_nowait()
            while True:
                going_on = self._resume(chunk, None)  # runs it to its first policy call
                if going_on is not None:
                    min(self._cohorts, key=len).append(going_on)
                chunk = self._arrivals.get_nowait()
        except queue.Empty:
            return

    def _resume(self, chunk: _Chunk, value: Any) -> _Chunk | None:
        """Send ``value`` into the chunk's generator; the chunk that goes on in its place:
        itself, its follower once it returned (`_follow`), or None."""
        self.current = chunk.index
        going_on = None
        try:
            chunk.request = chunk.steps.send(value)
            return chunk
        except StopIteration as finished:
            chunk.result = finished.value
            going_on = self._follow(chunk)
        except BaseException as error:  # noqa: BLE001 - raised in the actor's thread
            chunk.error = error
        finally:
            self.current = None
        chunk.done.release()
        return going_on

    def _follow(self, chunk: _Chunk) -> _Chunk | None:
        """The actor's next chunk, begun where ``chunk`` ended and run to its first policy
        call, if its params are at hand; left for its next `drive` to take over."""
        follow = getattr(chunk.result, "follow", None)
        if chunk.next_params is None or follow is None:
            return None
        try:
            params = chunk.next_params()  # its actor's thread waits for this chunk meanwhile
        except BaseException as error:  # noqa: BLE001 - raised in the actor's thread
            chunk.error = error
            return None
        if params is None:
            return None
        follower = _Chunk(chunk.index, params, follow(params), chunk.lineage)
        self._followers[chunk.index] = follower  # before the actor's thread wakes
        self.followed += 1
        return self._resume(follower, None)

    def _advance(self, cohort: list[_Chunk]) -> None:
        """One step of every chunk of ``cohort``: its envs waited for, one call, started again."""
        kept = []
        for chunk in cohort:
            if chunk.abandoned:
                chunk.steps.close()
            elif chunk.request is not None:
                kept.append(chunk)
            else:
                chunk = self._resume(chunk, None)
                if chunk is not None:
                    kept.append(chunk)
        cohort[:] = kept
        if not cohort:
            return
        for chunk in cohort:
            self._inputs[chunk.index] = chunk.request
        sent = next(x for x in self._inputs if x is not None)
        inputs = [sent if x is None else x for x in self._inputs]
        replaced: dict[int, _Chunk | None] = {}  # id of a chunk -> what goes on in its place
        for group in _by_params([(c.index, c.params, c) for c in cohort]):
            try:
                out = self.fn(group[0][1], inputs)
            except BaseException as error:  # noqa: BLE001 - each of the group's actors raises it
                for *_, chunk in group:
                    chunk.error = InferenceError(
                        f"the batched policy call of actor row {chunk.index} failed")
                    chunk.error.__cause__ = error
                    chunk.done.release()
                    replaced[id(chunk)] = None
                continue
            self.calls += 1
            self.requests += len(group)
            for index, _, chunk in group:
                going_on = self._resume(chunk, out[index])
                if going_on is not chunk:
                    replaced[id(chunk)] = going_on
        if replaced:
            cohort[:] = [c for c in (replaced.get(id(c), c) for c in cohort) if c is not None]


class SharedParams:
    """Loads each broadcast version once for every actor of ``device`` (the newest ``keep`` kept).

    Thread-safe; actors given the same version get the same params object.
    """

    def __init__(self, template: Any, device: Any, keep: int = 8):
        self.template, self.device, self.keep = template, device, keep
        self.loads = 0  # versions loaded (decoded, checked and placed)
        self._lock = threading.Lock()
        self._loaded: collections.OrderedDict[int, Any] = collections.OrderedDict()

    def __call__(self, broadcast: PolicyBroadcast) -> Any:
        with self._lock:
            params = self._loaded.get(broadcast.version)
            if params is None:
                params = load_policy_from_broadcast(broadcast, self.template, self.device)
                self.loads += 1
                self._loaded[broadcast.version] = params
                while len(self._loaded) > self.keep:
                    self._loaded.popitem(last=False)
            return params
