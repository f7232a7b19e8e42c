"""Plain-numpy reference estimators, written from the papers' equations.

These are deliberately *not* the library's reverse recursions: each target is
the explicit forward sum over the rest of the trajectory, with the trace
weights formed as explicit products, in float64, with Python for-loops. They
are O(T^3 B) and only meant for the short trajectories of the tests.

Conventions (as in ``ppo_async.core.advantages``): arrays are time-major ``[T, B]``,
``bootstrap_value`` is ``[B]`` and is V(x_T), ``discounts[t] = gamma * (1 - done_t)``.
"""

from __future__ import annotations

import numpy as np


def _as_f64(*arrays):
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _values_with_bootstrap(values: np.ndarray, bootstrap_value: np.ndarray) -> np.ndarray:
    """V(x_0), ..., V(x_{T-1}), V(x_T): shape [T + 1, B]."""
    return np.concatenate([values, bootstrap_value[None, :]], axis=0)


def gae_reference(rewards, values, discounts, bootstrap_value, lambda_):
    """GAE (Schulman et al. 2016, eq. 16) as an explicit forward sum.

    delta_t = r_t + discounts_t * V_{t+1} - V_t            (V_T = bootstrap)
    A_s     = sum_{t=s}^{T-1} (prod_{i=s}^{t-1} discounts_i * lambda_) * delta_t

    Returns (advantages, value_targets = advantages + values), both [T, B] float64.
    """
    rewards, values, discounts, bootstrap_value = _as_f64(
        rewards, values, discounts, bootstrap_value
    )
    T, B = rewards.shape
    v_ext = _values_with_bootstrap(values, bootstrap_value)

    deltas = np.zeros((T, B))
    for t in range(T):
        for b in range(B):
            deltas[t, b] = rewards[t, b] + discounts[t, b] * v_ext[t + 1, b] - v_ext[t, b]

    advantages = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total = 0.0
            for t in range(s, T):
                weight = 1.0
                for i in range(s, t):
                    weight *= discounts[i, b] * lambda_
                total += weight * deltas[t, b]
            advantages[s, b] = total
    return advantages, advantages + values


def vtrace_reference(
    rewards,
    values,
    discounts,
    bootstrap_value,
    log_rhos,
    lambda_=1.0,
    rho_bar=1.0,
    c_bar=1.0,
    pg_rho_bar=None,
    weight_pg=True,
):
    """V-trace (Espeholt et al. 2018, eq. 1) as an explicit forward sum.

    rho_t   = min(rho_bar, exp(log_rho_t))
    c_i     = lambda_ * min(c_bar, exp(log_rho_i))
    delta_t = r_t + discounts_t * V(x_{t+1}) - V(x_t)                (unweighted)
    v_s     = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} discounts_i * c_i) * rho_t * delta_t
    q_s     = r_s + discounts_s * (lambda_ * v_{s+1} + (1 - lambda_) * V(x_{s+1}))
              with v_T = V(x_T) = bootstrap_value
    pg_adv_s = min(pg_rho_bar, exp(log_rho_s)) * (q_s - V(x_s)),  pg_rho_bar None -> rho_bar
               (q_s - V(x_s) with weight_pg False)

    Returns (value_targets, pg_advantages, clipped_rhos), each [T, B] float64.
    """
    rewards, values, discounts, bootstrap_value, log_rhos = _as_f64(
        rewards, values, discounts, bootstrap_value, log_rhos
    )
    if pg_rho_bar is None:
        pg_rho_bar = rho_bar
    T, B = rewards.shape
    v_ext = _values_with_bootstrap(values, bootstrap_value)

    rhos = np.zeros((T, B))
    clipped_rhos = np.zeros((T, B))
    cs = np.zeros((T, B))
    pg_rhos = np.zeros((T, B))
    deltas = np.zeros((T, B))
    for t in range(T):
        for b in range(B):
            rhos[t, b] = np.exp(log_rhos[t, b])
            clipped_rhos[t, b] = min(rho_bar, rhos[t, b])
            cs[t, b] = lambda_ * min(c_bar, rhos[t, b])
            pg_rhos[t, b] = min(pg_rho_bar, rhos[t, b]) if weight_pg else 1.0
            deltas[t, b] = rewards[t, b] + discounts[t, b] * v_ext[t + 1, b] - v_ext[t, b]

    # v_s, eq. (1), with v_T = V(x_T) appended at the end.
    vs_ext = np.zeros((T + 1, B))
    for b in range(B):
        vs_ext[T, b] = bootstrap_value[b]
        for s in range(T):
            total = 0.0
            for t in range(s, T):
                trace = 1.0
                for i in range(s, t):
                    trace *= discounts[i, b] * cs[i, b]
                total += trace * clipped_rhos[t, b] * deltas[t, b]
            vs_ext[s, b] = values[s, b] + total

    pg_advantages = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            q = rewards[s, b] + discounts[s, b] * (
                lambda_ * vs_ext[s + 1, b] + (1.0 - lambda_) * v_ext[s + 1, b]
            )
            pg_advantages[s, b] = pg_rhos[s, b] * (q - values[s, b])

    return vs_ext[:T], pg_advantages, clipped_rhos
