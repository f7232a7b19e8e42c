"""The PPO objective (Schulman et al. 2017, arXiv:1707.06347).

One pure function over per-sample arrays, so it can be tested without a
network: the caller evaluates its policy and passes log-probabilities, values
and entropies in.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

# Log-ratios are clipped to +-LOG_RATIO_LIMIT before exponentiating: e^20 is
# far past any ratio a healthy update sees, and far from float32's overflow.
LOG_RATIO_LIMIT = 20.0


def masked_mean(x: jax.Array, mask: jax.Array | None) -> jax.Array:
    """``mean(x)`` over the samples where ``mask`` is 1 (0 if none is)."""
    if mask is None:
        return jnp.mean(x)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def ppo_loss(
    logp: jax.Array,
    proximal_logp: jax.Array,
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
    behaviour_logp: jax.Array | None = None,
    is_weight_max: float = 100.0,
    mask: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped-surrogate PPO loss, value loss and entropy bonus.

    ``proximal_logp`` is the proximal policy pi_prox the ratio is centred on
    (Hilton et al. 2021, arXiv:2110.00641). With ``r = pi / pi_prox =
    exp(clip(logp - proximal_logp, -20, 20))``::

        policy_loss = -mean(w * min(r * A, clip(r, 1 - eps, 1 + eps) * A))

    where ``w = 1`` when ``behaviour_logp`` is None (pi_prox is the policy
    that collected the data: standard PPO), and otherwise the importance
    weight of the proximal over the behaviour policy mu,
    ``w = exp(min(proximal_logp - behaviour_logp, log(is_weight_max)))``, so the
    surrogate is an expectation under mu of the decoupled objective.
    ``value_loss = 0.5 * mean((V - target)^2)``, or with ``value_clip_eps`` the
    elementwise max against the value clipped to ``old_values +- value_clip_eps``;
    ``loss = policy_loss + vf_coef * value_loss - ent_coef * mean(entropy)``.
    With a ``mask``, every mean (and the advantage standardisation) runs over
    the samples where it is 1: the others contribute nothing to the loss or
    its gradient.

    Args:
      logp: ``[N]`` log pi(a|x) under the parameters being optimised.
      proximal_logp: ``[N]`` log pi_prox(a|x), the ratio's anchor (the behaviour
        policy, the learner's params at the update's start, or their moving
        average: see ``AsyncActorLearnerConfig.ppo_ratio_anchor``).
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
      behaviour_logp: ``[N]`` log mu(a|x) of the policy that acted, when it is
        not the anchor; ``None`` when it is.
      is_weight_max: cap on the importance weight ``w``.
      mask: ``[N]`` 1.0 for samples in the loss, 0.0 for dropped ones.

    Returns:
      ``(loss, metrics)``: the scalar loss and a flat dict of scalars
      (``policy_loss``, ``value_loss``, ``entropy``, ``approx_kl``,
      ``clip_fraction``, and ``is_weight_mean`` with ``behaviour_logp``).
    """
    chex.assert_rank(logp, 1)
    chex.assert_equal_shape(
        [logp, proximal_logp, advantages, values, old_values, value_targets, entropy]
    )
    advantages = jax.lax.stop_gradient(advantages)
    value_targets = jax.lax.stop_gradient(value_targets)
    if normalize_advantages and mask is None:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    elif normalize_advantages:
        mean = masked_mean(advantages, mask)
        std = jnp.sqrt(masked_mean(jnp.square(advantages - mean), mask))
        advantages = (advantages - mean) / (std + 1e-8)

    log_ratio = jnp.clip(logp - proximal_logp, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = jnp.exp(log_ratio)
    surrogate = ratio * advantages
    clipped_surrogate = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    objective = jnp.minimum(surrogate, clipped_surrogate)
    metrics = {}
    if behaviour_logp is not None:
        chex.assert_equal_shape([logp, behaviour_logp])
        log_weight = jnp.minimum(
            proximal_logp - behaviour_logp, jnp.log(jnp.float32(is_weight_max))
        )
        weight = jnp.exp(log_weight)
        objective = weight * objective
        metrics["is_weight_mean"] = masked_mean(weight, mask)
    policy_loss = -masked_mean(objective, mask)

    value_error = jnp.square(values - value_targets)
    if value_clip_eps is not None:
        clipped_values = old_values + jnp.clip(
            values - old_values, -value_clip_eps, value_clip_eps
        )
        value_error = jnp.maximum(value_error, jnp.square(clipped_values - value_targets))
    value_loss = 0.5 * masked_mean(value_error, mask)

    mean_entropy = masked_mean(entropy, mask)
    loss = policy_loss + vf_coef * value_loss - ent_coef * mean_entropy
    metrics.update({
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": mean_entropy,
        # The (ratio - 1) - log(ratio) estimator: unbiased and never negative.
        "approx_kl": jax.lax.stop_gradient(masked_mean((ratio - 1.0) - log_ratio, mask)),
        "clip_fraction": jax.lax.stop_gradient(
            masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32), mask)
        ),
    })
    return loss, metrics
