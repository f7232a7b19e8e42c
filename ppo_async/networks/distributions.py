"""The two action distributions PPO needs: categorical and diagonal Gaussian.

Each is a NamedTuple of its parameters (so it is a pytree and crosses ``jit``
and ``vmap``) with ``log_prob``, ``entropy``, ``sample`` and ``mode``. The
formulas are the closed forms; the tests check them against scipy-free numpy.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Union

import jax
import jax.numpy as jnp

_LOG_2PI = math.log(2.0 * math.pi)


class Categorical(NamedTuple):
    """Categorical over the last axis of ``logits``."""

    logits: jax.Array  # [..., num_actions] unnormalised log-probabilities

    def log_prob(self, actions: jax.Array) -> jax.Array:
        """``[...]`` log-probability of integer ``actions`` ``[...]``."""
        log_p = jax.nn.log_softmax(self.logits, axis=-1)
        return jnp.take_along_axis(
            log_p, actions[..., None].astype(jnp.int32), axis=-1
        )[..., 0]

    def entropy(self) -> jax.Array:
        """``[...]`` entropy ``-sum_a p(a) log p(a)``."""
        log_p = jax.nn.log_softmax(self.logits, axis=-1)
        return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)

    def sample(self, key: jax.Array) -> jax.Array:
        """``[...]`` int32 actions."""
        return jax.random.categorical(key, self.logits, axis=-1).astype(jnp.int32)

    def mode(self) -> jax.Array:
        """``[...]`` int32 most likely actions."""
        return jnp.argmax(self.logits, axis=-1).astype(jnp.int32)


class DiagGaussian(NamedTuple):
    """Gaussian with diagonal covariance over the last axis."""

    mean: jax.Array  # [..., action_dim]
    log_std: jax.Array  # [..., action_dim] (broadcast against mean)

    def log_prob(self, actions: jax.Array) -> jax.Array:
        """``[...]`` log-density of ``actions`` ``[..., action_dim]``, summed over dims."""
        log_std = jnp.broadcast_to(self.log_std, self.mean.shape)
        z = (actions - self.mean) * jnp.exp(-log_std)
        return jnp.sum(-0.5 * z**2 - log_std - 0.5 * _LOG_2PI, axis=-1)

    def entropy(self) -> jax.Array:
        """``[...]`` differential entropy ``sum_d (log sigma_d + 0.5 log(2 pi e))``."""
        log_std = jnp.broadcast_to(self.log_std, self.mean.shape)
        return jnp.sum(log_std + 0.5 * (_LOG_2PI + 1.0), axis=-1)

    def sample(self, key: jax.Array) -> jax.Array:
        """``[..., action_dim]`` float actions (unbounded; the env clips)."""
        noise = jax.random.normal(key, self.mean.shape, self.mean.dtype)
        std = jnp.exp(jnp.broadcast_to(self.log_std, self.mean.shape))
        return self.mean + std * noise

    def mode(self) -> jax.Array:
        """``[..., action_dim]`` the mean."""
        return self.mean


Distribution = Union[Categorical, DiagGaussian]
