"""ppo_loss against the PPO paper's formulas (arXiv:1707.06347), in numpy.

The gradient checks are the point: the clipped surrogate must pass the plain
policy gradient ``-A * ratio / N`` wherever the unclipped branch is the
minimum and exactly zero where the clipped branch is, and no gradient may flow
into advantages or value targets. Every check runs eagerly and under jit.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async.core.losses import ppo_loss

CLIP_EPS = 0.2
# One batch size throughout: eagerly, every primitive compiles once per shape,
# so a shared N keeps the eager half of the suite from recompiling per test.
N = 16
METRIC_NAMES = {"policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"}


def _random_inputs(rng, n=N):
    """Per-sample loss inputs ``[n]`` as float32 jax arrays, ratios near 1."""
    proximal_logp = -np.abs(rng.standard_normal(n))
    logp = proximal_logp + 0.3 * rng.standard_normal(n)
    old_values = rng.standard_normal(n)
    return dict(
        logp=logp,
        proximal_logp=proximal_logp,
        advantages=rng.standard_normal(n),
        values=old_values + 0.5 * rng.standard_normal(n),
        old_values=old_values,
        value_targets=rng.standard_normal(n),
        entropy=np.abs(rng.standard_normal(n)),
    )


def _as_jax(inputs):
    return {name: jnp.asarray(value, jnp.float32) for name, value in inputs.items()}


def _loss_fn(**options):
    """``(inputs dict) -> (loss, metrics)`` with the hyperparameters bound."""
    options = {"clip_eps": CLIP_EPS, "vf_coef": 0.5, "ent_coef": 0.01, **options}
    return lambda inputs: ppo_loss(**inputs, **options)


def _np_policy_loss(logp, proximal_logp, advantages, clip_eps):
    ratio = np.exp(logp - proximal_logp)
    clipped = np.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return -np.mean(np.minimum(ratio * advantages, clipped * advantages))


def _np_value_loss(values, old_values, value_targets, value_clip_eps):
    error = (values - value_targets) ** 2
    if value_clip_eps is not None:
        clipped = old_values + np.clip(values - old_values, -value_clip_eps, value_clip_eps)
        error = np.maximum(error, (clipped - value_targets) ** 2)
    return 0.5 * np.mean(error)


def _f64(inputs):
    return {name: np.asarray(value, np.float64) for name, value in inputs.items()}


# --------------------------------------------------------------------------
# Policy term
# --------------------------------------------------------------------------


def test_ratio_one_is_plain_policy_gradient(maybe_jit):
    rng = np.random.default_rng(0)
    inputs = _random_inputs(rng)
    inputs["logp"] = inputs["proximal_logp"]
    inputs = _as_jax(inputs)
    loss_fn = _loss_fn(normalize_advantages=False)

    def policy_loss(logp):
        return loss_fn({**inputs, "logp": logp})[1]["policy_loss"]

    value, grad = maybe_jit(jax.value_and_grad(policy_loss))(inputs["logp"])

    advantages = np.asarray(inputs["advantages"], np.float64)
    np.testing.assert_allclose(value, -advantages.mean(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, -advantages / N, rtol=1e-5, atol=1e-8)


def test_policy_loss_matches_numpy(maybe_jit):
    rng = np.random.default_rng(1)
    inputs = _as_jax(_random_inputs(rng))
    _, metrics = maybe_jit(_loss_fn(normalize_advantages=False))(inputs)
    f64 = _f64(inputs)
    expected = _np_policy_loss(f64["logp"], f64["proximal_logp"], f64["advantages"], CLIP_EPS)
    np.testing.assert_allclose(metrics["policy_loss"], expected, rtol=1e-5, atol=1e-6)


# One sample per case; ratios are kept 1e-2 away from the clip edges so float32
# rounding cannot move a sample across one.
#            ratio  advantage  clipped branch active
_CLIP_CASES = [
    (1.00, +1.0, False),
    (1.10, +2.0, False),
    (0.90, +0.5, False),
    (1.10, -1.5, False),
    (0.85, -1.0, False),
    (1.19, +1.0, False),  # just inside 1 + eps
    (0.81, -1.0, False),  # just inside 1 - eps
    (1.21, +1.0, True),  # just outside 1 + eps, A > 0
    (1.50, +2.0, True),
    (0.79, -1.0, True),  # just outside 1 - eps, A < 0
    (0.50, -0.5, True),
    (1.50, -1.0, False),  # outside, but the unclipped term is the minimum
    (1.21, -2.0, False),
    (0.50, +1.0, False),
    (0.79, +0.5, False),
    (1.00, -1.0, False),
]


def test_clipping_zeroes_gradient_exactly_where_clipped_branch_is_active(maybe_jit):
    ratio = np.array([case[0] for case in _CLIP_CASES])
    advantages = np.array([case[1] for case in _CLIP_CASES])
    clipped_active = np.array([case[2] for case in _CLIP_CASES])
    n = len(_CLIP_CASES)
    assert n == N
    proximal_logp = np.full(n, -1.0)
    inputs = _as_jax(dict(
        logp=proximal_logp + np.log(ratio), proximal_logp=proximal_logp, advantages=advantages,
        values=np.zeros(n), old_values=np.zeros(n), value_targets=np.zeros(n),
        entropy=np.zeros(n),
    ))
    loss_fn = _loss_fn(normalize_advantages=False)

    def loss_of_logp(logp):
        return loss_fn({**inputs, "logp": logp})

    (_, metrics), grad = maybe_jit(jax.value_and_grad(loss_of_logp, has_aux=True))(
        inputs["logp"]
    )
    grad = np.asarray(grad)

    np.testing.assert_array_equal(grad[clipped_active], 0.0)
    assert np.all(grad[~clipped_active] != 0.0)
    # d/dlogp of -ratio * A / N, with d ratio / d logp = ratio.
    np.testing.assert_allclose(
        grad[~clipped_active], -(ratio * advantages)[~clipped_active] / n, rtol=1e-5
    )
    f64 = _f64(inputs)
    np.testing.assert_allclose(
        metrics["policy_loss"],
        _np_policy_loss(f64["logp"], f64["proximal_logp"], f64["advantages"], CLIP_EPS),
        rtol=1e-5,
    )
    # clip_fraction counts |ratio - 1| > eps whatever the advantage's sign.
    np.testing.assert_allclose(
        metrics["clip_fraction"], np.mean(np.abs(ratio - 1.0) > CLIP_EPS), rtol=1e-6
    )


def test_clip_fraction_matches_numpy_on_random_ratios(maybe_jit):
    rng = np.random.default_rng(2)
    inputs = _random_inputs(rng)
    # Log-ratios in [-0.4, 0.4], kept clear of the clip edges (float32 rounding).
    log_ratio = rng.uniform(-0.4, 0.4, size=4 * N)
    edges = np.log([1.0 - CLIP_EPS, 1.0 + CLIP_EPS])
    clear = np.abs(log_ratio[:, None] - edges).min(axis=1) > 1e-3
    log_ratio = log_ratio[clear][:N]
    inputs["logp"] = inputs["proximal_logp"] + log_ratio
    _, metrics = maybe_jit(_loss_fn())(_as_jax(inputs))
    expected = np.mean(np.abs(np.exp(log_ratio) - 1.0) > CLIP_EPS)
    assert 0.1 < expected < 0.9  # the case is not degenerate
    np.testing.assert_allclose(metrics["clip_fraction"], expected, rtol=1e-6)


def test_approx_kl_nonnegative_and_zero_at_ratio_one(maybe_jit):
    rng = np.random.default_rng(3)
    loss_fn = maybe_jit(_loss_fn())
    for _ in range(5):
        inputs = _random_inputs(rng)
        inputs["logp"] = inputs["proximal_logp"] + rng.standard_normal(N)
        _, metrics = loss_fn(_as_jax(inputs))
        log_ratio = np.float32(inputs["logp"]) - np.float32(inputs["proximal_logp"])
        expected = np.mean(np.expm1(log_ratio.astype(np.float64)) - log_ratio)
        assert metrics["approx_kl"] >= 0.0
        np.testing.assert_allclose(metrics["approx_kl"], expected, rtol=1e-4)

    inputs = _random_inputs(rng)
    inputs["logp"] = inputs["proximal_logp"]
    _, metrics = loss_fn(_as_jax(inputs))
    assert metrics["approx_kl"] == 0.0
    assert metrics["clip_fraction"] == 0.0


def test_normalize_advantages_standardises(maybe_jit):
    rng = np.random.default_rng(4)
    inputs = _random_inputs(rng)
    inputs["advantages"] = 5.0 + 3.0 * inputs["advantages"]
    inputs["logp"] = inputs["proximal_logp"]
    inputs = _as_jax(inputs)
    loss_fn = _loss_fn(normalize_advantages=True)

    def policy_loss(logp, advantages):
        return loss_fn({**inputs, "logp": logp, "advantages": advantages})[1]["policy_loss"]

    value, grad = maybe_jit(jax.value_and_grad(policy_loss))(
        inputs["logp"], inputs["advantages"]
    )

    # At ratio 1 the gradient w.r.t. logp is -A_used / N, exposing A_used.
    advantages = np.asarray(inputs["advantages"], np.float64)
    standardised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    np.testing.assert_allclose(grad, -standardised / N, rtol=1e-4, atol=1e-6)
    assert abs(float(value)) < 1e-6  # -mean of standardised advantages
    # Away from ratio 1, the same loss for a positive affine map of the advantages.
    logp = inputs["proximal_logp"] + jnp.asarray(0.3 * rng.standard_normal(N), jnp.float32)
    np.testing.assert_allclose(
        policy_loss(logp, 0.5 * inputs["advantages"] - 2.0),
        policy_loss(logp, inputs["advantages"]),
        rtol=1e-5, atol=1e-6,
    )


# --------------------------------------------------------------------------
# Value term, total, gradients
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value_clip_eps", [None, 0.2])
def test_value_loss_matches_numpy(maybe_jit, value_clip_eps):
    rng = np.random.default_rng(5)
    inputs = _as_jax(_random_inputs(rng))
    _, metrics = maybe_jit(_loss_fn(value_clip_eps=value_clip_eps))(inputs)
    f64 = _f64(inputs)
    expected = _np_value_loss(
        f64["values"], f64["old_values"], f64["value_targets"], value_clip_eps
    )
    np.testing.assert_allclose(metrics["value_loss"], expected, rtol=1e-5)


def test_value_clip_golden_case(maybe_jit):
    # Sample 0: V moved 2 from old V = 0 toward nothing; target 0.
    #   unclipped (2 - 0)^2 = 4, clipped (0.5 - 0)^2 = 0.25 -> max 4.
    # Sample 1: V moved 0.2 toward target 1 from old V = 0, clip 0.1.
    #   unclipped (0.2 - 1)^2 = 0.64, clipped (0.1 - 1)^2 = 0.81 -> max 0.81.
    # Sample 2: V within the clip: both terms (0.05 - 1)^2 = 0.9025.
    values = jnp.array([2.0, 0.2, 0.05])
    inputs = dict(
        logp=jnp.zeros(3), proximal_logp=jnp.zeros(3), advantages=jnp.zeros(3),
        values=values, old_values=jnp.zeros(3),
        value_targets=jnp.array([0.0, 1.0, 1.0]), entropy=jnp.zeros(3),
    )
    loss_fn = _loss_fn(value_clip_eps=0.1, normalize_advantages=False)
    clipped_eps_half = _loss_fn(value_clip_eps=0.5, normalize_advantages=False)

    def value_loss(v, fn):
        return fn({**inputs, "values": v})[1]["value_loss"]

    value, grad = maybe_jit(jax.value_and_grad(lambda v: value_loss(v, loss_fn)))(values)
    # Sample 0 with eps 0.5 picks the unclipped term as well.
    np.testing.assert_allclose(value_loss(values, clipped_eps_half),
                               0.5 * (4.0 + 0.64 + 0.9025) / 3, rtol=1e-6)
    np.testing.assert_allclose(value, 0.5 * (4.0 + 0.81 + 0.9025) / 3, rtol=1e-6)
    # Sample 1 takes the clipped branch, whose value is constant in V.
    np.testing.assert_allclose(grad, [2.0 / 3, 0.0, (0.05 - 1.0) / 3], rtol=1e-5)


def test_total_loss_combines_terms(maybe_jit):
    rng = np.random.default_rng(6)
    inputs = _as_jax(_random_inputs(rng))
    loss, metrics = maybe_jit(
        _loss_fn(vf_coef=0.7, ent_coef=0.05, value_clip_eps=0.3)
    )(inputs)
    assert set(metrics) == METRIC_NAMES
    for value in metrics.values():
        assert value.shape == ()
    np.testing.assert_allclose(
        metrics["entropy"], np.mean(np.float64(inputs["entropy"])), rtol=1e-6
    )
    expected = (
        metrics["policy_loss"] + 0.7 * metrics["value_loss"] - 0.05 * metrics["entropy"]
    )
    np.testing.assert_allclose(loss, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("normalize_advantages", [False, True])
@pytest.mark.parametrize("value_clip_eps", [None, 0.2])
def test_gradients_finite_and_none_into_targets(maybe_jit, normalize_advantages,
                                                value_clip_eps):
    rng = np.random.default_rng(7)
    inputs = _as_jax(_random_inputs(rng))
    loss_fn = _loss_fn(normalize_advantages=normalize_advantages,
                       value_clip_eps=value_clip_eps)

    loss, grads = maybe_jit(jax.value_and_grad(lambda x: loss_fn(x)[0]))(inputs)

    chex.assert_tree_all_finite((loss, grads))
    np.testing.assert_array_equal(grads["advantages"], 0.0)
    np.testing.assert_array_equal(grads["value_targets"], 0.0)
    np.testing.assert_array_equal(grads["proximal_logp"], -grads["logp"])
    # The entropy bonus: d loss / d entropy = -ent_coef / N.
    np.testing.assert_allclose(grads["entropy"], np.full(N, -0.01 / N), rtol=1e-5)
    assert np.any(grads["logp"] != 0.0) and np.any(grads["values"] != 0.0)


def test_jit_and_eager_agree():
    rng = np.random.default_rng(8)
    inputs = _as_jax(_random_inputs(rng))
    loss_fn = _loss_fn(value_clip_eps=0.2)
    eager = loss_fn(inputs)
    jitted = jax.jit(loss_fn)(inputs)
    chex.assert_trees_all_close(eager, jitted, rtol=1e-6, atol=1e-7)


def test_shape_checks():
    inputs = _as_jax(_random_inputs(np.random.default_rng(9)))
    with pytest.raises(AssertionError):
        _loss_fn()({**inputs, "values": jnp.zeros(N - 1)})
    with pytest.raises(AssertionError):
        _loss_fn()({name: value[None] for name, value in inputs.items()})
