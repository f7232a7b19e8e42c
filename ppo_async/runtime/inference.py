"""Batched inference: one jitted policy call for every thread actor of a device that waits for actions.

An actor of a host env calls its policy once per env step. With many actors
of few envs each, those calls (a dispatch, a device-to-host copy and the GIL
each) cost more than the envs. An `InferenceServer` runs on its own thread
(``ppo-inference``): actors hand it their inputs and wait; the server takes
every request waiting, makes ONE call of a function vmapped over the actor
axis, and hands each actor its row. The actors keep everything else of their
own: envs, columns, keys, valve, stats. Host envs batch each env step's
policy call this way; gymnax envs batch whole chunks (the rollouts of all
actors as one vmapped program).

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
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

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


def _by_params(pending: list[tuple[int, Any]]) -> list[list[tuple[int, Any]]]:
    """``pending`` grouped by params object (first seen first), each group in actor order."""
    groups: dict[int, list[tuple[int, Any]]] = {}
    for request in pending:
        groups.setdefault(id(request[1]), []).append(request)
    return [sorted(group, key=lambda r: r[0]) for group in groups.values()]


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
