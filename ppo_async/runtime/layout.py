"""How a run collects experience, decided once: `Layout` and `resolve_layout`.

Six ways collect the actors' chunks: the learner's own program (jitted envs),
thread actors (each calling alone, sharing an inference thread, or driven by a
shared sampler), actor processes, env workers and Ray processes. Every field
that chooses among them and may be left to ``"auto"`` or ``None``
(``actor_backend``, ``sampler``, ``batch_inference``, ``actors_per_process``,
``env_groups``) is resolved here and nowhere else. `resolve_layout` measures
what it needs (a host env's step, whether its factory can leave the process,
the cores), applies the decision table of docs/guide/collection.md, and
returns a `Layout`; `Layout.pin` writes the decision into the config, so that
the transports, the actor processes, ``config.json`` and a resumed run all
read one concrete value. A field the user set is obeyed, never overridden.

At an exact policy lag every layout of the same calls gives the same bytes, so
``auto`` changes the speed of a run, never its result.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import numpy as np

from ppo_async.config import AsyncActorLearnerConfig, ConfigError

# Thread actors of one process share their jitted calls from this many actors on, where
# batch_inference is None (fewer are as fast calling alone; docs/guide/collection.md).
GYMNAX_SHARED_CALLS_FROM = 8
HOST_SHARED_CALLS_FROM = 16
PROBE_BUDGET_S = 0.3  # the most a probe steps the env for
PROBE_MAX_STEPS = 200


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the machine offers the run: the cores this process may use."""

    cores: int

    @classmethod
    def here(cls) -> Machine:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        return cls(len(cpus) if cpus else (os.cpu_count() or 1))


@dataclasses.dataclass(frozen=True)
class EnvProbe:
    """One host env batch stepped with random actions before the run (`probe_host_env`)."""

    step_us: float  # wall time of one env's step (a batch step over its envs)
    cpu_share: float  # the stepping thread's CPU time over the wall time: ~1 computes, ~0 waits
    steps: int  # batch steps timed
    seconds: float  # what the probe cost, the env's construction included


@dataclasses.dataclass(frozen=True)
class Layout:
    """How this run collects experience; every value concrete (`resolve_layout`)."""

    collection: str  # "learner" | "threads" | "processes" | "ray"
    sampler: str  # "learner" | "actors" | "shared"
    batch_inference: bool  # a process's thread actors share their jitted calls
    jitted_env: bool  # gymnax: the env steps inside a jitted rollout
    num_actors: int
    envs_per_actor: int
    actors_per_process: int  # processes: the config's in force; threads: all; ray: 1
    env_workers: int  # per actor (host envs stepped in worker processes); 0: in the actor
    env_groups: int  # per actor
    exact_lag: int | None  # None: free-running actors
    cores: int
    reason: str  # why this layout, in a few words
    probe: EnvProbe | None = None  # measured where auto needed it

    @property
    def num_processes(self) -> int:
        """Actor processes (0 where the actors run in the learner's process)."""
        if self.collection not in ("processes", "ray"):
            return 0
        return math.ceil(self.num_actors / self.actors_per_process)

    def pin(self, config: AsyncActorLearnerConfig) -> AsyncActorLearnerConfig:
        """``config`` with every layout field set to this layout's value."""
        fields: dict[str, Any] = dict(
            actor_backend="threads" if self.collection == "learner" else self.collection,
            sampler=self.sampler, batch_inference=self.batch_inference)
        if self.collection == "processes":
            fields["actors_per_process"] = self.actors_per_process
        if self.env_workers or config.env_groups is not None or self.env_groups != 1:
            fields["env_groups"] = self.env_groups
        return dataclasses.replace(config, **fields)

    def describe(self) -> str:
        """One line: what runs where, and why."""
        lag = "free-running" if self.exact_lag is None else f"exact lag {self.exact_lag}"
        envs = f"{self.envs_per_actor} env{'s' if self.envs_per_actor != 1 else ''}"
        if self.collection == "learner":
            where = f"the learner's program collects {self.num_actors} x {envs}"
        elif self.collection == "threads":
            where = f"{self.num_actors} thread actor{'s' if self.num_actors != 1 else ''} x {envs}"
        else:
            kind = "Ray" if self.collection == "ray" else "actor"
            where = (f"{self.num_processes} {kind} process{'es' if self.num_processes != 1 else ''}"
                     f" x {self.actors_per_process} actor"
                     f"{'s' if self.actors_per_process != 1 else ''} x {envs}")
        extras = []
        if self.sampler == "shared":
            extras.append("chunks collected from one thread" if self.jitted_env
                          else "shared sampler")
        elif self.batch_inference and self.collection != "learner":
            extras.append("shared policy calls")
        if self.env_workers:
            extras.append(f"{self.env_workers} env workers x {self.env_groups} groups")
        return f"{', '.join([where, *extras, lag])} ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``summary.json`` and the report."""
        return dataclasses.asdict(self) | {"num_processes": self.num_processes}


# --------------------------------------------------------------------------
# The rules, each applied by resolve_layout (and by a transport built directly
# from a config, as tests and benchmarks do).
# --------------------------------------------------------------------------


def is_jitted_env(config: AsyncActorLearnerConfig) -> bool:
    """Gymnax ids: the env steps inside a jitted rollout; the rest step on the host."""
    from ppo_async.envs.registry import GYMNAX, split_env_id

    return split_env_id(config.env_id)[0] == GYMNAX


def steps_in_workers(config: AsyncActorLearnerConfig) -> bool:
    """gymnasium: and host: ids may step their envs in env worker processes."""
    from ppo_async.envs.registry import GYMNASIUM, HOST, split_env_id

    return split_env_id(config.env_id)[0] in (GYMNASIUM, HOST)


def env_workers_and_groups(config: AsyncActorLearnerConfig) -> tuple[int, int]:
    """``(env workers, env groups)`` of each actor: ``env_groups`` None is 2 beside env
    workers when ``envs_per_actor`` is even, else 1; ``(0, 1)`` where envs cannot have workers."""
    if not steps_in_workers(config):
        return 0, 1
    workers = config.env_workers
    return workers, config.env_groups or (2 if workers and config.envs_per_actor % 2 == 0 else 1)


def actors_per_process(config: AsyncActorLearnerConfig, cores: int | None = None) -> int:
    """``actors_per_process`` in force: None is one process per core, ceil(actors / cores)."""
    if config.actors_per_process is not None:
        return min(config.actors_per_process, config.num_actors)
    return math.ceil(config.num_actors / (cores or Machine.here().cores))


def shares_calls(config: AsyncActorLearnerConfig, num_actors: int) -> bool:
    """Whether ``num_actors`` thread actors of one process share their jitted calls."""
    if num_actors == 1 or config.batch_inference is False:
        return False
    if config.batch_inference is None:
        return num_actors >= (GYMNAX_SHARED_CALLS_FROM if is_jitted_env(config)
                              else HOST_SHARED_CALLS_FROM)
    return True


def uses_shared_sampler(config: AsyncActorLearnerConfig, num_actors: int) -> bool:
    """Whether one sampler thread steps the host envs of ``num_actors`` actors of a process in
    lock-step: ``sampler='shared'``, or None where they share calls by default."""
    if is_jitted_env(config) or config.sampler in ("actors", "learner"):
        return False
    if config.sampler == "shared":
        return True
    return num_actors >= HOST_SHARED_CALLS_FROM and shares_calls(config, num_actors)


def collects_as_group(config: AsyncActorLearnerConfig) -> bool:
    """Whether thread actors of a jitted env are collected from one thread (`ActorGroup`):
    ``sampler='shared'``, or None and several actors."""
    if not is_jitted_env(config) or config.sampler in ("actors", "learner"):
        return False
    return config.sampler == "shared" or config.num_actors > 1


def rolls_out_together(config: AsyncActorLearnerConfig) -> bool:
    """Whether the learner's program collects every actor's chunk as one rollout of all their
    envs (the bits of thread actors with shared calls), or each actor's in turn."""
    return config.num_actors > 1 and config.batch_inference is not False


def collects_in_learner(config: AsyncActorLearnerConfig, *, learner_program: bool = True) -> bool:
    """Whether the learner's program collects the chunks: ``sampler='learner'``, or None where
    it can: a jitted env (``learner_program``: its own rollout, not a replaced one), thread
    actors, an exact lag, ``broadcast_every=1`` and one learner device, the actors' own."""
    if config.sampler != "auto" or not learner_program or not is_jitted_env(config):
        return config.sampler == "learner"
    if (config.actor_backend not in ("threads", "auto") or config.exact_lag is None
            or config.broadcast_every != 1 or config.actors_per_process is not None):
        return False
    from ppo_async.core.devices import resolve_device

    return config.learner_placement().devices == (resolve_device(config.actor_device),)


# --------------------------------------------------------------------------
# Measuring the env.
# --------------------------------------------------------------------------


def _random_actions(space: Any, num_envs: int, rng: np.random.Generator) -> np.ndarray:
    if hasattr(space, "n"):
        return rng.integers(0, int(space.n), size=num_envs).astype(np.int32)
    shape = (num_envs, *tuple(space.shape))
    low = np.broadcast_to(np.asarray(getattr(space, "low", -1.0), np.float32), shape)
    high = np.broadcast_to(np.asarray(getattr(space, "high", 1.0), np.float32), shape)
    low, high = np.where(np.isfinite(low), low, -1.0), np.where(np.isfinite(high), high, 1.0)
    return rng.uniform(low, high).astype(np.float32)


def probe_host_env(config: AsyncActorLearnerConfig, budget_s: float = PROBE_BUDGET_S) -> EnvProbe:
    """Step one actor's batch of the run's host env with random actions for up to ``budget_s``
    (and `PROBE_MAX_STEPS` steps): its wall time per env step and the share of it the
    stepping thread spent on a CPU."""
    from ppo_async.envs.host import close_envs, make_host_env

    start = time.perf_counter()
    envs = make_host_env(config.env_id, config.envs_per_actor, **config.env_make_kwargs())
    try:
        rng = np.random.default_rng(config.seed)
        envs.reset(config.seed)
        envs.step(_random_actions(envs.action_space, config.envs_per_actor, rng))  # warm
        walls, cpu = [], 0.0
        deadline = time.perf_counter() + budget_s
        while len(walls) < PROBE_MAX_STEPS and time.perf_counter() < deadline:
            actions = _random_actions(envs.action_space, config.envs_per_actor, rng)
            wall_0, cpu_0 = time.perf_counter(), time.thread_time()
            envs.step(actions)
            cpu += time.thread_time() - cpu_0
            walls.append(time.perf_counter() - wall_0)
    finally:
        close_envs(envs)
    # The median: a step the OS preempted (another process's turn on the core) is not the env's.
    return EnvProbe(step_us=1e6 * float(np.median(walls)) / config.envs_per_actor,
                    cpu_share=min(1.0, cpu / sum(walls)) if sum(walls) > 0 else 1.0,
                    steps=len(walls), seconds=time.perf_counter() - start)


def sendable(config: AsyncActorLearnerConfig, *, load_back: bool = True) -> str | None:
    """Why the env's factory cannot be sent to another process (None: it can). Without
    ``load_back`` only its pickling is checked: loading it back here would change the
    classes of a factory that then runs in this process (`sendable_payload`)."""
    from ppo_async.envs.payload import sendable_payload

    why = sendable_payload(config.env_id, load_back=load_back)[1]
    return None if why is None else f"{config.env_id}'s factory cannot be sent to another process ({why})"


# --------------------------------------------------------------------------
# The decision.
# --------------------------------------------------------------------------


def _host_backend(config: AsyncActorLearnerConfig, machine: Machine,
                  probe: EnvProbe | None) -> tuple[str, str, EnvProbe | None]:
    """``(backend, reason, probe)`` for a host env with ``actor_backend='auto'``: actor
    processes wherever they can run. On 2 cores every host env measured, from one whose
    step is free to MuJoCo, ran 1.5-3x the env steps/s in processes that it ran in thread
    actors (docs/benchmarks.md), so the env's step (`probe_host_env`) is measured and
    shown, and the choice does not depend on it: a run's layout, and so its bits, does
    not vary with the machine's load."""
    if machine.cores < 2:
        return "threads", "1 core", probe
    if config.actor_device.split(":")[0] != "cpu":
        return "threads", f"actor_device={config.actor_device!r}", probe
    if config.env_workers:
        return "threads", "env workers step the envs", probe
    if sendable(config, load_back=False) is not None:
        return "threads", "the env's factory cannot leave this process", probe
    probe = probe or probe_host_env(config)
    return "processes", (f"host env: env step {probe.step_us:.0f} us, "
                         f"{100 * probe.cpu_share:.0f}% on a CPU; {machine.cores} cores"), probe


def _backend(config: AsyncActorLearnerConfig, machine: Machine,
             probe: EnvProbe | None) -> tuple[str, str, EnvProbe | None]:
    """``(actor backend, reason, probe)``: the config's, or what ``'auto'`` chooses; a set
    backend (or actors_per_process, which asks for processes) that cannot work is refused."""
    jitted = is_jitted_env(config)
    backend = config.actor_backend
    if backend == "processes" or (backend == "auto" and config.actors_per_process is not None):
        why = None if jitted else sendable(config)
        if why is not None:
            raise ConfigError(f"actor_backend={config.actor_backend!r}: {why}; define the "
                              "factory in an importable module, or use actor_backend='threads'")
        return "processes", "as configured", None
    if backend != "auto":
        return backend, "as configured", None
    if config.ray_address is not None:
        return "ray", "ray_address is set", None
    if jitted:
        return "threads", "jitted env: its rollouts leave the GIL free", None
    return _host_backend(config, machine, probe)


def _check_workers_and_learner(config: AsyncActorLearnerConfig, learner_program: bool) -> None:
    """Refuse env workers whose factory cannot travel, and a ``sampler='learner'`` that cannot run."""
    if config.env_workers and steps_in_workers(config):
        from ppo_async.envs.workers import portable_factory

        why = portable_factory(config.env_id)[1]
        if why is not None:
            raise ConfigError(f"env_workers={config.env_workers}: {config.env_id}: {why}; "
                              "define the factory in an importable module, or set env_workers=0")
    workers, groups = env_workers_and_groups(config)
    if config.envs_per_actor % groups or config.envs_per_actor // groups < workers:
        raise ConfigError(
            f"env_workers={workers}: {groups} groups of {workers} env workers need "
            f"envs_per_actor ({config.envs_per_actor}) divisible by {groups} with at least "
            f"{workers} envs per group (one per worker); set env_groups or lower env_workers")
    if config.sampler == "learner" and not learner_program:
        raise ConfigError("sampler='learner': this env's rollout was replaced, so the "
                          "learner's program cannot collect it; use sampler='auto'")
    if config.sampler == "learner" and config.learner_placement().mesh is not None:
        raise ConfigError(
            f"sampler='learner' with learner_device={config.learner_device!r}: the actors' "
            "chunks run in the program of one learner device; name one device, or use "
            "sampler='auto'")


def resolve_layout(config: AsyncActorLearnerConfig, machine: Machine | None = None, *,
                   learner_program: bool = True, probe: EnvProbe | None = None) -> Layout:
    """The run's `Layout`: every auto field of ``config`` decided, every set one obeyed.

    ``actor_backend='auto'`` is never Ray (unless ``ray_address`` is set): a jitted env
    runs in the learner's program where it can (`collects_in_learner`), else in thread
    actors; a host env runs in actor processes where its factory can be sent, there are 2
    cores or more, the actors act on the CPU and no env workers are asked for, else in
    thread actors (its step is measured for the line, `probe_host_env`, unless ``probe``
    is given). ``learner_program`` False: the
    env's rollout was replaced, so the learner's program cannot collect it. Raises
    `ConfigError` for a set field that cannot work with this env or machine.
    """
    machine = machine or Machine.here()
    _check_workers_and_learner(config, learner_program)
    backend, reason, measured = _backend(config, machine, probe)
    decided = dataclasses.replace(config, actor_backend=backend)
    jitted = is_jitted_env(config)
    per_process = {"processes": actors_per_process(decided, machine.cores),
                   "ray": 1}.get(backend, config.num_actors)
    if collects_in_learner(decided, learner_program=learner_program):
        collection, sampler, batch = "learner", "learner", rolls_out_together(decided)
        if config.sampler == "auto":
            reason = "jitted env, exact lag, one device: the learner's program collects the chunks"
    else:
        collection = backend
        if backend == "ray":  # a Ray actor process runs one actor
            sampler, batch = "actors", False
        elif jitted:
            sampler = "shared" if backend == "threads" and collects_as_group(decided) else "actors"
            batch = shares_calls(decided, per_process)
        else:
            sampler = "shared" if uses_shared_sampler(decided, per_process) else "actors"
            batch = shares_calls(decided, per_process)
    workers, groups = env_workers_and_groups(config)
    return Layout(collection=collection, sampler=sampler, batch_inference=batch,
                  jitted_env=jitted, num_actors=config.num_actors,
                  envs_per_actor=config.envs_per_actor, actors_per_process=per_process,
                  env_workers=workers, env_groups=groups, exact_lag=config.exact_lag,
                  cores=machine.cores, reason=reason, probe=measured)
