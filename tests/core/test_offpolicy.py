"""Off-policy corrections: the ratio's anchor, the importance weight, stale-sample
masking and the truncation bootstrap, against hand-computed or numpy references."""

from __future__ import annotations

import dataclasses
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core.losses import ppo_loss
from ppo_async.core.update import (
    Batch,
    ProximalAverage,
    average_in,
    batch_targets,
    init_learner_state,
    make_update_fn,
)
from ppo_async.networks.actor_critic import init_params, make_network

from reference import gae_reference, vtrace_reference

T, B, OBS = 8, 4, 3
CONFIG = AsyncActorLearnerConfig(
    num_actors=1, envs_per_actor=B, num_steps=T, num_epochs=2, num_minibatches=2,
    hidden_sizes=(16,), anneal_lr=False, gamma=0.9,
)


def _network():
    return make_network((OBS,), types.SimpleNamespace(n=3), CONFIG.hidden_sizes)


def _batch(params, seed=0, behaviour_shift=0.0, lag=0, final_obs=False):
    """A batch whose behaviour log-probs are the policy's, shifted by noise of scale ``behaviour_shift``."""
    rng = np.random.default_rng(seed)
    network = _network()
    obs = rng.normal(size=(T, B, OBS)).astype(np.float32)
    dist, values = network.apply(params, obs)
    action = jnp.asarray(rng.integers(0, 3, size=(T, B)), jnp.int32)
    logp = dist.log_prob(action)
    done = rng.random((T, B)) < 0.15
    truncated = done & (rng.random((T, B)) < 0.5)
    truncated[[2, 5], [1, 3]] = done[[2, 5], [1, 3]] = True  # at least two truncations
    return Batch(
        obs=jnp.asarray(obs), action=action,
        reward=jnp.asarray(rng.normal(size=(T, B)), jnp.float32),
        done=jnp.asarray(done),
        behaviour_logp=logp + jnp.asarray(behaviour_shift * rng.normal(size=(T, B)), jnp.float32),
        behaviour_value=values,
        bootstrap_obs=jnp.asarray(rng.normal(size=(B, OBS)), jnp.float32),
        bootstrap_value=jnp.asarray(rng.normal(size=(B,)), jnp.float32),
        policy_lag=jnp.full((B,), lag, jnp.int32),
        truncated=jnp.asarray(truncated) if final_obs else None,
        final_obs=jnp.asarray(rng.normal(size=(T, B, OBS)), jnp.float32) if final_obs else None,
    )


@pytest.fixture(scope="module")
def params():
    return init_params(_network(), jax.random.key(1), (OBS,))


# --- the loss ------------------------------------------------------------------


def test_anchor_losses_against_a_hand_computed_case():
    # Three samples, eps 0.2, no normalisation, only the policy term (vf and ent 0).
    logp = jnp.log(jnp.array([0.5, 0.3, 0.9]))        # pi
    prox = jnp.log(jnp.array([0.4, 0.3, 0.5]))        # pi_prox
    behaviour = jnp.log(jnp.array([0.2, 0.6, 0.001]))  # mu
    adv = jnp.array([1.0, -2.0, 0.5])
    zeros = jnp.zeros(3)

    def loss(**kw):
        return ppo_loss(logp, prox, adv, zeros, zeros, zeros, zeros, clip_eps=0.2,
                        vf_coef=0.0, ent_coef=0.0, normalize_advantages=False, **kw)

    # r = (1.25, 1.0, 1.8); min(r A, clip(r) A) = (1.2, -2.0, 0.6).
    plain, _ = loss()
    np.testing.assert_allclose(plain, -(1.2 - 2.0 + 0.6) / 3, rtol=1e-6)
    # w = pi_prox / mu = (2, 0.5, 500) capped at 100: (2.4, -1.0, 60).
    weighted, metrics = loss(behaviour_logp=behaviour, is_weight_max=100.0)
    np.testing.assert_allclose(weighted, -(2.4 - 1.0 + 60.0) / 3, rtol=1e-5)
    np.testing.assert_allclose(metrics["is_weight_mean"], (2 + 0.5 + 100) / 3, rtol=1e-5)
    # A cap of 1 leaves (1, 0.5, 1): (1.2, -1.0, 0.6).
    capped, _ = loss(behaviour_logp=behaviour, is_weight_max=1.0)
    np.testing.assert_allclose(capped, -(1.2 - 1.0 + 0.6) / 3, rtol=1e-6)


def test_masked_samples_contribute_nothing():
    rng = np.random.default_rng(3)
    n = 12
    inputs = [jnp.asarray(rng.normal(size=n), jnp.float32) for _ in range(7)]
    mask = jnp.asarray(rng.random(n) < 0.6, jnp.float32)
    keep = np.flatnonzero(np.asarray(mask))

    def loss(x, mask=None):
        return ppo_loss(*x, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01, mask=mask)[0]

    masked_value, masked_grads = jax.value_and_grad(loss)(inputs, mask)
    subset = [x[keep] for x in inputs]
    subset_value, subset_grads = jax.value_and_grad(loss)(subset)
    np.testing.assert_allclose(masked_value, subset_value, rtol=1e-5)
    for full, part in zip(masked_grads, subset_grads):
        np.testing.assert_array_equal(np.delete(np.asarray(full), keep), 0.0)
        np.testing.assert_allclose(np.asarray(full)[keep], part, rtol=1e-4, atol=1e-7)


def test_extreme_log_probs_stay_finite():
    # A behaviour action the current policy finds e^1000 times likelier (or less):
    # ratios and weights are clipped in log space before exp, never inf or NaN.
    logp = jnp.array([0.0, -1000.0, 1000.0, -1.0])
    old = jnp.array([-1000.0, 0.0, -1.0, 1000.0])
    behaviour = jnp.array([-3000.0, 3000.0, 0.0, -2.0])
    zeros, adv = jnp.zeros(4), jnp.array([1.0, -1.0, 2.0, -3.0])

    def loss(logp):
        return ppo_loss(logp, old, adv, zeros, zeros, zeros, zeros, clip_eps=0.2, vf_coef=0.5,
                        ent_coef=0.01, behaviour_logp=behaviour)[0]

    value, grad = jax.value_and_grad(loss)(logp)
    chex.assert_tree_all_finite((value, grad))


# --- the proximal moving average ------------------------------------------------


def test_ewma_matches_the_bias_corrected_numpy_average():
    decay = 0.7
    rng = np.random.default_rng(4)
    thetas = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(6)]
    average = ProximalAverage({"w": jnp.asarray(thetas[0])}, jnp.ones((), jnp.int32))
    for theta in thetas[1:]:
        average = average_in(average, {"w": jnp.asarray(theta)}, decay)
    # Adam-style: m_t = decay m_{t-1} + (1 - decay) theta_t from m_0 = 0, divided by 1 - decay^t.
    m = np.zeros((2, 3))
    for theta in thetas:
        m = decay * m + (1 - decay) * theta
    expected = m / (1 - decay ** len(thetas))
    np.testing.assert_allclose(average.params["w"], expected, rtol=1e-5, atol=1e-6)
    assert int(average.count) == len(thetas)


def test_update_averages_after_every_optimizer_step(params):
    network = _network()
    batch = _batch(params, behaviour_shift=0.3)
    steps = CONFIG.num_epochs * CONFIG.num_minibatches
    # decay 0: the average is the newest params, so after the update it equals them.
    config = dataclasses.replace(CONFIG, use_vtrace=True, ppo_ratio_anchor="ewma",
                                 proximal_ewma_decay=0.0)
    state = init_learner_state(config.update_options(), params, jax.random.key(0))
    new_state, metrics = make_update_fn(config.update_options(), network)(state, batch)
    assert int(new_state.proximal.count) == 1 + steps
    chex.assert_trees_all_close(new_state.proximal.params, new_state.params)
    assert np.isfinite(float(metrics["is_weight_mean"]))
    # decay 0.9: somewhere between the start and the end.
    config = dataclasses.replace(config, proximal_ewma_decay=0.9)
    state = init_learner_state(config.update_options(), params, jax.random.key(0))
    new_state, _ = make_update_fn(config.update_options(), network)(state, batch)
    start, end, mid = (jax.tree.leaves(p)[0] for p in
                       (params, new_state.params, new_state.proximal.params))
    assert 0 < float(jnp.linalg.norm(mid - start)) < float(jnp.linalg.norm(end - start))


# --- the update -----------------------------------------------------------------


def test_learner_anchor_at_lag_zero_equals_behaviour_anchor(params):
    # The behaviour log-probs are the learner's own (the batch's policy is its
    # params): the weight is exactly 1 and the anchors coincide bit for bit.
    network = _network()
    batch = _batch(params)
    results = {}
    for anchor in ("behaviour", "learner"):
        config = dataclasses.replace(CONFIG, ppo_ratio_anchor=anchor)
        state = init_learner_state(config.update_options(), params, jax.random.key(0))
        new_state, metrics = make_update_fn(config.update_options(), network)(state, batch)
        results[anchor] = (jax.device_get(new_state.params), metrics)
    assert float(results["learner"][1]["is_weight_mean"]) == 1.0
    chex.assert_trees_all_equal(results["behaviour"][0], results["learner"][0])
    for name in ("policy_loss", "value_loss", "approx_kl"):
        assert results["behaviour"][1][name] == results["learner"][1][name]


@pytest.mark.parametrize("pg_rho_bar", [None, 1.2])
@pytest.mark.parametrize("final_obs", [False, True])
def test_vtrace_targets_use_learner_over_behaviour_log_rhos(params, final_obs, pg_rho_bar):
    # Behaviour log-probs off by N(0, 1): many rhos above the bar, many below,
    # so a flipped log-rho or swapped policies change the clipped weights.
    network = _network()
    batch = _batch(params, seed=5, behaviour_shift=1.0, final_obs=final_obs)
    config = dataclasses.replace(CONFIG, use_vtrace=True, vtrace_lambda=0.9,
                                 vtrace_rho_bar=1.0, vtrace_c_bar=0.8,
                                 vtrace_pg_rho_bar=pg_rho_bar)
    targets = batch_targets(config.update_options(), network, params, batch)

    dist, values = network.apply(params, batch.obs)
    target_logp = np.asarray(dist.log_prob(batch.action))
    _, bootstrap = network.apply(params, batch.bootstrap_obs)
    reward = np.asarray(batch.reward, np.float64)
    if final_obs:
        _, final_values = network.apply(params, batch.final_obs)
        reward = reward + config.gamma * np.where(batch.truncated, final_values, 0.0)
    discounts = config.gamma * (1.0 - np.asarray(batch.done, np.float64))
    log_rhos = target_logp - np.asarray(batch.behaviour_logp)
    assert (log_rhos > 0.2).mean() > 0.2 and (log_rhos < -0.2).mean() > 0.2

    def reference(log_rhos):
        return vtrace_reference(reward, values, discounts, bootstrap, log_rhos,
                                lambda_=0.9, rho_bar=1.0, c_bar=0.8, pg_rho_bar=pg_rho_bar,
                                weight_pg=pg_rho_bar is not None)

    value_targets, pg_advantages, _ = reference(log_rhos)
    np.testing.assert_allclose(targets.value_targets, value_targets, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(targets.advantages, pg_advantages, rtol=1e-4, atol=1e-4)
    flipped_targets, flipped_advantages, _ = reference(-log_rhos)
    assert np.abs(flipped_targets - value_targets).max() > 1e-2
    assert np.abs(flipped_advantages - pg_advantages).max() > 1e-2


def test_truncation_bootstrap_follows_the_current_critic(params):
    network = _network()
    batch = _batch(params, seed=6, final_obs=True)
    assert bool(batch.truncated.any())
    config = dataclasses.replace(CONFIG, use_vtrace=True)
    # The critic changes between collection and update: only the value head's
    # bias (the one bias with a single output) moves, by 1.
    moved = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 1.0 if "bias" in jax.tree_util.keystr(path) and x.shape == (1,)
        else x, params)
    assert not all(np.array_equal(a, b) for a, b in
                   zip(jax.tree.leaves(params), jax.tree.leaves(moved)))
    before = batch_targets(config.update_options(), network, params, batch)
    after = batch_targets(config.update_options(), network, moved, batch)
    # Every value rises by 1 and so does every truncated step's bootstrap,
    # by gamma (with lambda 1 and on-policy, targets telescope to r + gamma V_next).
    _, final_before = network.apply(params, batch.final_obs)
    _, final_after = network.apply(moved, batch.final_obs)
    np.testing.assert_allclose(final_after - final_before, 1.0, rtol=1e-5)
    diff = np.asarray(after.value_targets - before.value_targets)
    assert np.abs(diff).max() > 0.5
    # Against GAE (lambda 1, on-policy rhos clipped at 1 exactly) with the fold done by hand.
    _, values = network.apply(moved, batch.obs)
    _, bootstrap = network.apply(moved, batch.bootstrap_obs)
    reward = np.asarray(batch.reward) + config.gamma * np.where(batch.truncated, final_after, 0.0)
    discounts = config.gamma * (1.0 - np.asarray(batch.done, np.float64))
    _, expected = gae_reference(reward, values, discounts, bootstrap, 1.0)
    np.testing.assert_allclose(after.value_targets, expected, rtol=1e-4, atol=1e-4)


def test_max_policy_lag_drops_stale_columns_exactly(params):
    network = _network()
    fresh = _batch(params, seed=7)
    # Envs 2 and 3 are 5 updates stale, and their data is replaced by garbage.
    lag = jnp.array([0, 1, 5, 5], jnp.int32)
    garbage = _batch(params, seed=8)

    def envs_2_3_from_garbage(name):
        a, g = getattr(fresh, name), getattr(garbage, name)
        env_axis = 0 if name.startswith("bootstrap") else 1
        return jnp.concatenate([jnp.take(a, jnp.arange(2), env_axis),
                                jnp.take(g, jnp.arange(2, B), env_axis)], env_axis)

    mixed = Batch(**{name: envs_2_3_from_garbage(name) for name in (
        "obs", "action", "reward", "done", "behaviour_logp", "behaviour_value",
        "bootstrap_obs", "bootstrap_value")}, policy_lag=lag)
    assert not np.allclose(mixed.obs[:, 2:], fresh.obs[:, 2:])
    config = dataclasses.replace(CONFIG, max_policy_lag=3, num_minibatches=1)
    update = make_update_fn(config.update_options(), network)
    state = init_learner_state(config.update_options(), params, jax.random.key(0))
    a, metrics = update(state, fresh._replace(policy_lag=lag))
    b, _ = update(state, mixed)
    np.testing.assert_allclose(metrics["dropped_fraction"], 0.5)
    # The stale half differs completely, yet the gradients (hence the params) agree.
    chex.assert_trees_all_close(a.params, b.params, rtol=1e-5, atol=1e-6)
    # Without the cap the garbage does change the update.
    config = dataclasses.replace(config, max_policy_lag=None)
    update = make_update_fn(config.update_options(), network)
    c, _ = update(state, fresh)
    d, _ = update(state, mixed._replace(policy_lag=None))
    assert max(float(jnp.abs(x - y).max()) for x, y in
               zip(jax.tree.leaves(c.params), jax.tree.leaves(d.params))) > 1e-5


def test_twin_simulates_the_policy_lag():
    from ppo_async.sync import make_sync_twin

    config = dataclasses.replace(CONFIG, env_id="CartPole-v1", max_policy_lag=1)
    twin = make_sync_twin(config, policy_lag=2)
    carry, step = twin.init(jax.random.key(0)), jax.jit(twin.step)
    history = [jax.device_get(carry.learner.params)]
    dropped = []
    for _ in range(4):
        # The rollout acts with the params of two updates ago (the initial ones at first).
        acting = jax.tree.map(lambda p: p[0], carry.stale_params)
        chex.assert_trees_all_equal(jax.device_get(acting), history[max(0, len(history) - 3)])
        carry, metrics = step(carry)
        history.append(jax.device_get(carry.learner.params))
        dropped.append(float(metrics["dropped_fraction"]))
    # Lags 0, 1, 2, 2: the cap of 1 drops the last two batches whole.
    assert dropped == [0.0, 0.0, 1.0, 1.0]


def test_twin_per_actor_lags():
    from ppo_async.sync import make_sync_twin

    config = dataclasses.replace(CONFIG, env_id="CartPole-v1", num_actors=2, envs_per_actor=2,
                                 max_policy_lag=1)

    def run(policy_lag, updates=4):
        twin = make_sync_twin(config, policy_lag=policy_lag)
        carry, step = twin.init(jax.random.key(0)), jax.jit(twin.step)
        out = []
        for _ in range(updates):
            carry, metrics = step(carry)
            out.append(jax.device_get(metrics))
        return out

    # Actor 1 straggles two updates behind: half the batch goes stale from update 3 on.
    assert [float(m["dropped_fraction"]) for m in run((0, 2))] == [0.0, 0.0, 0.5, 0.5]
    # Every actor at lag 2 acts as the single-lag twin does (per-env params, same values).
    per_actor, single = run((2, 2)), run(2)
    for a, b in zip(per_actor, single):
        np.testing.assert_allclose(a["policy_loss"], b["policy_loss"], rtol=1e-4, atol=1e-6)
        assert float(a["episode_return_sum"]) == float(b["episode_return_sum"])
    with pytest.raises(ValueError, match="num_actors=2"):
        make_sync_twin(config, policy_lag=(1, 2, 3))


def test_default_is_the_studys_recommendation():
    # docs/results.md: V-trace with unweighted advantages and the behaviour anchor.
    config = AsyncActorLearnerConfig(use_vtrace=True)
    assert config.ppo_ratio_anchor == "behaviour"
    assert config.vtrace_pg_rho_bar is None and config.vtrace_lambda == 1.0
    assert config.max_policy_lag is None


def test_resume_cannot_switch_to_or_from_the_moving_average():
    from ppo_async.config import ConfigError
    from ppo_async.runs.checkpoint import check_resume_compatible

    def config(**kw):
        return AsyncActorLearnerConfig(**kw).to_dict()

    # Anchors without a moving average replace each other freely.
    check_resume_compatible(config(ppo_ratio_anchor="learner"), config(ppo_ratio_anchor="behaviour"))
    check_resume_compatible(config(ppo_ratio_anchor="ewma"), config(ppo_ratio_anchor="ewma"))
    old = {k: v for k, v in config().items() if k != "ppo_ratio_anchor"}  # an older checkpoint
    check_resume_compatible(old, config(ppo_ratio_anchor="learner"))
    for saved, new in (("ewma", "behaviour"), ("learner", "ewma")):
        with pytest.raises(ConfigError, match="ppo_ratio_anchor"):
            check_resume_compatible(config(ppo_ratio_anchor=saved), config(ppo_ratio_anchor=new))
    with pytest.raises(ConfigError, match="ppo_ratio_anchor"):
        check_resume_compatible(old, config(ppo_ratio_anchor="ewma"))


@pytest.mark.slow
def test_pendulum_at_lag_15_stays_finite_with_every_anchor():
    # Regression: the learner-anchored V-trace path once diverged here
    # (NonFiniteError at update 110, 225k env steps). One seed per anchor,
    # 240k steps at a simulated lag of 15 updates.
    from ppo_async.presets import preset
    from ppo_async.sync import make_train

    for anchor in ("behaviour", "learner", "ewma"):
        config = preset("pendulum", total_env_steps=240_000, use_vtrace=True,
                        ppo_ratio_anchor=anchor)
        metrics = jax.device_get(jax.jit(make_train(config, 15))(jax.random.key(0)).metrics)
        assert metrics["params_finite"].min() == 1.0, anchor
        for name, values in metrics.items():
            assert np.all(np.isfinite(values)), (anchor, name)


# --- the loss's own knobs ---------------------------------------------------------


@pytest.mark.parametrize("fields, metric", [
    (dict(value_clip_eps=0.01), "value_loss"),
    (dict(normalize_advantages=False), "policy_loss"),
])
def test_the_configs_value_clip_and_advantage_standardisation_reach_the_loss(params, fields,
                                                                             metric):
    # One epoch of one minibatch: the update's loss metrics are ppo_loss of the whole
    # batch at the initial params (a mean does not depend on the shuffle).
    config = dataclasses.replace(CONFIG, num_epochs=1, num_minibatches=1, **fields)
    network = _network()
    batch = _batch(params)
    noise = np.random.default_rng(3).normal(size=(T, B))
    batch = batch._replace(behaviour_value=batch.behaviour_value + jnp.asarray(noise, jnp.float32))
    _, metrics = make_update_fn(config.update_options(), network)(
        init_learner_state(config.update_options(), params, jax.random.key(0)), batch)

    targets = batch_targets(config.update_options(), network, params, batch)
    dist, values = network.apply(params, batch.obs)

    def loss_metrics(**knobs):
        flat = [x.reshape(-1) for x in (
            dist.log_prob(batch.action), batch.behaviour_logp, targets.advantages, values,
            targets.old_values, targets.value_targets, dist.entropy())]
        return ppo_loss(*flat, clip_eps=config.clip_eps, vf_coef=config.vf_coef,
                        ent_coef=config.ent_coef, **knobs)[1]

    expected, default = loss_metrics(**fields), loss_metrics()
    assert abs(float(expected[metric]) - float(default[metric])) > 1e-3  # the knob matters here
    np.testing.assert_allclose(metrics[metric], expected[metric], rtol=1e-5)
