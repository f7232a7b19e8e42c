"""make_network / init_params on the three target environments' spaces.

Checks the head each action space gets, parameter shapes and dtypes, output
shapes for a batch, that only image observations get the conv torso, that the
parameters survive a flax.serialization round trip bit for bit, and that bad
spaces are rejected.
"""

import functools
import math
from typing import Any, NamedTuple

import chex
import flax.serialization
import gymnasium
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from ppo_async import AsyncActorLearnerConfig, ConfigError
from ppo_async.networks.actor_critic import ActorCritic, init_params, make_network, params_template
from ppo_async.networks.distributions import Categorical, DiagGaussian

BATCH = 5
HIDDEN = 64  # make_network's default hidden width
ENV_IDS = ["CartPole-v1", "Pendulum-v1", "Breakout-MinAtar"]


class Built(NamedTuple):
    env_id: str
    observation_shape: tuple[int, ...]
    action_space: Any  # gymnax space
    network: ActorCritic
    params: Any  # init_params(network, key(0), observation_shape)


@functools.cache
def _build(env_id: str) -> Built:
    # Cached: compiling the orthogonal initialiser dominates this file's
    # runtime, so each environment's network is initialised once.
    env, env_params = gymnax.make(env_id)
    observation_shape = tuple(env.observation_space(env_params).shape)
    action_space = env.action_space(env_params)
    network = make_network(observation_shape, action_space)
    params = init_params(network, jax.random.key(0), observation_shape)
    return Built(env_id, observation_shape, action_space, network, params)


@pytest.fixture(params=ENV_IDS)
def built(request) -> Built:
    return _build(request.param)


def _kernel_and_bias_shapes(params):
    flat = flatten_dict(params["params"])
    kernels = sorted(v.shape for k, v in flat.items() if k[-1] == "kernel")
    biases = sorted(v.shape for k, v in flat.items() if k[-1] == "bias")
    return kernels, biases


def _random_observations(rng, batch_shape, observation_shape):
    return jnp.asarray(rng.standard_normal((*batch_shape, *observation_shape)), jnp.float32)


def test_heads_and_output_shapes(built):
    env_id, observation_shape, action_space, network, params = built
    observations = _random_observations(
        np.random.default_rng(0), (BATCH,), observation_shape
    )

    distribution, value = network.apply(params, observations)

    assert value.shape == (BATCH,) and value.dtype == jnp.float32
    if env_id == "Pendulum-v1":
        action_dim = action_space.shape[0]
        assert isinstance(distribution, DiagGaussian)
        assert distribution.mean.shape == (BATCH, action_dim)
        assert distribution.log_std.shape == (action_dim,)
        assert distribution.mean.dtype == distribution.log_std.dtype == jnp.float32
        # A sampled batch of actions scores under the same distribution.
        actions = distribution.sample(jax.random.key(1))
        assert actions.shape == (BATCH, action_dim)
        assert distribution.log_prob(actions).shape == (BATCH,)
    else:
        assert isinstance(distribution, Categorical)
        assert distribution.logits.shape == (BATCH, action_space.n)
        assert distribution.logits.dtype == jnp.float32
        actions = distribution.sample(jax.random.key(1))
        assert actions.shape == (BATCH,)
        assert distribution.log_prob(actions).shape == (BATCH,)
    assert distribution.entropy().shape == (BATCH,)
    chex.assert_tree_all_finite((distribution, value))


def test_eager_and_jit_agree_and_batch_axes_are_free(built):
    _, observation_shape, _, network, params = built
    observations = _random_observations(
        np.random.default_rng(1), (3, BATCH), observation_shape
    )  # [T, B, *obs]

    eager = network.apply(params, observations)
    jitted = jax.jit(network.apply)(params, observations)
    chex.assert_trees_all_close(eager, jitted, rtol=1e-5, atol=1e-6)
    assert eager[1].shape == (3, BATCH)
    # Each observation is processed on its own: row [1, 2] alone gives the same.
    single_distribution, single_value = network.apply(params, observations[1, 2])
    assert single_value.shape == ()
    np.testing.assert_allclose(single_value, eager[1][1, 2], rtol=1e-5, atol=1e-6)
    # logits or mean: the distribution's first field carries the batch axes.
    np.testing.assert_allclose(
        single_distribution[0], eager[0][0][1, 2], rtol=1e-5, atol=1e-6
    )


def test_parameter_shapes_and_dtypes(built):
    env_id, observation_shape, action_space, _, params = built

    for leaf in jax.tree_util.tree_leaves(params):
        assert leaf.dtype == jnp.float32

    flat = flatten_dict(params["params"])
    is_conv = env_id.endswith("MinAtar")
    if is_conv:
        height, width, channels = observation_shape
        # One VALID 3x3 conv with 16 channels, flattened.
        torso_features = (height - 2) * (width - 2) * 16
    else:
        (torso_features,) = observation_shape
    continuous = env_id == "Pendulum-v1"
    action_dim = action_space.shape[0] if continuous else action_space.n

    dense_kernels = [
        (torso_features, HIDDEN), (torso_features, HIDDEN),  # actor, critic layer 1
        (HIDDEN, HIDDEN), (HIDDEN, HIDDEN),  # layer 2
        (HIDDEN, 1), (HIDDEN, action_dim),  # value head, policy head
    ]
    kernels, biases = _kernel_and_bias_shapes(params)
    expected_kernels = dense_kernels + ([(3, 3, observation_shape[-1], 16)] if is_conv else [])
    assert kernels == sorted(expected_kernels)
    assert biases == sorted((shape[-1],) for shape in expected_kernels)

    log_std_leaves = [v for k, v in flat.items() if k[-1] == "log_std"]
    if continuous:
        assert len(log_std_leaves) == 1
        assert log_std_leaves[0].shape == (action_dim,)
        np.testing.assert_array_equal(log_std_leaves[0], 0.0)  # std 1 at init
    else:
        assert not log_std_leaves


def test_conv_torso_only_for_image_observations(built):
    env_id, _, _, network, params = built

    module_names = {name for path in flatten_dict(params["params"]) for name in path}
    has_conv = any("MinAtarTorso" in name or "Conv" in name for name in module_names)
    assert has_conv == env_id.endswith("MinAtar")
    assert network.torso == ("minatar" if env_id.endswith("MinAtar") else "none")


def test_minatar_accepts_environment_observations():
    built = _build("Breakout-MinAtar")
    env, env_params = gymnax.make(built.env_id)
    network, params = built.network, built.params
    keys = jax.random.split(jax.random.key(1), BATCH)
    observations, _ = jax.vmap(env.reset, in_axes=(0, None))(keys, env_params)

    distribution, value = jax.jit(network.apply)(params, observations)

    assert distribution.logits.shape == (BATCH, env.action_space(env_params).n)
    assert value.shape == (BATCH,)
    chex.assert_tree_all_finite((distribution, value))


def test_params_template_has_the_params_structure_without_running_init(built):
    _, observation_shape, _, network, params = built
    template = params_template(network, observation_shape)
    assert jax.tree.structure(template) == jax.tree.structure(params)
    for leaf, param in zip(jax.tree.leaves(template), jax.tree.leaves(params)):
        assert isinstance(leaf, np.ndarray)
        assert leaf.shape == param.shape and leaf.dtype == param.dtype
        assert not leaf.any()
    # Bytes of real params decode into it exactly.
    restored = flax.serialization.from_bytes(template, flax.serialization.to_bytes(params))
    chex.assert_trees_all_equal(restored, jax.device_get(params))


def test_params_round_trip_through_flax_serialization(built):
    _, observation_shape, _, network, params = built
    fresh = init_params(network, jax.random.key(1), observation_shape)
    # The fresh init really is different, so a restore into it is not a no-op.
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(fresh))
    )

    payload = flax.serialization.to_bytes(params)
    for target in (params, fresh):
        restored = flax.serialization.from_bytes(target, payload)
        assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(params)
        for original, copy in zip(
            jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(restored)
        ):
            assert copy.shape == original.shape and copy.dtype == original.dtype
            np.testing.assert_array_equal(copy, original)

    # The raw msgpack state dict, restored into the fresh init.
    state = flax.serialization.msgpack_restore(payload)
    restored = flax.serialization.from_state_dict(fresh, state)
    chex.assert_trees_all_equal(restored, params)

    observations = _random_observations(
        np.random.default_rng(2), (BATCH,), observation_shape
    )
    chex.assert_trees_all_equal(
        network.apply(restored, observations), network.apply(params, observations)
    )


@pytest.mark.parametrize("observation_shape, network_kind", [
    ((), "mlp"), ((10, 5), "mlp"), ((2, 3, 4, 2), "mlp"), ((10, 5), "gru")])
def test_other_observation_shapes_are_read_as_their_flattened_vector(observation_shape,
                                                                       network_kind):
    # A grid (Catch-bsuite's (10, 5)), a scalar or any shape but an image: the
    # same params and outputs, bit for bit, as the network of the flat vector.
    flat_shape = (int(np.prod(observation_shape)),)
    network = make_network(observation_shape, _Discrete(), network=network_kind,
                           rnn_hidden_size=8)
    flat = make_network(flat_shape, _Discrete(), network=network_kind, rnn_hidden_size=8)
    assert network.torso == "none" and network.observation_rank == len(observation_shape)
    params = init_params(network, jax.random.key(0), observation_shape)
    chex.assert_trees_all_equal(params, init_params(flat, jax.random.key(0), flat_shape))
    observations = _random_observations(np.random.default_rng(4), (2, BATCH), observation_shape)
    flat_observations = observations.reshape(2, BATCH, *flat_shape)
    if network_kind == "mlp":
        chex.assert_trees_all_equal(network.apply(params, observations),
                                    flat.apply(params, flat_observations))
    else:
        hidden = network.zero_hidden(BATCH)
        chex.assert_trees_all_equal(network.apply(params, hidden, observations[0]),
                                    flat.apply(params, hidden, flat_observations[0]))
    with pytest.raises(ValueError, match="cannot read observations"):
        make_network(observation_shape, _Discrete(), torso="minatar")


def test_no_torso_on_an_image_is_the_mlp_of_its_flattened_grid():
    # MinAtar's 10x10x4 grid read by the MLPs alone (gymnax-blines' PPO
    # baselines): the network of the flat 400-vector, bit for bit.
    shape, flat_shape = (10, 10, 4), (400,)
    network = make_network(shape, _Discrete(), torso="none", hidden_sizes=(32, 32))
    flat = make_network(flat_shape, _Discrete(), hidden_sizes=(32, 32))
    assert network.torso == "none" and network.observation_rank == 3
    params = init_params(network, jax.random.key(0), shape)
    chex.assert_trees_all_equal(params, init_params(flat, jax.random.key(0), flat_shape))
    grids = np.random.default_rng(5).integers(0, 2, (2, BATCH, *shape)).astype(np.float32)
    chex.assert_trees_all_equal(network.apply(params, grids),
                                flat.apply(params, grids.reshape(2, BATCH, *flat_shape)))


@pytest.mark.parametrize(
    "action_space",
    [
        gymnasium.spaces.Box(-1.0, 1.0, shape=(2, 2)),
        gymnax.environments.spaces.Box(-1.0, 1.0, shape=(2, 3)),
        gymnasium.spaces.Box(-1.0, 1.0, shape=()),
        # Spaces with a 1-D shape that are not boxes of floats: a Gaussian head
        # would send them float actions (MultiDiscrete was trained so, silently).
        gymnasium.spaces.MultiDiscrete([2, 3]),
        gymnasium.spaces.MultiBinary(4),
        gymnasium.spaces.Box(0, 5, shape=(2,), dtype=np.int64),
    ],
    ids=["gymnasium-2d", "gymnax-2d", "gymnasium-scalar", "multi-discrete", "multi-binary",
         "integer-box"],
)
def test_action_spaces_no_head_acts_in_are_refused(action_space):
    with pytest.raises(ValueError, match="action space .* is not supported"):
        make_network((4,), action_space)
    with pytest.raises(ConfigError, match="env_id='CartPole-v1': action space"):
        AsyncActorLearnerConfig(env_id="CartPole-v1").make_network((4,), action_space)


# Shapes cross the gymnax cases (a conv torso with a Gaussian head, a vector
# with three actions) but reuse their layer sizes, so nothing new compiles.
@pytest.mark.parametrize("observation_shape", [(3,), (10, 10, 4)])
@pytest.mark.parametrize(
    "action_space",
    [gymnasium.spaces.Discrete(3), gymnasium.spaces.Box(-2.0, 2.0, shape=(2,))],
    ids=["discrete", "box"],
)
def test_gymnasium_spaces(observation_shape, action_space):
    network = make_network(observation_shape, action_space)
    params = init_params(network, jax.random.key(0), observation_shape)
    observations = _random_observations(
        np.random.default_rng(3), (BATCH,), observation_shape
    )

    distribution, value = jax.jit(network.apply)(params, observations)

    assert value.shape == (BATCH,)
    if isinstance(action_space, gymnasium.spaces.Discrete):
        assert isinstance(distribution, Categorical)
        assert distribution.logits.shape == (BATCH, 3)
    else:
        assert isinstance(distribution, DiagGaussian)
        assert distribution.mean.shape == (BATCH, 2)
        assert distribution.log_std.shape == (2,)
    for leaf in jax.tree_util.tree_leaves(params):
        assert leaf.dtype == jnp.float32


@pytest.mark.parametrize("shape", [(4, 64), (64, 64), (64, 2), (3, 3, 4, 16)])
def test_orthogonal_init_gives_orthonormal_columns_or_rows(shape):
    from ppo_async.networks.actor_critic import orthogonal

    scale = 2.0
    w = np.asarray(orthogonal(scale)(jax.random.key(0), shape)).reshape(-1, shape[-1])
    gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
    np.testing.assert_allclose(gram, scale**2 * np.eye(gram.shape[0]), atol=1e-5)
    other = np.asarray(orthogonal(scale)(jax.random.key(1), shape))
    assert not np.allclose(other.reshape(w.shape), w)


def test_applying_a_network_traces_each_initializer_once_per_shape():
    # flax checks each param of every apply against jax.eval_shape of its initializer.
    import flax.linen as nn

    from ppo_async.networks.actor_critic import orthogonal

    init = orthogonal(0.37)  # a scale of this test alone: its own traces
    assert orthogonal(0.37) is init
    dense = nn.Dense(3, kernel_init=init)
    params = dense.init(jax.random.key(0), jnp.zeros((1, 5)))
    for _ in range(3):
        jax.eval_shape(dense.apply, params, jnp.zeros((2, 5)))
    assert init._cache_size() == 1


def _ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def test_orthogonal_init_is_haar_distributed():
    # Haar on O(n) (Mezzadri 2007): the Q of a Gaussian's QR with R's diagonal
    # made positive -- flax's orthogonal initializer, here in numpy. Ours
    # (a polar factor) must match it in law: compare an entry and the trace.
    from ppo_async.networks.actor_critic import orthogonal

    n, draws = 4, 2000
    keys = jax.random.split(jax.random.key(0), draws)
    ours = np.asarray(jax.jit(jax.vmap(lambda k: orthogonal()(k, (n, n))))(keys))
    rng = np.random.default_rng(0)
    q, r = np.linalg.qr(rng.standard_normal((draws, n, n)))
    haar = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]

    # Moments of Haar O(n): E[W_ij] = 0, E[W_ij^2] = 1/n, tr W has mean 0 and variance 1.
    trace = np.trace(ours, axis1=1, axis2=2)
    assert abs(ours[:, 0, 0].mean()) < 4 / np.sqrt(n * draws)
    assert abs((ours**2).mean() - 1 / n) < 0.01
    assert abs(trace.mean()) < 4 / np.sqrt(draws) and abs(trace.var() - 1) < 0.15
    # Two-sample KS at the 0.1% level (1.95 * sqrt(2 / draws)).
    critical = 1.95 * np.sqrt(2 / draws)
    for statistic in (lambda w: w[:, 0, 0], lambda w: w[:, 1, 2],
                      lambda w: np.trace(w, axis1=1, axis2=2)):
        assert _ks_statistic(statistic(ours), statistic(haar)) < critical
    # The check can fail: a QR without the sign fix is orthogonal but not Haar
    # (Householder makes its first entry always negative).
    unsigned = np.linalg.qr(np.random.default_rng(1).standard_normal((draws, n, n)))[0]
    assert _ks_statistic(unsigned[:, 0, 0], haar[:, 0, 0]) > critical


def test_init_gaussian_bits_match_a_numpy_reference_and_are_standard_normal():
    # The initializer's bits: a counter-based hash of the key, written here again
    # as a plain numpy loop over the counter, and its normals against N(0, 1).
    from ppo_async.networks.actor_critic import _hash_bits, _standard_normal

    def mix(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    key = jax.random.key(3)
    k0, k1 = (int(w) for w in np.asarray(jax.random.key_data(key)))
    expected = [mix((mix((i * 0x9E3779B9 + k0) & 0xFFFFFFFF)) ^ k1) for i in range(1000)]
    got = np.asarray(jax.jit(_hash_bits, static_argnums=1)(jax.random.key_data(key), 1000))
    np.testing.assert_array_equal(got, np.array(expected, np.uint32))
    assert len(set(expected)) == len(expected)  # a bijection of the counter

    normals = np.asarray(_standard_normal(key, (100, 200))).ravel()
    draws = np.sort(normals.astype(np.float64))
    normal_cdf = np.array([0.5 * (1 + math.erf(x / math.sqrt(2))) for x in draws])
    n = len(draws)
    ks = max((np.arange(1, n + 1) / n - normal_cdf).max(), (normal_cdf - np.arange(n) / n).max())
    assert ks < 1.95 / np.sqrt(n)  # one-sample KS at the 0.1% level
    other = np.asarray(_standard_normal(jax.random.key(4), (100, 200)))
    assert abs(np.corrcoef(other.ravel(), normals)[0, 1]) < 0.05  # keys give other draws


def test_orthogonal_init_draws_depend_only_on_the_key():
    # The twin (inside one big jitted program) and the runtime (a jitted init
    # alone) must draw the same params from the same key.
    from ppo_async.networks.actor_critic import orthogonal

    init = orthogonal(np.sqrt(2.0))
    key = jax.random.key(7)
    alone = np.asarray(jax.jit(init, static_argnums=1)(key, (64, 64)))
    inside = np.asarray(jax.jit(lambda k: init(k, (64, 64)) + 0.0)(key))
    eager = np.asarray(init(key, (64, 64)))
    np.testing.assert_array_equal(alone, inside)
    np.testing.assert_allclose(eager, alone, atol=1e-6)
    legacy = np.asarray(init(jax.random.key_data(key), (64, 64)))  # raw uint32 keys work too
    np.testing.assert_array_equal(legacy, eager)


# --- the Nature-CNN torso ------------------------------------------------------------

ATARI_SHAPE = (84, 84, 4)


class _Discrete:
    n = 6  # Pong's minimal action set


@functools.cache
def _nature_params():
    from ppo_async.networks.actor_critic import NatureTorso

    return NatureTorso().init(jax.random.key(0), np.zeros((1, *ATARI_SHAPE), np.float32))


def test_nature_torso_shapes_and_parameter_count():
    from ppo_async.networks.actor_critic import NatureTorso

    params = _nature_params()
    kernels = [v.shape for k, v in sorted(flatten_dict(params["params"]).items())
               if k[-1] == "kernel"]
    # Mnih et al. 2015: 32 8x8 s4, 64 4x4 s2, 64 3x3 s1 (84 -> 20 -> 9 -> 7), dense 512.
    assert kernels == [(8, 8, 4, 32), (4, 4, 32, 64), (3, 3, 64, 64), (7 * 7 * 64, 512)]
    count = sum(v.size for v in jax.tree.leaves(params))
    assert count == (8 * 8 * 4 * 32 + 32) + (4 * 4 * 32 * 64 + 64) + (3 * 3 * 64 * 64 + 64) \
        + (3136 * 512 + 512) == 1_684_128
    features = NatureTorso().apply(params, np.zeros((2, 3, *ATARI_SHAPE), np.uint8))
    assert features.shape == (2, 3, 512) and features.dtype == jnp.float32


def test_nature_torso_scales_pixels_to_unit_interval():
    from ppo_async.networks.actor_critic import NatureTorso

    params = _nature_params()
    frames = np.random.default_rng(0).integers(0, 256, (3, *ATARI_SHAPE), dtype=np.uint8)
    scaled = NatureTorso().apply(params, frames)
    # The same torso without its division, fed the frames already in [0, 1].
    unscaled_on_unit = NatureTorso(pixel_max=1.0).apply(params, frames.astype(np.float32) / 255.0)
    np.testing.assert_allclose(scaled, unscaled_on_unit, rtol=1e-5, atol=1e-6)
    # uint8 255 is float 1.0 exactly, and float32 copies of the pixels (what
    # the host actors send) give the same features as the uint8 frames.
    full = np.full((1, *ATARI_SHAPE), 255, np.uint8)
    np.testing.assert_array_equal(
        NatureTorso().apply(params, full),
        NatureTorso(pixel_max=1.0).apply(params, np.ones((1, *ATARI_SHAPE), np.float32)))
    np.testing.assert_array_equal(scaled, NatureTorso().apply(params, frames.astype(np.float32)))
    # Without the division the features differ: this test can fail.
    assert not np.allclose(scaled, NatureTorso(pixel_max=1.0).apply(params, frames), rtol=0.1)


def test_nature_actor_critic_and_its_recurrent_twin_on_atari_frames():
    frames = np.random.default_rng(1).integers(0, 256, (BATCH, *ATARI_SHAPE), dtype=np.uint8)
    network = make_network(ATARI_SHAPE, _Discrete(), torso="nature")
    params = params_template(network, ATARI_SHAPE)
    assert "NatureTorso_0" in params["params"]
    distribution, value = jax.jit(network.apply)(params, frames)
    assert distribution.logits.shape == (BATCH, 6) and value.shape == (BATCH,)

    recurrent = make_network(ATARI_SHAPE, _Discrete(), network="gru", rnn_hidden_size=16,
                             torso="nature")
    assert recurrent.torso == "nature"
    recurrent_params = params_template(recurrent, ATARI_SHAPE)
    assert "NatureTorso_0" in recurrent_params["params"]
    hidden, distribution, value = jax.jit(recurrent.apply)(
        recurrent_params, recurrent.zero_hidden(BATCH), frames)
    assert hidden.shape == (BATCH, 16) and value.shape == (BATCH,)


@pytest.mark.parametrize("shape, torso, problem", [
    ((4,), "nature", "cannot read observations"),
    ((10, 5), "minatar", "cannot read observations"),
    ((10, 10, 4), "nature", "at least 36x36"),
    ((4,), "resnet", "expected 'auto' or one of"),
])
def test_a_torso_that_cannot_read_the_observation_is_refused(shape, torso, problem):
    with pytest.raises(ValueError, match=problem):
        make_network(shape, _Discrete(), torso=torso)


def test_auto_torso_picks_nature_for_envpool_atari_and_minatar_for_minatar():
    from ppo_async import config as config_module
    from ppo_async.networks import actor_critic as networks

    assert config_module.TORSOS == ("auto", *networks.TORSOS)
    minatar = AsyncActorLearnerConfig(env_id="Breakout-MinAtar")
    assert minatar.network_torso == "auto"
    assert make_network((10, 10, 4), _Discrete(), torso=minatar.network_torso).torso == "minatar"
    assert make_network((4,), _Discrete(), torso="auto").torso == "none"
    pytest.importorskip("envpool")
    pong = AsyncActorLearnerConfig(env_id="envpool:Pong-v5")
    assert pong.network_torso == "nature"
    assert AsyncActorLearnerConfig(env_id="envpool:CartPole-v1").network_torso == "auto"
    # An explicit choice wins over auto.
    assert AsyncActorLearnerConfig(env_id="envpool:Pong-v5", torso="minatar").network_torso \
        == "minatar"


def test_a_torso_the_env_cannot_feed_is_a_config_error():
    from ppo_async.envs.backends import make_actor_program

    with pytest.raises(ConfigError, match="torso='nature' with env_id='CartPole-v1'"):
        make_actor_program(AsyncActorLearnerConfig(env_id="CartPole-v1", torso="nature"))
    with pytest.raises(ConfigError, match="torso='resnet'"):
        AsyncActorLearnerConfig(torso="resnet")


@pytest.mark.parametrize("network", ["mlp", "gru"])
def test_init_log_std_sets_the_gaussians_starting_spread(network):
    space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
    config = AsyncActorLearnerConfig(env_id="Pendulum-v1", network=network, init_log_std=-1.5)
    net = config.make_network((5,), space)
    params = init_params(net, jax.random.key(0), (5,))
    np.testing.assert_array_equal(params["params"]["log_std"], np.full(3, -1.5, np.float32))
    default = make_network((5,), space, network=network)
    assert init_params(default, jax.random.key(0), (5,))["params"]["log_std"].tolist() == [0.0] * 3
    with pytest.raises(ConfigError, match="init_log_std=nan"):
        AsyncActorLearnerConfig(init_log_std=float("nan"))
