"""Actor-critic networks (flax.linen).

``make_network(observation_shape, action_space)`` picks the torso from the
observation's rank (an MLP for vectors, a small conv net for MinAtar-shaped
``[10, 10, C]`` images) and the head from the action space (categorical for a
space with ``n``, diagonal Gaussian with a state-independent log-std for a
box). Calling the network returns ``(distribution, value)``: a
`ppo_async.distributions` NamedTuple holding the distribution's parameters, and
the value ``[...]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.distributions import Categorical, DiagGaussian, Distribution


def orthogonal(scale: float = 1.0):
    """Orthogonal initializer (Saxe et al. 2014) built by Gram-Schmidt, not QR.

    The distribution is that of ``flax.linen.initializers.orthogonal``: the
    orthonormal factor of a Gaussian matrix with R's diagonal made positive,
    i.e. Haar-distributed. Why not QR: with jax 0.10.2 on a 2-core CPU, a
    vmapped init (``jax.vmap(make_train(cfg))`` over seeds) runs XLA's batched
    QR, which deadlocks the CPU thread pool -- the twin hangs forever. A loop of
    matrix-vector products has no such kernel. The last axis is the output
    (column) axis, as in flax's default.
    """

    def init(key, shape, dtype=jnp.float32):
        num_cols = shape[-1]
        num_rows = math.prod(shape[:-1])
        tall = (max(num_rows, num_cols), min(num_rows, num_cols))
        gaussian = jax.random.normal(key, tall, jnp.float32)

        def orthonormalise_column(j, basis):
            column = gaussian[:, j]
            # Project out the earlier columns twice ("twice is enough" for float32).
            for _ in range(2):
                column = column - basis @ (basis.T @ column)
            return basis.at[:, j].set(column / jnp.linalg.norm(column))

        basis = jax.lax.fori_loop(
            0, tall[1], orthonormalise_column, jnp.zeros(tall, jnp.float32)
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
        x = nn.Conv(16, (3, 3), padding="VALID",
                    kernel_init=orthogonal(math.sqrt(2.0)))(x)
        x = nn.relu(x)
        return x.reshape(*x.shape[:-3], -1)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs over a shared (optional) conv torso."""

    action_dim: int
    continuous: bool
    hidden_sizes: Sequence[int] = (64, 64)
    conv_torso: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[Distribution, jax.Array]:
        x = obs.astype(jnp.float32)
        if self.conv_torso:
            x = MinAtarTorso()(x)
        actor = MLP(self.hidden_sizes)(x)
        critic = MLP(self.hidden_sizes)(x)
        value = _dense(1, 1.0)(critic)[..., 0]
        if self.continuous:
            mean = _dense(self.action_dim, 0.01)(actor)
            log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
            return DiagGaussian(mean, log_std), value
        logits = _dense(self.action_dim, 0.01)(actor)
        return Categorical(logits), value


def make_network(
    observation_shape: Sequence[int],
    action_space: Any,
    hidden_sizes: Sequence[int] = (64, 64),
) -> ActorCritic:
    """The actor-critic for one observation shape and action space.

    Args:
      observation_shape: shape of one observation: ``(D,)`` for a vector,
        ``(H, W, C)`` for an image (the conv torso).
      action_space: anything with ``n`` (discrete; gymnax and gymnasium
        ``Discrete``) or a 1-D ``shape`` (continuous; ``Box``).
      hidden_sizes: widths of the actor and critic MLPs.
    """
    observation_shape = tuple(observation_shape)
    if len(observation_shape) not in (1, 3):
        raise ValueError(
            f"observation_shape {observation_shape}: expected a vector (D,) or an "
            "image (H, W, C)"
        )
    conv_torso = len(observation_shape) == 3
    if hasattr(action_space, "n"):
        return ActorCritic(int(action_space.n), False, tuple(hidden_sizes), conv_torso)
    shape = tuple(getattr(action_space, "shape", ()))
    if len(shape) != 1:
        raise ValueError(
            f"action space {action_space!r}: expected a discrete space (with n) or a "
            "1-D box"
        )
    return ActorCritic(shape[0], True, tuple(hidden_sizes), conv_torso)


def init_params(network: ActorCritic, key: jax.Array, observation_shape: Sequence[int]):
    """Parameters for ``network`` from a dummy observation (batch of one)."""
    dummy = np.zeros((1, *observation_shape), np.float32)
    # One compiled program instead of one dispatch (and compile) per initializer op.
    return jax.jit(network.init)(key, dummy)


def params_template(network: ActorCritic, observation_shape: Sequence[int]):
    """Host zeros with the structure, shapes and dtypes of ``network``'s params.

    What decoding broadcast bytes needs, without running (or compiling) the
    initializers: ``jax.eval_shape`` only traces them. Compiling ``init`` costs
    seconds on a 2-core CPU, and a run would otherwise pay it once more for
    every template it builds.
    """
    dummy = jax.ShapeDtypeStruct((1, *observation_shape), jnp.float32)
    shapes = jax.eval_shape(network.init, jax.random.key(0), dummy)
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
