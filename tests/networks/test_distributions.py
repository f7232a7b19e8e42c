"""Categorical and DiagGaussian against closed forms written out in numpy.

Every check runs eagerly and under ``jax.jit`` (the distribution crosses the
jit boundary as a pytree argument). Sampling checks use 5-sigma bounds: they
cannot fail by chance at the fixed seeds, but a wrong sampler (wrong
temperature, wrong scale, an ignored axis) moves the statistics by hundreds of
sigmas.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.networks.distributions import Categorical, DiagGaussian

NUM_DRAWS = 20_000


def _np_log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _random_logits(rng, shape):
    return (3.0 * rng.standard_normal(shape)).astype(np.float32)


# --------------------------------------------------------------------------
# Categorical
# --------------------------------------------------------------------------


def test_categorical_log_prob_matches_numpy(maybe_jit):
    rng = np.random.default_rng(0)
    logits = _random_logits(rng, (2, 3, 5))  # [T, B, num_actions]
    actions = rng.integers(0, 5, size=(2, 3))  # [T, B]

    log_prob = maybe_jit(lambda dist, a: dist.log_prob(a))(
        Categorical(jnp.asarray(logits)), jnp.asarray(actions, jnp.int32)
    )

    expected = np.take_along_axis(
        _np_log_softmax(logits.astype(np.float64)), actions[..., None], axis=-1
    )[..., 0]
    assert log_prob.shape == (2, 3)
    np.testing.assert_allclose(log_prob, expected, rtol=1e-5, atol=1e-5)


def test_categorical_log_prob_normalises_over_all_actions(maybe_jit):
    rng = np.random.default_rng(0)
    logits = jnp.asarray(_random_logits(rng, (4, 6)))
    every_action = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (4, 6))

    # log_prob over [4] for each of the 6 actions, as [6, 4].
    log_probs = maybe_jit(
        lambda dist, a: jax.vmap(dist.log_prob, in_axes=1)(a)
    )(Categorical(logits), every_action)

    np.testing.assert_allclose(np.exp(log_probs).sum(axis=0), np.ones(4), rtol=1e-5)


def test_categorical_log_prob_is_stable_for_large_logits(maybe_jit):
    logits = jnp.array([[1000.0, 0.0, -1000.0]])
    log_prob = maybe_jit(lambda dist, a: dist.log_prob(a))(
        Categorical(logits), jnp.array([1], jnp.int32)
    )
    np.testing.assert_allclose(log_prob, [-1000.0], rtol=1e-6)


def test_categorical_entropy_matches_numpy(maybe_jit):
    rng = np.random.default_rng(0)
    logits = _random_logits(rng, (7, 4))

    entropy = maybe_jit(lambda dist: dist.entropy())(Categorical(jnp.asarray(logits)))

    log_p = _np_log_softmax(logits.astype(np.float64))
    expected = -(np.exp(log_p) * log_p).sum(axis=-1)
    assert entropy.shape == (7,)
    np.testing.assert_allclose(entropy, expected, rtol=1e-5, atol=1e-6)


def test_categorical_entropy_golden_cases(maybe_jit):
    # Uniform over 4: log 4. A (numerically) deterministic policy: 0.
    logits = jnp.array([[0.0, 0.0, 0.0, 0.0], [50.0, -50.0, -50.0, -50.0]])
    entropy = maybe_jit(lambda dist: dist.entropy())(Categorical(logits))
    np.testing.assert_allclose(entropy, [math.log(4.0), 0.0], atol=1e-6)


def test_categorical_sample_frequencies_match_probabilities(maybe_jit):
    logits = np.array(
        [[0.0, 1.0, 2.0, -1.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
        np.float32,
    )  # [B=3, num_actions=4]
    # One draw per row of a [NUM_DRAWS, B, num_actions] batch.
    dist = Categorical(jnp.broadcast_to(jnp.asarray(logits), (NUM_DRAWS, 3, 4)))

    samples = maybe_jit(lambda d, key: d.sample(key))(
        dist, jax.random.key(0)
    )  # [NUM_DRAWS, B]

    assert samples.shape == (NUM_DRAWS, 3)
    assert samples.dtype == jnp.int32
    samples = np.asarray(samples)
    assert samples.min() >= 0 and samples.max() < 4
    probs = np.exp(_np_log_softmax(logits.astype(np.float64)))  # [B, A]
    counts = np.stack(
        [np.bincount(samples[:, row], minlength=4) for row in range(3)]
    )  # [B, A]
    expected = NUM_DRAWS * probs
    sigma = np.sqrt(NUM_DRAWS * probs * (1.0 - probs))
    np.testing.assert_array_less(np.abs(counts - expected), 5.0 * sigma)
    # Draws in different rows of the batch are not the same draw.
    assert np.mean(samples[:, 0] == samples[:, 2]) < 0.5


def test_categorical_mode_is_argmax(maybe_jit):
    rng = np.random.default_rng(0)
    logits = _random_logits(rng, (3, 5, 6))
    mode = maybe_jit(lambda dist: dist.mode())(Categorical(jnp.asarray(logits)))
    assert mode.dtype == jnp.int32
    np.testing.assert_array_equal(mode, logits.argmax(axis=-1))


# --------------------------------------------------------------------------
# DiagGaussian
# --------------------------------------------------------------------------


def _np_gaussian_log_density(x, mean, std):
    """Sum over the last axis of log N(x; mean, std^2), from the density."""
    density = np.exp(-0.5 * ((x - mean) / std) ** 2) / (std * np.sqrt(2.0 * np.pi))
    return np.log(density).sum(axis=-1)


def _random_gaussian(rng, batch, action_dim):
    mean = rng.standard_normal((batch, action_dim)).astype(np.float32)
    log_std = (0.5 * rng.standard_normal(action_dim)).astype(np.float32)
    return mean, log_std


def test_gaussian_log_prob_matches_density_formula(maybe_jit):
    rng = np.random.default_rng(0)
    mean, log_std = _random_gaussian(rng, batch=8, action_dim=3)
    actions = (mean + rng.standard_normal((8, 3))).astype(np.float32)

    log_prob = maybe_jit(lambda dist, a: dist.log_prob(a))(
        DiagGaussian(jnp.asarray(mean), jnp.asarray(log_std)), jnp.asarray(actions)
    )

    expected = _np_gaussian_log_density(
        actions.astype(np.float64), mean.astype(np.float64),
        np.exp(log_std.astype(np.float64)),
    )
    assert log_prob.shape == (8,)
    np.testing.assert_allclose(log_prob, expected, rtol=1e-5, atol=1e-5)


def test_gaussian_log_prob_with_full_shape_log_std(maybe_jit):
    # log_std may also carry the batch axes (e.g. a state-dependent std).
    rng = np.random.default_rng(1)
    mean = rng.standard_normal((4, 2)).astype(np.float32)
    log_std = (0.3 * rng.standard_normal((4, 2))).astype(np.float32)
    actions = rng.standard_normal((4, 2)).astype(np.float32)

    log_prob = maybe_jit(lambda dist, a: dist.log_prob(a))(
        DiagGaussian(jnp.asarray(mean), jnp.asarray(log_std)), jnp.asarray(actions)
    )

    expected = _np_gaussian_log_density(
        actions.astype(np.float64), mean.astype(np.float64),
        np.exp(log_std.astype(np.float64)),
    )
    np.testing.assert_allclose(log_prob, expected, rtol=1e-5, atol=1e-5)


def test_gaussian_log_prob_golden_case(maybe_jit):
    # Standard normal in 2-D at the origin: -log(2 pi).
    log_prob = maybe_jit(lambda dist, a: dist.log_prob(a))(
        DiagGaussian(jnp.zeros((1, 2)), jnp.zeros(2)), jnp.zeros((1, 2))
    )
    np.testing.assert_allclose(log_prob, [-math.log(2.0 * math.pi)], rtol=1e-6)


def test_gaussian_entropy_matches_closed_form(maybe_jit):
    rng = np.random.default_rng(0)
    mean, log_std = _random_gaussian(rng, batch=5, action_dim=3)

    entropy = maybe_jit(lambda dist: dist.entropy())(
        DiagGaussian(jnp.asarray(mean), jnp.asarray(log_std))
    )

    sigma = np.exp(log_std.astype(np.float64))
    per_sample = (0.5 * np.log(2.0 * np.pi * np.e * sigma**2)).sum()
    assert entropy.shape == (5,)
    np.testing.assert_allclose(entropy, np.full(5, per_sample), rtol=1e-5)


def test_gaussian_sample_mean_and_std(maybe_jit):
    mean = np.array([[0.0, 5.0, -2.0], [1.0, -1.0, 0.5]], np.float32)  # [B, D]
    log_std = np.log(np.array([0.1, 1.0, 3.0], np.float32))  # [D]
    # One draw per row of a [NUM_DRAWS, B, D] batch; log_std stays [D].
    dist = DiagGaussian(
        jnp.broadcast_to(jnp.asarray(mean), (NUM_DRAWS, 2, 3)), jnp.asarray(log_std)
    )

    samples = maybe_jit(lambda d, key: d.sample(key))(
        dist, jax.random.key(0)
    )  # [NUM_DRAWS, B, D]

    assert samples.shape == (NUM_DRAWS, 2, 3)
    assert samples.dtype == jnp.float32
    samples = np.asarray(samples, np.float64)
    std = np.broadcast_to(np.exp(log_std.astype(np.float64)), mean.shape)
    # Standard errors of the sample mean and (for a Gaussian) the sample std.
    mean_error = std / np.sqrt(NUM_DRAWS)
    std_error = std / np.sqrt(2.0 * NUM_DRAWS)
    np.testing.assert_array_less(np.abs(samples.mean(axis=0) - mean), 5.0 * mean_error)
    np.testing.assert_array_less(np.abs(samples.std(axis=0) - std), 5.0 * std_error)
    # Dimensions and batch rows get independent noise.
    noise = (samples - mean) / std
    correlation = np.corrcoef(noise.reshape(NUM_DRAWS, -1), rowvar=False)
    off_diagonal = correlation[~np.eye(6, dtype=bool)]
    assert np.abs(off_diagonal).max() < 5.0 / np.sqrt(NUM_DRAWS)


def test_gaussian_mode_is_mean(maybe_jit):
    rng = np.random.default_rng(0)
    mean, log_std = _random_gaussian(rng, batch=4, action_dim=2)
    mode = maybe_jit(lambda dist: dist.mode())(
        DiagGaussian(jnp.asarray(mean), jnp.asarray(log_std))
    )
    np.testing.assert_array_equal(mode, mean)


def test_gaussian_broadcasts_action_dim_log_std_against_batch(maybe_jit):
    # The network's log_std is a [action_dim] parameter; the mean is
    # [batch, action_dim]. With rank promotion set to raise (conftest), any
    # implicit broadcast inside the distribution would error here.
    assert jax.config.jax_numpy_rank_promotion == "raise"
    rng = np.random.default_rng(0)
    mean, log_std = _random_gaussian(rng, batch=6, action_dim=2)
    dist = DiagGaussian(jnp.asarray(mean), jnp.asarray(log_std))

    def everything(d, key):
        actions = d.sample(key)
        return actions, d.log_prob(actions), d.entropy(), d.mode()

    actions, log_prob, entropy, mode = maybe_jit(everything)(dist, jax.random.key(0))

    assert actions.shape == (6, 2)
    assert log_prob.shape == (6,)
    assert entropy.shape == (6,)
    assert mode.shape == (6, 2)
    # Same values as with log_std tiled to the mean's shape explicitly.
    tiled = DiagGaussian(dist.mean, jnp.broadcast_to(dist.log_std, dist.mean.shape))
    np.testing.assert_allclose(log_prob, tiled.log_prob(actions), rtol=1e-6)
    np.testing.assert_allclose(entropy, tiled.entropy(), rtol=1e-6)
