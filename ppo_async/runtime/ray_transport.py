"""Actors as Ray processes: past the GIL on one machine, and across machines on the same path.

Each actor is one Ray actor (a process: `_ActorProcess`) that runs the same
actor loop as a thread does (`ppo_async.runtime.actor.run_actor`, its
`ActorThrottle`, the same `Experience` and `PolicyBroadcast` messages), behind
an `ActorEndpoint` whose queues live in that process:

- weights: the learner's `Publisher` thread serializes the params once,
  ``ray.put``-s the bytes once, and sends every actor only the object
  reference (``deliver``). Free-running, at most one call is in flight per
  actor: an actor whose last delivery is not done yet is owed the newest
  version, sent when it is, and it resolves the reference of the newest
  version it has when it starts a chunk, so skipped versions are never
  fetched. With ``exact_policy_lag`` every version goes to every actor (each
  is some chunk's), and only the version a chunk needs is fetched.
- experience: the learner keeps one ``poll`` call in flight per actor; each
  returns the numpy `Experience` pytrees (and failures) the actor sent since
  the last one, in order, so the learner's buffer fills exactly as with
  threads.
- failures: an exception in the loop comes back as an `ActorFailure`; a
  process that dies (killed, segfault, out of memory) fails its ``poll``,
  which becomes an `ActorFailure` naming the actor -- or, where its node is
  gone (marked dead, or its raylet refuses a connection), a `RayNodeLostError`
  naming the node and every actor on it; a process that stops
  producing is found by the learner's ``learner_timeout_s`` and killed here
  (`kill_actor`, ``ray.kill``) -- then the supervisor restarts or reports it.

JAX in each actor process runs on the CPU with one intra-op thread (set in the
process's environment before JAX is imported there), so N actors on N cores
do not oversubscribe them. Ray is imported only when this module is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import socket
import threading
import time
import traceback
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.envs.backends import make_actor_program
from ppo_async.envs.payload import HostEnvPayload, host_env_payload, register_host_env_payload
from ppo_async.envs.program import ActorProgram
from ppo_async.runtime.actor import ActorStart, ActorStats, run_actor
from ppo_async.runtime.learner import LearnerTimeoutError
from ppo_async.runtime.messages import (
    ActorFailure,
    Experience,
    PolicyBroadcast,
    take_all,
    take_newest,
)
from ppo_async.runtime.process_transport import actor_cpus, actor_env_vars, outgoing, pin_to_cpu
from ppo_async.runtime.transport import WHERE_TIMEOUT_S, Publisher, note_where_killed

logger = logging.getLogger(__name__)

_POLL_S = 0.2  # longest an actor's poll call blocks waiting for experience
_WAIT_SLICE_S = 0.05  # the learner's receive looks at reported failures this often
PRIVATE_OBJECT_STORE_BYTES = 256 * 1024**2  # weights and chunks are small; keep /dev/shm free
# How long a lost actor's raylet may take to accept a connection. Ray's own verdict (a node
# marked dead) takes about 16 s by default; a raylet that is gone refuses at once.
_RAYLET_PROBE_S = 1.0


class RayNodeLostError(RuntimeError):
    """A Ray node that ran actors is gone; the message names it and the actors it ran."""


def _import_ray():
    try:
        import ray
    except ImportError as error:  # config validation checks first; this is a second guard
        raise ConfigError(
            "actor_backend='ray': Ray is not installed; pip install 'ppo-async[ray]'"
        ) from error
    return ray


# --------------------------------------------------------------------------
# The actor's side: one process.
# --------------------------------------------------------------------------


class Delivery(NamedTuple):
    """A broadcast on its way into an actor process: its version and the reference to its bytes."""

    version: int
    refs: list  # [ObjectRef]: in a list, so that Ray hands the reference over unresolved


class _ProcessEndpoint:
    """The `ActorEndpoint` of an actor process: an inbox of references, an outbox of items."""

    def __init__(self, ray: Any):
        self._ray = ray
        self.inbox: queue.Queue = queue.Queue()  # Delivery
        self.outbox: queue.Queue = queue.Queue()  # Experience | ActorFailure, in order
        self.stop = threading.Event()

    def _load(self, delivery) -> PolicyBroadcast:
        return PolicyBroadcast(delivery.version, self._ray.get(delivery.refs[0]))

    def send(self, item: Experience | ActorFailure) -> None:
        self.outbox.put(outgoing(item))

    def take_newest(self) -> tuple[PolicyBroadcast | None, int]:
        newest, taken = take_newest(self.inbox)
        # Only the newest version's bytes are fetched.
        return (self._load(newest) if newest is not None else None), taken

    def take_all(self) -> list[Delivery]:
        return take_all(self.inbox)  # fetched only when loaded

    def load(self, item: Delivery | PolicyBroadcast) -> PolicyBroadcast:
        return self._load(item) if isinstance(item, Delivery) else item

    def wait_broadcast(self, timeout_s: float) -> PolicyBroadcast | None:
        try:
            return self._load(self.inbox.get(timeout=timeout_s))
        except queue.Empty:
            return None

    def stopped(self) -> bool:
        return self.stop.is_set()


class _ActorProcess:
    """One actor in its own process: the actor loop in a thread, fed by ``deliver``, read by ``poll``.

    Made a Ray actor (threaded, so that ``deliver``, ``poll`` and ``stop``
    run beside the loop) by `RayTransport`.
    """

    def __init__(self, actor_id: int, config: AsyncActorLearnerConfig,
                 host_env: HostEnvPayload | None, start: ActorStart, stats: ActorStats,
                 cpu: int | None = None):
        import jax
        import ray

        pin_to_cpu(cpu)  # before JAX starts here: its threads, and the actor's, stay on it

        from ppo_async.envs.registry import import_env_modules

        # The config arrives pickled, unvalidated: the modules that register its env are
        # imported here, as the config's validation imports them in the learner's process.
        import_env_modules(config.env_modules)
        if host_env is not None:  # the learner's registry does not exist in this process
            register_host_env_payload(host_env, ray.cloudpickle.loads)
        self.endpoint = _ProcessEndpoint(ray)
        self.stats = stats
        self.stats.pid = os.getpid()
        self.stats.node_id = ray.get_runtime_context().get_node_id()
        program = make_actor_program(config)
        device = jax.devices("cpu")[0]

        def run() -> None:
            try:
                run_actor(actor_id, config, program, self.endpoint, device, self.stats, start)
            except BaseException as error:  # noqa: BLE001 - reported, never swallowed
                self.endpoint.send(ActorFailure(actor_id, error, traceback.format_exc()))

        self.thread = threading.Thread(target=run, name=f"ppo-actor-{actor_id}", daemon=True)
        self.thread.start()

    def where(self) -> tuple[int, str]:
        """(pid, Ray node id) of this process."""
        return self.stats.pid, self.stats.node_id

    def stuck_in(self) -> list[str]:
        """This process's threads in an env's (or other non-runtime) code, with their frames."""
        from ppo_async.runtime.transport import threads_outside_the_runtime

        return threads_outside_the_runtime()

    def deliver(self, version: int, refs: list) -> None:
        # The reference arrives wrapped in a list, so Ray does not fetch the bytes
        # now: only the version the loop actually loads is fetched.
        self.endpoint.inbox.put(Delivery(version, refs))

    def poll(self, timeout_s: float) -> tuple[list, ActorStats]:
        """Everything sent since the last poll (waiting up to ``timeout_s`` for one), and the stats."""
        items = []
        try:
            items.append(self.endpoint.outbox.get(timeout=timeout_s))
            while True:
                items.append(self.endpoint.outbox.get_nowait())
        except queue.Empty:
            pass
        return items, dataclasses.replace(self.stats)

    def stop(self, timeout_s: float) -> ActorStats:
        self.endpoint.stop.set()
        self.thread.join(timeout_s)
        return dataclasses.replace(self.stats)


# --------------------------------------------------------------------------
# The learner's side.
# --------------------------------------------------------------------------


def connect(ray: Any, address: str | None, env_vars: dict[str, str] | None = None) -> bool:
    """Make sure this process is connected to Ray at ``address`` (``config.ray_address``); True
    if it connected here (and so must disconnect at the end).

    A process already connected (a notebook, a test fixture) keeps its
    connection. ``None`` starts a private local instance sized to this
    machine; an address joins a running cluster, which outlives the run.
    ``env_vars``: environment variables of every worker this connection starts.
    """
    if ray.is_initialized():
        return False
    common: dict[str, Any] = dict(log_to_driver=False, configure_logging=False)
    if env_vars:
        common["runtime_env"] = {"env_vars": dict(env_vars)}
    if address is None:
        os.environ["RAY_AUTH_MODE"] = "disabled"  # a private instance, on this machine only
        _ray_init(ray, num_cpus=os.cpu_count(), include_dashboard=False,
                  object_store_memory=PRIVATE_OBJECT_STORE_BYTES, **common)
    else:
        _ray_init(ray, address=address, **common)
    return True


def _ray_init(ray: Any, **options: Any) -> None:
    """``ray.init(**options)`` without JAX's warning that a fork will likely deadlock."""
    with ray_processes_start():
        ray.init(**options)


@contextlib.contextmanager
def ray_processes_start():
    """Silence JAX's os.fork warning while Ray starts its own processes (``ray.init``, a
    ``ray.cluster_utils.Cluster`` node), and only then.

    Ray starts them (gcs_server, raylet, the monitors) with
    ``subprocess.Popen(preexec_fn=...)``; a preexec_fn makes CPython run the
    at-fork hooks, and JAX's warns of a deadlock (a forked child has none of
    JAX's threads). That child only blocks SIGINT, sets its parent-death
    signal and execs the Ray binary or script: it never runs JAX, so nothing
    can wait on the threads it lacks. Actor processes are started by the
    raylet, not forked from here.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                category=RuntimeWarning)
        yield


def _check_resources(ray: Any, config: AsyncActorLearnerConfig) -> None:
    """Refuse a run whose actors the cluster can never place (Ray would queue them forever)."""
    total = ray.cluster_resources()
    wanted = [("CPU", "ray_num_cpus_per_actor", config.ray_num_cpus_per_actor)]
    wanted += [(name, "ray_actor_resources", amount)
               for name, amount in config.ray_actor_resources]
    for resource, field, per_actor in wanted:
        need = per_actor * config.num_actors
        if need > total.get(resource, 0.0) + 1e-9:
            raise ConfigError(
                f"{field}: {config.num_actors} actors x {per_actor} {resource} = {need}, but "
                f"the Ray cluster has {total.get(resource, 0.0)} {resource}; lower it, use "
                "fewer actors, or add nodes that have it"
            )


class RayTransport:
    """Actors as Ray processes; the `LearnerTransport` the learner and supervisor use."""

    def __init__(self, config: AsyncActorLearnerConfig, program: ActorProgram):
        ray = self._ray = _import_ray()
        self.config = config
        self._connected_here = connect(ray, config.ray_address)
        try:
            _check_resources(ray, config)
            self._host_env = host_env_payload(ray.cloudpickle, config.env_id)
        except BaseException:
            self._disconnect()
            raise
        self._remote = ray.remote(_ActorProcess)
        n = config.num_actors
        # A core each, as actor processes get (pin_actor_processes), on a private instance
        # only: the nodes of a cluster joined (or of a caller's Ray) are not this machine's.
        self._cpus = (actor_cpus(config, n) if self._connected_here and config.ray_address is None
                      else [None] * n)
        self.actors: list[Any] = [None] * n
        self._stats = [ActorStats(i) for i in range(n)]
        # What each process killed for a hung actor said of its threads in env code, by pid.
        self.where_killed: dict[int, str] = {}
        # Ray nodes found gone (`_process_ended`): node id -> what each of its actors reports
        self._lost_nodes: dict[str, str] = {}
        self._polls: dict[int, Any] = {}  # actor id -> its poll call in flight
        self._received: queue.Queue = queue.Queue()  # polled items and reported failures
        self._latest: tuple[int, Any] | None = None  # (version, ref) of the newest
        self._in_flight: dict[int, Any] = {}  # actor id -> its deliver call in flight
        self._owed: set[int] = set()  # actors owed the newest version
        self._every_version = config.exact_lag is not None
        # exact_policy_lag: the versions an actor starting now may still need (version -> ref)
        self._recent: dict[int, Any] = {}
        self._keep = (config.exact_lag or 0) + config.broadcast_every + 2
        self.publisher = Publisher(self._deliver, self.report_failure, on_idle=self._pay_owed,
                                   every_version=self._every_version)

    # --- weights out --------------------------------------------------------

    def _deliver(self, message: PolicyBroadcast) -> None:
        """Publisher thread, under its lock: one ``ray.put`` of the bytes, one reference to each."""
        version, ref = self._latest = (message.version, self._ray.put(message.payload))
        if self._every_version:
            self._recent[version] = ref
            for old in sorted(self._recent)[:-self._keep]:
                del self._recent[old]
        for actor_id in range(len(self.actors)):
            if self._every_version and self.actors[actor_id] is not None:
                # exact_policy_lag: each actor needs every version; the lead bounds how
                # many deliveries can be in flight, and the actor orders them by version.
                self.actors[actor_id].deliver.remote(version, [ref])
            else:
                self._send_latest(actor_id)

    def _send_latest(self, actor_id: int) -> None:
        actor, in_flight = self.actors[actor_id], self._in_flight.get(actor_id)
        if actor is None or self._latest is None:
            return
        if in_flight is not None and not self._ray.wait([in_flight], timeout=0)[0]:
            self._owed.add(actor_id)  # at most one delivery in flight per actor
            return
        self._owed.discard(actor_id)
        version, ref = self._latest
        self._in_flight[actor_id] = actor.deliver.remote(version, [ref])

    def _pay_owed(self) -> None:
        for actor_id in list(self._owed):
            self._send_latest(actor_id)

    def publish(self, params: Any, learner_updates: int) -> None:
        self.publisher.publish(params, learner_updates)

    # --- actors -------------------------------------------------------------

    def start_actor(self, actor_id: int, start: ActorStart) -> None:
        options: dict[str, Any] = dict(
            num_cpus=self.config.ray_num_cpus_per_actor,
            resources=dict(self.config.ray_actor_resources),
            runtime_env={"env_vars": actor_env_vars()},
            max_concurrency=4,  # deliver, poll, stop, stuck_in beside the loop's thread
        )
        actor = self._remote.options(**options).remote(
            actor_id, self.config, self._host_env, start, self._stats[actor_id],
            self._cpus[actor_id])
        with self.publisher.lock:
            self.actors[actor_id] = actor
            self._in_flight.pop(actor_id, None)
            if self._every_version:
                for version in sorted(v for v in self._recent if v >= start.first_version):
                    actor.deliver.remote(version, [self._recent[version]])
            else:
                self._send_latest(actor_id)
        self._polls[actor_id] = actor.poll.remote(_POLL_S)

    def restart_actor(self, actor_id: int, start: ActorStart) -> None:
        """Kill the old process, start a new one, and wait (up to ``ray_start_timeout_s``)
        until it is up: a process start and JAX's import take seconds, which the learner's
        hang clock, restarted when this returns, should not count."""
        self.kill_actor(actor_id, ask_where=False)  # a hung one was killed (and asked) already
        with self.publisher.lock:  # with exact_policy_lag, the oldest version it will have
            if self._latest is not None:
                start = start._replace(first_version=self._latest[0])
        self.start_actor(actor_id, start)
        self.wait_started([actor_id])

    def wait_started(self, actor_ids: Sequence[int] | None = None) -> None:
        """Wait until every actor's process is up (JAX imported, envs built).

        An actor that failed to start counts as up: its poll reports why.
        Raises `LearnerTimeoutError` naming the actors not up after
        ``ray_start_timeout_s``.
        """
        timeout_s = self.config.ray_start_timeout_s
        actor_ids = range(len(self.actors)) if actor_ids is None else actor_ids
        refs = {self.actors[i].where.remote(): i for i in actor_ids if self.actors[i] is not None}
        ready, pending = self._ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        for ref in ready:  # where it runs, before its first poll says so (a node lost names it)
            try:
                stats = self._stats[refs[ref]]
                stats.pid, stats.node_id = self._ray.get(ref)
            except self._ray.exceptions.RayError:  # failed to start: its poll reports why
                pass
        if pending:
            slow = sorted(refs[ref] for ref in pending)
            raise LearnerTimeoutError(
                f"{', '.join(f'actor {i}' for i in slow)} did not start within "
                f"ray_start_timeout_s={timeout_s} s (its Ray process was not placed, or "
                "importing JAX and building the envs took longer)", slow)

    def kill_actor(self, actor_id: int, ask_where: bool = True) -> bool:
        """Kill the actor's process (a hung actor's: first asked where its threads are)."""
        with self.publisher.lock:
            actor, self.actors[actor_id] = self.actors[actor_id], None
            self._in_flight.pop(actor_id, None)
            self._owed.discard(actor_id)
        self._polls.pop(actor_id, None)
        if actor is not None:
            if ask_where:
                self._ask_where(actor_id, actor)
            self._ray.kill(actor, no_restart=True)
        return True

    def _ask_where(self, actor_id: int, actor: Any) -> None:
        """As `ProcessTransport._ask_where`: where its threads in env code are, before the kill."""
        try:
            threads = self._ray.get(actor.stuck_in.remote(), timeout=WHERE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a timeout or a dead actor: no answer
            threads = None
        pid = self._stats[actor_id].pid
        note_where_killed(self.where_killed, pid, threads,
                          f"actor {actor_id}'s Ray process {pid}")

    # --- experience in ------------------------------------------------------

    def receive(self, timeout_s: float) -> Experience | ActorFailure | None:
        # timeout_s=0 still looks once at the polls: what has finished is taken.
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._received.get_nowait()
            except queue.Empty:
                pass
            remaining = max(deadline - time.monotonic(), 0.0)
            if self._polls:
                by_ref = {ref: actor_id for actor_id, ref in self._polls.items()}
                ready, _ = self._ray.wait(list(by_ref), num_returns=1,
                                          timeout=min(remaining, _WAIT_SLICE_S))
                for ref in ready:
                    self._collect(by_ref[ref], ref)
                if ready:
                    continue
            elif remaining > 0:
                try:
                    return self._received.get(timeout=min(remaining, _WAIT_SLICE_S))
                except queue.Empty:
                    pass
            if remaining <= 0:
                return None

    def _collect(self, actor_id: int, ref: Any) -> None:
        """Take one finished poll of ``actor_id`` and start the next."""
        try:
            items, stats = self._ray.get(ref)
        except self._ray.exceptions.RayError as error:
            self._polls.pop(actor_id, None)
            self._received.put(self._process_ended(actor_id, error))
            return
        for field in dataclasses.fields(ActorStats):
            setattr(self._stats[actor_id], field.name, getattr(stats, field.name))
        for item in items:
            self._received.put(item)
        if self.actors[actor_id] is not None:
            self._polls[actor_id] = self.actors[actor_id].poll.remote(_POLL_S)

    def _process_ended(self, actor_id: int, error: BaseException) -> ActorFailure:
        """The failure of an actor whose process ended: a `RayNodeLostError` naming the
        node and its actors where the node is gone, else Ray's ``error``."""
        stats = self._stats[actor_id]
        ended = (f"actor {actor_id}'s process (pid {stats.pid or '?'}) ended: "
                 f"{type(error).__name__}: {error}")
        said = self._lost_nodes.get(stats.node_id)
        if said is None:
            gone = self._node_gone(stats.node_id) if stats.node_id else None
            if gone is None:
                return ActorFailure(actor_id, error, ended)
            # Every actor it ran, said once: those restarted meanwhile have moved on.
            on_it = [i for i, other in enumerate(self._stats) if other.node_id == stats.node_id]
            said = self._lost_nodes[stats.node_id] = (
                f"Ray node {stats.node_id} ({gone}) was lost, and with it "
                f"actor{'s' if len(on_it) > 1 else ''} {', '.join(map(str, on_it))}")
        lost = RayNodeLostError(said)
        lost.add_note(ended)  # Ray's words, in the traceback (one_line says the node's)
        return ActorFailure(actor_id, lost, f"{lost}\n{ended}\n")

    def _node_gone(self, node_id: str) -> str | None:
        """How the Ray node ``node_id`` is gone (its address and why), or None while its raylet
        answers."""
        try:
            node = next((n for n in self._ray.nodes() if n["NodeID"] == node_id), None)
        except Exception:  # noqa: BLE001 - the GCS cannot say: the process's failure stands
            return None
        if node is None:
            return "no longer in the cluster"
        address = node.get("NodeManagerAddress", "?")
        if not node.get("Alive", False):
            return f"{address}, marked dead"
        try:
            socket.create_connection((address, int(node["NodeManagerPort"])),
                                     timeout=_RAYLET_PROBE_S).close()
        except (OSError, KeyError, ValueError):
            return f"{address}, its raylet does not answer"
        return None

    def report_failure(self, failure: ActorFailure) -> None:
        self._received.put(failure)

    def queue_depth(self) -> int:
        return self._received.qsize()

    def actor_stats(self) -> list[ActorStats]:
        return self._stats

    # --- the end ------------------------------------------------------------

    def stop(self, timeout_s: float, known_stuck: Sequence[int] = ()) -> list[str]:
        """Stop the publisher and every actor, then kill every actor process.

        An actor that does not stop in time is killed like the rest, so no
        process outlives the run; nothing is left to name.
        """
        deadline = time.monotonic() + timeout_s
        self.publisher.stop()
        stopping = {  # an actor on a lost node cannot be asked: it is killed with the rest
            actor_id: actor.stop.remote(max(0.0, deadline - time.monotonic()))
            for actor_id, actor in enumerate(self.actors)
            if actor is not None and actor_id not in known_stuck
            and self._stats[actor_id].node_id not in self._lost_nodes
        }
        if stopping:
            self._ray.wait(list(stopping.values()), num_returns=len(stopping),
                           timeout=max(0.0, deadline - time.monotonic()))
        for actor_id, ref in stopping.items():
            try:
                stats = self._ray.get(ref, timeout=0)
            except Exception as error:  # noqa: BLE001 - not stopped in time, or already dead
                logger.warning("actor %d did not stop by itself (%s); killing it", actor_id,
                               type(error).__name__)
                continue
            for field in dataclasses.fields(ActorStats):
                setattr(self._stats[actor_id], field.name, getattr(stats, field.name))
        actors = [actor for actor in self.actors if actor is not None]
        for actor_id in range(len(self.actors)):
            self.kill_actor(actor_id, ask_where=False)
        self._confirm_dead(actors, deadline)
        self.publisher.thread.join(max(0.0, deadline - time.monotonic()))
        stragglers = []
        if self.publisher.thread.is_alive():
            stragglers.append("ppo-publisher")
        self._disconnect()
        return stragglers

    def _confirm_dead(self, actors: list, deadline: float) -> None:
        """Wait (until ``deadline``) until Ray reports every killed actor dead."""
        for actor in actors:
            while time.monotonic() < deadline:
                try:
                    # Answered only while the kill has not reached the process yet.
                    self._ray.get(actor.where.remote(),
                                  timeout=max(0.1, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - ActorDiedError: what we wait for
                    break
                time.sleep(0.02)

    def _disconnect(self) -> None:
        if self._connected_here and self._ray.is_initialized():
            self._ray.shutdown()

    def late_failures(self) -> list[ActorFailure]:
        failures = []
        while True:
            try:
                item = self._received.get_nowait()
            except queue.Empty:
                return failures
            if isinstance(item, ActorFailure):
                failures.append(item)
