"""The synchronous twin: the same kernels in one fully jitted PPO loop.

``make_train(config)`` returns a pure ``train_fn(key) -> SyncResult``:
rollout (`ppo_async.envs.make_rollout`), update (`ppo_async.learner.make_update_fn`),
repeat, all inside one ``lax.scan``. No threads, no queues, no staleness, so
it is the baseline the asynchronous runtime is compared against, and since it
is pure, ``jax.jit(jax.vmap(make_train(cfg)))(keys)`` trains many seeds at once.

The batch matches the async run's: ``num_actors * envs_per_actor`` envs of
``num_steps`` rows per update. The topology fields (valve, broadcast,
timeouts) have no meaning here and are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.compile_cache import enable_compilation_cache
from ppo_async.config import AsyncActorLearnerConfig, ConfigError, make_config_network
from ppo_async.envs import BatchedEnv, EnvCarry, make_rollout
from ppo_async.host_envs import GYMNAX, split_env_id
from ppo_async.learner import Batch, LearnerState, init_learner_state, make_update_fn
from ppo_async.networks import init_params, is_recurrent


class SyncResult(NamedTuple):
    params: Any  # final params (with a leading seed axis under vmap)
    # Each metric is [num_updates] (or [seeds, num_updates] under vmap): the
    # learner's losses plus ``episode_return_sum`` and ``episodes`` of the
    # episodes that finished in each update's rollout.
    metrics: dict[str, jax.Array]


class SyncCarry(NamedTuple):
    """What the synchronous loop carries from one update to the next."""

    learner: LearnerState
    env: EnvCarry


class SyncTwin(NamedTuple):
    """The twin as two pure functions, for loops that stop early (benchmarks)."""

    init: Callable[[jax.Array], SyncCarry]  # key -> carry
    step: Callable[[SyncCarry], tuple[SyncCarry, dict[str, jax.Array]]]  # one update


def make_sync_twin(config: AsyncActorLearnerConfig) -> SyncTwin:
    """``init(key)`` and ``step(carry)``: one rollout and one update per step."""
    enable_compilation_cache(config.compilation_cache_dir)  # the twin's jit compiles later
    backend, env_name = split_env_id(config.env_id)
    if backend != GYMNAX:
        raise ConfigError(
            f"env_id={config.env_id!r}: the synchronous twin jits its envs and runs "
            "gymnax envs only"
        )
    env = BatchedEnv(env_name, config.num_envs)
    network = make_config_network(config, env.observation_shape, env.action_space)
    recurrent = is_recurrent(network)
    rollout = make_rollout(env, network.apply, config.num_steps, config.gamma,
                           recurrent=recurrent)
    update = make_update_fn(config, network)
    state_size = network.state_size if recurrent else None

    def init(key: jax.Array) -> SyncCarry:
        # The same key derivation as train(): with one actor in lock-step the
        # asynchronous runtime reproduces this loop bit for bit.
        params_key, learner_key = jax.random.split(key)
        params = init_params(network, params_key, env.observation_shape)
        return SyncCarry(
            init_learner_state(config, params, learner_key),
            env.reset(jax.random.fold_in(key, 0), state_size),
        )

    def step(carry: SyncCarry) -> tuple[SyncCarry, dict[str, jax.Array]]:
        env_carry, trajectory, bootstrap_value = rollout(carry.learner.params, carry.env)
        batch = Batch(
            obs=trajectory.obs,
            action=trajectory.action,
            reward=trajectory.reward,
            done=trajectory.done,
            behaviour_logp=trajectory.behaviour_logp,
            behaviour_value=trajectory.behaviour_value,
            bootstrap_obs=env_carry.obs,
            bootstrap_value=bootstrap_value,
            reset=trajectory.reset,
            initial_hidden=None if trajectory.hidden is None else trajectory.hidden[0],
        )
        learner, metrics = update(carry.learner, batch)
        metrics["episode_return_sum"] = jnp.sum(trajectory.episode_return)
        metrics["episodes"] = jnp.sum(trajectory.episode_length > 0)
        return SyncCarry(learner, env_carry), metrics

    return SyncTwin(init, step)


def make_train(config: AsyncActorLearnerConfig) -> Callable[[jax.Array], SyncResult]:
    """A pure, jittable ``train_fn(key)`` running ``config.num_updates`` synchronous updates."""
    twin = make_sync_twin(config)

    def train_fn(key: jax.Array) -> SyncResult:
        carry, metrics = jax.lax.scan(
            lambda carry, _: twin.step(carry), twin.init(key), None,
            length=config.num_updates,
        )
        return SyncResult(carry.learner.params, metrics)

    return train_fn


def recent_return_mean(metrics: dict[str, Any], min_episodes: int = 100) -> float:
    """Mean return of the most recent updates' episodes, at least ``min_episodes`` of them.

    Walks back from the last update until ``min_episodes`` episodes are
    covered (whole updates, so slightly more may count): the synchronous
    counterpart of `LearnerReport.episode_return_mean`. ``metrics`` is one
    seed's ``SyncResult.metrics``.
    """
    sums = np.asarray(metrics["episode_return_sum"])[::-1]
    counts = np.asarray(metrics["episodes"])[::-1]
    covered = np.cumsum(counts)
    last = int(np.searchsorted(covered, min_episodes)) + 1
    if covered[-1] == 0:
        return float("nan")
    return float(sums[:last].sum() / counts[:last].sum())
