"""Actors as processes of this machine, without Ray: past the GIL for host envs.

With ``actor_backend="processes"`` actors run in child processes,
``actors_per_process`` each (by default one process per core). Within a
process they are threads running the same actor loop as thread actors
(`ppo_async.runtime.actor.spawn_actor`), sharing its JAX, its load of each
params version and (`ppo_async.runtime.layout.shares_calls`) its policy calls, each behind an
`ActorEndpoint` over the process's one socket to the learner:

- weights: the `Publisher` thread serializes the params once and writes the
  same bytes once to every process's socket; the process's main thread puts
  them in the inbox of each of its actors (or of one: the versions a
  restarted actor needs), where the loop finds them as a thread actor finds
  its queue (the newest version free-running; with ``exact_policy_lag`` the
  version each chunk needs).
- experience: each actor writes each `Experience` (numpy) with its live
  `ActorStats`; the learner's ``receive`` waits on every process's socket at
  once and reads what is ready, so one actor's chunks arrive in order.
- failures: an exception in the loop comes back as an `ActorFailure` and the
  actor is restarted in its process; a process that dies (killed, segfault,
  out of memory) closes its socket, which becomes an `ActorFailure` for each
  actor it ran, naming its pid; an actor that stops producing is found by the
  learner's ``learner_timeout_s`` and killed with its process
  (`kill_actor`), whose other actors are reported failed; the supervisor
  restarts or reports each.
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
import math
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
from ppo_async.core.devices import to_host
from ppo_async.envs.gymnax_env import EnvCarry
from ppo_async.envs.payload import host_env_payload, register_host_env_payload
from ppo_async.envs.program import ActorProgram
from ppo_async.envs.workers import PARENT_CPUS_ENV
from ppo_async.runtime.actor import (
    ActorHandle,
    ActorStart,
    ActorStats,
    QueueEndpoint,
    spawn_actor,
)
from ppo_async.runtime.layout import actors_per_process
from ppo_async.runtime.learner import LearnerTimeoutError
from ppo_async.runtime.messages import ActorFailure, Experience, PolicyBroadcast
from ppo_async.runtime.transport import WHERE_TIMEOUT_S, Publisher, note_where_killed

logger = logging.getLogger(__name__)

# XLA flags of an actor process, so that N actors fit N cores: XLA's CPU kernels
# (Eigen) single-threaded. (A bare "intra_op_parallelism_threads=1", often set beside
# it, is not an XLA flag: the parser ignores it and every flag after it.)
ACTOR_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false"
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


def picklable_failure(failure: ActorFailure) -> ActorFailure:
    """The failure, with its exception replaced by a RuntimeError if it cannot be pickled."""
    try:
        pickle.loads(pickle.dumps(failure.error))
        return failure
    except Exception:  # noqa: BLE001 - any pickling problem
        error = RuntimeError(f"{type(failure.error).__name__}: {failure.error}")
        return failure._replace(error=error)


def outgoing(item: Experience | ActorFailure) -> Experience | ActorFailure:
    """``item`` as it leaves an actor process: a gymnax carry as host arrays (unpickling
    device arrays would cost the learner's thread time on every chunk), a host-env carry
    left behind (it holds live simulators; checkpoints of host-env runs restart their
    envs), a failure made picklable."""
    if isinstance(item, Experience):
        carry = item.env_carry
        return item._replace(env_carry=to_host(carry) if isinstance(carry, EnvCarry) else None)
    return picklable_failure(item)


# --------------------------------------------------------------------------
# The actor's side: one process.
# --------------------------------------------------------------------------


class _SocketOutbox:
    """What an actor's `QueueEndpoint` in an actor process puts experience into: the socket to
    the learner, each item with the actor's live stats (``lock``: the process's actors share
    the socket)."""

    def __init__(self, connection: Connection, stats: ActorStats, lock: threading.Lock):
        self._connection, self._stats, self._lock = connection, stats, lock

    def put(self, item: Experience | ActorFailure) -> None:
        message = ("item", outgoing(item), dataclasses.replace(self._stats))
        with self._lock:
            self._connection.send(message)


class _ActorHost:
    """The actors of one actor process: threads sharing its JAX, its loads of each params
    version and, as the layout says (`ppo_async.runtime.layout.shares_calls`), its policy calls.

    The process's main thread reads the learner's messages (`serve_messages`): ``start``
    runs an actor (again, after a failure), ``broadcast`` feeds the inbox of every actor
    (or of one, replaying the versions a restarted actor needs), ``stop`` ends the run.
    """

    def __init__(self, connection: Connection, config: AsyncActorLearnerConfig, first_id: int,
                 size: int, setup_failure: ActorFailure | None = None):
        self.connection, self.config, self.first_id = connection, config, first_id
        self.lock = threading.Lock()  # one writer at a time on the socket
        self.stop = threading.Event()
        self.inboxes: dict[int, queue.Queue] = {}
        self.handles: dict[int, ActorHandle] = {}
        self.inference = None
        self.setup_failure = setup_failure
        if setup_failure is not None:
            return
        try:
            import jax

            from ppo_async.envs.backends import make_actor_program
            from ppo_async.runtime.inference import SharedParams
            from ppo_async.runtime.transport import shared_caller

            # An actor process runs small programs (policy calls, rollouts) and waits for
            # each: run them in the calling thread (it releases the GIL there) rather than
            # hand each to XLA's dispatch thread and wake up again for its result.
            jax.config.update("jax_cpu_enable_async_dispatch", False)
            self.program = program = make_actor_program(config)
            self.device = jax.devices("cpu")[0]
            self.load_params = SharedParams(program.params_template, self.device)
            # Its actor threads share the process's (pinned) core with a sampler: below it.
            self.inference = shared_caller(config, program, size, self.stop.is_set,
                                           first_actor=self.first_id, background_clients=True)
            if self.inference is not None:
                self.inference.start()
        except BaseException as error:  # noqa: BLE001 - each actor started here reports it
            self.setup_failure = ActorFailure(-1, error, traceback.format_exc())

    def send(self, message: tuple) -> None:
        with self.lock:
            self.connection.send(message)

    def start(self, actor_id: int, start: ActorStart, stats: ActorStats) -> None:
        stats.pid, stats.node_id = os.getpid(), ""
        if self.setup_failure is not None:  # the envs or the program could not be built here
            self.send(("item", picklable_failure(self.setup_failure._replace(actor_id=actor_id)),
                       stats))
            return
        inbox = self.inboxes[actor_id] = queue.Queue()  # a restarted actor gets a fresh one
        endpoint = QueueEndpoint(_SocketOutbox(self.connection, stats, self.lock), inbox, self.stop)
        policy = None if self.inference is None else self.inference.client(actor_id - self.first_id)
        self.send(("started", stats))  # before anything the actor sends
        # Its failure, if it fails, goes out through the endpoint as a thread actor's does.
        self.handles[actor_id] = spawn_actor(actor_id, self.config, self.program, endpoint,
                                             self.device, stats, start, self.load_params, policy)

    def where(self) -> list[str]:
        """The threads of this process in an env's (or other non-runtime) code, with their frames."""
        from ppo_async.runtime.inference import LockstepSampler
        from ppo_async.runtime.transport import threads_outside_the_runtime

        sampler = self.inference if isinstance(self.inference, LockstepSampler) else None
        return threads_outside_the_runtime({sampler.thread: sampler.doing} if sampler else None)

    def serve_messages(self) -> None:
        """Read the learner's messages until ``stop``; the learner gone ends the process."""
        while True:
            try:
                kind, *detail = self.connection.recv()
            except (EOFError, OSError):
                os._exit(1)  # nobody is left to send to
            if kind == "broadcast":
                version, payload, target = detail
                message = PolicyBroadcast(version, payload)
                for actor_id, inbox in self.inboxes.items():
                    if target is None or target == actor_id:
                        inbox.put(message)
            elif kind == "start":
                self.start(*detail)
            elif kind == "where":  # the learner is about to kill this process
                self.send(("where", self.where()))
            elif kind == "stop":
                self.stop.set()
                break
        # The learner kills a process whose actors do not stop within its own timeout.
        deadline = time.monotonic() + self.config.shutdown_timeout_s
        threads = [h.thread for h in self.handles.values()]
        if self.inference is not None:
            threads.append(self.inference.thread)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for handle in self.handles.values():  # their last stats (a failure was their last word)
            if not handle.thread.is_alive() and handle.error is None:
                self.send(("stopped", handle.stats))


def actor_cpus(config: AsyncActorLearnerConfig, processes: int) -> list[int | None]:
    """The CPU each of ``processes`` actor processes pins itself to (None: not pinned).

    With ``pin_actor_processes`` and at most one process per CPU this process
    may use (its affinity), process ``i`` gets the ``i``-th of those CPUs.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not config.pin_actor_processes or not cpus or processes > len(cpus):
        return [None] * processes
    return cpus[:processes]


def pin_to_cpu(cpu: int | None) -> None:
    """Run the calling thread, and the threads and processes it starts from now on, on
    ``cpu`` alone (call it before JAX starts, so that XLA's threads are among them); the
    env worker processes started take back the CPUs it had (`PARENT_CPUS_ENV`)."""
    if cpu is None:
        return
    os.environ[PARENT_CPUS_ENV] = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, {cpu})


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the learner's process dies, even while
    this one is stuck in C code (its reader would never see the socket close)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def serve(fd: int) -> None:
    """An actor process: set up from the first message, then run actors until stopped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle
    _die_with_parent()
    connection = Connection(fd)
    _, setup = connection.recv()
    sys.path[:] = setup["path"]  # where the learner finds the modules that register envs
    if os.getppid() != setup["parent"]:
        os._exit(1)  # the learner died before the prctl took hold
    config = setup["config"]
    pin_to_cpu(setup["cpu"])
    try:
        from ppo_async.envs.registry import import_env_modules

        # The config arrives unvalidated: the modules that register its env are
        # imported here, as its validation imports them in the learner's process.
        import_env_modules(config.env_modules)
        if setup["host_env"] is not None:  # the learner's registry does not exist here
            register_host_env_payload(setup["host_env"], pickle.loads)
    except BaseException as error:  # noqa: BLE001 - reported by _ActorHost to each actor
        host_error = ActorFailure(-1, error, traceback.format_exc())
    else:
        host_error = None
    _ActorHost(connection, config, setup["first_id"], setup["size"], host_error).serve_messages()


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
class _Member:
    """One actor of an actor process, as the learner sees it."""

    started: bool = False
    ended: bool = False  # its loop ended (a failure, or stopped): a restart runs it again here


@dataclasses.dataclass
class _Process:
    """One actor process and the actors it runs, as the learner sees them."""

    process: subprocess.Popen
    connection: Connection
    members: dict[int, _Member] = dataclasses.field(default_factory=dict)
    send_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    expected_end: bool = False  # asked to stop, or killed here: its end is no failure


class ProcessTransport:
    """Actors as processes of this machine; the `LearnerTransport` the learner and supervisor use.

    Actor ``i`` runs in process ``i // actors_per_process`` (the layout's,
    `ppo_async.runtime.layout.actors_per_process`).
    """

    def __init__(self, config: AsyncActorLearnerConfig, program: ActorProgram):
        import cloudpickle  # a gymnasium dependency

        self.config = config
        self._host_env = host_env_payload(cloudpickle, config.env_id)
        n = config.num_actors
        self.per_process = actors_per_process(config)
        self.processes: list[_Process | None] = [None] * math.ceil(n / self.per_process)
        self._cpus = actor_cpus(config, len(self.processes))
        self._stats = [ActorStats(i) for i in range(n)]
        # Items and reported failures (the publisher thread appends too: deque appends are atomic).
        self._received: collections.deque = collections.deque()
        # The failure reported for an actor killed with another one, until it is received,
        # and those voided (the actor was found stuck itself: its kill explains its end).
        self._killed_along: dict[int, ActorFailure] = {}
        self._void: set[int] = set()  # ids of voided failures, skipped when received
        # What each process killed for a hung actor said of its threads in env code, by pid.
        self.where_killed: dict[int, str] = {}
        self._where: dict[int, list[str]] = {}  # replies to "where", by slot
        self._every_version = config.exact_lag is not None
        # exact_policy_lag: the versions an actor starting now may still need
        self._recent: dict[int, PolicyBroadcast] = {}
        self._keep = (config.exact_lag or 0) + config.broadcast_every + 2
        self._env = {**os.environ, **actor_env_vars()}
        self.publisher = Publisher(self._deliver, self.report_failure,
                                   every_version=self._every_version)
        _LIVE.add(self)

    def _process_of(self, actor_id: int) -> _Process | None:
        return self.processes[actor_id // self.per_process]

    # --- weights out --------------------------------------------------------

    def _deliver(self, message: PolicyBroadcast) -> None:
        """Publisher thread, under its lock: the same bytes once to every live process."""
        if self._every_version:
            self._recent[message.version] = message
            for old in sorted(self._recent)[:-self._keep]:
                del self._recent[old]
        for process in self.processes:
            if process is not None:
                self._send(process, ("broadcast", message.version, message.payload, None))

    @staticmethod
    def _send(process: _Process, message: tuple) -> None:
        """Write to an actor process's socket. A dead one is passed over (its end is reported
        by ``receive``, which reads the closed socket); one that has not read for
        ``learner_timeout_s`` (its socket's send timeout) is hung and is killed, the same way."""
        with process.send_lock:
            try:
                process.connection.send(message)
            except OSError:
                process.process.kill()

    def publish(self, params: Any, learner_updates: int) -> None:
        self.publisher.publish(params, learner_updates)

    # --- actors -------------------------------------------------------------

    def _spawn(self, slot: int) -> _Process:
        """A new actor process for slot ``slot`` (no actor runs in it yet)."""
        mine, theirs = socket.socketpair()
        # Every write to the process returns within the learner's timeout, even if it stops reading.
        seconds = max(1, int(self.config.learner_timeout_s))
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, 0))
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        try:
            popen = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, root, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=self._env)
        finally:
            theirs.close()
        process = _Process(popen, Connection(mine.detach()))
        first = slot * self.per_process
        setup = dict(config=self.config, first_id=first, parent=os.getpid(),
                     size=min(self.per_process, self.config.num_actors - first),
                     host_env=self._host_env, path=list(sys.path),
                     cpu=self._cpus[slot])
        self._send(process, ("setup", setup))
        return process

    def start_actor(self, actor_id: int, start: ActorStart) -> None:
        """Run actor ``actor_id`` in its process, started first if it is not running."""
        slot = actor_id // self.per_process
        with self.publisher.lock:
            process = self.processes[slot]
        if process is None:
            process = self._spawn(slot)
        stats = self._stats[actor_id]
        stats.pid = process.process.pid
        with self.publisher.lock:
            self.processes[slot] = process
            process.members[actor_id] = _Member()
            self._send(process, ("start", actor_id, start, stats))
            if self._every_version:
                replay = [self._recent[v] for v in sorted(self._recent) if v >= start.first_version]
            else:
                replay = [self.publisher.latest] if self.publisher.latest is not None else []
            for message in replay:
                self._send(process, ("broadcast", message.version, message.payload, actor_id))

    def restart_actor(self, actor_id: int, start: ActorStart) -> None:
        """Run the actor again and wait (up to `START_TIMEOUT_S`) until it is up: in its
        process if its loop ended there (it raised), else in a new process (the old one died,
        or is killed here with the other actors it ran). A process start and JAX's import
        take seconds, which the learner's hang clock, restarted when this returns, should
        not count."""
        member = self._member(actor_id)
        if member is not None and not member.ended:  # it may still run: its process goes
            self.kill_actor(actor_id, ask_where=False)
        with self.publisher.lock:  # with exact_policy_lag, the oldest version it will have
            if self.publisher.latest is not None:
                start = start._replace(first_version=self.publisher.latest.version)
        self.start_actor(actor_id, start)
        self.wait_started([actor_id])

    def wait_started(self, actor_ids: Sequence[int] | None = None) -> None:
        """Wait until every actor is up (its process has imported JAX and built the envs).

        An actor that failed to start counts as up: its failure is received.
        Raises `LearnerTimeoutError` naming the actors not up after `START_TIMEOUT_S`.
        """
        ids = list(range(len(self._stats)) if actor_ids is None else actor_ids)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            waiting = [i for i in ids if (member := self._member(i)) is not None
                       and not member.started and not member.ended]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise LearnerTimeoutError(
                    f"{', '.join(f'actor {i}' for i in waiting)} did not start within "
                    f"{START_TIMEOUT_S:g} s (importing JAX and building the envs took longer)",
                    waiting)
            self._read_ready(_WAIT_SLICE_S)

    def _member(self, actor_id: int) -> _Member | None:
        process = self._process_of(actor_id)
        return None if process is None else process.members.get(actor_id)

    def kill_actor(self, actor_id: int, report_others: bool = True,
                   ask_where: bool = True) -> bool:
        """Kill the actor's process (a hung actor's: first asked where its threads are). The
        other actors it ran are reported failed (the supervisor restarts them), unless they
        are being killed themselves."""
        slot = actor_id // self.per_process
        process = self.processes[slot]
        if process is None:
            failure = self._killed_along.pop(actor_id, None)
            if failure is not None:  # killed with another actor already: no second restart
                self._void.add(id(failure))
            return True
        if ask_where:
            self._ask_where(slot, process)
        self._kill(slot, process)
        for other, member in process.members.items():
            if report_others and other != actor_id and not member.ended:
                error = RuntimeError(
                    f"actor {other}'s process (pid {process.process.pid}) was killed with "
                    f"actor {actor_id}, which it also ran")
                failure = self._killed_along[other] = ActorFailure(other, error, f"{error}\n")
                self._received.append(failure)
        return True

    def _ask_where(self, slot: int, process: _Process) -> None:
        """Ask the process where its threads are (up to ``WHERE_TIMEOUT_S``), before it is
        killed: `where_killed` keeps the answer, and a warning says it. A thread holding
        its GIL keeps it from answering."""
        process.expected_end = True  # killed next: an end meanwhile is no failure of its own
        self._send(process, ("where",))
        deadline = time.monotonic() + WHERE_TIMEOUT_S
        while slot not in self._where and self.processes[slot] is process:
            left = deadline - time.monotonic()
            if left <= 0 or not process.connection.poll(left):
                break
            self._read_one(slot)  # the process's other messages go where they always go
        pid = process.process.pid
        note_where_killed(self.where_killed, pid, self._where.pop(slot, None),
                          f"actor process {pid} (actors "
                          f"{', '.join(map(str, sorted(process.members)))})")

    def _kill(self, slot: int, process: _Process) -> None:
        process.expected_end = True
        process.process.kill()
        with self.publisher.lock:
            self.processes[slot] = None
        self._reap(process, 5.0)

    def kill_all(self) -> None:
        for slot, process in enumerate(self.processes):
            if process is not None:
                self._kill(slot, process)

    @staticmethod
    def _reap(process: _Process, timeout_s: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.process.wait(timeout_s)
        process.connection.close()

    # --- experience in ------------------------------------------------------

    def receive(self, timeout_s: float) -> Experience | ActorFailure | None:
        # timeout_s=0 still looks once at the sockets: what has arrived is taken.
        deadline = time.monotonic() + timeout_s
        while True:
            while self._received:
                item = self._received.popleft()
                if id(item) in self._void:
                    self._void.discard(id(item))
                    continue
                if isinstance(item, ActorFailure) and self._killed_along.get(item.actor_id) is item:
                    del self._killed_along[item.actor_id]
                return item
            remaining = deadline - time.monotonic()
            if remaining <= 0 and not self._read_ready(0.0):
                return None
            if remaining > 0:
                self._read_ready(min(remaining, _WAIT_SLICE_S))

    def _read_ready(self, timeout_s: float) -> bool:
        """Read every message ready on the processes' sockets, waiting up to ``timeout_s`` for
        one; True if any was read."""
        live = {p.connection: slot for slot, p in enumerate(self.processes) if p is not None}
        if not live:
            time.sleep(timeout_s)
            return False
        ready = wait(list(live), timeout_s)
        for connection in ready:
            self._read_one(live[connection])
        return bool(ready)

    def _read_one(self, slot: int) -> None:
        process = self.processes[slot]
        if process is None:  # killed while its message waited
            return
        try:
            kind, *detail = process.connection.recv()
        except (EOFError, OSError):
            self._ended(slot, process)
            return
        if kind == "where":
            self._where[slot] = detail[0]
            return
        if kind == "item":
            item, stats = detail
            self._received.append(item)
        else:  # "started" or "stopped"
            (stats,) = detail
        member = process.members.get(stats.actor_id)
        if member is not None:
            member.started |= kind == "started"
            # After its failure or its last message the actor's loop has ended.
            member.ended |= kind == "stopped" or isinstance(detail[0], ActorFailure)
        self._stats[stats.actor_id].__dict__.update(stats.__dict__)

    def _ended(self, slot: int, process: _Process) -> None:
        """Its socket closed: the process ended. Unless asked to, that is the failure of every
        actor still running in it."""
        with self.publisher.lock:
            self.processes[slot] = None
        self._reap(process, 1.0)
        if process.expected_end:
            return
        code = process.process.poll()
        status = ("it is still running" if code is None else
                  f"killed by signal {signal.Signals(-code).name}" if code < 0 else
                  f"exit code {code}")
        for actor_id, member in process.members.items():
            if not member.ended:
                error = RuntimeError(
                    f"actor {actor_id}'s process (pid {process.process.pid}) ended: {status}")
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

        A process that does not stop in time is killed like the rest, so no
        process outlives the run; nothing is left to name but the publisher.
        """
        deadline = time.monotonic() + timeout_s
        self.publisher.stop()
        for actor_id in known_stuck:
            self.kill_actor(actor_id, report_others=False)
        for process in self.processes:
            if process is not None:
                process.expected_end = True
                self._send(process, ("stop",))
        # Read on until each socket closes (`_ended`): a process's last messages (stats,
        # failures) come before its end, and may still wait there after it has exited.
        while any(p is not None for p in self.processes):
            if time.monotonic() > deadline:
                break
            self._read_ready(_WAIT_SLICE_S)
        for process in self.processes:
            if process is not None and process.process.poll() is None:
                logger.warning("actor process %d (actors %s) did not stop by itself; killing it",
                               process.process.pid, sorted(process.members))
        self.kill_all()
        _LIVE.discard(self)
        self.publisher.thread.join(max(0.0, deadline - time.monotonic()))
        return ["ppo-publisher"] if self.publisher.thread.is_alive() else []

    def late_failures(self) -> list[ActorFailure]:
        failures = [item for item in self._received
                    if isinstance(item, ActorFailure) and id(item) not in self._void]
        self._received.clear()
        return failures
