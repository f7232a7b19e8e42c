"""Env workers: an actor's host envs stepped in worker processes that never import JAX.

A thread actor that steps its own envs holds the GIL for every Python line
of them, so env steps, policy calls and the learner queue on one lock.
`EnvWorkers` moves the envs into ``workers`` processes: each steps its
share of the actor's ``E`` envs, reading actions from and writing
observations, rewards and flags to one shared-memory block, and answers
each command over a socket with one small message. The actor's thread only
writes actions, sends a byte and waits; while it waits the GIL is free.

Double-buffered sampling: the envs are split into ``groups`` (contiguous
columns). `HostRollout` asks for group 0's actions, starts group 0 stepping
(`step_async`), asks for group 1's actions while group 0 steps, and so on:
env time and inference overlap. Each env keeps its column and its own
trajectory; the learner cannot tell.

Layout: group ``g`` holds envs ``[g E/G, (g+1) E/G)``; inside a group,
worker ``w`` holds a contiguous share. A worker makes one vector env per
group it holds (`ppo_async.envs.host.make_host_env`) and resets the share
starting at env ``i`` with ``seed + i``, so gymnasium envs get the seeds an
in-process batch gives them (``seed + i`` for env ``i``).

Why written here rather than taken from gymnasium's ``AsyncVectorEnv``:
that runs one process per env, and on a small machine a process per env
is slower than one thread (docs/benchmarks.md); a worker here steps several
envs, and the number of workers follows the cores. Its wait has no per-group
split either, which double buffering needs. envpool ids keep envpool's own
threads (its pool is C++ and releases the GIL).

Faults: a worker that raises, dies or does not answer within
``reply_timeout_s`` is named in an `EnvWorkerError` (actor, worker, env
indices, pid); a hung worker is killed. A worker polls its parent and exits
when the parent is gone, so a killed run leaves no worker behind; `close`
and an ``atexit`` hook end every worker of the process.
"""

from __future__ import annotations

import atexit
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from ppo_async.envs.host import (
    FLAG_KINDS,
    OBS_KINDS,
    REWARD_KINDS,
    EnvContractError,
    HostEnvError,
    HostStep,
    close_envs,
    contract_problem,
    make_host_env,
    steps_natively_async,
)
from ppo_async.envs.payload import HostEnvPayload, register_host_env_payload, sendable_payload

# How often a waiting actor looks at its worker's health, and an idle worker at its parent.
_POLL_S = 0.05
_PARENT_POLL_S = 0.5
_SPIN_S = 0.002  # how long an idle worker waits awake for its next command (a core each)


def spin_seconds(workers_in_run: int) -> float:
    """How long an idle worker spins before it sleeps: `_SPIN_S` while the run's workers
    have a core each, else 0 (spinning workers would take the cores the actors need)."""
    return _SPIN_S if workers_in_run <= (os.cpu_count() or 1) else 0.0
_START_TIMEOUT_S = 120.0  # a worker imports the simulator (MuJoCo: about a second)
_CLOSE_TIMEOUT_S = 2.0  # a worker closes its envs in milliseconds; a hung one is killed


class EnvWorkerError(HostEnvError):
    """An env worker raised, died or hung; the message names the actor, worker, envs and pid."""


def _fields(num_envs: int, observation_shape: tuple[int, ...], action_shape: tuple[int, ...],
            action_dtype: Any) -> list[tuple[str, tuple[int, ...], Any]]:
    obs = (num_envs, *observation_shape)
    return [("actions", (num_envs, *action_shape), np.dtype(action_dtype)),
            ("obs", obs, np.dtype(np.float32)), ("final_obs", obs, np.dtype(np.float32)),
            ("reward", (num_envs,), np.dtype(np.float32)),
            ("terminated", (num_envs,), np.dtype(bool)),
            ("truncated", (num_envs,), np.dtype(bool))]


def _views(buffer: memoryview, fields) -> dict[str, np.ndarray]:
    """Arrays over ``buffer``, one per field, each aligned to 8 bytes."""
    views, offset = {}, 0
    for name, shape, dtype in fields:
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        views[name] = np.ndarray(shape, dtype, buffer=buffer, offset=offset)
        offset += -(-size // 8) * 8
    return views


def _nbytes(fields) -> int:
    return sum(-(-int(np.prod(s, dtype=np.int64)) * d.itemsize // 8) * 8 for _, s, d in fields)


def split(num_envs: int, groups: int, workers: int) -> list[list[tuple[int, int]]]:
    """``[group][worker] -> (lo, hi)``: group ``g``'s envs, each worker's contiguous share."""
    shares = []
    for g in range(groups):
        lo, hi = g * num_envs // groups, (g + 1) * num_envs // groups
        size = hi - lo
        shares.append([(lo + w * size // workers, lo + (w + 1) * size // workers)
                       for w in range(workers)])
    return shares


def portable_factory(env_id: str) -> tuple[HostEnvPayload | None, str | None]:
    """``(payload, None)`` for a ``host:`` id, ``(None, None)`` for a gymnasium id,
    or ``(None, why)`` when the factory cannot be sent to a worker process.

    cloudpickle (a gymnasium dependency) sends a class or closure defined in a
    notebook or script by value, with the script's file (`ppo_async.envs.payload`);
    one from an importable module by name (a worker shares this process's
    ``sys.path``); an object holding a lock or an open simulator cannot travel at all.
    """
    payload, why = sendable_payload(env_id, modules_by_value=False)
    if why is None:
        return payload, None
    from ppo_async.envs.registry import host_env_factory, split_env_id

    return None, (f"its factory {host_env_factory(split_env_id(env_id)[1])!r} cannot be sent "
                  f"to an env worker process ({why})")


class _Stepper:
    """A thread ("ppo-env-stepper") that steps one vector env when told: `EnvGroups.step_in_threads`.

    C-level locks only, as `ppo_async.runtime.inference.InferenceServer`'s:
    a step costs the stepper one wake-up and its caller none until it waits.
    """

    def __init__(self, batch: Any, name: str, stopped: Callable[[], bool]):
        self.batch, self.stopped, self.closed = batch, stopped, False
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._actions: Any = None
        self._result: Any = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            if self.closed:
                return
            try:
                self._result = self.batch.step(self._actions)
            except BaseException as error:  # noqa: BLE001 - raised again by `wait`
                self._error = error
            self._done.release()

    def start(self, actions: np.ndarray) -> None:
        self._actions = actions
        self._go.release()

    def wait(self) -> Any:
        """The step's result; the env's own exception (raised in the caller's thread) if it raised.

        Once ``stopped()``, a step still running raises `HostEnvError` instead: the
        caller (a lock-step sampler) ends, and a step that never returns leaves only
        this thread, named by its env's name and the line it is stuck on.
        """
        while not self._done.acquire(timeout=_POLL_S):
            if not self.thread.is_alive():
                raise HostEnvError(f"{self.thread.name} ended while a step was waited for")
            if self.stopped():
                raise HostEnvError(f"the run stopped while {self.thread.name} was in its step")
        result, error, self._result, self._error = self._result, self._error, None, None
        if error is not None:
            raise error
        return result

    def close(self, timeout_s: float = 1.0) -> None:
        """End the thread (unless it is stuck inside the env's step: it is a daemon)."""
        self.closed = True
        try:
            self._go.release()  # wakes it if idle
        except RuntimeError:  # a step started and not yet taken up wakes it already
            pass
        self.thread.join(timeout_s)


class EnvGroups:
    """The in-process counterpart of `EnvWorkers`: ``G`` vector envs stepped by the actor's thread.

    ``step_async`` starts a group's step and ``step_wait`` hands its result
    over. A batch with its own ``step_async`` / ``step_wait``
    (`ppo_async.envs.host.steps_natively_async`: envpool, or a simulator
    that steps elsewhere) steps on its own, so its groups overlap with the
    policy calls; any other batch steps inside ``step_async``. Group ``g``
    is reset with ``seed + lo`` (its first env's index), as a worker's share
    is. After `step_in_threads` each group that cannot step on its own steps
    in a thread of its own instead, so that ``step_async`` returns at once
    (a lock-step sampler drives many actors' envs from one thread).
    ``steps[g]`` counts group ``g``'s steps; ``owner`` (``"actor 3"``) and they
    say where an `EnvContractError` came from.
    """

    def __init__(self, batches: Sequence[Any], size: int, owner: str = "actor"):
        self.batches = list(batches)  # each a HostVectorEnv of ``size`` envs
        self.groups = [(g * size, (g + 1) * size) for g in range(len(self.batches))]
        self.owner, self.steps = owner, [0] * len(self.batches)
        self.native = [steps_natively_async(batch) for batch in self.batches]
        self._pending: list[Any] = [None] * len(self.batches)
        self._steppers: list[_Stepper | None] = []
        self.observation_shape = tuple(self.batches[0].observation_shape)
        self.action_space = self.batches[0].action_space

    def step_in_threads(self, stopped: Callable[[], bool]) -> list[threading.Thread]:
        """From now on each group that cannot step on its own steps in a stepper thread.

        The threads are started once; this returns those it started (none after
        the first call). A step waited for ends once ``stopped()`` (`_Stepper.wait`).
        """
        if self._steppers:
            return []
        owner = threading.current_thread().name.replace("ppo-actor-", "")
        self._steppers = [None if native else _Stepper(batch, f"ppo-env-stepper-{owner}-{g}",
                                                       stopped)
                          for g, (batch, native) in enumerate(zip(self.batches, self.native))]
        return [stepper.thread for stepper in self._steppers if stepper is not None]

    def reset(self, seed: int) -> np.ndarray:
        if len(self.batches) == 1:
            return self.batches[0].reset(seed)
        return np.concatenate([np.asarray(self._reset_group(batch, seed, lo))
                               for batch, (lo, _) in zip(self.batches, self.groups)])

    @staticmethod
    def _reset_group(batch: Any, seed: int, lo: int) -> Any:
        try:
            return batch.reset(seed + lo)
        except EnvContractError as error:  # its env index in the group, made the actor's
            error.locate(env_offset=lo)
            raise

    def step(self, actions: np.ndarray) -> Any:
        if len(self.batches) == 1:
            return self.batches[0].step(actions)
        for g, (lo, hi) in enumerate(self.groups):
            self.step_async(actions[lo:hi], g)
        steps = [self.step_wait(g) for g in range(len(self.batches))]
        return HostStep(*(np.concatenate([np.asarray(s[i]) for s in steps]) for i in range(5)))

    def step_async(self, actions: np.ndarray, group: int) -> None:
        self.steps[group] += 1
        try:
            if self.native[group]:
                self.batches[group].step_async(actions)
            elif self._steppers:
                self._steppers[group].start(actions)
            else:
                self._pending[group] = self.batches[group].step(actions)
        except EnvContractError as error:  # its env index in the group, made the actor's
            error.locate(env_offset=self.groups[group][0])
            raise

    def step_wait(self, group: int) -> Any:
        try:
            if self.native[group]:
                return self.batches[group].step_wait()
            if self._steppers:
                return self._steppers[group].wait()
        except EnvContractError as error:
            error.locate(env_offset=self.groups[group][0])
            raise
        step, self._pending[group] = self._pending[group], None
        return step

    def close(self) -> None:
        for stepper in self._steppers:
            if stepper is not None:
                stepper.close()
        for batch in self.batches:
            close_envs(batch)


_LIVE: weakref.WeakSet = weakref.WeakSet()  # every EnvWorkers of this process not yet closed


@atexit.register
def _close_all() -> None:
    for pool in list(_LIVE):
        pool.close()


class EnvWorkers:
    """``num_envs`` host envs stepped in ``workers`` processes, in ``groups`` double buffers.

    A `ppo_async.envs.host.HostVectorEnv` (``reset``, ``step``) with
    ``step_async(actions, group)`` / ``step_wait(group)`` besides, and
    ``groups`` (the ``(lo, hi)`` columns of each group).

    Args:
      env_id: a ``gymnasium:`` or ``host:`` id.
      num_envs, workers, groups: the layout; every group needs at least one env per worker.
      observation_shape, action_space: from a probe env made in the parent.
      env_modules: imported by each worker first (they register the env).
      payload: for a ``host:`` id, its factory on its way (`portable_factory`); the
        worker registers it under the id's name.
      make_kwargs: what `ppo_async.envs.host.make_host_env` gets besides the id
        and size (the config's ``env_make_kwargs()``).
      owner: how errors name the envs' owner (``"actor 3"``).
      reply_timeout_s: a worker that does not answer a command for this long is hung.
      spin_s: how long an idle worker waits awake for its next command before it sleeps
        (`spin_seconds`: 0 when the run has more workers than the machine has cores).
    """

    def __init__(self, env_id: str, num_envs: int, *, workers: int, groups: int,
                 observation_shape: tuple[int, ...], action_space: Any,
                 env_modules: Sequence[str] = (), payload: HostEnvPayload | None = None,
                 make_kwargs: dict[str, Any] | None = None, owner: str = "actor",
                 reply_timeout_s: float = 30.0,
                 start_timeout_s: float = _START_TIMEOUT_S, spin_s: float = _SPIN_S):
        per_group = num_envs // groups if groups else 0
        if groups < 1 or workers < 1 or num_envs % groups or per_group < workers:
            raise ValueError(f"{num_envs} envs cannot be split into {groups} groups of at "
                             f"least {workers} envs (one per worker) each")
        self.env_id, self.num_envs, self.owner = env_id, num_envs, owner
        self._make_kwargs = dict(make_kwargs or {})  # make_host_env's, in every worker
        self.reply_timeout_s, self.spin_s = reply_timeout_s, spin_s
        self.observation_shape = tuple(observation_shape)
        self.action_space = action_space
        continuous = not hasattr(action_space, "n")
        action_shape = (int(action_space.shape[0]),) if continuous else ()
        fields = _fields(num_envs, self.observation_shape, action_shape,
                         np.float32 if continuous else np.int32)
        shares = split(num_envs, groups, workers)
        self.groups = [(g[0][0], g[-1][1]) for g in shares]
        self.steps = [0] * groups  # each group's steps, as `EnvGroups.steps`
        # [worker] -> the (group, lo, hi) it holds
        self._held = [[(g, *shares[g][w]) for g in range(groups)] for w in range(workers)]
        self._closed = False
        self._lock = threading.Lock()  # close() may come from another thread (atexit)
        self._memory = shared_memory.SharedMemory(create=True, size=max(_nbytes(fields), 8))
        self._arrays = _views(self._memory.buf, fields)
        self._processes: list[subprocess.Popen] = []
        self._connections: list[Connection] = []
        _LIVE.add(self)
        try:
            for w in range(workers):
                self._start(w, fields, env_modules, payload)
            for w in range(workers):
                self._wait_reply(w, "start", start_timeout_s)
        except BaseException:
            self.close()
            raise

    # --- the HostVectorEnv contract ---------------------------------------------------

    def reset(self, seed: int) -> np.ndarray:
        for w in range(len(self._processes)):
            self._send(w, ("reset", int(seed)))
        for w in range(len(self._processes)):
            self._wait_reply(w, "reset")
        return self._arrays["obs"].copy()

    def step(self, actions: np.ndarray) -> HostStep:
        for g in range(len(self.groups)):
            lo, hi = self.groups[g]
            self.step_async(actions[lo:hi], g)
        for g in range(len(self.groups)):
            self.step_wait(g)
        a = self._arrays
        return HostStep(a["obs"].copy(), a["reward"].copy(), a["terminated"].copy(),
                        a["truncated"].copy(), a["final_obs"].copy())

    def step_in_threads(self, stopped: Callable[[], bool]) -> list[threading.Thread]:
        """Nothing to do: ``step_async`` already returns at once (the workers step)."""
        return []

    def step_async(self, actions: np.ndarray, group: int) -> None:
        """Start group ``group``'s envs stepping with ``actions`` (that group's rows)."""
        lo, hi = self.groups[group]
        self.steps[group] += 1
        self._arrays["actions"][lo:hi] = actions
        for w in range(len(self._processes)):  # every worker holds a share of every group
            self._send(w, ("step", group))

    def step_wait(self, group: int) -> HostStep:
        """Group ``group``'s step, once its workers are done: views into shared memory.

        The views hold until the group's next ``step_async``; copy what must outlive it.
        """
        for w in range(len(self._processes)):
            self._wait_reply(w, f"step of group {group}")
        lo, hi = self.groups[group]
        a = self._arrays
        return HostStep(a["obs"][lo:hi], a["reward"][lo:hi], a["terminated"][lo:hi],
                        a["truncated"][lo:hi], a["final_obs"][lo:hi])

    def close(self) -> None:
        """End the workers (asked first, then killed) and free the shared memory; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for conn in self._connections:
            try:
                conn.send(("close", None))
            except OSError:
                pass
        deadline = time.monotonic() + _CLOSE_TIMEOUT_S
        for process in self._processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for conn in self._connections:
            conn.close()
        self._arrays = {}
        try:
            self._memory.close()
            self._memory.unlink()
        except (BufferError, FileNotFoundError):
            pass
        _LIVE.discard(self)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    # --- the parent's side of the protocol -------------------------------------------

    def _start(self, w: int, fields, env_modules: Sequence[str],
               payload: HostEnvPayload | None) -> None:
        mine, theirs = socket.socketpair()
        setup = dict(env_id=self.env_id, held=self._held[w], memory=self._memory.name,
                     fields=fields, env_modules=tuple(env_modules), payload=payload,
                     make_kwargs=self._make_kwargs, parent=os.getpid(), path=list(sys.path),
                     spin_s=self.spin_s)
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, os.path.dirname(os.path.dirname(
                    os.path.dirname(os.path.abspath(__file__)))), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        connection = Connection(mine.detach())
        self._processes.append(process)
        self._connections.append(connection)
        connection.send(setup)

    def _describe(self, w: int) -> str:
        shares = ", ".join(f"{lo}-{hi - 1}" if hi - lo > 1 else f"{lo}"
                           for _, lo, hi in self._held[w])
        return (f"{self.env_id}: env worker {w} of {self.owner} (envs {shares}, "
                f"pid {self._processes[w].pid})")

    def _send(self, w: int, message: tuple) -> None:
        try:
            self._connections[w].send(message)
        except OSError as error:
            raise EnvWorkerError(f"{self._describe(w)} cannot be reached: "
                                 f"{self._exit_status(w) or error}") from None

    def _exit_status(self, w: int) -> str:
        code = self._processes[w].poll()
        if code is None:
            return ""
        return f"it died (killed by signal {-code})" if code < 0 else f"it exited with code {code}"

    def _wait_reply(self, w: int, what: str, timeout_s: float | None = None) -> None:
        connection = self._connections[w]
        limit = self.reply_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while not connection.poll(_POLL_S):
            status = self._exit_status(w)
            if status:
                raise EnvWorkerError(f"{self._describe(w)}: {status} during its {what}")
            if time.monotonic() > deadline:
                self._processes[w].kill()
                raise EnvWorkerError(
                    f"{self._describe(w)}: no answer to its {what} within {limit:g} s; "
                    "the worker was killed (an env stuck in its step?)")
        try:
            kind, detail = connection.recv()
        except (EOFError, OSError):  # the socket closed: the worker is ending, or ended
            try:
                self._processes[w].wait(1.0)
            except subprocess.TimeoutExpired:
                pass
            status = self._exit_status(w) or "its socket closed"
            raise EnvWorkerError(f"{self._describe(w)}: {status} during its {what}") from None
        if kind == "error":
            text, data = detail
            try:
                cause = pickle.loads(data) if data is not None else None
            except Exception:  # noqa: BLE001 - its class may not import here
                cause = None
            if isinstance(cause, EnvContractError):  # the env's fault, not the worker's
                cause.locate(actor=self.owner)
                cause.add_note(f"raised in {self._describe(w)}:\n{text}")
                raise cause
            raise EnvWorkerError(f"{self._describe(w)} raised during its {what}:\n{text}") from cause


# The worker's entry: it imports the package's env modules without the package's __init__
# (which imports JAX), so that a worker holds numpy, the simulator and nothing more.
_BOOTSTRAP = """
import sys, types
root, fd = sys.argv[1], int(sys.argv[2])
package = types.ModuleType("ppo_async")
package.__path__ = [root + "/ppo_async"]
sys.modules["ppo_async"] = package
from ppo_async.envs.workers import serve
serve(fd, package)
"""

# What `from ppo_async import NAME` finds in a worker: the env registration API (an env
# module imported by the worker registers its envs with it).
_WORKER_NAMES = {
    "register_single_env": "ppo_async.envs.host", "register_host_env": "ppo_async.envs.registry",
    "HostEnvError": "ppo_async.envs.host", "UnknownEnvError": "ppo_async.envs.registry",
}


def _package_getattr(name: str) -> Any:
    """``ppo_async.NAME`` in a worker: the registration API without JAX; any other name
    runs the package's real ``__init__`` (importing JAX) for an env module that needs it."""
    import importlib

    package = sys.modules["ppo_async"]
    if name in _WORKER_NAMES:
        return getattr(importlib.import_module(_WORKER_NAMES[name]), name)
    if name.startswith("__") or package.__dict__.get("_full_init_done"):
        raise AttributeError(f"module 'ppo_async' has no attribute {name!r}")
    package._full_init_done = True
    init = os.path.join(package.__path__[0], "__init__.py")
    with open(init) as source:
        exec(compile(source.read(), init, "exec"), package.__dict__)  # noqa: S102
    return getattr(package, name)


# Set by an actor process pinned to one core (`ppo_async.runtime.process_transport`): the
# CPUs it had before, which its env workers take back.
PARENT_CPUS_ENV = "PPO_ASYNC_PARENT_CPUS"


def _take_back_cpus() -> None:
    """A worker started by a pinned actor process runs on the CPUs the actor had."""
    cpus = os.environ.pop(PARENT_CPUS_ENV, "")
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
        except OSError:  # a CPU taken from this process since: keep the one it has
            pass


def serve(fd: int, package: Any = None) -> None:
    """A worker's loop: set up from the first message, then answer commands until ``close``."""
    _take_back_cpus()
    if package is not None:
        package.__getattr__ = _package_getattr
    connection = Connection(fd)
    setup = connection.recv()
    sys.path[:] = setup["path"]
    memory = None
    envs: dict[int, Any] = {}
    try:
        from ppo_async.envs.registry import import_env_modules

        memory = shared_memory.SharedMemory(name=setup["memory"])
        _untrack(memory)
        arrays = _views(memory.buf, setup["fields"])
        import_env_modules(setup["env_modules"])
        if setup["payload"] is not None:
            register_host_env_payload(setup["payload"], pickle.loads)
        for group, lo, hi in setup["held"]:
            envs[group] = (lo, hi, make_host_env(setup["env_id"], hi - lo,
                                                 **setup["make_kwargs"]))
        connection.send(("ok", None))
    except BaseException as error:  # noqa: BLE001 - reported to the actor, which raises it
        _report(connection, error)
        return
    try:
        _answer(connection, setup, envs, arrays)
    finally:
        for _, _, batch in envs.values():
            try:
                close_envs(batch)
            except Exception:  # noqa: BLE001 - the worker is ending anyway
                pass
        del arrays
        memory.close()


def _answer(connection: Connection, setup: dict, envs: dict, arrays: dict) -> None:
    env_id = setup["env_id"]
    while True:
        # The next command comes within a policy call or two: waiting for it awake
        # spares the wake-up of a sleeping process (tens to hundreds of microseconds).
        spin_until = time.perf_counter() + setup["spin_s"]
        while not connection.poll(0) and time.perf_counter() < spin_until:
            pass
        if not connection.poll(_PARENT_POLL_S):
            if os.getppid() != setup["parent"]:
                return  # the parent is gone: nobody will read what this worker makes
            continue
        try:
            command, argument = connection.recv()
        except (EOFError, OSError):
            return
        if command == "close":
            return
        try:
            if command == "reset":
                for lo, hi, batch in envs.values():
                    _put(env_id, arrays["obs"][lo:hi], batch.reset(argument + lo), "obs")
            else:  # "step"
                lo, hi, batch = envs[argument]
                step = batch.step(arrays["actions"][lo:hi])
                if len(step) != 5:
                    raise HostEnvError(
                        f"{env_id}: step returned {len(step)} values, expected 5 "
                        "(obs, reward, terminated, truncated, final_obs)")
                for name, value in zip(_STEP_FIELDS, step):
                    _put(env_id, arrays[name][lo:hi], value, name)
        except BaseException as error:  # noqa: BLE001 - reported to the actor, which raises it
            if isinstance(error, EnvContractError):  # its env index in the batch, made the actor's
                error.locate(env_offset=lo)
            _report(connection, error)
            continue
        connection.send(("ok", None))


def _report(connection: Connection, error: BaseException) -> None:
    """The traceback, and the exception itself where it pickles (the actor raises from it)."""
    try:
        import cloudpickle

        data = cloudpickle.dumps(error)
    except Exception:  # noqa: BLE001 - the traceback alone then
        data = None
    connection.send(("error", (traceback.format_exc(), data)))


_STEP_FIELDS = ("obs", "reward", "terminated", "truncated", "final_obs")
_KINDS = {"obs": OBS_KINDS, "final_obs": OBS_KINDS, "reward": REWARD_KINDS,
          "terminated": FLAG_KINDS, "truncated": FLAG_KINDS}


def _put(env_id: str, into: np.ndarray, value: Any, field: str) -> None:
    """``value`` into shared memory; `EnvContractError` unless it has the shape and a dtype
    of its field (`ppo_async.envs.host.contract_problem`)."""
    kinds = _KINDS[field]
    if type(value) is not np.ndarray or value.shape != into.shape or value.dtype.kind not in kinds:
        problem = contract_problem(value, into.shape, kinds)
        if problem is not None:
            raise EnvContractError(env_id, field, problem)
    into[...] = value


def _untrack(memory: shared_memory.SharedMemory) -> None:
    """The parent owns the block: this process's resource tracker must not unlink it at exit."""
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(memory._name, "shared_memory")  # noqa: SLF001
    except Exception:  # noqa: BLE001 - Python versions that do not track attached blocks
        pass
