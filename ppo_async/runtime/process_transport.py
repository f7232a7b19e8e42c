"""Actors as processes of this machine, without Ray: past the GIL for host envs.

Each actor is one child process (``actor_backend="processes"``) that runs the
same actor loop as a thread (`ppo_async.runtime.actor.run_actor`) behind an
`ActorEndpoint` over one socket to the learner's process:

- weights: the `Publisher` thread serializes the params once and writes the
  same bytes to every actor's socket; a reader thread in the actor process
  puts them in its inbox, where the loop finds them as a thread actor finds
  its queue (the newest version free-running; with ``exact_policy_lag`` the
  version each chunk needs).
- experience: the actor writes each `Experience` (numpy) with its live
  `ActorStats`; the learner's ``receive`` waits on every actor's socket at
  once and reads what is ready, so one actor's chunks arrive in order.
- failures: an exception in the loop comes back as an `ActorFailure`; a
  process that dies (killed, segfault, out of memory) closes its socket,
  which becomes an `ActorFailure` naming the actor and its pid; a process
  that stops producing is found by the learner's ``learner_timeout_s`` and
  killed (`kill_actor`), then the supervisor restarts or reports it.
- cleanup: an actor process ignores Ctrl-C (the learner stops it), exits
  when its socket to the learner closes, and on Linux is killed with its
  parent (``PR_SET_PDEATHSIG``), so no actor outlives the learner's process.

Why not `multiprocessing`'s own process start: ``spawn`` re-imports the
user's ``__main__`` (a script without a ``__main__`` guard would train
again in every actor), and ``fork`` copies a process whose JAX threads are
running. An actor process is a fresh interpreter (`subprocess`) that
imports only the package, with JAX on the CPU and one intra-op thread (set
before JAX is imported there), as Ray's actor processes do, so a run with
an exact lag gives the bytes of a run with thread actors.

The helpers every actor process shares (its environment, a ``host:`` env's
factory by value, a failure made picklable) are also Ray's
(`ppo_async.runtime.ray_transport`).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import logging
import os
import pickle
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.envs.gymnax_env import EnvCarry
from ppo_async.envs.program import ActorProgram
from ppo_async.envs.registry import HOST, host_env_factory, split_env_id
from ppo_async.runtime.actor import ActorStart, ActorStats, QueueEndpoint, run_actor
from ppo_async.runtime.learner import LearnerTimeoutError
from ppo_async.runtime.messages import ActorFailure, Experience, PolicyBroadcast
from ppo_async.runtime.transport import Publisher

logger = logging.getLogger(__name__)

# XLA flags of an actor process, so that N actors fit N cores: the first makes XLA's
# CPU kernels (Eigen) single-threaded; the second is the companion JAX users set for
# one-thread CPU runs (without a leading -- XLA's flag parser passes it over: harmless).
ACTOR_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
START_TIMEOUT_S = 120.0  # a process start, JAX's import, the envs and the first compile
_WAIT_SLICE_S = 0.05  # the learner's receive looks at dead processes this often
_PR_SET_PDEATHSIG = 1


def actor_env_vars() -> dict[str, str]:
    """Environment of an actor process, set before JAX is imported there."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join([*flags, ACTOR_XLA_FLAGS])}
    env.update(inherited_cache_env())  # the learner's persistent compilation cache, if it has one
    return env


def inherited_cache_env() -> dict[str, str]:
    """Environment variables that give a child process this process's compilation cache.

    Empty when this process has none (or has not imported JAX). Actor
    processes and a sweep's workers (`ppo_async.sweep`) set them before JAX
    starts there.
    """
    if "jax" not in sys.modules:
        return {}
    import jax

    cache_dir = jax.config.jax_compilation_cache_dir
    if not cache_dir:
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": str(cache_dir),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS":
                str(jax.config.jax_persistent_cache_min_compile_time_secs)}


def host_env_payload(pickler: Any, env_id: str) -> tuple[str, bytes] | None:
    """A ``host:NAME`` env's factory, pickled by value with ``pickler`` (cloudpickle) so an
    actor process can register it; None for other ids."""
    backend, name = split_env_id(env_id)
    if backend != HOST:
        return None
    factory = host_env_factory(name)
    # register_single_env wraps the user's env factory: its module is the one to look at.
    module = sys.modules.get(getattr(getattr(factory, "make_env", factory), "__module__", ""), None)
    by_value = module is not None and module.__name__ != "__main__" and not (
        module.__name__.startswith("ppo_async")
        or "site-packages" in str(getattr(module, "__file__", ""))
    )
    # A factory defined in a script or test module cannot be imported by name
    # in another process; its code travels with it.
    if by_value:
        pickler.register_pickle_by_value(module)
    try:
        return name, pickler.dumps(factory)
    finally:
        if by_value:
            pickler.unregister_pickle_by_value(module)


class ActorProcessesWarning(UserWarning):
    """``actor_backend="processes"`` asked for, but the env cannot leave this process: threads run."""


def unportable(env_id: str) -> str | None:
    """Why the actors of ``env_id`` cannot run in processes (a ``host:`` factory that holds a
    lock or an open simulator cannot be sent); None when they can."""
    import cloudpickle  # a gymnasium dependency

    try:
        payload = host_env_payload(cloudpickle, env_id)
        if payload is not None:
            pickle.loads(payload[1])
    except Exception as error:  # noqa: BLE001 - any failure means: it stays in this process
        first_line = str(error).splitlines()[0] if str(error) else ""
        return (f"{env_id}'s factory cannot be sent to another process "
                f"({type(error).__name__}: {first_line})")
    return None


def picklable_failure(failure: ActorFailure) -> ActorFailure:
    """The failure, with its exception replaced by a RuntimeError if it cannot be pickled."""
    try:
        pickle.loads(pickle.dumps(failure.error))
        return failure
    except Exception:  # noqa: BLE001 - any pickling problem
        error = RuntimeError(f"{type(failure.error).__name__}: {failure.error}")
        return failure._replace(error=error)


def outgoing(item: Experience | ActorFailure, device_get: Any) -> Experience | ActorFailure:
    """``item`` as it leaves an actor process: a gymnax carry as host arrays (unpickling
    device arrays would cost the learner's thread time on every chunk), a host-env carry
    left behind (it holds live simulators; checkpoints of host-env runs restart their
    envs), a failure made picklable."""
    if isinstance(item, Experience):
        carry = item.env_carry
        return item._replace(env_carry=device_get(carry) if isinstance(carry, EnvCarry) else None)
    return picklable_failure(item)


# --------------------------------------------------------------------------
# The actor's side: one process.
# --------------------------------------------------------------------------


class _SocketOutbox:
    """What an actor process's `QueueEndpoint` puts experience into: the socket to the learner,
    each item with the actor's live stats."""

    def __init__(self, connection: Connection, stats: ActorStats):
        import jax

        self._connection, self._stats, self._device_get = connection, stats, jax.device_get

    def put(self, item: Experience | ActorFailure) -> None:
        self._connection.send(("item", outgoing(item, self._device_get),
                               dataclasses.replace(self._stats)))


def _read_broadcasts(connection: Connection, endpoint: QueueEndpoint) -> None:
    """The reader thread: broadcasts into the endpoint's inbox until ``stop``; the learner gone
    ends the process (nobody is left to send to)."""
    while True:
        try:
            kind, *detail = connection.recv()
        except (EOFError, OSError):
            os._exit(1)
        if kind == "broadcast":
            endpoint.broadcast_queue.put(PolicyBroadcast(*detail))
        elif kind == "stop":
            endpoint.stop.set()
            return


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the learner's process dies, even while
    this one is stuck in C code (its reader thread would never see the socket close)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def serve(fd: int) -> None:
    """An actor process: set up from the first message, then run the actor loop until stopped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle
    _die_with_parent()
    connection = Connection(fd)
    _, setup = connection.recv()
    sys.path[:] = setup["path"]  # where the learner finds the modules that register envs
    if os.getppid() != setup["parent"]:
        os._exit(1)  # the learner died before the prctl took hold
    actor_id, config, start, stats = (setup[k] for k in ("actor_id", "config", "start", "stats"))
    stats.pid, stats.node_id = os.getpid(), ""
    try:
        import jax

        from ppo_async.envs.backends import make_actor_program
        from ppo_async.envs.registry import import_env_modules, register_host_env

        # The thread actor's endpoint, with the socket as its experience queue.
        endpoint = QueueEndpoint(_SocketOutbox(connection, stats), queue.Queue(), threading.Event())
        # The config arrives unvalidated: the modules that register its env are
        # imported here, as its validation imports them in the learner's process.
        import_env_modules(config.env_modules)
        if setup["host_env"] is not None:  # the learner's registry does not exist here
            name, factory = setup["host_env"]
            register_host_env(name, pickle.loads(factory))
        program = make_actor_program(config)
        device = jax.devices("cpu")[0]
    except BaseException as error:  # noqa: BLE001 - reported, never swallowed
        connection.send(("item", picklable_failure(
            ActorFailure(actor_id, error, traceback.format_exc())), stats))
        return
    connection.send(("started", stats))
    reader = threading.Thread(target=_read_broadcasts, args=(connection, endpoint),
                              name="ppo-actor-inbox", daemon=True)
    reader.start()
    try:
        run_actor(actor_id, config, program, endpoint, device, stats, start)
    except BaseException as error:  # noqa: BLE001 - reported, never swallowed
        endpoint.send(ActorFailure(actor_id, error, traceback.format_exc()))
    connection.send(("stopped", stats))


# The process's entry: the package importable, then `serve` (JAX's flags are in its environment).
_BOOTSTRAP = """
import sys
sys.path.insert(0, sys.argv[1])
from ppo_async.runtime.process_transport import serve
serve(int(sys.argv[2]))
"""


# --------------------------------------------------------------------------
# The learner's side.
# --------------------------------------------------------------------------

_LIVE: weakref.WeakSet = weakref.WeakSet()  # transports with processes, ended at exit


@atexit.register
def _kill_all() -> None:
    for transport in list(_LIVE):
        transport.kill_all()


@dataclasses.dataclass
class _Actor:
    """One actor process, as the learner sees it."""

    process: subprocess.Popen
    connection: Connection
    send_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    started: bool = False
    expected_end: bool = False  # asked to stop, or killed here: its end is no failure


class ProcessTransport:
    """Actors as processes of this machine; the `LearnerTransport` the learner and supervisor use."""

    def __init__(self, config: AsyncActorLearnerConfig, program: ActorProgram):
        import cloudpickle  # a gymnasium dependency

        self.config = config
        self._host_env = host_env_payload(cloudpickle, config.env_id)
        n = config.num_actors
        self.actors: list[_Actor | None] = [None] * n
        self._stats = [ActorStats(i) for i in range(n)]
        # Items and reported failures (the publisher thread appends too: deque appends are atomic).
        self._received: collections.deque = collections.deque()
        self._every_version = config.exact_lag is not None
        # exact_policy_lag: the versions an actor starting now may still need
        self._recent: dict[int, PolicyBroadcast] = {}
        self._keep = (config.exact_lag or 0) + config.broadcast_every + 2
        self._env = {**os.environ, **actor_env_vars()}
        self.publisher = Publisher(self._deliver, self.report_failure,
                                   every_version=self._every_version)
        _LIVE.add(self)

    # --- weights out --------------------------------------------------------

    def _deliver(self, message: PolicyBroadcast) -> None:
        """Publisher thread, under its lock: the same bytes to every live actor."""
        if self._every_version:
            self._recent[message.version] = message
            for old in sorted(self._recent)[:-self._keep]:
                del self._recent[old]
        for actor in self.actors:
            if actor is not None:
                self._send(actor, ("broadcast", message.version, message.payload))

    @staticmethod
    def _send(actor: _Actor, message: tuple) -> None:
        """Write to an actor's socket. A dead one is passed over (its end is reported by
        ``receive``, which reads the closed socket); one that has not read for
        ``learner_timeout_s`` (its socket's send timeout) is hung and is killed, the same way."""
        with actor.send_lock:
            try:
                actor.connection.send(message)
            except OSError:
                actor.process.kill()

    def publish(self, params: Any, learner_updates: int) -> None:
        self.publisher.publish(params, learner_updates)

    # --- actors -------------------------------------------------------------

    def start_actor(self, actor_id: int, start: ActorStart) -> None:
        mine, theirs = socket.socketpair()
        # Every write to the actor returns within the learner's timeout, even if it stops reading.
        seconds = max(1, int(self.config.learner_timeout_s))
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, 0))
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, root, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=self._env)
        finally:
            theirs.close()
        actor = _Actor(process, Connection(mine.detach()))
        self._stats[actor_id].pid = process.pid
        setup = dict(actor_id=actor_id, config=self.config, start=start, parent=os.getpid(),
                     stats=self._stats[actor_id], host_env=self._host_env, path=list(sys.path))
        self._send(actor, ("setup", setup))
        with self.publisher.lock:
            self.actors[actor_id] = actor
            if self._every_version:
                replay = [self._recent[v] for v in sorted(self._recent) if v >= start.first_version]
            else:
                replay = [self.publisher.latest] if self.publisher.latest is not None else []
            for message in replay:
                self._send(actor, ("broadcast", message.version, message.payload))

    def restart_actor(self, actor_id: int, start: ActorStart) -> None:
        """Kill the old process, start a new one, and wait (up to `START_TIMEOUT_S`) until it
        is up: a process start and JAX's import take seconds, which the learner's hang clock,
        restarted when this returns, should not count."""
        self.kill_actor(actor_id)
        with self.publisher.lock:  # with exact_policy_lag, the oldest version it will have
            if self.publisher.latest is not None:
                start = start._replace(first_version=self.publisher.latest.version)
        self.start_actor(actor_id, start)
        self.wait_started([actor_id])

    def wait_started(self, actor_ids: Sequence[int] | None = None) -> None:
        """Wait until every actor's process is up (JAX imported, envs built).

        An actor that failed to start counts as up: its failure is received.
        Raises `LearnerTimeoutError` naming the actors not up after `START_TIMEOUT_S`.
        """
        ids = list(range(len(self.actors)) if actor_ids is None else actor_ids)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            waiting = [i for i in ids if self.actors[i] is not None and not self.actors[i].started]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise LearnerTimeoutError(
                    f"{', '.join(f'actor {i}' for i in waiting)} did not start within "
                    f"{START_TIMEOUT_S:g} s (importing JAX and building the envs took longer)",
                    waiting)
            self._read_ready(_WAIT_SLICE_S)

    def kill_actor(self, actor_id: int) -> bool:
        actor = self.actors[actor_id]
        if actor is not None:
            actor.expected_end = True
            actor.process.kill()
            with self.publisher.lock:
                self.actors[actor_id] = None
            self._reap(actor, 5.0)
        return True

    def kill_all(self) -> None:
        for actor_id in range(len(self.actors)):
            self.kill_actor(actor_id)

    @staticmethod
    def _reap(actor: _Actor, timeout_s: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            actor.process.wait(timeout_s)
        actor.connection.close()

    # --- experience in ------------------------------------------------------

    def receive(self, timeout_s: float) -> Experience | ActorFailure | None:
        # timeout_s=0 still looks once at the sockets: what has arrived is taken.
        deadline = time.monotonic() + timeout_s
        while True:
            if self._received:
                return self._received.popleft()
            remaining = deadline - time.monotonic()
            if remaining <= 0 and not self._read_ready(0.0):
                return None
            if remaining > 0:
                self._read_ready(min(remaining, _WAIT_SLICE_S))

    def _read_ready(self, timeout_s: float) -> bool:
        """Read every message ready on the actors' sockets, waiting up to ``timeout_s`` for
        one; True if any was read."""
        live = {a.connection: i for i, a in enumerate(self.actors) if a is not None}
        if not live:
            time.sleep(timeout_s)
            return False
        ready = wait(list(live), timeout_s)
        for connection in ready:
            self._read_one(live[connection])
        return bool(ready)

    def _read_one(self, actor_id: int) -> None:
        actor = self.actors[actor_id]
        try:
            kind, *detail = actor.connection.recv()
        except (EOFError, OSError):
            self._ended(actor_id, actor)
            return
        if kind == "item":
            item, stats = detail
            self._received.append(item)
        else:  # "started" or "stopped"
            (stats,) = detail
            actor.started = True
        # After its failure or its last message the process ends: that end is explained.
        actor.expected_end |= kind == "stopped" or isinstance(detail[0], ActorFailure)
        self._stats[actor_id].__dict__.update(stats.__dict__)

    def _ended(self, actor_id: int, actor: _Actor) -> None:
        """Its socket closed: the process ended. Unless asked to, that is the actor's failure."""
        with self.publisher.lock:
            self.actors[actor_id] = None
        self._reap(actor, 1.0)
        if actor.expected_end:
            return
        code = actor.process.poll()
        status = ("it is still running" if code is None else
                  f"killed by signal {signal.Signals(-code).name}" if code < 0 else
                  f"exit code {code}")
        error = RuntimeError(f"actor {actor_id}'s process (pid {actor.process.pid}) ended: {status}")
        self._received.append(ActorFailure(actor_id, error, f"{error}\n"))

    def report_failure(self, failure: ActorFailure) -> None:
        self._received.append(failure)

    def queue_depth(self) -> int:
        return len(self._received)

    def actor_stats(self) -> list[ActorStats]:
        return self._stats

    # --- the end ------------------------------------------------------------

    def stop(self, timeout_s: float, known_stuck: Sequence[int] = ()) -> list[str]:
        """Stop the publisher and every actor, then kill any actor process still running.

        An actor that does not stop in time is killed like the rest, so no
        process outlives the run; nothing is left to name but the publisher.
        """
        deadline = time.monotonic() + timeout_s
        self.publisher.stop()
        for actor_id, actor in enumerate(self.actors):
            if actor is not None:
                actor.expected_end = True
                if actor_id in known_stuck:
                    self.kill_actor(actor_id)
                else:
                    self._send(actor, ("stop",))
        # Read on while they stop: their last messages (stats, failures) must not fill
        # a socket nobody reads.
        while any(a is not None and a.process.poll() is None for a in self.actors):
            if time.monotonic() > deadline:
                break
            self._read_ready(_WAIT_SLICE_S)
        for actor_id, actor in enumerate(self.actors):
            if actor is not None and actor.process.poll() is None:
                logger.warning("actor %d did not stop by itself; killing it", actor_id)
        self.kill_all()
        _LIVE.discard(self)
        self.publisher.thread.join(max(0.0, deadline - time.monotonic()))
        return ["ppo-publisher"] if self.publisher.thread.is_alive() else []

    def late_failures(self) -> list[ActorFailure]:
        failures = [item for item in self._received if isinstance(item, ActorFailure)]
        self._received.clear()
        return failures

