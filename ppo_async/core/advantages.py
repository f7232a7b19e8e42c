"""Advantage estimators: GAE and V-trace.

Pure, jittable functions over time-major arrays. Every array is ``[T, B]``
(time, batch) except ``bootstrap_value``, which is ``[B]``: the value of the
observation that follows the last step. ``discounts[t] = gamma * (1 - done[t])``
where ``done`` marks the end of an episode at step ``t``. Truncated episodes are
not special here: the caller folds ``gamma * V(final_obs)`` into the reward of
a truncated step and sets its discount to 0 (the actors do, with the behaviour
critic; in V-trace mode the learner does, with its current critic: see
``ppo_async.envs.gymnax_env`` and ``ppo_async.runtime.learner``).

Both estimators run a reverse ``jax.lax.scan`` over time, so their cost under
``jit`` does not grow with a Python loop, and both return targets with
``stop_gradient`` applied: they are regression targets, never differentiated.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class VTraceOutput(NamedTuple):
    """What `vtrace` returns."""

    value_targets: jax.Array  # [T, B] v_s, the V-trace value targets
    pg_advantages: jax.Array  # [T, B] min(pg_rho_bar, rho_s) * (q_s - V(x_s)), or unweighted
    clipped_rhos: jax.Array  # [T, B] min(rho_bar, rho_s)


def _check_trajectory(rewards, values, discounts, bootstrap_value, *extra):
    chex.assert_rank([rewards, values, discounts, bootstrap_value], [2, 2, 2, 1])
    chex.assert_equal_shape([rewards, values, discounts, *extra])
    chex.assert_equal_shape_suffix([rewards, bootstrap_value], 1)
    chex.assert_type([rewards, values, discounts, bootstrap_value, *extra], float)


def _reverse_discounted_sum(
    deltas: jax.Array, decays: jax.Array
) -> jax.Array:
    """acc[t] = deltas[t] + decays[t] * acc[t + 1], with acc[T] = 0."""

    def step(acc, delta_and_decay):
        delta, decay = delta_and_decay
        acc = delta + decay * acc
        return acc, acc

    _, accs = jax.lax.scan(
        step, jnp.zeros_like(deltas[0]), (deltas, decays), reverse=True
    )
    return accs


def _next_values(values: jax.Array, bootstrap_value: jax.Array) -> jax.Array:
    """V(x_{t+1}) for every t: the values shifted by one, bootstrap at the end."""
    return jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)


def gae(
    rewards: jax.Array,
    values: jax.Array,
    discounts: jax.Array,
    bootstrap_value: jax.Array,
    *,
    lambda_: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    ``delta_t = r_t + discount_t * V(x_{t+1}) - V(x_t)`` and
    ``A_t = delta_t + discount_t * lambda_ * A_{t+1}`` with ``A_T = 0``.

    Args:
      rewards: ``[T, B]`` rewards r_t.
      values: ``[T, B]`` V(x_t) of the policy being evaluated.
      discounts: ``[T, B]`` gamma * (1 - done_t).
      bootstrap_value: ``[B]`` V(x_T), the value after the last step.
      lambda_: the GAE lambda in [0, 1].

    Returns:
      ``(advantages, value_targets)``, both ``[T, B]``; ``value_targets`` is
      ``advantages + values`` (the lambda-return).
    """
    _check_trajectory(rewards, values, discounts, bootstrap_value)
    deltas = rewards + discounts * _next_values(values, bootstrap_value) - values
    advantages = _reverse_discounted_sum(deltas, discounts * lambda_)
    advantages = jax.lax.stop_gradient(advantages)
    value_targets = jax.lax.stop_gradient(advantages + values)
    return advantages, value_targets


def vtrace(
    rewards: jax.Array,
    values: jax.Array,
    discounts: jax.Array,
    bootstrap_value: jax.Array,
    log_rhos: jax.Array,
    *,
    lambda_: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    weight_pg: bool = True,
) -> VTraceOutput:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, arXiv:1802.01561).

    With ``rho_t = min(rho_bar, exp(log_rho_t))`` and
    ``c_t = lambda_ * min(c_bar, exp(log_rho_t))``::

        delta_t = rho_t * (r_t + discount_t * V(x_{t+1}) - V(x_t))
        v_s     = V(x_s) + delta_s + discount_s * c_s * (v_{s+1} - V(x_{s+1}))
        q_s     = r_s + discount_s * (lambda_ * v_{s+1} + (1 - lambda_) * V(x_{s+1}))
        pg_advantage_s = min(pg_rho_bar, exp(log_rho_s)) * (q_s - V(x_s))

    with ``v_T = V(x_T) = bootstrap_value``. The recursion for ``v_s`` is the
    paper's sum ``V(x_s) + sum_t (prod_{s<=i<t} discount_i c_i) delta_t``. The
    advantage follows rlax's ``vtrace_td_error_and_advantage``. On-policy
    (``log_rhos == 0`` and bars >= 1), ``value_targets - values`` equals GAE's
    advantages with the same ``lambda_``, and so does ``pg_advantages``.

    Args:
      rewards: ``[T, B]`` rewards r_t.
      values: ``[T, B]`` V(x_t) under the target (current) policy's critic.
      discounts: ``[T, B]`` gamma * (1 - done_t).
      bootstrap_value: ``[B]`` V(x_T).
      log_rhos: ``[T, B]`` log pi(a_t|x_t) - log mu(a_t|x_t), target minus
        behaviour log-probability of the taken action.
      lambda_: mixes in the one-step target (``lambda_ = 1`` is the paper's V-trace).
      rho_bar: clip on the importance weight inside the TD errors.
      c_bar: clip on the trace-cutting coefficients.
      pg_rho_bar: clip on the weight of the policy-gradient advantage;
        ``None`` means ``rho_bar``.
      weight_pg: False leaves the weight out: ``pg_advantage_s = q_s - V(x_s)``,
        for a surrogate whose own ratio already weights each sample by
        pi / mu (PPO's clipped ratio against the behaviour policy).
    """
    _check_trajectory(rewards, values, discounts, bootstrap_value, log_rhos)
    if pg_rho_bar is None:
        pg_rho_bar = rho_bar
    # Clipped in log space before exponentiating: a log-rho of +1000 (a
    # behaviour action the target policy finds far likelier) gives the bar,
    # never inf, and inf * 0 never turns into NaN further down.
    def clipped(bar):
        return jnp.exp(jnp.minimum(log_rhos, jnp.log(jnp.float32(bar))))

    clipped_rhos = clipped(rho_bar)
    cs = lambda_ * clipped(c_bar)
    next_values = _next_values(values, bootstrap_value)

    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    vs_minus_values = _reverse_discounted_sum(deltas, discounts * cs)
    value_targets = vs_minus_values + values

    next_value_targets = _next_values(value_targets, bootstrap_value)
    q_values = rewards + discounts * (
        lambda_ * next_value_targets + (1.0 - lambda_) * next_values
    )
    pg_advantages = q_values - values
    if weight_pg:
        pg_advantages = clipped(pg_rho_bar) * pg_advantages
    return VTraceOutput(
        value_targets=jax.lax.stop_gradient(value_targets),
        pg_advantages=jax.lax.stop_gradient(pg_advantages),
        clipped_rhos=jax.lax.stop_gradient(clipped_rhos),
    )
