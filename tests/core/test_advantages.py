"""Tests for ppo_async.core.advantages (GAE and V-trace).

The library kernels are compared with the independent float64 forward-sum
references in ``tests/reference.py``, with hand-derived golden cases, with the
identities that tie the two together (on-policy V-trace with c_bar = rho_bar = 1
is GAE with the same lambda; docs/design.md, "The math"), and with
shape/gradient contracts.
"""

from __future__ import annotations

import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async.core.advantages import VTraceOutput, gae, vtrace

from reference import gae_reference, vtrace_reference

GAMMA = 0.99
TOL = 1e-5  # float32 agreement: |lib - ref| <= TOL * max(1, |ref|_max) + TOL * |ref|


def assert_close(actual, expected, tol=TOL):
    """Elementwise agreement to ~1e-5, relative to the magnitude of the targets."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale)


def make_trajectory(seed, T, B, gamma=GAMMA, p_done=0.1):
    """Random float32 [T, B] trajectory with terminals inside it."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    done = rng.random(size=(T, B)) < p_done
    discounts = (gamma * (1.0 - done)).astype(np.float32)
    bootstrap_value = rng.normal(size=(B,)).astype(np.float32)
    log_rhos = rng.normal(scale=0.5, size=(T, B)).astype(np.float32)
    return rewards, values, discounts, bootstrap_value, log_rhos, done


# --------------------------------------------------------------------------
# On a small CPU machine each distinct compiled program costs ~0.3 s, so the
# wide sweeps below use one jitted kernel per input shape with the
# hyperparameters *traced* (jax.jit traces Python-float keyword arguments; the
# kernels only use them arithmetically, and pg_rho_bar=None is static pytree
# structure). The documented ways to call the kernels -- plain eager calls and
# jit with the hyperparameters static or closed over -- are exercised
# separately, on a covering subset of settings.
_gae_jit_traced = jax.jit(gae)
_vtrace_jit_traced = jax.jit(vtrace)


def gae_sweep(rewards, values, discounts, bootstrap_value, *, lambda_):
    return _gae_jit_traced(rewards, values, discounts, bootstrap_value, lambda_=lambda_)


def vtrace_sweep(
    rewards, values, discounts, bootstrap_value, log_rhos,
    *, lambda_=1.0, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None,
):
    # Always pass every keyword, so each input shape compiles at most twice
    # (pg_rho_bar None or not), whatever the caller spells out.
    return _vtrace_jit_traced(
        rewards, values, discounts, bootstrap_value, log_rhos,
        lambda_=lambda_, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar,
    )


LAMBDAS = [0.0, 0.5, 0.95, 1.0]
BAR_VALUES = [0.5, 1.0, 2.0]
PG_RHO_BARS = [None, 0.5, 1.0, 2.0]
T0, B0 = 16, 5  # main random shape


# --------------------------------------------------------------------------
# Random trajectories vs. the reference.


def _gae_data(lambda_):
    return make_trajectory(10 + int(100 * lambda_), T0, B0)[:4]


@pytest.fixture(scope="module")
def gae_closed_over_outputs():
    """gae under jit, lambda_ closed over, every lambda_ in one compiled program."""

    @jax.jit
    def run(all_data):
        return [gae(*data, lambda_=lam) for lam, data in zip(LAMBDAS, all_data)]

    return dict(zip(LAMBDAS, run([_gae_data(lam) for lam in LAMBDAS])))


@pytest.mark.parametrize("lambda_", LAMBDAS)
def test_gae_matches_reference(lambda_, gae_closed_over_outputs):
    rewards, values, discounts, bootstrap = data = _gae_data(lambda_)
    assert np.any(discounts == 0), "the trajectory should contain terminals"
    ref_adv, ref_targets = gae_reference(rewards, values, discounts, bootstrap, lambda_)
    eager = gae(*data, lambda_=lambda_)
    for adv, targets in (eager, gae_closed_over_outputs[lambda_]):
        chex.assert_shape([adv, targets], (T0, B0))
        chex.assert_type([adv, targets], jnp.float32)
        assert_close(adv, ref_adv)
        assert_close(targets, ref_targets)


@pytest.mark.parametrize("T,B", [(1, 1), (7, 3)])
def test_gae_matches_reference_other_shapes(T, B):
    rewards, values, discounts, bootstrap, _, _ = make_trajectory(20 + T, T, B)
    for lambda_ in LAMBDAS:
        ref = gae_reference(rewards, values, discounts, bootstrap, lambda_)
        got = gae_sweep(rewards, values, discounts, bootstrap, lambda_=lambda_)
        for a, b in zip(got, ref):
            assert_close(a, b)
    # jit with lambda_ as a static argument.
    static = jax.jit(gae, static_argnames=("lambda_",))
    ref = gae_reference(rewards, values, discounts, bootstrap, 0.95)
    for a, b in zip(static(rewards, values, discounts, bootstrap, lambda_=0.95), ref):
        assert_close(a, b)


# Covering subset for the documented call styles: every lambda_ twice, every
# bar value below / at / above 1 for rho_bar and c_bar, pg_rho_bar None and
# explicit, both below and above rho_bar.
VTRACE_CONFIGS = [
    # lambda_, rho_bar, c_bar, pg_rho_bar
    (0.0, 0.5, 2.0, None),
    (0.0, 2.0, 0.5, 1.0),
    (0.5, 1.0, 1.0, None),
    (0.5, 0.5, 0.5, 2.0),
    (0.95, 2.0, 2.0, 0.5),
    (0.95, 1.0, 0.5, None),
    (1.0, 2.0, 2.0, None),
    (1.0, 0.5, 1.0, 2.0),
]
_VTRACE_KEYS = ("lambda_", "rho_bar", "c_bar", "pg_rho_bar")


def _vtrace_data(config):
    lambda_, rho_bar, c_bar, _ = config
    seed = int(100 * lambda_) + int(10 * rho_bar) + int(1000 * c_bar)
    return make_trajectory(seed, T0, B0)[:5]


@pytest.fixture(scope="module")
def vtrace_closed_over_outputs():
    """vtrace under jit, hyperparameters closed over, all configs in one program."""

    @jax.jit
    def run(all_data):
        return [
            vtrace(*data, **dict(zip(_VTRACE_KEYS, config)))
            for config, data in zip(VTRACE_CONFIGS, all_data)
        ]

    return dict(zip(VTRACE_CONFIGS, run([_vtrace_data(c) for c in VTRACE_CONFIGS])))


@pytest.mark.parametrize("config", VTRACE_CONFIGS, ids=str)
def test_vtrace_matches_reference(config, vtrace_closed_over_outputs):
    data = _vtrace_data(config)
    assert np.any(data[2] == 0), "the trajectory should contain terminals"
    kwargs = dict(zip(_VTRACE_KEYS, config))
    ref = vtrace_reference(*data, **kwargs)
    eager = vtrace(*data, **kwargs)
    for out in (eager, vtrace_closed_over_outputs[config]):
        assert isinstance(out, VTraceOutput)
        chex.assert_shape(list(out), (T0, B0))
        chex.assert_type(list(out), jnp.float32)
        for got, want in zip(out, ref):
            assert_close(got, want)


@pytest.mark.parametrize("lambda_", [0.5, 1.0])
def test_vtrace_unweighted_pg_advantages_match_reference(lambda_):
    rewards, values, discounts, bootstrap, log_rhos, _ = make_trajectory(77, T0, B0)
    kwargs = dict(lambda_=lambda_, rho_bar=1.0, c_bar=1.0)
    out = vtrace(rewards, values, discounts, bootstrap, log_rhos, weight_pg=False, **kwargs)
    targets, advantages, _ = vtrace_reference(rewards, values, discounts, bootstrap, log_rhos,
                                              weight_pg=False, **kwargs)
    assert_close(out.value_targets, targets)
    assert_close(out.pg_advantages, advantages)
    # The weighted advantages differ from these by exactly the clipped rho.
    weighted = vtrace(rewards, values, discounts, bootstrap, log_rhos, **kwargs)
    assert_close(weighted.pg_advantages, np.minimum(1.0, np.exp(log_rhos)) * advantages)
    assert np.abs(np.asarray(weighted.pg_advantages) - advantages).max() > 1e-2


@pytest.mark.parametrize("lambda_", LAMBDAS)
def test_vtrace_matches_reference_full_grid(lambda_):
    """Every (rho_bar, c_bar, pg_rho_bar) in {0.5, 1, 2}^2 x {None, 0.5, 1, 2}."""
    for i, (rho_bar, c_bar, pg_rho_bar) in enumerate(
        itertools.product(BAR_VALUES, BAR_VALUES, PG_RHO_BARS)
    ):
        rewards, values, discounts, bootstrap, log_rhos, _ = make_trajectory(
            500 + 50 * int(100 * lambda_) + i, T0, B0
        )
        kwargs = dict(lambda_=lambda_, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar)
        ref = vtrace_reference(rewards, values, discounts, bootstrap, log_rhos, **kwargs)
        out = vtrace_sweep(rewards, values, discounts, bootstrap, log_rhos, **kwargs)
        for name, got, want in zip(VTraceOutput._fields, out, ref):
            try:
                assert_close(got, want)
            except AssertionError as e:
                raise AssertionError(f"{name} differs for {kwargs}") from e


@pytest.mark.parametrize("T,B", [(1, 1), (7, 3)])
def test_vtrace_jit_static_argnames_matches_reference(T, B):
    rewards, values, discounts, bootstrap, log_rhos, _ = make_trajectory(11 + T, T, B)
    jitted = jax.jit(
        vtrace, static_argnames=("lambda_", "rho_bar", "c_bar", "pg_rho_bar")
    )
    kwargs = dict(lambda_=0.95, rho_bar=2.0, c_bar=0.5, pg_rho_bar=1.0)
    out = jitted(rewards, values, discounts, bootstrap, log_rhos, **kwargs)
    ref = vtrace_reference(rewards, values, discounts, bootstrap, log_rhos, **kwargs)
    for a, b in zip(out, ref):
        assert_close(a, b)


def test_vtrace_defaults():
    """Defaults are lambda_=1, rho_bar=c_bar=1, pg_rho_bar=rho_bar."""
    rewards, values, discounts, bootstrap, log_rhos, _ = make_trajectory(3, T0, B0)
    out = vtrace(rewards, values, discounts, bootstrap, log_rhos)
    ref = vtrace_reference(
        rewards, values, discounts, bootstrap, log_rhos,
        lambda_=1.0, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0,
    )
    for a, b in zip(out, ref):
        assert_close(a, b)
    # pg_rho_bar=None means rho_bar, whatever rho_bar is.
    for rho_bar in (0.5, 2.0):
        none = vtrace_sweep(rewards, values, discounts, bootstrap, log_rhos, rho_bar=rho_bar)
        explicit = vtrace_sweep(
            rewards, values, discounts, bootstrap, log_rhos,
            rho_bar=rho_bar, pg_rho_bar=rho_bar,
        )
        np.testing.assert_array_equal(none.pg_advantages, explicit.pg_advantages)


# --------------------------------------------------------------------------
# Hand-checkable golden cases.
#
# T = 4, B = 1, gamma = 0.9, V = [1, 2, 1, 3], bootstrap V(x_4) = 100.
#   t=0: ordinary step,   r = 1,                          discount 0.9
#   t=1: terminal,        r = 3,                          discount 0
#   t=2: ordinary step,   r = 0,                          discount 0.9
#   t=3: truncated,       raw reward 1, V(final_obs) = 2, so the runtime
#                         folds r = 1 + 0.9 * 2 = 2.8 in, discount 0
# The huge bootstrap (100) must never leak: the last step's discount is 0.
#
# One-step TD errors delta_t = r_t + d_t V_{t+1} - V_t:
#   delta_0 = 1 + 0.9*2 - 1   = 1.8
#   delta_1 = 3 + 0   - 2     = 1.0
#   delta_2 = 0 + 0.9*3 - 1   = 1.7
#   delta_3 = 2.8 + 0*100 - 3 = -0.2

G_REWARDS = np.array([[1.0], [3.0], [0.0], [2.8]], np.float32)
G_VALUES = np.array([[1.0], [2.0], [1.0], [3.0]], np.float32)
G_DISCOUNTS = np.array([[0.9], [0.0], [0.9], [0.0]], np.float32)
G_BOOTSTRAP = np.array([100.0], np.float32)

GAE_GOLDEN = {
    # lambda_ = 0: A_t = delta_t; targets = r_t + d_t V_{t+1}.
    0.0: ([1.8, 1.0, 1.7, -0.2], [2.8, 3.0, 2.7, 2.8]),
    # lambda_ = 0.5 (d*lambda = 0.45 on ordinary steps):
    #   A_3 = -0.2
    #   A_2 = 1.7 + 0.45 * (-0.2) = 1.61
    #   A_1 = 1.0              (discount 0 cuts the trace)
    #   A_0 = 1.8 + 0.45 * 1.0 = 2.25
    #   targets = A + V = [3.25, 3.0, 2.61, 2.8]
    0.5: ([2.25, 1.0, 1.61, -0.2], [3.25, 3.0, 2.61, 2.8]),
    # lambda_ = 1: targets are the Monte-Carlo returns within each episode:
    #   G_0 = 1 + 0.9*3 = 3.7, G_1 = 3, G_2 = 0 + 0.9*2.8 = 2.52, G_3 = 2.8
    #   A = G - V = [2.7, 1.0, 1.52, -0.2]
    1.0: ([2.7, 1.0, 1.52, -0.2], [3.7, 3.0, 2.52, 2.8]),
}


@pytest.mark.parametrize("lambda_", sorted(GAE_GOLDEN))
def test_gae_golden(lambda_):
    expected_adv, expected_targets = (
        np.array(x, np.float64)[:, None] for x in GAE_GOLDEN[lambda_]
    )
    adv, targets = gae(G_REWARDS, G_VALUES, G_DISCOUNTS, G_BOOTSTRAP, lambda_=lambda_)
    np.testing.assert_allclose(adv, expected_adv, atol=1e-5)
    np.testing.assert_allclose(targets, expected_targets, atol=1e-5)
    # The reference agrees with the hand derivation too.
    ref_adv, ref_targets = gae_reference(
        G_REWARDS, G_VALUES, G_DISCOUNTS, G_BOOTSTRAP, lambda_
    )
    np.testing.assert_allclose(ref_adv, expected_adv, atol=1e-5)
    np.testing.assert_allclose(ref_targets, expected_targets, atol=1e-5)


# V-trace on the same trajectory with rhos = exp(log_rhos) = [2, 0.5, 0.5, 2],
# lambda_ = 0.5, rho_bar = c_bar = 1:
#   clipped rho_t = min(1, rho_t)        = [1, 0.5, 0.5, 1]
#   c_t = 0.5 * min(1, rho_t)            = [0.5, 0.25, 0.25, 0.5]
#   rho_t * delta_t                      = [1.8, 0.5, 0.85, -0.2]
# v_s - V_s = sum_t (prod_{s<=i<t} d_i c_i) rho_t delta_t:
#   s=3: -0.2
#   s=2: 0.85 + (0.9*0.25) * (-0.2) = 0.85 - 0.045 = 0.805
#   s=1: 0.5                        (d_1 = 0)
#   s=0: 1.8 + (0.9*0.5) * 0.5      = 1.8 + 0.225 = 2.025
#   v = [3.025, 2.5, 1.805, 2.8]
# q_s = r_s + d_s (0.5 v_{s+1} + 0.5 V_{s+1}):
#   q_0 = 1 + 0.9*(0.5*2.5 + 0.5*2)   = 1 + 0.9*2.25 = 3.025
#   q_1 = 3                            (d_1 = 0)
#   q_2 = 0 + 0.9*(0.5*2.8 + 0.5*3)   = 0.9*2.9 = 2.61
#   q_3 = 2.8                          (d_3 = 0; the bootstrap 100 is unused)
#   q - V = [2.025, 1.0, 1.61, -0.2]
# pg_rho_bar = None (= rho_bar = 1): weights [1, 0.5, 0.5, 1]
#   pg_adv = [2.025, 0.5, 0.805, -0.2]
# pg_rho_bar = 2: weights min(2, rho) = [2, 0.5, 0.5, 2]
#   pg_adv = [4.05, 0.5, 0.805, -0.4]
G_LOG_RHOS = np.log(np.array([[2.0], [0.5], [0.5], [2.0]])).astype(np.float32)
VTRACE_GOLDEN_VS = [3.025, 2.5, 1.805, 2.8]
VTRACE_GOLDEN_RHOS = [1.0, 0.5, 0.5, 1.0]
VTRACE_GOLDEN_PG = {None: [2.025, 0.5, 0.805, -0.2], 2.0: [4.05, 0.5, 0.805, -0.4]}


@pytest.mark.parametrize("pg_rho_bar", [None, 2.0])
def test_vtrace_golden(pg_rho_bar):
    kwargs = dict(lambda_=0.5, rho_bar=1.0, c_bar=1.0, pg_rho_bar=pg_rho_bar)
    expected = (
        np.array(VTRACE_GOLDEN_VS)[:, None],
        np.array(VTRACE_GOLDEN_PG[pg_rho_bar])[:, None],
        np.array(VTRACE_GOLDEN_RHOS)[:, None],
    )
    out = vtrace(G_REWARDS, G_VALUES, G_DISCOUNTS, G_BOOTSTRAP, G_LOG_RHOS, **kwargs)
    ref = vtrace_reference(
        G_REWARDS, G_VALUES, G_DISCOUNTS, G_BOOTSTRAP, G_LOG_RHOS, **kwargs
    )
    for got, want in zip(out, expected):
        np.testing.assert_allclose(got, want, atol=1e-5)
    for got, want in zip(ref, expected):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_golden_bootstrap_does_not_leak():
    """With discount 0 at the last step, the bootstrap value is irrelevant."""
    other = np.array([-7.0], np.float32)
    for lambda_ in (0.0, 0.5, 1.0):
        a = gae_sweep(G_REWARDS, G_VALUES, G_DISCOUNTS, G_BOOTSTRAP, lambda_=lambda_)
        b = gae_sweep(G_REWARDS, G_VALUES, G_DISCOUNTS, other, lambda_=lambda_)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
        a = vtrace_sweep(G_REWARDS, G_VALUES, G_DISCOUNTS, G_BOOTSTRAP, G_LOG_RHOS, lambda_=lambda_)
        b = vtrace_sweep(G_REWARDS, G_VALUES, G_DISCOUNTS, other, G_LOG_RHOS, lambda_=lambda_)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------
# Identities.


@pytest.mark.parametrize("lambda_", LAMBDAS)
def test_on_policy_vtrace_equals_gae(lambda_):
    rewards, values, discounts, bootstrap, _, done = make_trajectory(21, 16, 5)
    assert done.any()
    zeros = np.zeros_like(rewards)
    adv, targets = gae_sweep(rewards, values, discounts, bootstrap, lambda_=lambda_)
    # bars == 1 (and > 1: clipping at >= 1 is inactive when rho == 1).
    for bar in (1.0, 2.0):
        out = vtrace_sweep(
            rewards, values, discounts, bootstrap, zeros,
            lambda_=lambda_, rho_bar=bar, c_bar=bar,
        )
        assert_close(out.value_targets - values, adv)
        assert_close(out.value_targets, targets)
        assert_close(out.pg_advantages, adv)
        np.testing.assert_array_equal(out.clipped_rhos, np.ones_like(rewards))


def _split_case(seed, T=T0, B=B0, k=T0 // 2 - 1):
    rewards, values, discounts, bootstrap, log_rhos, _ = make_trajectory(seed, T, B)
    discounts = discounts.copy()
    discounts[k] = 0.0  # every episode in the batch ends at step k
    return rewards, values, discounts, bootstrap, log_rhos, k


@pytest.mark.parametrize("lambda_", LAMBDAS)
def test_gae_split_at_terminal(lambda_):
    rewards, values, discounts, bootstrap, _, k = _split_case(31)
    full = gae_sweep(rewards, values, discounts, bootstrap, lambda_=lambda_)
    first, second = slice(0, k + 1), slice(k + 1, None)
    # First part with any bootstrap: the discount at its last step is 0.
    for first_bootstrap in (values[k + 1], np.full_like(bootstrap, 123.0)):
        head = gae_sweep(
            rewards[first], values[first], discounts[first], first_bootstrap,
            lambda_=lambda_,
        )
        for f, h in zip(full, head):
            assert_close(f[first], h)
    tail = gae_sweep(
        rewards[second], values[second], discounts[second], bootstrap, lambda_=lambda_
    )
    for f, t in zip(full, tail):
        assert_close(f[second], t)


@pytest.mark.parametrize("lambda_", LAMBDAS)
@pytest.mark.parametrize("rho_bar,c_bar,pg_rho_bar", [(1.0, 1.0, None), (0.5, 2.0, 2.0), (2.0, 0.5, 0.5)])
def test_vtrace_split_at_terminal(lambda_, rho_bar, c_bar, pg_rho_bar):
    rewards, values, discounts, bootstrap, log_rhos, k = _split_case(41)
    kwargs = dict(lambda_=lambda_, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar)
    full = vtrace_sweep(rewards, values, discounts, bootstrap, log_rhos, **kwargs)
    first, second = slice(0, k + 1), slice(k + 1, None)
    for first_bootstrap in (values[k + 1], np.full_like(bootstrap, -55.0)):
        head = vtrace_sweep(
            rewards[first], values[first], discounts[first], first_bootstrap,
            log_rhos[first], **kwargs,
        )
        for f, h in zip(full, head):
            assert_close(f[first], h)
    tail = vtrace_sweep(
        rewards[second], values[second], discounts[second], bootstrap,
        log_rhos[second], **kwargs,
    )
    for f, t in zip(full, tail):
        assert_close(f[second], t)


# --------------------------------------------------------------------------
# Shape / type contracts.

T_, B_ = T0, B0  # same shape as the random tests: reuses eager compilations
_GOOD = dict(
    rewards=np.zeros((T_, B_), np.float32),
    values=np.zeros((T_, B_), np.float32),
    discounts=np.zeros((T_, B_), np.float32),
    bootstrap_value=np.zeros((B_,), np.float32),
)
_BAD_TRAJECTORIES = {
    "rewards_rank1": dict(rewards=np.zeros((T_,), np.float32)),
    "rewards_rank3": dict(rewards=np.zeros((T_, B_, 1), np.float32)),
    "values_wrong_T": dict(values=np.zeros((T_ + 1, B_), np.float32)),
    "values_wrong_B": dict(values=np.zeros((T_, B_ + 1), np.float32)),
    "discounts_transposed": dict(discounts=np.zeros((B_, T_), np.float32)),
    "bootstrap_rank2": dict(bootstrap_value=np.zeros((1, B_), np.float32)),
    "bootstrap_rank0": dict(bootstrap_value=np.zeros((), np.float32)),
    "bootstrap_wrong_B": dict(bootstrap_value=np.zeros((B_ + 1,), np.float32)),
    "int_rewards": dict(rewards=np.zeros((T_, B_), np.int32)),
}


def _args(bad):
    kw = {**_GOOD, **bad}
    return kw["rewards"], kw["values"], kw["discounts"], kw["bootstrap_value"]


def test_good_shapes_pass():
    advantages, targets = gae(*_args({}), lambda_=0.9)
    out = vtrace(*_args({}), np.zeros((T_, B_), np.float32))
    for array in (advantages, targets, *out):
        assert array.shape == (T_, B_)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", sorted(_BAD_TRAJECTORIES))
def test_gae_rejects_bad_shapes(case, jit):
    fn = functools.partial(gae, lambda_=0.9)
    if jit:
        fn = jax.jit(fn)
    with pytest.raises(AssertionError):
        fn(*_args(_BAD_TRAJECTORIES[case]))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize(
    "case", sorted(_BAD_TRAJECTORIES) + ["log_rhos_wrong_B", "log_rhos_rank1"]
)
def test_vtrace_rejects_bad_shapes(case, jit):
    log_rhos = np.zeros((T_, B_), np.float32)
    bad = _BAD_TRAJECTORIES.get(case, {})
    if case == "log_rhos_wrong_B":
        log_rhos = np.zeros((T_, B_ + 1), np.float32)
    elif case == "log_rhos_rank1":
        log_rhos = np.zeros((T_,), np.float32)
    fn = vtrace
    if jit:
        fn = jax.jit(vtrace)
    with pytest.raises(AssertionError):
        fn(*_args(bad), log_rhos)


# --------------------------------------------------------------------------
# Outputs are regression targets: no gradient flows through them.


def test_gae_outputs_carry_no_gradient():
    rewards, values, discounts, bootstrap, _, _ = make_trajectory(51, T0, B0)

    def loss(rewards, values, bootstrap, which):
        out = gae(rewards, values, discounts, bootstrap, lambda_=0.95)
        return jnp.sum(out[which])

    for which in (0, 1):  # advantages, value_targets
        grads = jax.grad(loss, argnums=(0, 1, 2))(rewards, values, bootstrap, which)
        for g in grads:
            np.testing.assert_array_equal(g, np.zeros_like(g))


def test_vtrace_outputs_carry_no_gradient():
    rewards, values, discounts, bootstrap, log_rhos, _ = make_trajectory(61, T0, B0)

    def loss(rewards, values, bootstrap, log_rhos, which):
        out = vtrace(
            rewards, values, discounts, bootstrap, log_rhos,
            lambda_=0.95, rho_bar=2.0, c_bar=2.0,
        )
        return jnp.sum(out[which])

    for which in range(3):
        grads = jax.grad(loss, argnums=(0, 1, 2, 3))(
            rewards, values, bootstrap, log_rhos, which
        )
        for g in grads:
            np.testing.assert_array_equal(g, np.zeros_like(g))


# --------------------------------------------------------------------------
# Output type.


def test_vtrace_output_is_namedtuple():
    assert issubclass(VTraceOutput, tuple)
    assert VTraceOutput._fields == ("value_targets", "pg_advantages", "clipped_rhos")
    rewards, values, discounts, bootstrap, log_rhos, _ = make_trajectory(71, T0, B0)
    out = vtrace(rewards, values, discounts, bootstrap, log_rhos)
    assert type(out) is VTraceOutput
    assert out[0] is out.value_targets
    assert out[1] is out.pg_advantages
    assert out[2] is out.clipped_rhos
    # Survives jit as the same pytree type.
    jitted = vtrace_sweep(
        rewards, values, discounts, bootstrap, log_rhos,
        lambda_=1.0, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None,
    )
    assert type(jitted) is VTraceOutput
