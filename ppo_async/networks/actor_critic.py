"""Actor-critic networks (flax.linen).

``make_network(observation_shape, action_space, torso=...)`` puts a torso
(`TORSOS`) in front of the actor and critic MLPs: "none" (vectors go straight
into the MLPs; any other shape, an image, a grid ``(H, W)`` or a scalar, is
flattened into one), "minatar" (one small conv, for MinAtar-shaped
``[10, 10, C]`` images) or "nature" (the Nature-DQN CNN for ``[84, 84, 4]``
Atari frames, which it scales from [0, 255] to [0, 1] itself); "auto" picks
"minatar" for images and "none" for the rest. The head follows the action
space (`action_head`: categorical for a ``Discrete`` space, diagonal Gaussian
with a state-independent log-std for a 1-D box of floats). Calling the network returns ``(distribution, value)``: a
`ppo_async.networks.distributions` NamedTuple holding the distribution's parameters, and
the value ``[...]``.

``make_network(..., network="lstm" | "gru")`` gives a `RecurrentActorCritic`
instead: the same torso, MLPs and heads around a recurrent cell, called as
``(hidden, obs) -> (hidden, distribution, value)``. The hidden state is one
array ``[..., state_size]``; resetting it at episode starts is the caller's
job (`reset_hidden`), done in one place for actor and learner alike, and
`unroll` runs the network over a time-major sequence with those resets.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.networks.conv import conv_nhwc
from ppo_async.networks.distributions import Categorical, DiagGaussian, Distribution

# Newton-Schulz steps of the polar factor. Each step maps a singular value s
# to 1.5 s - 0.5 s^3: one near 0 grows by 1.5x a step, then converges
# quadratically to 1. After scaling by the Frobenius norm every singular value
# is at most 1; in float32 rounding keeps the smallest above ~1e-8 of the
# largest, and 1.5^45 > 1e8, so 60 steps reach orthonormality to float
# precision for every draw.
_POLAR_STEPS = 60


def _mix32(x: jax.Array) -> jax.Array:
    """A bijection of uint32 that spreads every input bit over the output (a
    multiply-xorshift finalizer: "lowbias32", found by Chris Wellons' hash
    prospector)."""
    x = x ^ (x >> 16)
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> 16)


def _hash_bits(key: jax.Array, size: int) -> jax.Array:
    """``size`` uint32 words of a counter-based hash of the 64-bit ``key``.

    Word ``i`` is ``mix(mix(i * golden + k0) ^ k1)``: a bijection of ``i`` for a
    given key, so the words of one draw never repeat. Integer arithmetic
    modulo 2^32 only, the same bits on every backend (tests/networks checks
    them against numpy).
    """
    words = key.reshape(-1).astype(jnp.uint32)
    count = jax.lax.iota(jnp.uint32, size)
    return _mix32(_mix32(count * np.uint32(0x9E3779B9) + words[0]) ^ words[1])


def _standard_normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Standard normal float32 ``shape``, a deterministic function of ``key``.

    Not ``jax.random.normal`` nor XLA's RngBitGenerator: compiling either
    cost about 0.1 s of CPU per call when they were timed (the threefry hash
    as JAX lowers it on CPU, a loop, or the Philox expansion), and ``init``
    makes one call per layer on the way to a run's first update
    (``experiments/startup_timeline.py``). The bits come from a
    counter-based integer hash of the key (`_hash_bits`), which XLA compiles
    in a fraction of that. The runtime and the jitted twin trace the same
    function, so they draw the same numbers. Uniform bits become a normal
    through the inverse error function, as ``jax.random.normal`` does.
    """
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    bits = _hash_bits(key, math.prod(shape)).reshape(shape)
    # 23 random mantissa bits under exponent 0: a float in [1, 2), minus 1.
    unit = jax.lax.bitcast_convert_type((bits >> 9) | np.uint32(0x3F800000), jnp.float32) - 1.0
    lowest = np.nextafter(np.float32(-1.0), np.float32(0.0))  # erf_inv(-1) is -inf
    uniform = jnp.maximum(lowest, 2.0 * unit - 1.0)
    return np.float32(math.sqrt(2.0)) * jax.lax.erf_inv(uniform)


@functools.cache
def orthogonal(scale: float = 1.0):
    """Orthogonal initializer (Saxe et al. 2014): the polar factor of a Gaussian matrix.

    For a tall Gaussian ``G`` the polar factor ``G (G^T G)^{-1/2}`` is
    Haar-distributed on the matrices with orthonormal columns (``O G`` has
    polar factor ``O U`` and the same law as ``G``, for every orthogonal
    ``O``) -- the distribution of ``flax.linen.initializers.orthogonal``,
    which takes the Q of a QR instead; the draws differ, the law does not.
    It is computed with Newton-Schulz steps (matrix products only), and the
    Gaussian from an integer hash of the key (`_standard_normal`), because this
    initializer's compile time is on the path to a run's first update
    (``experiments/bench_startup.py`` times it). Why not QR: with jax 0.10.2
    on CPU, a vmapped init (``jax.vmap(make_train(cfg))`` over seeds) runs XLA's batched QR,
    which deadlocks the CPU thread pool -- the twin hangs forever; matrix
    products have no such kernel. The last axis is the output (column) axis,
    as in flax's default.

    Jitted (shape and dtype static), and one function per ``scale``: flax
    checks every param of every ``apply`` against ``jax.eval_shape`` of its
    initializer, a trace of the whole draw each time, where a jitted one is
    traced once per shape (0.2 s of the 0.6 s a default learner's update and
    rollout took to trace, timed with cProfile). The bits are unchanged.
    """

    @functools.partial(jax.jit, static_argnums=(1, 2))
    def init(key, shape, dtype=jnp.float32):
        num_cols = shape[-1]
        num_rows = math.prod(shape[:-1])
        tall = (max(num_rows, num_cols), min(num_rows, num_cols))
        gaussian = _standard_normal(key, tall)
        identity = jnp.eye(tall[1], dtype=jnp.float32)

        def newton_schulz_step(_, matrix):
            return matrix @ (1.5 * identity - 0.5 * (matrix.T @ matrix))

        basis = jax.lax.fori_loop(
            0, _POLAR_STEPS, newton_schulz_step, gaussian / jnp.linalg.norm(gaussian)
        )
        matrix = basis if num_rows >= num_cols else basis.T
        return (scale * matrix).reshape(shape).astype(dtype)

    return init


def _dense(features: int, scale: float) -> nn.Dense:
    return nn.Dense(
        features,
        kernel_init=orthogonal(scale),
        bias_init=nn.initializers.zeros,
    )


class MLP(nn.Module):
    """tanh MLP with orthogonal init (scale sqrt(2)), as in the PPO paper's setup."""

    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for size in self.hidden_sizes:
            x = nn.tanh(_dense(size, math.sqrt(2.0))(x))
        return x


class MinAtarTorso(nn.Module):
    """One 3x3 conv (16 channels) and a flatten: the MinAtar paper's network body."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Conv(16, (3, 3), padding="VALID", kernel_init=orthogonal(math.sqrt(2.0)),
                    conv_general_dilated=conv_nhwc)(x)
        x = nn.relu(x)
        return x.reshape(*x.shape[:-3], -1)


class NatureTorso(nn.Module):
    """The Nature-DQN body (Mnih et al. 2015) over ``[..., 84, 84, 4]`` frames in [0, 255].

    ``x / pixel_max`` -> conv 32 8x8 stride 4 -> conv 64 4x4 stride 2 -> conv
    64 3x3 stride 1 -> flatten -> dense 512, each followed by a ReLU; VALID
    padding, orthogonal init with scale sqrt(2), zero biases. An 84x84 frame
    becomes 20x20, 9x9, then 7x7x64 = 3136 features before the dense layer.
    The division is inside the network, so actors, learner, evaluation and
    the sync twin all feed it the env's raw pixels (uint8, or their float32
    copies) and all see the same [0, 1] inputs. The convolutions are
    `ppo_async.networks.conv.conv_nhwc`: their gradients run on XLA's fast CPU
    path inside the update's minibatch loop too.
    """

    pixel_max: float = 255.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32) / self.pixel_max
        for features, size, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.Conv(features, (size, size), strides=(stride, stride), padding="VALID",
                        kernel_init=orthogonal(math.sqrt(2.0)),
                        bias_init=nn.initializers.zeros, conv_general_dilated=conv_nhwc)(x)
            x = nn.relu(x)
        x = x.reshape(*x.shape[:-3], -1)
        return nn.relu(_dense(512, math.sqrt(2.0))(x))


TORSOS = ("none", "minatar", "nature")  # what make_network's torso="auto" resolves to
_TORSO_MODULES = {"minatar": MinAtarTorso, "nature": NatureTorso}
NATURE_MIN_SIZE = 36  # the smallest height and width the Nature torso's VALID convs accept


def _apply_torso(torso: str, obs: jax.Array, observation_rank: int) -> jax.Array:
    """``obs`` (``[..., *obs_shape]``, ``observation_rank`` dims per observation) as
    float32 features after ``torso`` (one of `TORSOS`); "none" flattens each observation."""
    x = obs.astype(jnp.float32)
    if torso == "none":
        if observation_rank == 1:
            return x
        return x.reshape(*x.shape[:x.ndim - observation_rank], -1)
    return _TORSO_MODULES[torso]()(x)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs over a shared torso (one of `TORSOS`)."""

    action_dim: int
    continuous: bool
    hidden_sizes: Sequence[int] = (64, 64)
    torso: str = "none"
    init_log_std: float = 0.0  # the Gaussian's initial log-std (continuous actions only)
    observation_rank: int = 1  # dims of one observation (1: a vector, 3: an image)

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[Distribution, jax.Array]:
        x = _apply_torso(self.torso, obs, self.observation_rank)
        actor = MLP(self.hidden_sizes)(x)
        critic = MLP(self.hidden_sizes)(x)
        value = _dense(1, 1.0)(critic)[..., 0]
        if self.continuous:
            mean = _dense(self.action_dim, 0.01)(actor)
            log_std = self.param("log_std", nn.initializers.constant(self.init_log_std),
                                 (self.action_dim,))
            return DiagGaussian(mean, log_std), value
        logits = _dense(self.action_dim, 0.01)(actor)
        return Categorical(logits), value


def make_network(
    observation_shape: Sequence[int],
    action_space: Any,
    hidden_sizes: Sequence[int] = (64, 64),
    network: str = "mlp",
    rnn_hidden_size: int = 128,
    torso: str = "auto",
    init_log_std: float = 0.0,
) -> ActorCritic | RecurrentActorCritic:
    """The actor-critic for one observation shape and action space.

    Args:
      observation_shape: shape of one observation: ``(D,)`` for a vector,
        ``(H, W, C)`` for an image; any other shape (a grid ``(H, W)``, a
        scalar ``()``) is read as the vector of its flattened elements.
      action_space: a discrete space (``n``, no shape; gymnax and gymnasium
        ``Discrete``) or a 1-D box of floats (continuous; ``Box``); any
        other raises ValueError (`action_head`).
      hidden_sizes: widths of the actor and critic MLPs.
      network: "mlp" (feed-forward `ActorCritic`), or "lstm" / "gru"
        (`RecurrentActorCritic` with that cell).
      rnn_hidden_size: features of the recurrent cell (recurrent networks only).
      torso: one of `TORSOS`, or "auto": "minatar" for an image, "none" for
        any other shape ("none" flattens an image too). A torso that cannot
        read the observation raises ValueError.
      init_log_std: the initial log-std of a continuous policy's Gaussian
        (one learned number per action dimension, state-independent).
    """
    if network != "mlp":
        return _make_recurrent_network(
            observation_shape, action_space, hidden_sizes, network, rnn_hidden_size, torso,
            init_log_std,
        )
    observation_shape = tuple(observation_shape)
    torso = resolve_torso(torso, observation_shape)
    rank = len(observation_shape)
    action_dim, continuous = action_head(action_space)
    return ActorCritic(action_dim, continuous, tuple(hidden_sizes), torso, float(init_log_std),
                       rank)


def action_head(action_space: Any) -> tuple[int, bool]:
    """``(action_dim, continuous)`` of the head for ``action_space``.

    Discrete: a space with ``n`` and no shape beyond a scalar (gymnax's and
    gymnasium's ``Discrete``). Continuous: a 1-D box of floats, without ``n``
    (gymnasium's ``MultiBinary`` has one) or ``nvec`` (``MultiDiscrete``).
    Anything else raises ValueError: acting in it with either head would send
    the env actions of another kind.
    """
    shape = tuple(getattr(action_space, "shape", None) or ())
    if hasattr(action_space, "n") and shape == ():
        return int(action_space.n), False
    dtype = getattr(action_space, "dtype", None)
    floating = dtype is None or np.issubdtype(np.dtype(dtype), np.floating)
    if (len(shape) == 1 and floating and not hasattr(action_space, "n")
            and not hasattr(action_space, "nvec")):
        return shape[0], True
    raise ValueError(
        f"action space {action_space!r} is not supported: the policy acts in a discrete "
        "space (Discrete, with n) or a 1-D box of floats (Box, shape (action_dim,))"
    )


def resolve_torso(torso: str, observation_shape: Sequence[int]) -> str:
    """The torso (one of `TORSOS`) that ``torso`` names for ``observation_shape``.

    "auto" is "minatar" for an image ``(H, W, C)`` and "none" for any other
    shape (a vector ``(D,)``; a grid ``(H, W)`` or a scalar, which "none"
    flattens). "none" reads an image too, flattened (MinAtar's 10x10xC grid
    into an MLP, as gymnax-blines' PPO baselines do). Raises ValueError for
    an unknown name, or a torso that cannot read the observation (a conv on
    anything but an image, the Nature torso on an image under
    `NATURE_MIN_SIZE` pixels a side).
    """
    shape = tuple(observation_shape)
    image = len(shape) == 3
    if torso == "auto":
        return "minatar" if image else "none"
    if torso not in TORSOS:
        raise ValueError(f"torso {torso!r}: expected 'auto' or one of {TORSOS}")
    if torso != "none" and not image:
        raise ValueError(
            f"torso {torso!r} cannot read observations of shape {shape}: 'minatar' and "
            "'nature' take images (H, W, C); 'none' takes any shape, flattened"
        )
    if torso == "nature" and min(shape[:2]) < NATURE_MIN_SIZE:
        raise ValueError(
            f"torso 'nature' needs images of at least {NATURE_MIN_SIZE}x{NATURE_MIN_SIZE} "
            f"pixels (it was designed for 84x84); got {shape}"
        )
    return torso


def init_params(network: ActorCritic, key: jax.Array, observation_shape: Sequence[int]):
    """Parameters for ``network`` from a dummy observation (batch of one)."""
    dummy = np.zeros((1, *observation_shape), np.float32)
    if is_recurrent(network):
        return _jitted_init(network)(key, network.zero_hidden(1), dummy)
    return _jitted_init(network)(key, dummy)


# One compiled program instead of one dispatch (and compile) per initializer
# op, held for the process: networks are frozen dataclasses, equal by value, so
# a run that repeats another's network finds its compiled ``init`` here.
@functools.lru_cache(maxsize=32)
def _jitted_init(network: ActorCritic | RecurrentActorCritic):
    return jax.jit(network.init)


def _shape_key() -> jax.Array:
    """A key to trace shapes with: wrapping key data compiles nothing (``jax.random.key`` does)."""
    return jax.random.wrap_key_data(np.zeros(2, np.uint32), impl="threefry2x32")


def params_template(network: ActorCritic, observation_shape: Sequence[int]):
    """Host zeros with the structure, shapes and dtypes of ``network``'s params.

    What decoding broadcast bytes needs, without running (or compiling) the
    initializers: ``jax.eval_shape`` only traces them. Compiling ``init`` takes
    seconds, and a run would otherwise pay it once more for every template it
    builds.
    """
    dummy = jax.ShapeDtypeStruct((1, *observation_shape), jnp.float32)
    inputs = (network.zero_hidden(1), dummy) if is_recurrent(network) else (dummy,)
    shapes = jax.eval_shape(network.init, _shape_key(), *inputs)
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)


# --------------------------------------------------------------------------
# Recurrent actor-critics (LSTM, GRU).
# --------------------------------------------------------------------------

RECURRENT_CELLS = ("lstm", "gru")


class MemoryMLP(nn.Module):
    """`MLP` whose first layer also reads a memory vector: ``tanh(W x + b + U m)``.

    Layer names match `MLP`'s (``Dense_0``, ``Dense_1``...), and the memory
    enters through its own bias-free ``memory_in`` kernel ``U``. Why this
    shape: with ``U = 0`` the module *is* `MLP` (adding an exact zero changes
    no bit), so a recurrent network with its recurrent weights zeroed can be
    checked against the feed-forward network it extends. It is the usual
    "skip past the LSTM" wiring (the torso features and the cell's output both
    reach the heads), written as a sum instead of a concatenation.
    """

    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, x: jax.Array, memory: jax.Array) -> jax.Array:
        for i, size in enumerate(self.hidden_sizes):
            pre = _dense(size, math.sqrt(2.0))(x)
            if i == 0:
                pre = pre + nn.Dense(
                    size, use_bias=False, kernel_init=orthogonal(math.sqrt(2.0)),
                    name="memory_in",
                )(memory)
            x = nn.tanh(pre)
        return x


class RecurrentActorCritic(nn.Module):
    """`ActorCritic` with a recurrent cell between the torso and the MLPs.

    ``obs -> torso -> x``; ``(hidden, x) -> cell -> (hidden', m)``; actor and
    critic are `MemoryMLP` s of ``(x, m)``; the heads are `ActorCritic`'s.
    The cell reads the torso features, so memory of any observation is
    possible; the MLPs read both, so the feed-forward path is intact.

    ``hidden`` is one array ``[..., state_size]``: ``concat(c, h)`` for the
    LSTM (``2 * rnn_hidden_size``), ``h`` for the GRU. Call:
    ``(hidden, obs) -> (hidden', distribution, value)``. Zeroing the state at
    an episode start is not done here (see `reset_hidden`), so one rule
    serves the actor's rollout and the learner's re-unroll.
    """

    action_dim: int
    continuous: bool
    hidden_sizes: Sequence[int] = (64, 64)
    torso: str = "none"
    cell: str = "lstm"
    rnn_hidden_size: int = 128
    init_log_std: float = 0.0
    observation_rank: int = 1  # dims of one observation (1: a vector, 3: an image)

    @property
    def state_size(self) -> int:
        """Width of the hidden-state array."""
        return (2 if self.cell == "lstm" else 1) * self.rnn_hidden_size

    def zero_hidden(self, batch_size: int) -> jax.Array:
        """``[batch_size, state_size]`` float32 zeros: the state at an episode start."""
        return jnp.zeros((batch_size, self.state_size), jnp.float32)

    @nn.compact
    def __call__(
        self, hidden: jax.Array, obs: jax.Array
    ) -> tuple[jax.Array, Distribution, jax.Array]:
        x = _apply_torso(self.torso, obs, self.observation_rank)
        size = self.rnn_hidden_size
        # The project's orthogonal init, not flax's default for the recurrent
        # kernel: flax's uses QR, which deadlocks a vmapped init on CPU (see
        # `orthogonal`), and the twin vmaps init over seeds.
        if self.cell == "lstm":
            cell = nn.OptimizedLSTMCell(size, recurrent_kernel_init=orthogonal(), name="cell")
            (c, h), memory = cell((hidden[..., :size], hidden[..., size:]), x)
            hidden = jnp.concatenate([c, h], axis=-1)
        else:
            cell = nn.GRUCell(size, recurrent_kernel_init=orthogonal(), name="cell")
            hidden, memory = cell(hidden, x)
        actor = MemoryMLP(self.hidden_sizes, name="MLP_0")(x, memory)
        critic = MemoryMLP(self.hidden_sizes, name="MLP_1")(x, memory)
        value = _dense(1, 1.0)(critic)[..., 0]
        if self.continuous:
            mean = _dense(self.action_dim, 0.01)(actor)
            log_std = self.param("log_std", nn.initializers.constant(self.init_log_std),
                                 (self.action_dim,))
            # Broadcast, so that the distribution stacks along time in `unroll`.
            return hidden, DiagGaussian(mean, jnp.broadcast_to(log_std, mean.shape)), value
        logits = _dense(self.action_dim, 0.01)(actor)
        return hidden, Categorical(logits), value


def is_recurrent(network: Any) -> bool:
    """Whether ``network`` carries a hidden state (`RecurrentActorCritic`)."""
    return isinstance(network, RecurrentActorCritic)


def _make_recurrent_network(
    observation_shape, action_space, hidden_sizes, cell: str, rnn_hidden_size: int,
    torso: str, init_log_std: float,
) -> RecurrentActorCritic:
    if cell not in RECURRENT_CELLS:
        raise ValueError(f"network {cell!r}: expected 'mlp' or one of {RECURRENT_CELLS}")
    feed_forward = make_network(observation_shape, action_space, hidden_sizes, torso=torso,
                                init_log_std=init_log_std)
    return RecurrentActorCritic(
        feed_forward.action_dim, feed_forward.continuous, feed_forward.hidden_sizes,
        feed_forward.torso, cell, int(rnn_hidden_size), feed_forward.init_log_std,
        feed_forward.observation_rank,
    )


def reset_hidden(hidden: jax.Array, reset: jax.Array) -> jax.Array:
    """``hidden`` ``[B, S]`` with the rows where ``reset`` ``[B]`` is true set to zero.

    The one rule for episode starts: the actor's rollout, the learner's
    re-unroll and the evaluator all zero the state with this, right before
    the network acts on an episode's first observation.
    """
    chex.assert_rank([hidden, reset], [2, 1])
    chex.assert_equal_shape_prefix([hidden, reset], 1)
    return jnp.where(reset[:, None], jnp.zeros_like(hidden), hidden)


class Unrolled(NamedTuple):
    """A recurrent network run over ``T`` steps of ``B`` sequences."""

    distribution: Distribution  # fields [T, B, ...]
    value: jax.Array  # [T, B]
    hidden: jax.Array  # [T, B, S] the state each step acted with (after its reset)
    final_hidden: jax.Array  # [B, S] the state after the last step (before any reset)


def unroll(
    network: RecurrentActorCritic,
    params: Any,
    initial_hidden: jax.Array,
    obs: jax.Array,
    reset: jax.Array,
) -> Unrolled:
    """Run ``network`` over a time-major sequence, zeroing the state where ``reset``.

    Args:
      initial_hidden: ``[B, S]`` state entering step 0 (before its reset).
      obs: ``[T, B, *obs_shape]``.
      reset: ``[T, B]`` bool, an episode starts at this step: the state is
        zeroed before the network sees ``obs[t]``.
    """
    chex.assert_rank([initial_hidden, reset], [2, 2])
    chex.assert_equal_shape_prefix([obs, reset], 2)

    def step(hidden, inputs):
        obs_t, reset_t = inputs
        hidden = reset_hidden(hidden, reset_t)
        next_hidden, distribution, value = network.apply(params, hidden, obs_t)
        return next_hidden, (distribution, value, hidden)

    final_hidden, (distribution, value, hidden) = jax.lax.scan(
        step, initial_hidden, (obs, reset)
    )
    return Unrolled(distribution, value, hidden, final_hidden)
