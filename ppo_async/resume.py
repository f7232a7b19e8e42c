"""Checkpoints of a run: what one holds, when one is written, resuming from one, and loading a run.

This module sits above `ppo_async.runs` (which only reads and writes files):
it builds the templates a checkpoint decodes into from the update, the env
programs and the learner's report.

A checkpoint (`ppo_async.runs.checkpoint` writes the file) holds

- the `LearnerState` (params, optimizer state, shuffling key);
- each actor's env carry after its last consumed chunk (gymnax envs; host
  envs hold live simulators, and their actors start fresh episodes);
- the counters of the `LearnerReport` (updates, env steps, episodes, the
  policy-lag histogram) and its last 100 episode returns;
- the learning-rate schedule in force (`LearningRateSchedule`), so that a
  resumed run continues it instead of restarting it;
- the run's config.

Resuming continues the same run: the newest checkpoint that passes every
check (`validate_checkpoint`: a damaged or malformed one is skipped with a
warning, like a truncated file) gives the state and counters; a changed
``num_actors`` or ``envs_per_actor`` is allowed and starts fresh episodes for
the actors whose envs no longer fit (with a warning).

The learning rate: resumed with its own budget and ``learning_rate``, a run
keeps its schedule exactly (a lock-step resume is byte-identical to an
uninterrupted run). A new budget or ``learning_rate`` re-plans the linear
schedule as if the run had been planned so from the start: from
``learning_rate`` at optimizer step 0 to 0 at the new last step, so that the
rate at the resume point is ``learning_rate * (1 - steps_done / new_total)``
(`ppo_async.core.update.continue_schedule`; extending a finished run does not
continue from its final rate of 0). Steps are optimizer steps: ``new_total`` is
those taken so far plus the updates left times the resuming config's
``num_epochs * num_minibatches``. ``anneal_lr`` may be switched: off, the rate
is the constant ``learning_rate``; on, the re-planned schedule (the optimizer
state gains or drops the schedule's step counter; Adam's moments carry over).
A rate at the resume point that differs from the saved run's is logged as one
warning line, from X to Y.

Loading a run (``ppo-async eval`` and ``enjoy``, notebooks): `load_run` gives
the config a run directory was trained with (`load_run_config`) and its final
params, or those of its newest valid checkpoint when it did not finish
(`load_run_params`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
import sys
import time
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np

from ppo_async.config import (
    AsyncActorLearnerConfig,
    ConfigError,
    fields_from_json,
    resolve_exact_lag,
)
from ppo_async.core.update import (
    LearnerState,
    LearningRateSchedule,
    continue_schedule,
    init_learner_state,
    optimizer_steps_per_update,
)
from ppo_async.envs.backends import make_actor_program
from ppo_async.envs.gymnax_env import EnvCarry
from ppo_async.envs.program import ActorProgram
from ppo_async.runs.checkpoint import LoadedCheckpoint, load_latest_checkpoint
from ppo_async.runtime.learner import RECENT_EPISODES, LearnerReport
from ppo_async.version import __version__

logger = logging.getLogger(__name__)


class TopologyChangeWarning(UserWarning):
    """A run resumed with another ``num_actors`` or ``envs_per_actor``: some actors start fresh episodes."""


class ResumePoint(NamedTuple):
    """Where a resumed run continues from."""

    state: LearnerState  # host arrays
    report: LearnerReport  # the counters so far
    actor_carries: tuple  # one per actor of the resuming config: its env carry, or None (fresh episodes)
    schedule: LearningRateSchedule  # the learning-rate schedule the resumed run follows
    end_update: int  # the update the resumed run ends at
    path: pathlib.Path  # the checkpoint file
    # exact_policy_lag: (version, params) of the versions before the checkpoint's that
    # the actors may still need, oldest first (empty for a free-running run's checkpoint)
    params_history: tuple = ()


def params_history_size(config: AsyncActorLearnerConfig | dict[str, Any]) -> int:
    """How many params versions before its own a checkpoint keeps (``exact_policy_lag`` only).

    After update ``U`` an exact-lag actor's next chunk needs version
    `ppo_async.runtime.actor.exact_version` ``(U, lag, broadcast_every)``, at
    least ``U - lag - broadcast_every + 1``: the checkpoint keeps the versions
    from there up to ``U - 1`` (the learner's own params are version ``U``).
    ``config`` may be a saved config's dict.
    """
    get = config.get if isinstance(config, dict) else (lambda name: getattr(config, name))
    lag = resolve_exact_lag(get("exact_policy_lag"), get("max_lead_steps"))
    every = get("broadcast_every")
    if not (isinstance(lag, int) and isinstance(every, int)):
        return 0
    return max(0, lag + every - 1)


def checkpoint_contents(
    state: LearnerState, report: LearnerReport, carries: list[Any],
    schedule: LearningRateSchedule, params_history: list[tuple[int, Any]] = (),
) -> tuple[dict[str, Any], dict[str, int]]:
    """(state pytree, integer counters) of one checkpoint.

    ``params_history``: (version, params) of the earlier versions an exact-lag
    run's actors may still need (`params_history_size` of them; padded at the
    front with the oldest when the run is younger).
    """
    recent = np.full(RECENT_EPISODES, np.nan, np.float32)
    recent[: len(report.recent_returns)] = report.recent_returns
    resumable = all(isinstance(carry, EnvCarry) for carry in carries)
    tree = {
        "learner": state,
        # Host-env carries hold live simulator objects; those actors restart their envs.
        "actor_carries": tuple(carries) if resumable else (),
        "recent_returns": recent,
        "lr_begin_value": np.float64(schedule.begin_value),
    }
    if params_history:
        tree["params_history"] = {
            "versions": np.array([version for version, _ in params_history], np.int64),
            "params": tuple(params for _, params in params_history),
        }
    counters = {
        "updates": report.updates,
        "env_steps": report.env_steps,
        "episodes": report.episodes,
        "recent_count": len(report.recent_returns),
        "lr_begin_step": schedule.begin_step,
        "lr_end_step": schedule.end_step,
        **{f"lag_{lag}": count for lag, count in report.policy_lag_counts.items()},
    }
    return tree, counters


_REQUIRED_COUNTERS = ("updates", "env_steps", "episodes", "recent_count",
                      "lr_begin_step", "lr_end_step")


def validate_checkpoint(loaded: LoadedCheckpoint) -> None:
    """Raise ValueError naming the first value of ``loaded`` that cannot be right."""
    counters = loaded.counters
    for name in _REQUIRED_COUNTERS:
        if name not in counters:
            raise ValueError(f"counter {name!r} is missing")
    for name in counters:
        if name not in _REQUIRED_COUNTERS and not (
            name.startswith("lag_") and name[4:].isdigit()
        ):
            raise ValueError(f"unknown counter {name!r}")
    if counters["updates"] != loaded.step:
        raise ValueError(f"counter updates={counters['updates']} but the file is of step {loaded.step}")
    if counters["recent_count"] > RECENT_EPISODES or counters["recent_count"] > counters["episodes"]:
        raise ValueError(
            f"recent_count={counters['recent_count']} exceeds {RECENT_EPISODES} or the "
            f"episodes counted ({counters['episodes']})"
        )
    if counters["env_steps"] < counters["updates"]:
        raise ValueError(
            f"env_steps={counters['env_steps']} is below updates={counters['updates']}"
        )
    chunks = sum(count for name, count in counters.items() if name.startswith("lag_"))
    if counters["updates"] > 0 and chunks < counters["updates"]:
        raise ValueError(f"the lag histogram counts {chunks} chunks for {counters['updates']} updates")
    if not counters["lr_begin_step"] <= counters["lr_end_step"]:
        raise ValueError(
            f"learning-rate schedule begins at step {counters['lr_begin_step']}, after its end "
            f"{counters['lr_end_step']}"
        )
    begin_value = float(np.asarray(loaded.state["lr_begin_value"]))
    if not (math.isfinite(begin_value) and begin_value >= 0):
        raise ValueError(f"learning rate {begin_value} is not a finite number >= 0")
    recent = np.asarray(loaded.state["recent_returns"])[: counters["recent_count"]]
    if not np.all(np.isfinite(recent)):
        raise ValueError("a recent episode return is not finite")
    for leaf in jax.tree.leaves(loaded.state["learner"].params):
        if not np.all(np.isfinite(leaf)):
            raise ValueError("the params contain NaN or inf")


def _carries_template(config: AsyncActorLearnerConfig, program: ActorProgram,
                      saved: dict[str, Any]) -> tuple:
    """Env carries shaped as the saved run's actors had them (``()`` for host envs)."""
    if program.chunk_spec is None:
        # Host envs: their carries (live simulators, env worker processes) are not
        # saved, and a reset here would start envs and workers that nothing closes.
        return ()
    cpu = jax.devices("cpu")[0]
    if not isinstance(program.reset(jax.random.key(0), cpu), EnvCarry):
        return ()
    num_actors, envs_per_actor = saved.get("num_actors"), saved.get("envs_per_actor")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
               for n in (num_actors, envs_per_actor)):
        raise ValueError(
            f"saved config has num_actors={num_actors!r}, envs_per_actor={envs_per_actor!r}"
        )
    if envs_per_actor != config.envs_per_actor:
        # A carry template of the saved width: only its shapes matter.
        saved_config = dataclasses.replace(
            config, num_actors=num_actors, envs_per_actor=envs_per_actor, num_minibatches=1,
            total_env_steps=max(config.total_env_steps,
                                num_actors * envs_per_actor * config.num_steps),
        )
        program = make_actor_program(saved_config)
    return tuple(program.reset(jax.random.key(i), cpu) for i in range(num_actors))


def load_newest_checkpoint(
    config: AsyncActorLearnerConfig, program: ActorProgram, checkpoints: pathlib.Path,
) -> LoadedCheckpoint:
    """The newest checkpoint in ``checkpoints`` that decodes, fits and passes `validate_checkpoint`.

    Raises `ConfigError` when there is none or ``config`` changes a locked
    field; `ppo_async.runs.checkpoint.CheckpointError` when every file is damaged.
    """
    params_template = program.params_template

    def template(saved: dict[str, Any]) -> dict[str, Any]:
        # The optimizer state is shaped by the saved anneal_lr (load_resume_point switches it).
        saved_config = dataclasses.replace(config, anneal_lr=_saved_anneal_lr(saved, config))
        return {
            "learner": init_learner_state(saved_config.update_options(), params_template,
                                          jax.random.key(0)),
            "actor_carries": _carries_template(config, program, saved),
            "recent_returns": np.zeros(RECENT_EPISODES, np.float32),
            "lr_begin_value": np.float64(0.0),
            **_history_template(saved, params_template),
        }

    loaded = load_latest_checkpoint(
        checkpoints, template, config_dict=config.to_dict(), validate=validate_checkpoint
    )
    if loaded is None:
        raise ConfigError(
            f"run directory {checkpoints.parent}: no checkpoint in {checkpoints}, so there "
            "is nothing to resume (ppo-async train --resume, train(resume_from=...)) or evaluate"
        )
    return loaded


def _history_template(saved: dict[str, Any], params_template: Any) -> dict[str, Any]:
    size = params_history_size(saved)
    if not size:
        return {}
    return {"params_history": {"versions": np.zeros(size, np.int64),
                               "params": (params_template,) * size}}


def _params_history(loaded: LoadedCheckpoint) -> tuple[tuple[int, Any], ...]:
    """The saved (version, params) before the checkpoint's own, each version once, oldest first."""
    saved = loaded.state.get("params_history")
    if saved is None:
        return ()
    history = dict(zip((int(v) for v in saved["versions"]), saved["params"], strict=True))
    return tuple(sorted(history.items(), key=lambda item: item[0]))


def load_resume_point(
    config: AsyncActorLearnerConfig, program: ActorProgram, checkpoints: pathlib.Path,
) -> ResumePoint:
    """The newest valid checkpoint in ``checkpoints``, fitted to ``config``.

    Raises `ConfigError` when there is none, when ``config`` changes a locked
    field (`ppo_async.runs.checkpoint.RESUME_LOCKED_FIELDS`), or when its budget
    is already spent; `ppo_async.runs.checkpoint.CheckpointError` when every file
    is damaged.
    """
    loaded = load_newest_checkpoint(config, program, checkpoints)
    counters = loaded.counters
    report = LearnerReport(
        updates=counters["updates"], env_steps=counters["env_steps"],
        episodes=counters["episodes"],
        policy_lag_counts={
            int(name[4:]): count for name, count in counters.items() if name.startswith("lag_")
        },
        recent_returns=loaded.state["recent_returns"][: counters["recent_count"]].tolist(),
    )
    report.refresh_summaries()
    # The budget counts env steps; the batch may have changed size since.
    remaining = max(0, config.total_env_steps - report.env_steps) // config.batch_size
    if remaining == 0:
        raise ConfigError(
            f"total_env_steps={config.total_env_steps}: the checkpoint {loaded.path.name} is "
            f"at update {report.updates} ({report.env_steps} env steps), which leaves no "
            f"whole batch of {config.batch_size}. Pass a larger total_env_steps "
            "(--total-env-steps) to extend the run."
        )

    saved_schedule = LearningRateSchedule(
        counters["lr_begin_step"], float(loaded.state["lr_begin_value"]), counters["lr_end_step"]
    )
    state = loaded.state["learner"]
    optimizer_steps = _optimizer_steps(state.opt_state)
    saved = _SavedRate.of(loaded.config, config, saved_schedule)
    schedule = continue_schedule(
        saved_schedule,
        optimizer_steps + remaining * optimizer_steps_per_update(config.update_options()),
        config.learning_rate, saved.learning_rate,
    )
    _report_rate_change(config, saved, schedule, optimizer_steps)
    if saved.anneal_lr != config.anneal_lr:
        state = _switch_anneal_lr(config, state, optimizer_steps)
    carries = _fit_carries(config, loaded.config, tuple(loaded.state["actor_carries"]))
    logger.info("resuming from %s (update %d)", loaded.path, report.updates)
    return ResumePoint(state, report, carries, schedule,
                       report.updates + remaining, loaded.path, _params_history(loaded))


def _saved_anneal_lr(saved: dict[str, Any], config: AsyncActorLearnerConfig) -> bool:
    """The checkpointed run's ``anneal_lr`` (``config``'s where the saved config lacks it)."""
    anneal_lr = saved.get("anneal_lr", config.anneal_lr)
    return anneal_lr if isinstance(anneal_lr, bool) else config.anneal_lr


class _SavedRate(NamedTuple):
    """How the checkpointed run set its learning rate."""

    anneal_lr: bool
    learning_rate: float
    schedule: LearningRateSchedule

    @classmethod
    def of(cls, saved: dict[str, Any], config: AsyncActorLearnerConfig,
           schedule: LearningRateSchedule) -> _SavedRate:
        learning_rate = saved.get("learning_rate", config.learning_rate)
        return cls(_saved_anneal_lr(saved, config),
                   float(learning_rate) if isinstance(learning_rate, (int, float))
                   else config.learning_rate, schedule)

    def at(self, step: int) -> float:
        return float(self.schedule(step)) if self.anneal_lr else self.learning_rate


def _report_rate_change(config: AsyncActorLearnerConfig, saved: _SavedRate,
                        schedule: LearningRateSchedule, optimizer_steps: int) -> None:
    """One line when the resumed run's rate at the resume point differs from the saved run's."""
    before = saved.at(optimizer_steps)
    after = float(schedule(optimizer_steps)) if config.anneal_lr else config.learning_rate
    if before == after:
        return
    how = (f"re-planned as if the run had been planned for this budget from the start: "
           f"linear from learning_rate={config.learning_rate:.3g} at optimizer step 0 to 0 at "
           f"step {schedule.end_step}" if config.anneal_lr else "anneal_lr=False: constant")
    # A warning, so that it shows without any logging set up: it changes what the run trains.
    logger.warning("resuming at optimizer step %d: the learning rate changes from %.3g to "
                   "%.3g (%s)", optimizer_steps, before, after, how)


def _switch_anneal_lr(config: AsyncActorLearnerConfig, state: LearnerState,
                      optimizer_steps: int) -> LearnerState:
    """``state`` with the optimizer state of ``config.anneal_lr`` (the schedule adds a step
    counter, or drops it); Adam's moments and step count carry over."""
    import optax

    fresh = init_learner_state(config.update_options(), state.params, state.key).opt_state
    count = np.asarray(optimizer_steps, np.int32)
    opt_state = optax.tree_utils.tree_set(
        fresh, mu=optax.tree_utils.tree_get(state.opt_state, "mu"),
        nu=optax.tree_utils.tree_get(state.opt_state, "nu"), count=count,
    )
    return state._replace(opt_state=jax.device_get(opt_state))


def _optimizer_steps(opt_state: Any) -> int:
    """The optimizer steps taken so far (the schedule's step counter)."""
    import optax

    counts = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    if not counts:
        raise ValueError("the optimizer state has no step counter")
    return int(np.asarray(counts[-1][1]))


def _fit_carries(config: AsyncActorLearnerConfig, saved: dict[str, Any], carries: tuple) -> tuple:
    """One carry (or None: fresh episodes) per actor of ``config``."""
    fitted = [None] * config.num_actors
    if carries and saved.get("envs_per_actor") == config.envs_per_actor:
        for actor_id in range(min(len(carries), config.num_actors)):
            fitted[actor_id] = carries[actor_id]
    saved_topology = (saved.get("num_actors"), saved.get("envs_per_actor"))
    if saved_topology != (config.num_actors, config.envs_per_actor):
        fresh = [i for i, carry in enumerate(fitted) if carry is None]
        message = (
            f"resuming with num_actors={config.num_actors}, envs_per_actor="
            f"{config.envs_per_actor} (the checkpoint has {saved_topology[0]} x "
            f"{saved_topology[1]}): actors {fresh} start fresh episodes; the params, "
            "optimizer state and counters carry over"
        )
        logger.warning(message)
        warnings.warn(message, TopologyChangeWarning, stacklevel=3)
    return tuple(fitted)


class CheckpointPolicy:
    """When to write a checkpoint: every ``every_updates`` updates, or once
    ``every_s`` seconds have passed since the last one, whichever comes first
    (0 turns either off)."""

    def __init__(self, every_updates: int, every_s: float):
        self.every_updates = every_updates
        self.every_s = every_s
        self.last_saved_at = time.monotonic()
        self.last_saved_update: int | None = None

    def due(self, updates: int) -> bool:
        if self.every_updates and updates % self.every_updates == 0:
            return True
        return bool(self.every_s) and time.monotonic() - self.last_saved_at >= self.every_s

    def saved(self, updates: int) -> None:
        self.last_saved_at = time.monotonic()
        self.last_saved_update = updates


# --- loading a run ------------------------------------------------------------------------


class LoadedRun(NamedTuple):
    """A run directory's config and the params it ended with (`load_run`)."""

    config: AsyncActorLearnerConfig
    params: Any  # the policy's params pytree (host arrays)


def load_run_config(run_dir: str | pathlib.Path) -> AsyncActorLearnerConfig:
    """The config a run directory was trained with (its ``config.json``).

    Fields this version does not know (the run was written by another
    version) are left out with a one-line warning on stderr: the run stays
    usable, and the warning says what was not applied.
    """
    from ppo_async.runs.run_dir import CONFIG_FILE, read_config_fields

    if not pathlib.Path(run_dir).is_dir():
        what = "is not a directory" if pathlib.Path(run_dir).exists() else "no such directory"
        raise ConfigError(f"run_dir={str(run_dir)!r}: {what}; give a run directory that "
                          "ppo-async train wrote (runs/<env>-<time>)")
    fields = read_config_fields(run_dir)
    if fields is None:
        runs = sorted(p.name for p in pathlib.Path(run_dir).iterdir() if (p / CONFIG_FILE).is_file())
        if runs:  # a sweep's or a population's directory
            raise ConfigError(
                f"run_dir={str(run_dir)!r} is not a run but holds "
                f"{len(runs)} run director{'y' if len(runs) == 1 else 'ies'} (a sweep's or a "
                f"population's); name one, e.g. "
                f"{str(pathlib.Path(run_dir) / runs[0])!r}")
        raise ConfigError(f"run_dir={str(run_dir)!r}: no {CONFIG_FILE} there; is it a run directory?")
    known = {f.name for f in dataclasses.fields(AsyncActorLearnerConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        print(f"ppo-async: warning: {pathlib.Path(run_dir) / CONFIG_FILE}: ignoring "
              f"{', '.join(unknown)}, not config fields of ppo-async {__version__} "
              "(written by another version?)", file=sys.stderr)
    fields = fields_from_json({k: v for k, v in fields.items() if k in known})
    if isinstance(fields.get("exact_policy_lag"), int):
        # The lead an exact lag implies (older config.json files hold it resolved):
        # derived again, so that flags may change the sizes.
        fields.pop("max_lead_steps", None)
    try:
        return AsyncActorLearnerConfig(**fields)
    except (ConfigError, TypeError) as error:  # named as a TOML config file's error is
        raise ConfigError(f"{pathlib.Path(run_dir) / CONFIG_FILE}: {error}") from None


def load_run_params(run_dir: str | pathlib.Path, config: AsyncActorLearnerConfig) -> Any:
    """A run's final ``params.msgpack``, or the params of its newest valid checkpoint.

    A ``params.msgpack`` that does not decode or does not fit ``config``'s
    network (damaged, or copied from another run) is passed over with one
    warning line on stderr naming it, for the newest valid checkpoint's
    params; with no valid checkpoint either, `ConfigError` names the file and
    the fix.
    """
    from ppo_async.runs.checkpoint import CheckpointError, read_params
    from ppo_async.runs.run_dir import PARAMS_FILE, checkpoint_dir

    program = make_actor_program(config)
    final = pathlib.Path(run_dir) / PARAMS_FILE
    checkpoints = checkpoint_dir(pathlib.Path(run_dir))
    if not final.is_file():  # an unfinished run: the params of its newest valid checkpoint
        return load_newest_checkpoint(config, program, checkpoints).state["learner"].params
    try:
        return read_params(final, program.params_template)
    except ValueError as error:
        problem = f"{final} {error}"
    try:
        loaded = load_newest_checkpoint(config, program, checkpoints)
    except (ConfigError, CheckpointError) as error:
        raise ConfigError(
            f"{problem}, and no valid checkpoint to fall back to ({' '.join(str(error).split())}); "
            f"restore {PARAMS_FILE} from a copy, or train the run again"
        ) from None
    print(f"ppo-async: warning: {problem}; using the params of the newest valid checkpoint, "
          f"{loaded.path.name} (update {loaded.step})", file=sys.stderr)
    return loaded.state["learner"].params


def load_run(run_dir: str | pathlib.Path) -> LoadedRun:
    """A run directory's config and params: ``config, params = load_run("runs/cartpole")``.

    The params are the run's final ``params.msgpack``, or those of its newest
    valid checkpoint when it did not finish. Raises `ConfigError` for a
    directory without a ``config.json`` or without params or a checkpoint.
    (`ppo_async.runs.analysis.load_run` reads a run's metrics instead.)
    """
    config = load_run_config(run_dir)
    return LoadedRun(config, load_run_params(run_dir, config))
