"""Running observation normalization and return-based reward scaling.

The statistics are the Welford / Chan et al. running mean and variance of
cleanrl's and Stoix's ``RunningMeanStd`` (brax's ``running_statistics``):

- observations: ``clip((obs - mean) / sqrt(var + eps), -obs_clip, obs_clip)``
  with the mean and variance of every observation the learner has consumed;
- rewards (cleanrl's ``NormalizeReward``): each env keeps a discounted return
  ``R_t = r_t + gamma * (1 - done_{t-1}) * R_{t-1}`` (reset after an episode
  ends), and a reward is scaled to ``clip(r_t / sqrt(var(R) + eps),
  -reward_clip, reward_clip)``, ``var(R)`` the running variance of every
  ``R_t`` consumed. The mean is not subtracted: the sign of a reward stays.

Who owns what, so that every consumer applies the same transform: the
learner owns the statistics. They travel in its params, which become a
`NormalizedPolicy` (network params plus statistics) when an option is on, so
the broadcast bytes, checkpoints, ``params.msgpack`` and the evaluator all
carry them with no extra channel. Actors act on ``normalize_observation`` of
the statistics they last received, scale rewards with them, and send the raw
observations and their discounted returns; the learner folds each batch into
the statistics in consumption order (before the update, as brax does),
trains on the batch normalized with the new statistics, and broadcasts
both. A run with both options off carries plain network params.

Everything here is pure and jittable, and takes named options, never the config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

EPSILON = 1e-8  # inside sqrt(var + eps): a constant feature does not divide by zero


class RunningMeanStd(NamedTuple):
    """Running mean and (population) variance of a stream of samples."""

    mean: jax.Array  # [*shape] float32
    var: jax.Array  # [*shape] float32, sum of squared deviations / count (1 before any sample)
    count: jax.Array  # [] float32, samples folded in so far


def init_running_mean_std(shape: tuple[int, ...] = ()) -> RunningMeanStd:
    """No samples yet: mean 0, var 1, so normalizing is (nearly) the identity."""
    return RunningMeanStd(np.zeros(shape, np.float32), np.ones(shape, np.float32),
                          np.zeros((), np.float32))


def update_running_mean_std(stats: RunningMeanStd, samples: jax.Array) -> RunningMeanStd:
    """``stats`` with ``samples`` ``[..., *shape]`` folded in (all leading axes are samples).

    Chan, Golub & LeVeque's parallel update (the batch form of Welford's): with
    ``n_a, mean_a, var_a`` the running statistics and ``n_b, mean_b, var_b``
    the batch's, ``delta = mean_b - mean_a``, ``n = n_a + n_b``,
    ``mean = mean_a + delta * n_b / n`` and
    ``var = (var_a * n_a + var_b * n_b + delta^2 * n_a * n_b / n) / n``,
    so that after any split of a stream into batches ``mean`` and ``var``
    equal ``np.mean`` and ``np.var`` of the whole stream.
    """
    sample_rank = samples.ndim - stats.mean.ndim
    chex.assert_shape(samples, (*samples.shape[:sample_rank], *stats.mean.shape))
    axes = tuple(range(sample_rank))
    samples = jnp.asarray(samples, jnp.float32)
    batch_count = jnp.float32(np.prod(samples.shape[:sample_rank]))
    batch_mean = jnp.mean(samples, axis=axes)
    batch_var = jnp.var(samples, axis=axes)
    count = stats.count + batch_count
    delta = batch_mean - stats.mean
    mean = stats.mean + delta * batch_count / count
    m2 = stats.var * stats.count + batch_var * batch_count + (
        jnp.square(delta) * stats.count * batch_count / count)
    return RunningMeanStd(mean, m2 / count, count)


def normalize_observation(stats: RunningMeanStd, obs: jax.Array, *, clip: float) -> jax.Array:
    """``clip((obs - mean) / sqrt(var + eps), -clip, clip)``, float32, for ``obs [..., *shape]``."""
    chex.assert_equal_shape_suffix([obs, stats.mean], stats.mean.ndim)
    leading = (1,) * (obs.ndim - stats.mean.ndim)  # explicit: no implicit rank promotion
    mean = jnp.reshape(stats.mean, leading + stats.mean.shape)
    std = jnp.reshape(jnp.sqrt(stats.var + EPSILON), leading + stats.mean.shape)
    scaled = (obs - mean) / std
    return jnp.clip(scaled, -clip, clip).astype(jnp.float32)


def scale_reward(stats: RunningMeanStd, reward: jax.Array, *, clip: float) -> jax.Array:
    """``clip(reward / sqrt(var + eps), -clip, clip)``: ``stats`` are those of discounted returns."""
    chex.assert_rank(stats.var, 0)
    return jnp.clip(reward / jnp.sqrt(stats.var + EPSILON), -clip, clip).astype(jnp.float32)


def accumulate_return(carried: jax.Array, reward: jax.Array, done: jax.Array, *,
                      gamma: float) -> tuple[jax.Array, jax.Array]:
    """``(R_t, carried')`` for one step of ``E`` envs (all ``[E]``).

    ``R_t = gamma * carried + r_t``, where ``carried`` is ``R_{t-1}``, or 0
    after a step that ended an episode; ``carried'`` is ``R_t``, or 0 where
    ``done``. ``R_t`` is the sample the return statistics take.
    """
    chex.assert_equal_shape([carried, reward, done])
    discounted_return = gamma * carried + reward
    return discounted_return, jnp.where(done, 0.0, discounted_return)


class NormalizedPolicy(NamedTuple):
    """What acts when normalization is on: network params and the learner's statistics.

    A learner's params, a broadcast's payload, a checkpoint's params and a
    run's ``params.msgpack`` all have this structure then.
    """

    params: Any  # the network's params
    obs_stats: RunningMeanStd | None  # of observations [*obs_shape]; None: not normalized
    return_stats: RunningMeanStd | None  # of discounted returns []; None: rewards not scaled


class NormalizationOptions(NamedTuple):
    """Which transforms a run applies, and their clips.

    A run's come from ``AsyncActorLearnerConfig.normalization_options()`` (its
    ``normalize_*`` and ``*_clip`` fields).
    """

    observations: bool = False  # normalize observations by their running statistics
    rewards: bool = False  # scale rewards by the spread of a running discounted return
    obs_clip: float = 10.0  # normalized observations are clipped to [-obs_clip, obs_clip]
    reward_clip: float = 10.0  # scaled rewards are clipped to [-reward_clip, reward_clip]

    @property
    def enabled(self) -> bool:
        """Whether params travel as a `NormalizedPolicy`."""
        return self.observations or self.rewards


def wrap_params(params: Any, observation_shape: tuple[int, ...],
                options: NormalizationOptions) -> Any:
    """``params`` as the run's policy: unchanged with both options off, else a
    `NormalizedPolicy` with statistics of no samples yet (host arrays)."""
    if not options.enabled:
        return params
    return NormalizedPolicy(
        params,
        init_running_mean_std(tuple(observation_shape)) if options.observations else None,
        init_running_mean_std(()) if options.rewards else None,
    )


def network_params(policy: Any) -> Any:
    """The network's params of a policy (plain params pass through)."""
    return policy.params if isinstance(policy, NormalizedPolicy) else policy


def acting_apply(apply_fn: Callable[..., Any], options: NormalizationOptions) -> Callable[..., Any]:
    """``apply(policy, *inputs, obs)``: ``apply_fn`` of the network params on normalized obs.

    ``apply_fn`` is a network's ``apply`` (``(params, obs)`` or, recurrent,
    ``(params, hidden, obs)``); the observation is its last argument. With
    both options off, ``apply_fn`` itself (the policy is plain params).
    """
    if not options.enabled:
        return apply_fn

    def apply(policy: NormalizedPolicy, *inputs: Any) -> Any:
        *state, obs = inputs
        if policy.obs_stats is not None:
            obs = normalize_observation(policy.obs_stats, obs, clip=options.obs_clip)
        return apply_fn(policy.params, *state, obs)

    return apply


def update_statistics(policy: NormalizedPolicy, obs: jax.Array,
                      discounted_return: jax.Array | None) -> NormalizedPolicy:
    """``policy`` with a batch's raw ``obs [..., *obs_shape]`` and returns ``[...]`` folded in."""
    obs_stats, return_stats = policy.obs_stats, policy.return_stats
    if obs_stats is not None:
        obs_stats = update_running_mean_std(obs_stats, obs)
    if return_stats is not None:
        return_stats = update_running_mean_std(return_stats, discounted_return)
    return NormalizedPolicy(policy.params, obs_stats, return_stats)
