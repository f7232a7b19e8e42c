"""The synchronous twin: the same kernels in one fully jitted PPO loop.

``make_train(config)`` returns a pure ``train_fn(key) -> SyncResult``:
rollout (`ppo_async.envs.gymnax_env.make_rollout`), update (`ppo_async.core.update.make_update_fn`),
repeat, all inside one ``lax.scan``. No threads, no queues, no staleness, so
it is the baseline the asynchronous runtime is compared against, and since it
is pure, ``jax.jit(jax.vmap(make_train(cfg)))(keys)`` trains many seeds at once.

The batch matches the async run's: ``num_actors * envs_per_actor`` envs of
``num_steps`` rows per update. The topology fields (valve, broadcast,
timeouts) have no meaning here and are ignored.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.core.normalization import acting_apply, wrap_params
from ppo_async.core.update import (
    Batch,
    LearnerState,
    init_learner_state,
    make_update_fn,
    with_normalization,
)
from ppo_async.envs.gymnax_env import EnvCarry, make_rollout
from ppo_async.envs.program import Trajectory
from ppo_async.envs.registry import env_backend
from ppo_async.networks.actor_critic import init_params, is_recurrent
from ppo_async.runs.compile_cache import enable_compilation_cache


class SyncResult(NamedTuple):
    params: Any  # final params (with a leading seed axis under vmap); a NormalizedPolicy with normalization
    # Each metric is [num_updates] (or [seeds, num_updates] under vmap): the
    # learner's losses plus ``episode_return_sum`` and ``episodes`` of the
    # episodes that finished in each update's rollout.
    metrics: dict[str, jax.Array]


class SyncCarry(NamedTuple):
    """What the synchronous loop carries from one update to the next."""

    learner: LearnerState
    env: EnvCarry
    # With a simulated policy lag k > 0 (None otherwise): the k params before
    # the current ones, oldest first (the initial params until k updates are
    # done), their versions, and the updates done.
    stale_params: Any = None  # every leaf [k, ...]
    stale_versions: jax.Array | None = None  # [k] int32
    updates: jax.Array | None = None  # int32


class SyncTwin(NamedTuple):
    """The twin as two pure functions, for loops that stop early (benchmarks)."""

    init: Callable[[jax.Array], SyncCarry]  # key -> carry
    step: Callable[[SyncCarry], tuple[SyncCarry, dict[str, jax.Array]]]  # one update


def make_sync_twin(
    config: AsyncActorLearnerConfig, policy_lag: int | tuple[int, ...] = 0
) -> SyncTwin:
    """``init(key)`` and ``step(carry)``: one rollout and one update per step.

    ``policy_lag`` = k > 0 simulates, deterministically, what one actor with a
    valve lead of k + 1 chunks does when the learner keeps up: the rollout for
    update u + 1 acts with the params of update max(0, u - k), so every
    batch after the first k is exactly k updates stale (``Batch.policy_lag``
    says so, for ``max_policy_lag``). The off-policy study uses it to compare
    corrections at a fixed lag, free of thread timing. A tuple of
    ``num_actors`` lags gives each actor's ``envs_per_actor`` envs their own
    (a straggler among fresh actors, say; feed-forward networks only: every
    env then acts with its own copy of the params).
    """
    lags, per_actor = _checked_lags(config, policy_lag)
    history_size = max(lags)
    # Each env's index into the history of params plus the current ones (last).
    env_index = np.repeat([history_size - k for k in lags],
                          config.envs_per_actor if per_actor else config.num_envs)
    enable_compilation_cache(config.compilation_cache_dir)  # the twin's jit compiles later
    env = env_backend(config.env_id).jitted_env(config, config.num_envs)
    if env is None:
        raise ConfigError(
            f"env_id={config.env_id!r}: the synchronous twin jits its envs and runs "
            "gymnax envs only (backends whose envs jit)"
        )
    network = config.make_network(env.observation_shape, env.action_space)
    recurrent = is_recurrent(network)
    # The actors' transforms: the same rollout acts on the same statistics.
    options = config.normalization_options()
    acting_fn = acting_apply(network.apply, options)
    if per_actor:
        acting_fn = jax.vmap(acting_fn)  # params and observations of one env each
    rollout = make_rollout(env, acting_fn, config.num_steps,
                           config.gamma, recurrent=recurrent,
                           reward_clip=options.reward_clip if options.rewards else None,
                           keep_final_obs=config.learner_bootstraps_truncation)
    # A learner_device of several devices: the update data-parallel over them,
    # as the runtime's learner runs it (`ppo_async.core.devices`).
    update = with_normalization(
        make_update_fn(config.update_options(), network, mesh=config.learner_mesh()), options)
    state_size = network.state_size if recurrent else None

    def init(key: jax.Array) -> SyncCarry:
        # The same key derivation as train(): with one actor in lock-step the
        # asynchronous runtime reproduces this loop bit for bit.
        params_key, learner_key = jax.random.split(key)
        params = wrap_params(init_params(network, params_key, env.observation_shape),
                             env.observation_shape, options)
        carry = SyncCarry(
            init_learner_state(config.update_options(), params, learner_key),
            env.reset(jax.random.fold_in(key, 0), state_size, track_return=options.rewards),
        )
        if history_size:
            carry = carry._replace(
                stale_params=jax.tree.map(
                    lambda p: jnp.broadcast_to(p, (history_size, *p.shape)), params),
                stale_versions=jnp.zeros((history_size,), jnp.int32),
                updates=jnp.zeros((), jnp.int32),
            )
        return carry

    def step(carry: SyncCarry) -> tuple[SyncCarry, dict[str, jax.Array]]:
        acting, lag = carry.learner.params, jnp.zeros((config.num_envs,), jnp.int32)
        if history_size:
            acting, lag = _stale_params(carry, env_index, per_actor)
        env_carry, trajectory, bootstrap_value = rollout(acting, carry.env)
        learner, metrics = update(carry.learner,
                                  _batch_of(trajectory, env_carry.obs, bootstrap_value, lag))
        metrics["episode_return_sum"] = jnp.sum(trajectory.episode_return)
        metrics["episodes"] = jnp.sum(trajectory.episode_length > 0)
        if not history_size:
            return SyncCarry(learner, env_carry), metrics
        return _with_history(SyncCarry(learner, env_carry), carry), metrics

    return SyncTwin(init, step)


def _checked_lags(config: AsyncActorLearnerConfig,
                  policy_lag: int | tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
    """``(lags, per_actor)`` of a `make_sync_twin` ``policy_lag``; raises for a bad one."""
    per_actor = isinstance(policy_lag, tuple)
    lags = policy_lag if per_actor else (policy_lag,)
    if not lags or not all(isinstance(k, int) and k >= 0 for k in lags) or (
        per_actor and len(lags) != config.num_actors
    ):
        raise ValueError(
            f"policy_lag={policy_lag!r}: must be an integer >= 0, or a tuple of "
            f"num_actors={config.num_actors} of them"
        )
    if per_actor and config.recurrent:
        raise ConfigError(f"network={config.network!r}: per-actor lags need a feed-forward network")
    return lags, per_actor


def _stale_params(carry: SyncCarry, env_index: np.ndarray, per_actor: bool) -> tuple[Any, jax.Array]:
    """The params each env acts with, from the history, and each env's lag ``[E]``."""
    versions = jnp.append(carry.stale_versions, carry.updates)
    lag = carry.updates - versions[env_index]
    if per_actor:  # every env its own params: [E, ...]
        acting = jax.tree.map(lambda h, p: jnp.concatenate([h, p[None]])[env_index],
                              carry.stale_params, carry.learner.params)
    else:
        acting = jax.tree.map(lambda p: p[0], carry.stale_params)
    return acting, lag


def _batch_of(trajectory: Trajectory, bootstrap_obs: jax.Array, bootstrap_value: jax.Array,
              lag: jax.Array) -> Batch:
    """One rollout as the learner's `Batch` (the runtime stacks its actors' chunks the same way)."""
    return Batch(
        obs=trajectory.obs,
        action=trajectory.action,
        reward=trajectory.reward,
        done=trajectory.done,
        behaviour_logp=trajectory.behaviour_logp,
        behaviour_value=trajectory.behaviour_value,
        bootstrap_obs=bootstrap_obs,
        bootstrap_value=bootstrap_value,
        reset=trajectory.reset,
        initial_hidden=None if trajectory.hidden is None else trajectory.hidden[0],
        policy_lag=lag,
        truncated=None if trajectory.final_obs is None else trajectory.truncated,
        final_obs=trajectory.final_obs,
        discounted_return=trajectory.discounted_return,
    )


def _with_history(new: SyncCarry, old: SyncCarry) -> SyncCarry:
    """``new`` with the params ``old`` started its update from (version ``updates``) in the history.

    The oldest params drop out; the current ones stay in the learner state.
    """
    def push(history, newest):
        return jnp.concatenate([history[1:], newest[None]], axis=0)

    return new._replace(
        stale_params=jax.tree.map(push, old.stale_params, old.learner.params),
        stale_versions=push(old.stale_versions, old.updates),
        updates=old.updates + 1,
    )


def make_train(
    config: AsyncActorLearnerConfig, policy_lag: int | tuple[int, ...] = 0
) -> Callable[[jax.Array], SyncResult]:
    """A pure, jittable ``train_fn(key)`` running ``config.num_updates`` synchronous updates.

    ``policy_lag``: act with params this many updates old, or a lag per actor
    (see `make_sync_twin`).
    """
    twin = make_sync_twin(config, policy_lag)

    def train_fn(key: jax.Array) -> SyncResult:
        carry, metrics = jax.lax.scan(
            lambda carry, _: twin.step(carry), twin.init(key), None,
            length=config.num_updates,
        )
        return SyncResult(carry.learner.params, metrics)

    return train_fn


def recent_return_curve(metrics: dict[str, Any], min_episodes: int = 100) -> np.ndarray:
    """`recent_return_mean` after every update, ``[num_updates]`` (NaN before any episode ends).

    After update u: the mean return of the episodes of the most recent
    updates up to u that hold at least ``min_episodes`` of them (whole
    updates, so slightly more may count), as the learner's
    ``episode_return`` reports it.
    """
    sums = np.concatenate([[0.0], np.cumsum(np.asarray(metrics["episode_return_sum"], np.float64))])
    counts = np.concatenate([[0.0], np.cumsum(np.asarray(metrics["episodes"], np.float64))])
    ends = np.arange(1, len(sums))
    # The latest start whose updates up to the end hold min_episodes; from the first if none does.
    starts = np.clip(np.searchsorted(counts, counts[ends] - min_episodes, side="right") - 1,
                     0, ends - 1)
    covered = counts[ends] - counts[starts]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(covered > 0, (sums[ends] - sums[starts]) / covered, np.nan)


def recent_return_mean(metrics: dict[str, Any], min_episodes: int = 100) -> float:
    """Mean return of the most recent updates' episodes, at least ``min_episodes`` of them.

    Walks back from the last update until ``min_episodes`` episodes are
    covered (whole updates, so slightly more may count): the synchronous
    counterpart of `LearnerReport.episode_return_mean`. ``metrics`` is one
    seed's ``SyncResult.metrics``.
    """
    return float(recent_return_curve(metrics, min_episodes)[-1])


class SeedsResult(NamedTuple):
    """`train_seeds`' outcome: the seeds' results stacked, on the host."""

    params: Any  # every leaf [seeds, ...]
    metrics: dict[str, np.ndarray]  # every metric [seeds, num_updates]
    seconds: float  # running the compiled program, all seeds at once
    compile_seconds: float


def train_seeds(config: AsyncActorLearnerConfig, seeds: Sequence[int],
                policy_lag: int | tuple[int, ...] = 0) -> SeedsResult:
    """``config`` for each of ``seeds`` at once: ``jax.jit(jax.vmap(make_train(config, policy_lag)))``.

    Each seed is keyed ``jax.random.key(seed)``, as `train` keys itself, so
    ``config.seed`` is not read. On a 2-core CPU set
    ``--xla_cpu_enable_concurrency_optimized_scheduler=false`` in
    ``XLA_FLAGS`` before JAX starts (a vmapped twin can deadlock without it;
    ``experiments/common.py`` says why).
    """
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    start = time.perf_counter()
    compiled = jax.jit(jax.vmap(make_train(config, policy_lag))).lower(keys).compile()
    compiled_at = time.perf_counter()
    result = jax.block_until_ready(compiled(keys))
    seconds = time.perf_counter() - compiled_at
    params, metrics = jax.device_get((result.params, result.metrics))
    return SeedsResult(params, {k: np.asarray(v) for k, v in metrics.items()}, seconds,
                       compiled_at - start)


def write_twin_run(run_dir: pathlib.Path, config: AsyncActorLearnerConfig, params: Any,
                   metrics: dict[str, np.ndarray], seconds: float, policy_lag: int) -> None:
    """One seed of `train_seeds` as a run directory: the files `train` writes, but checkpoints.

    ``metrics.jsonl`` holds a line per update with the names the learner
    logs (``episode_return`` is `recent_return_curve`; ``policy_lag_mean``
    the lag the twin acted at, ``min(update - 1, policy_lag)``;
    ``env_steps_per_s`` the rate of the whole program, compiling not
    counted); ``summary.json`` the `LearnerReport` fields that apply, with
    ``trainer: "sync twin"``.
    """
    from ppo_async.runs.run_dir import (
        PARAMS_FILE,
        SUMMARY_FILE,
        MetricsFile,
        prepare_fresh,
        record_segment,
        write_atomically,
        write_json,
    )

    prepare_fresh(run_dir)
    record_segment(run_dir, config, start_update=0, start_env_steps=0, resumed_from=None)
    updates = len(metrics["episodes"])
    returns = recent_return_curve(metrics)
    lags = np.minimum(np.arange(updates), policy_lag)
    env_steps = (np.arange(updates) + 1) * config.batch_size
    rate = float(env_steps[-1] / seconds) if seconds > 0 else float("nan")
    per_update = {k: v for k, v in metrics.items() if v.ndim == 1}
    log = MetricsFile(run_dir)
    try:
        for u in range(updates):
            log.write({"update": u + 1, "env_steps": int(env_steps[u]), "env_steps_per_s": rate,
                       "episode_return": float(returns[u]), "policy_lag_mean": float(lags[u]),
                       "policy_lag_max": int(lags[u]),
                       **{k: float(v[u]) for k, v in per_update.items()}})
    finally:
        log.close()
    write_atomically(run_dir / PARAMS_FILE, flax.serialization.to_bytes(params))
    write_json(run_dir / SUMMARY_FILE, dict(
        updates=updates, env_steps=int(env_steps[-1]), wall_time_s=seconds,
        env_steps_per_s=rate, policy_lag_mean=float(lags.mean()), policy_lag_max=int(lags.max()),
        episode_return_mean=float(returns[-1]), episodes=int(np.sum(metrics["episodes"])),
        trainer="sync twin"))


def train_twin_runs(runs: Sequence[tuple[pathlib.Path, AsyncActorLearnerConfig]]) -> None:
    """Train runs whose configs differ only by seed in one `train_seeds`, and write their directories.

    Each acts at its config's exact policy lag (one actor at
    ``exact_policy_lag=K`` is the twin at ``policy_lag=K``); free-running
    actors have no fixed lag and are refused.
    """
    config = runs[0][1]
    if config.exact_lag is None:
        raise ConfigError("the twin simulates an exact policy lag; exact_policy_lag is None")
    different = {f for _, c in runs for f, v in c.to_dict().items()
                 if f != "seed" and v != config.to_dict()[f]}
    if different:
        raise ValueError(f"runs trained together may differ only by seed, not {sorted(different)}")
    lag = int(config.exact_lag)
    result = train_seeds(config, [c.seed for _, c in runs], lag)
    for i, (run_dir, run_config) in enumerate(runs):
        write_twin_run(run_dir, run_config, jax.tree.map(lambda leaf: leaf[i], result.params),
                       {k: v[i] for k, v in result.metrics.items()}, result.seconds, lag)
