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

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.envs import BatchedEnv, make_rollout
from ppo_async.learner import Batch, init_learner_state, make_update_fn
from ppo_async.networks import init_params, make_network


class SyncResult(NamedTuple):
    params: Any  # final params (with a leading seed axis under vmap)
    # Each metric is [num_updates] (or [seeds, num_updates] under vmap): the
    # learner's losses plus ``episode_return_sum`` and ``episodes`` of the
    # episodes that finished in each update's rollout.
    metrics: dict[str, jax.Array]


def make_train(config: AsyncActorLearnerConfig) -> Callable[[jax.Array], SyncResult]:
    """A pure, jittable ``train_fn(key)`` running ``config.num_updates`` synchronous updates."""
    env = BatchedEnv(config.env_id, config.num_envs)
    network = make_network(env.observation_shape, env.action_space, config.hidden_sizes)
    rollout = make_rollout(env, network.apply, config.num_steps, config.gamma)
    update = make_update_fn(config, network)

    def train_fn(key: jax.Array) -> SyncResult:
        # The same key derivation as train(): with one actor in lock-step the
        # asynchronous runtime reproduces this function bit for bit.
        params_key, learner_key = jax.random.split(key)
        env_key = jax.random.fold_in(key, 0)
        params = init_params(network, params_key, env.observation_shape)
        state = init_learner_state(config, params, learner_key)

        def one_update(carry, _):
            state, env_carry = carry
            env_carry, trajectory, bootstrap_value = rollout(state.params, env_carry)
            batch = Batch(
                obs=trajectory.obs,
                action=trajectory.action,
                reward=trajectory.reward,
                done=trajectory.done,
                behaviour_logp=trajectory.behaviour_logp,
                behaviour_value=trajectory.behaviour_value,
                bootstrap_obs=env_carry.obs,
                bootstrap_value=bootstrap_value,
            )
            state, metrics = update(state, batch)
            metrics["episode_return_sum"] = jnp.sum(trajectory.episode_return)
            metrics["episodes"] = jnp.sum(trajectory.episode_length > 0)
            return (state, env_carry), metrics

        (state, _), metrics = jax.lax.scan(
            one_update, (state, env.reset(env_key)), None, length=config.num_updates
        )
        return SyncResult(state.params, metrics)

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
