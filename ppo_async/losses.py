"""The PPO objective (Schulman et al. 2017, arXiv:1707.06347).

One pure function over per-sample arrays, so it can be tested without a
network: the caller evaluates its policy and passes log-probabilities, values
and entropies in.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def ppo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    values: jax.Array,
    old_values: jax.Array,
    value_targets: jax.Array,
    entropy: jax.Array,
    *,
    clip_eps: float,
    vf_coef: float,
    ent_coef: float,
    value_clip_eps: float | None = None,
    normalize_advantages: bool = True,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped-surrogate PPO loss, value loss and entropy bonus.

    ``ratio = exp(logp - old_logp)``;
    ``policy_loss = -mean(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A))``;
    ``value_loss = 0.5 * mean((V - target)^2)``, or with ``value_clip_eps`` the
    elementwise max against the value clipped to ``old_values +- value_clip_eps``;
    ``loss = policy_loss + vf_coef * value_loss - ent_coef * mean(entropy)``.

    Args:
      logp: ``[N]`` log pi(a|x) under the parameters being optimised.
      old_logp: ``[N]`` log-probability under the policy the ratio is taken
        against (the behaviour policy, or the learner's policy at the start of
        the update when V-trace corrects for staleness).
      advantages: ``[N]`` advantage estimates (no gradient flows into them).
      values: ``[N]`` V(x) under the parameters being optimised.
      old_values: ``[N]`` V(x) the value clip is centred on.
      value_targets: ``[N]`` regression targets.
      entropy: ``[N]`` policy entropy at x.
      clip_eps: surrogate clip epsilon.
      vf_coef: weight of the value loss.
      ent_coef: weight of the entropy bonus.
      value_clip_eps: clip of the value update; ``None`` turns it off.
      normalize_advantages: standardise ``advantages`` over the ``N`` samples.

    Returns:
      ``(loss, metrics)``: the scalar loss and a flat dict of scalars
      (``policy_loss``, ``value_loss``, ``entropy``, ``approx_kl``,
      ``clip_fraction``).
    """
    chex.assert_rank(logp, 1)
    chex.assert_equal_shape(
        [logp, old_logp, advantages, values, old_values, value_targets, entropy]
    )
    advantages = jax.lax.stop_gradient(advantages)
    value_targets = jax.lax.stop_gradient(value_targets)
    if normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    log_ratio = logp - old_logp
    ratio = jnp.exp(log_ratio)
    surrogate = ratio * advantages
    clipped_surrogate = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    policy_loss = -jnp.mean(jnp.minimum(surrogate, clipped_surrogate))

    value_error = jnp.square(values - value_targets)
    if value_clip_eps is not None:
        clipped_values = old_values + jnp.clip(
            values - old_values, -value_clip_eps, value_clip_eps
        )
        value_error = jnp.maximum(value_error, jnp.square(clipped_values - value_targets))
    value_loss = 0.5 * jnp.mean(value_error)

    mean_entropy = jnp.mean(entropy)
    loss = policy_loss + vf_coef * value_loss - ent_coef * mean_entropy
    metrics = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": mean_entropy,
        # The (ratio - 1) - log(ratio) estimator: unbiased and never negative.
        "approx_kl": jax.lax.stop_gradient(jnp.mean((ratio - 1.0) - log_ratio)),
        "clip_fraction": jax.lax.stop_gradient(
            jnp.mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32))
        ),
    }
    return loss, metrics
