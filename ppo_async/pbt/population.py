"""Running a population: Ray Tune's `PopulationBasedTraining` over members (`member_segments`).

`run_pbt` checks the spec and the directory, connects to Ray (a private local
instance, or the cluster at ``ray_address``), checks up front that a member
fits, and runs Tune: a new population, or the one Tune recorded in
``DIR/tune`` continued (its unfinished and failed members resume from their
last checkpoints). Ctrl-C stops it (Tune saves its state) and raises
`PBTInterrupted` with the command that continues.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shlex
import signal
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.pbt.member import member_name, member_segments
from ppo_async.pbt.report import write_population_summary
from ppo_async.pbt.spec import PBT_FILE, PBTSpec, load_pbt
from ppo_async.runs.run_dir import write_atomically
from ppo_async.sweep.pools import Job, one_line_cause
from ppo_async.sweep.spec import SweepRun

TUNE_SUBDIR = "tune"  # Tune's own records: experiment state and each member's checkpoints
METRIC = "episode_return"
TIME_ATTR = "updates"


class PBTWarning(UserWarning):
    """The population does not fit at once: members take turns."""


class PBTInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the population: ``finished`` of ``total`` members done; ``command`` continues it."""

    def __init__(self, finished: int, total: int, command: str):
        super().__init__(f"population stopped: {finished} of {total} members finished; "
                         f"continue with: {command}")
        self.finished, self.total, self.command = finished, total, command


class _WithoutTunesEndLines(logging.Filter):
    """Drops what Tune logs as a Ctrl-C ends it: "Resume experiment with: Tuner.restore(...)"
    and "Trials did not complete: [...]". `PBTInterrupted` says both the project's way (the
    command that continues, which also writes the summary; the members finished)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("Tuner.restore(" in message or message.startswith("Trials did not complete"))


class ClipToRanges:
    """Tune's explore, then each ranged field put back inside its range (Tune's x0.8 / x1.2
    perturbation can step outside it). A class, so that Tune can pickle it."""

    def __init__(self, ranges: Mapping[str, tuple[float, float]]):
        self.ranges = dict(ranges)

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for field, (low, high) in self.ranges.items():
            value = min(max(config[field], low), high)
            config[field] = type(low)(value) if isinstance(low, int) and isinstance(
                high, int) else float(value)
        return config


def member_resources(config: AsyncActorLearnerConfig, cpus_per_member: float | None) -> Any:
    """What one member asks Ray for: its learner and actor threads' CPUs (``cpus_per_member``
    overrides), or, with Ray actors, a bundle for the learner and one per actor."""
    from ray import tune

    if config.actor_backend == "ray":
        actor = {"CPU": config.ray_num_cpus_per_actor, **dict(config.ray_actor_resources)}
        learner = {"CPU": cpus_per_member if cpus_per_member is not None else 1}
        return tune.PlacementGroupFactory([learner] + [actor] * config.num_actors)
    threads = Job("member", [SweepRun("member", {}, config.seed, config)], False).threads()
    return {"cpu": cpus_per_member if cpus_per_member is not None else threads}


def check_fits(pbt: PBTSpec, cluster: Mapping[str, float], cpus_per_member: float | None) -> None:
    """A member that needs more CPUs than the cluster has would wait forever: refused, saying
    what to lower. A population that does not fit at once is allowed (members take turns)."""
    config = pbt.base_config()
    if config.actor_backend == "ray":
        need = (cpus_per_member or 1) + config.num_actors * config.ray_num_cpus_per_actor
    else:
        need = member_resources(config, cpus_per_member)["cpu"]
    cpus = cluster.get("CPU", 0)
    what = (f"1 learner + {config.num_actors} actors x ray_num_cpus_per_actor="
            f"{config.ray_num_cpus_per_actor}" if config.actor_backend == "ray"
            else f"its learner, {config.num_actors} actor threads"
            + (" and the evaluator" if config.eval_every_updates else ""))
    if need > cpus:
        raise ConfigError(
            f"{pbt.source}: a member needs {need:g} CPUs ({what}), the Ray cluster has "
            f"{cpus:g}: lower num_actors in [base], or share cores with --cpus-per-member "
            f"(cpus_per_member=...)")
    at_once = int(cpus // need)
    if at_once < pbt.population:
        warnings.warn(
            f"population {pbt.population}: {at_once} of {pbt.population} members fit at once "
            f"on {cpus:g} CPUs ({need:g} each); the others wait their turn (lower the "
            "population or num_actors, or pass --cpus-per-member)", PBTWarning, stacklevel=3)


def _check_pbt_dir(pbt: PBTSpec, out: pathlib.Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r}: exists and is not a directory")
    recorded = out / PBT_FILE
    if recorded.is_file() and load_pbt(recorded).to_table() != pbt.to_table():
        raise ConfigError(f"--out {str(out)!r} holds another population ({recorded}); run this "
                          "one into another directory")


def continue_command(spec: Any, out: pathlib.Path, ray_address: str | None,
                     cpus_per_member: float | None) -> str:
    path = spec if isinstance(spec, (str, os.PathLike)) else out / PBT_FILE
    argv = ["ppo-async", "pbt", str(path), "--out", str(out)]
    argv += ["--ray-address", ray_address] if ray_address else []
    argv += ["--cpus-per-member", f"{cpus_per_member:g}"] if cpus_per_member else []
    return shlex.join(argv)


def _tuner(pbt: PBTSpec, out: pathlib.Path, cpus_per_member: float | None, progress: bool,
           hook: Callable[[str, int], None] | None) -> Any:
    """Tune's `Tuner` of the population: restored from ``DIR/tune`` when Tune recorded one."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining
    from ray.tune.search.basic_variant import BasicVariantGenerator

    config = pbt.base_config()
    trainable = tune.with_resources(
        tune.with_parameters(member_segments, table=pbt.to_table(), out=str(out), hook=hook),
        member_resources(config, cpus_per_member))
    path = out / TUNE_SUBDIR
    if tune.Tuner.can_restore(path):
        return tune.Tuner.restore(str(path), trainable, resume_unfinished=True,
                                  resume_errored=True)
    domains = {field: tune.loguniform(low, high) if low > 0 else tune.uniform(low, high)
               for field, (low, high) in pbt.ranges.items()}
    scheduler = PopulationBasedTraining(
        time_attr=TIME_ATTR, perturbation_interval=pbt.interval_updates,
        hyperparam_mutations={**{f: list(v) for f, v in pbt.sweep.grid.items()}, **domains},
        quantile_fraction=pbt.quantile_fraction, resample_probability=pbt.resample_probability,
        synch=pbt.synch, custom_explore_fn=ClipToRanges(pbt.ranges))

    def name(trial: Any) -> str:  # trial ids end in a counter: member i is the i-th trial
        return member_name(int(trial.trial_id[-5:]))

    return tune.Tuner(
        trainable,
        param_space={**{f: tune.choice(list(v)) for f, v in pbt.sweep.grid.items()}, **domains},
        tune_config=tune.TuneConfig(
            metric=METRIC, mode="max", scheduler=scheduler, num_samples=pbt.population,
            search_alg=BasicVariantGenerator(random_state=pbt.seed),
            trial_name_creator=name, trial_dirname_creator=name),
        run_config=tune.RunConfig(
            name=TUNE_SUBDIR, storage_path=str(out), stop={TIME_ATTR: config.num_updates},
            failure_config=tune.FailureConfig(max_failures=pbt.max_failures),
            verbose=1 if progress else 0))


def run_pbt(spec: str | os.PathLike | Mapping[str, Any] | PBTSpec, out: str | os.PathLike, *,
            ray_address: str | None = None, cpus_per_member: float | None = None,
            progress: bool = True,
            hook: Callable[[str, int], None] | None = None) -> list[dict[str, Any]]:
    """Train a population with Ray Tune's PBT into ``out``; a row per member (``summary.csv``).

    Args:
      spec: a PBT file (TOML, or YAML with pyyaml), its table as a dict, or a `PBTSpec`.
      out: the population directory (made if missing); the same call again continues it.
      ray_address: a Ray cluster to join (its nodes must all see ``out``); default: this
        process's Ray connection, or a private local instance.
      cpus_per_member: CPUs each member asks for (default: its learner and actor threads).
      progress: Tune's progress table.
      hook: ``hook(member_name, update)``, called in the member as each segment starts.

    Raises `ConfigError` for a bad spec, a directory of another population or a member that
    cannot fit, before anything trains; `PBTInterrupted` on Ctrl-C.
    """
    pbt = load_pbt(spec)
    out = pathlib.Path(out).resolve()
    _check_pbt_dir(pbt, out)
    try:
        import ray
        from ray import tune  # noqa: F401 - its extra's packages, checked here
    except ImportError:
        raise ConfigError("PBT runs on Ray Tune, which is not installed: pip install "
                          "'ppo-async[ray]'") from None
    from ppo_async.runtime.process_transport import inherited_cache_env
    from ppo_async.runtime.ray_transport import connect

    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / PBT_FILE, pbt.to_toml().encode())
    command = continue_command(spec, out, ray_address, cpus_per_member)
    connected_here = connect(ray, ray_address, env_vars=inherited_cache_env())
    failed: dict[str, str] = {}
    # Tune installs its own Ctrl-C handlers and leaves them behind: restored on the way out,
    # so that a later Ctrl-C in this process (a notebook, a sweep) is a KeyboardInterrupt again.
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    tune_log, end_lines = logging.getLogger("ray.tune.tune"), _WithoutTunesEndLines()
    tune_log.addFilter(end_lines)
    try:
        check_fits(pbt, ray.cluster_resources(), cpus_per_member)
        with warnings.catch_warnings():
            # Tune's advice to reuse actors: a member's segment may still be training when
            # Tune would reset it, so each restart is a fresh process (see docs/design.md).
            warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
            results = _tuner(pbt, out, cpus_per_member, progress, hook).fit()
        for result in results:
            if result.error is not None:
                failed[pathlib.Path(result.path).name] = one_line_cause(result.error)
    except KeyboardInterrupt:  # a second Ctrl-C: Tune did not finish saving
        rows = write_population_summary(pbt, out, failed)
        raise PBTInterrupted(sum(r["status"] == "done" for r in rows), len(rows),
                             command) from None
    finally:
        tune_log.removeFilter(end_lines)
        if threading.current_thread() is threading.main_thread():
            for number, handler in handlers.items():
                if handler is not None:  # None: not set from Python, nothing to restore
                    signal.signal(number, handler)
        if connected_here:
            ray.shutdown()
    rows = write_population_summary(pbt, out, failed)
    if any(r["status"] in ("stopped", "pending") for r in rows):  # Tune stopped on Ctrl-C
        raise PBTInterrupted(sum(r["status"] == "done" for r in rows), len(rows), command)
    return rows
