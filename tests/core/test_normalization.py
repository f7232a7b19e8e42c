"""Observation normalization and reward scaling: the statistics, and every consumer's transform."""

import dataclasses

import chex
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async import AsyncActorLearnerConfig, train
from ppo_async.core.normalization import (
    EPSILON,
    NormalizationOptions,
    NormalizedPolicy,
    accumulate_return,
    init_running_mean_std,
    normalize_observation,
    scale_reward,
    update_running_mean_std,
    wrap_params,
)
from ppo_async.networks.actor_critic import init_params
from ppo_async.runtime.evaluate import Evaluator
from ppo_async.sync import make_train

from run_helpers import interrupt_at

# Pendulum: continuous control, where normalization is meant to be used.
NORMALIZED = AsyncActorLearnerConfig(
    env_id="Pendulum-v1", num_actors=1, envs_per_actor=4, num_steps=8, num_epochs=1,
    num_minibatches=2, total_env_steps=4 * 8 * 4, max_lead_steps=8, seed=5,
    normalize_observations=True, normalize_rewards=True,
)


@pytest.mark.parametrize("jit", [False, True])
def test_running_statistics_match_numpy_over_the_whole_stream(jit):
    rng = np.random.default_rng(0)
    # Uneven chunks with far-off means: Chan's update must not lose precision.
    chunks = [rng.normal(loc=5.0, scale=[1.0, 3.0, 0.1], size=(n, 2, 3)).astype(np.float32)
              for n in (1, 7, 3, 16)]
    update = jax.jit(update_running_mean_std) if jit else update_running_mean_std
    stats = init_running_mean_std((3,))
    for chunk in chunks:
        stats = update(stats, chunk)
    stream = np.concatenate(chunks).reshape(-1, 3).astype(np.float64)
    np.testing.assert_allclose(stats.mean, stream.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(stats.var, stream.var(axis=0), rtol=1e-4)
    assert float(stats.count) == stream.shape[0]


def test_observation_normalization_formula_and_clip():
    stats = init_running_mean_std((2,))._replace(
        mean=np.array([1.0, -2.0], np.float32), var=np.array([4.0, 0.0], np.float32))
    obs = np.array([[3.0, -2.0], [1.0, -1.0]], np.float32)
    normalized = normalize_observation(stats, obs, clip=10.0)
    expected = np.array([[2.0 / np.sqrt(4.0 + EPSILON), 0.0], [0.0, 10.0]], np.float32)
    np.testing.assert_allclose(normalized, expected, rtol=1e-6)  # 1 / sqrt(1e-8) clipped to 10


def _numpy_discounted_returns(rewards, dones, gamma):
    """cleanrl's NormalizeReward loop: return = return * gamma * (1 - done_prev) + reward."""
    returns = np.zeros(rewards.shape[1])
    previous_done = np.zeros(rewards.shape[1])
    out = np.zeros_like(rewards, dtype=np.float64)
    for t in range(rewards.shape[0]):
        returns = returns * gamma * (1 - previous_done) + rewards[t]
        out[t] = returns
        previous_done = dones[t]
    return out


@pytest.mark.parametrize("jit", [False, True])
def test_reward_scaling_matches_a_numpy_loop_of_the_discounted_return(jit):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(20, 3)).astype(np.float32)
    dones = rng.random((20, 3)) < 0.2
    gamma = 0.9

    def returns_and_stats(rewards, dones):
        def step(carried, row):
            discounted_return, carried = accumulate_return(carried, *row, gamma=gamma)
            return carried, discounted_return
        _, returns = jax.lax.scan(step, jnp.zeros(3), (rewards, dones))
        # Fed in two chunks, as two updates would.
        stats = update_running_mean_std(init_running_mean_std(), returns[:9])
        stats = update_running_mean_std(stats, returns[9:])
        return returns, stats, scale_reward(stats, rewards, clip=1.5)

    fn = jax.jit(returns_and_stats) if jit else returns_and_stats
    returns, stats, scaled = fn(rewards, dones)
    expected = _numpy_discounted_returns(rewards, dones, gamma)
    np.testing.assert_allclose(returns, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.var, expected.var(), rtol=1e-4)
    np.testing.assert_allclose(
        scaled, np.clip(rewards / np.sqrt(expected.var() + EPSILON), -1.5, 1.5), rtol=1e-4)


def test_a_golden_discounted_return_by_hand():
    # Rewards 1, 2, 3 in one env with the episode ending at step 1, gamma 0.5:
    # R = 1, 2 + 0.5 * 1 = 2.5, then the new episode's 3.
    carried, returns = jnp.zeros(1), []
    for reward, done in ((1.0, False), (2.0, True), (3.0, False)):
        value, carried = accumulate_return(carried, jnp.array([reward]), jnp.array([done]),
                                           gamma=0.5)
        returns.append(float(value[0]))
    assert returns == [1.0, 2.5, 3.0]


def test_lock_step_async_with_normalization_reproduces_the_sync_twin_exactly():
    assert NORMALIZED.lock_step
    async_params = train(NORMALIZED, progress=False).params
    sync = jax.jit(make_train(NORMALIZED))(jax.random.key(NORMALIZED.seed))
    assert isinstance(async_params, NormalizedPolicy)
    # Every row the learner consumed is in the statistics, once.
    assert float(async_params.obs_stats.count) == NORMALIZED.num_updates * NORMALIZED.batch_size
    assert float(async_params.return_stats.count) == float(async_params.obs_stats.count)
    assert np.all(sync.metrics["return_std"] > 0)
    assert flax.serialization.to_bytes(jax.device_get(sync.params)) == (
        flax.serialization.to_bytes(async_params))


def test_normalization_changes_the_run_and_off_carries_plain_params():
    plain = dataclasses.replace(NORMALIZED, normalize_observations=False,
                                normalize_rewards=False)
    off = jax.jit(make_train(plain))(jax.random.key(0))
    on = jax.jit(make_train(NORMALIZED))(jax.random.key(0))
    assert not isinstance(off.params, NormalizedPolicy)
    assert "return_std" not in off.metrics
    assert not np.allclose(off.metrics["policy_loss"], on.metrics["policy_loss"])


def test_statistics_survive_checkpoint_and_resume(tmp_path):
    config = dataclasses.replace(NORMALIZED, total_env_steps=4 * 8 * 6, checkpoint_every_updates=2)
    whole = train(config, run_dir=tmp_path / "whole", progress=False)
    run_dir = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        train(config, run_dir=run_dir, progress=False, on_update=interrupt_at(3))
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.resume import load_resume_point
    from ppo_async.runs.run_dir import checkpoint_dir

    saved = load_resume_point(config, make_actor_program(config), checkpoint_dir(run_dir))
    assert float(saved.state.params.obs_stats.count) == 3 * config.batch_size
    assert saved.actor_carries[0].discounted_return.shape == (config.envs_per_actor,)
    resumed = train(config, resume_from=run_dir, progress=False)
    # The resumed run normalizes exactly as the uninterrupted one did.
    assert flax.serialization.to_bytes(resumed.params) == flax.serialization.to_bytes(whole.params)


def test_evaluation_applies_the_statistics_the_params_carry():
    config = AsyncActorLearnerConfig(normalize_observations=True, obs_clip=1e6)
    plain_config = dataclasses.replace(config, normalize_observations=False)
    evaluator, plain_evaluator = Evaluator(config, 8), Evaluator(plain_config, 8)
    params = init_params(plain_evaluator.network, jax.random.key(1),
                         plain_evaluator.env.observation_shape)
    policy = wrap_params(params, (4,), config.normalization_options())
    # Statistics of no samples (mean 0, var 1) normalize to the observation itself.
    plain_returns = plain_evaluator(params).episode_returns
    np.testing.assert_array_equal(evaluator(policy).episode_returns, plain_returns)
    shifted = policy._replace(obs_stats=policy.obs_stats._replace(
        mean=np.array([0.0, 0.0, 0.5, 0.0], np.float32),
        var=np.full(4, 0.01, np.float32)))
    shifted_returns = evaluator(shifted).episode_returns
    assert not np.array_equal(shifted_returns, plain_returns)
    # As bytes (a broadcast or params.msgpack) the statistics come along.
    np.testing.assert_array_equal(
        evaluator(flax.serialization.to_bytes(shifted)).episode_returns, shifted_returns)


def test_normalization_fields_are_validated():
    from ppo_async import ConfigError

    with pytest.raises(ConfigError, match="obs_clip"):
        AsyncActorLearnerConfig(obs_clip=0.0)
    with pytest.raises(ConfigError, match="normalize_rewards"):
        AsyncActorLearnerConfig(normalize_rewards=1)
    chex.assert_trees_all_equal(NORMALIZED.normalization_options(),
                                NormalizationOptions(True, True, 10.0, 10.0))


def test_host_env_actors_and_evaluation_normalize_too():
    from ppo_async.runtime.evaluate import evaluate

    config = dataclasses.replace(NORMALIZED, env_id="gymnasium:Pendulum-v1",
                                 total_env_steps=4 * 8 * 2)
    result = train(config, progress=False)
    assert float(result.params.obs_stats.count) == 2 * config.batch_size
    assert float(result.params.return_stats.var) > 0
    chex.assert_tree_all_finite(result.params)
    outcome = evaluate(config, flax.serialization.to_bytes(result.params), num_episodes=1)
    assert np.isfinite(outcome.mean_return)
