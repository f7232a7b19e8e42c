"""The synchronous twin: pure, vmappable, and the async runtime's exact limit."""

import dataclasses

import chex
import flax.serialization
import jax
import numpy as np
import pytest

from ppo_async import AsyncActorLearnerConfig, train
from ppo_async.sync import make_train, recent_return_curve, recent_return_mean

TINY = AsyncActorLearnerConfig(
    num_actors=1, envs_per_actor=4, num_steps=8, num_epochs=2, num_minibatches=2,
    total_env_steps=4 * 8 * 5, seed=3,
)


def test_vmap_over_seeds_trains_each_seed():
    train_fn = jax.jit(jax.vmap(make_train(TINY)))
    result = train_fn(jax.random.split(jax.random.key(0), 3))
    chex.assert_tree_all_finite(result.params)
    assert result.metrics["policy_loss"].shape == (3, TINY.num_updates)
    assert result.metrics["episodes"].shape == (3, TINY.num_updates)
    # Different seeds give different params; the same seed gives the same ones.
    first, second = (jax.tree.map(lambda x: x[i], result.params) for i in (0, 1))
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)))
    again = jax.jit(make_train(TINY))(jax.random.split(jax.random.key(0), 3)[0])
    chex.assert_trees_all_close(again.params, first, atol=1e-6)


@pytest.mark.parametrize("sampler", [None, "actors"], ids=["default", "thread-actor"])
def test_lock_step_async_with_one_actor_reproduces_the_sync_twin_exactly(sampler):
    # None: the learner's program collects the chunk (the default without a GPU).
    config = dataclasses.replace(TINY, max_lead_steps=TINY.num_steps, sampler=sampler)
    assert config.lock_step
    async_params = train(config, progress=False).params
    sync_params = jax.jit(make_train(config))(jax.random.key(config.seed)).params
    assert flax.serialization.to_bytes(jax.device_get(sync_params)) == (
        flax.serialization.to_bytes(async_params)
    )


def test_recent_return_mean_walks_back_over_whole_updates():
    metrics = {
        "episode_return_sum": np.array([10.0, 300.0, 80.0, 90.0]),
        "episodes": np.array([1, 3, 1, 1]),
    }
    assert recent_return_mean(metrics, min_episodes=1) == 90.0
    assert recent_return_mean(metrics, min_episodes=2) == 85.0
    assert recent_return_mean(metrics, min_episodes=3) == (300 + 80 + 90) / 5
    assert recent_return_mean(metrics, min_episodes=100) == 480 / 6
    empty = {"episode_return_sum": np.zeros(2), "episodes": np.zeros(2, int)}
    assert np.isnan(recent_return_mean(empty))



def test_recent_return_curve_is_the_walk_back_after_every_update():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 7, size=40)
    counts[:3] = 0  # no episode has ended yet: NaN
    sums = rng.uniform(0, 50, size=40) * counts

    def walk_back(u, min_episodes):  # the loop recent_return_mean's docstring describes
        total, episodes = 0.0, 0
        for i in range(u, -1, -1):
            total, episodes = total + sums[i], episodes + counts[i]
            if episodes >= min_episodes:
                break
        return total / episodes if episodes else np.nan

    metrics = {"episode_return_sum": sums, "episodes": counts}
    for min_episodes in (1, 10, 1000):
        np.testing.assert_allclose(recent_return_curve(metrics, min_episodes),
                                   [walk_back(u, min_episodes) for u in range(40)])

def test_the_twin_takes_prefixed_gymnax_ids_and_refuses_host_envs():
    import pytest

    from ppo_async import ConfigError
    from ppo_async.sync import make_sync_twin

    make_sync_twin(dataclasses.replace(TINY, env_id="gymnax:CartPole-v1"))
    with pytest.raises(ConfigError, match="gymnax envs only"):
        make_sync_twin(dataclasses.replace(TINY, env_id="gymnasium:CartPole-v1"))


def test_vmapped_twin_with_one_update_does_not_hang():
    # A batched QR in the initializer deadlocked XLA's CPU pool here; the
    # subprocess turns a hang into a failure instead of a stuck suite.
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import jax
        from ppo_async import AsyncActorLearnerConfig
        from ppo_async.sync import make_train
        cfg = AsyncActorLearnerConfig(num_actors=1, envs_per_actor=4, num_steps=8,
                                      num_epochs=1, num_minibatches=2, total_env_steps=32)
        result = jax.jit(jax.vmap(make_train(cfg)))(jax.random.split(jax.random.key(0), 4))
        print(result.metrics["policy_loss"].shape)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    assert "(4, 1)" in done.stdout


def test_on_policy_vtrace_updates_equal_gae_updates():
    # With no lag the V-trace path (re-evaluated values and truncation
    # bootstraps) must train exactly like GAE with the same lambda.
    from ppo_async.sync import make_sync_twin

    params = {}
    for use_vtrace in (False, True):
        twin = make_sync_twin(dataclasses.replace(
            TINY, use_vtrace=use_vtrace, vtrace_lambda=TINY.gae_lambda))
        carry, step = twin.init(jax.random.key(0)), jax.jit(twin.step)
        for _ in range(3):
            carry, _ = step(carry)
        params[use_vtrace] = jax.device_get(carry.learner.params)
    chex.assert_trees_all_close(params[True], params[False], atol=1e-5)
    moved = max(np.abs(a - b).max() for a, b in zip(
        jax.tree.leaves(params[False]),
        jax.tree.leaves(jax.device_get(make_sync_twin(TINY).init(jax.random.key(0)).learner.params))))
    assert moved > 1e-4  # the updates did change the params
