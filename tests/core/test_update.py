"""The update as a notebook calls it: named numbers, no config; and the config's one
place of building those options from its fields."""

from __future__ import annotations

import dataclasses
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core.normalization import NormalizationOptions
from ppo_async.core.update import Batch, UpdateOptions, init_learner_state, make_update_fn
from ppo_async.networks.actor_critic import init_params, make_network

T, B, OBS, ACTIONS = 8, 4, 3, 2


def _batch(network, params, seed):
    rng = np.random.default_rng(seed)
    obs = jnp.asarray(rng.normal(size=(T, B, OBS)), jnp.float32)
    dist, values = network.apply(params, obs)
    action = jnp.asarray(rng.integers(0, ACTIONS, size=(T, B)), jnp.int32)
    return Batch(
        obs=obs, action=action, reward=jnp.asarray(rng.normal(size=(T, B)), jnp.float32),
        done=jnp.asarray(rng.random((T, B)) < 0.2), behaviour_logp=dist.log_prob(action),
        behaviour_value=values, bootstrap_obs=jnp.asarray(rng.normal(size=(B, OBS)), jnp.float32),
        bootstrap_value=jnp.zeros((B,), jnp.float32),
    )


def test_the_update_runs_on_named_numbers_and_compiles_once(monkeypatch):
    def no_config(self):
        raise AssertionError("the math built a config")

    monkeypatch.setattr(AsyncActorLearnerConfig, "__post_init__", no_config)
    network = make_network((OBS,), types.SimpleNamespace(n=ACTIONS), hidden_sizes=(16,))
    options = UpdateOptions(num_updates=10, num_epochs=2, num_minibatches=2, use_vtrace=True,
                            gamma=0.9, ppo_ratio_anchor="ewma")
    params = init_params(network, jax.random.key(0), (OBS,))
    # On the device, as the learner puts it (host leaves would take a cache entry of their own).
    state = jax.device_put(init_learner_state(options, params, jax.random.key(1)))
    update = make_update_fn(options, network)
    for seed in range(2):
        state, metrics = update(state, _batch(network, params, seed))
        chex.assert_tree_all_finite((state.params, metrics))
    assert update._cache_size() == 1  # the second call reused the first's program
    assert int(state.proximal.count) == 1 + 2 * 2 * 2  # two updates of 2 x 2 optimizer steps
    assert float(metrics["learning_rate"]) == pytest.approx(5e-4 * (1 - 4 / 40))
    assert float(metrics["params_finite"]) == 1.0
    leaves, structure = jax.tree.flatten(state.params)  # one leaf's NaN is seen
    leaves[-1] = leaves[-1].at[0].set(jnp.nan)
    _, metrics = update(state._replace(params=jax.tree.unflatten(structure, leaves)),
                        _batch(network, params, 2))
    assert float(metrics["params_finite"]) == 0.0


@pytest.mark.parametrize("anneal_lr", [True, False])
def test_the_optimizer_state_built_on_the_host_is_optaxs_own_init(anneal_lr):
    """Zeros in the shapes of ``init`` (nothing compiled) equal optax's ``init`` run,
    leaf for leaf; inside a trace the state is ``init``'s own."""
    from ppo_async.core.update import initial_optimizer_state, make_optimizer

    network = make_network((OBS,), types.SimpleNamespace(n=ACTIONS), hidden_sizes=(16,))
    params = init_params(network, jax.random.key(0), (OBS,))
    options = UpdateOptions(num_updates=10, num_epochs=2, num_minibatches=2, anneal_lr=anneal_lr)
    built = initial_optimizer_state(options, params)
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(built))
    for state in (built, jax.jit(lambda p: initial_optimizer_state(options, p))(params)):
        expected = make_optimizer(options).init(params)
        assert jax.tree.structure(state) == jax.tree.structure(expected)
        for leaf, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected), strict=True):
            assert (leaf.shape, leaf.dtype) == (want.shape, want.dtype)
            np.testing.assert_array_equal(leaf, want)


def test_runs_differing_in_budget_or_learning_rate_share_one_update_program_with_the_same_bits():
    """The learning-rate piece is the program's argument: one program for every
    budget and rate, giving the bytes of the program with the piece as constants
    (what the twin compiles inside its own loop)."""
    from ppo_async.core.update import LearningRateSchedule

    network = make_network((OBS,), types.SimpleNamespace(n=ACTIONS), hidden_sizes=(16,))
    params = init_params(network, jax.random.key(0), (OBS,))
    cases = [  # (num_updates, learning_rate, anneal_lr, a resumed piece)
        (6, 5e-4, True, None), (7, 1e-3, True, None), (976, 2.5e-4, True, None),
        (9, 3e-4, True, LearningRateSchedule(12, 3e-4, 37)), (5, 2e-3, False, None)]
    texts, batch = set(), _batch(network, params, 0)
    for num_updates, rate, anneal, piece in cases:
        options = UpdateOptions(num_updates=num_updates, num_epochs=4, num_minibatches=4,
                                learning_rate=rate, anneal_lr=anneal)
        update = make_update_fn(options, network, schedule=piece)
        state = init_learner_state(options, params, jax.random.key(1))
        as_constants = jax.jit(lambda s, b, update=update: update.program(s, b, update.rate))
        expected = state
        for _ in range(3):  # optimizer steps 0-47: rates that differ with a plain division
            state, metrics = update(state, batch)
            expected, _ = as_constants(expected, batch)
        chex.assert_trees_all_equal(state, expected)
        texts.add((anneal, update.program.lower(state, batch, update.rate).as_text()))
        first = piece if piece is not None else LearningRateSchedule(0, rate, num_updates * 16)
        assert float(metrics["learning_rate"]) == pytest.approx(first(32) if anneal else rate)
    assert len(texts) == 2  # one program annealed, one not


def test_the_options_defaults_are_the_configs():
    config = AsyncActorLearnerConfig()
    assert config.update_options() == UpdateOptions(num_updates=config.num_updates)
    assert config.normalization_options() == NormalizationOptions()


def test_the_config_builds_every_option_from_the_field_of_its_name():
    config = AsyncActorLearnerConfig(
        learning_rate=1e-3, anneal_lr=False, max_grad_norm=0.7, num_epochs=3, num_minibatches=8,
        gamma=0.95, gae_lambda=0.9, use_vtrace=True, vtrace_lambda=0.8, vtrace_rho_bar=2.0,
        vtrace_c_bar=0.5, vtrace_pg_rho_bar=1.5, max_policy_lag=3, ppo_ratio_anchor="learner",
        proximal_ewma_decay=0.5, is_weight_max=10.0, clip_eps=0.1, value_clip_eps=0.3,
        normalize_advantages=False, vf_coef=0.25, ent_coef=0.0, normalize_observations=True,
        obs_clip=5.0, reward_clip=3.0,
    )
    options = config.update_options()
    for field in dataclasses.fields(UpdateOptions):
        assert getattr(options, field.name) == getattr(config, field.name), field.name
    assert config.normalization_options() == NormalizationOptions(True, False, 5.0, 3.0)
    space = types.SimpleNamespace(n=ACTIONS)
    assert config.make_network((OBS,), space) == make_network(
        (OBS,), space, hidden_sizes=config.hidden_sizes, network=config.network,
        rnn_hidden_size=config.rnn_hidden_size, torso="none")
