"""The learner: rollout buffer, jitted PPO update, and the loop that feeds it.

`RolloutBuffer` keeps one column per actor. When every column holds a chunk of
``num_steps`` rows, `learner_loop` takes one chunk per actor in fixed actor
order (so a lock-step run is reproducible), stacks them along the env axis,
and runs one jitted `make_update_fn` step: advantages (GAE on the behaviour
values, or V-trace re-evaluated under the current params; `batch_targets`),
then ``num_epochs x num_minibatches`` PPO steps with optax, the ratio centred
on the anchor ``config.ppo_ratio_anchor`` names. A recurrent network is
re-unrolled from each chunk's stored initial state (`reevaluate_recurrent`)
and trained on minibatches of whole env sequences (`recurrent_sequences`). Every
``broadcast_every`` updates it hands the params to its transport's publisher,
which sends them to every actor as bytes. Which transport carries the
messages (threads, Ray processes) the loop does not know.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import queue
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ppo_async.runtime.actor import ActorError, ActorFailure, ActorStats, Experience
from ppo_async.core.advantages import gae, vtrace
from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core.losses import ppo_loss
from ppo_async.networks.actor_critic import (
    ActorCritic,
    RecurrentActorCritic,
    is_recurrent,
    reset_hidden,
    unroll,
)
from ppo_async.core.normalization import (
    NormalizationOptions,
    network_params,
    normalize_observation,
    update_statistics,
)
from ppo_async.runtime.messages import PolicyBroadcast, place, serialize_policy

if TYPE_CHECKING:  # the transport module builds on this one's callers, not on it
    from ppo_async.runtime.evaluate import EvalResult
    from ppo_async.runtime.transport import LearnerTransport


class LearnerTimeoutError(TimeoutError):
    """Actors the learner waits on sent nothing for ``learner_timeout_s``.

    ``actor_ids`` names them: the actors whose buffer column is empty and
    whose last chunk is older than the timeout, whatever the others sent.
    """

    def __init__(self, message: str, actor_ids: Sequence[int] = ()):
        super().__init__(message)
        self.actor_ids = tuple(actor_ids)


class StopTraining(Exception):
    """Raise from an ``on_update`` callback to end the run early, as if it had finished."""


class NonFiniteError(FloatingPointError):
    """An update produced a non-finite metric or parameter; the run stops before using it."""


class Batch(NamedTuple):
    """One learner batch: a chunk from every actor, envs stacked (``B = num_envs``)."""

    obs: jax.Array  # [T, B, *obs_shape]
    action: jax.Array  # [T, B] or [T, B, action_dim]
    reward: jax.Array  # [T, B] truncation bootstrap folded in (unless final_obs is given)
    done: jax.Array  # [T, B] bool, terminated or truncated
    behaviour_logp: jax.Array  # [T, B]
    behaviour_value: jax.Array  # [T, B]
    bootstrap_obs: jax.Array  # [B, *obs_shape]
    bootstrap_value: jax.Array  # [B] under the behaviour params
    # Recurrent policies only (None otherwise):
    reset: jax.Array | None = None  # [T, B] bool, the state was zeroed before this step
    initial_hidden: jax.Array | None = None  # [B, state_size] the state row 0 acted with
    # Learner updates since each env's chunk was collected (None: all fresh):
    policy_lag: jax.Array | None = None  # [B] int32
    # When the learner bootstraps truncations (config.learner_bootstraps_truncation;
    # None otherwise): ``reward`` has nothing folded in, and at truncated steps
    # the learner adds gamma * V(final_obs) under its current critic.
    truncated: jax.Array | None = None  # [T, B] bool, the time limit ended the episode
    final_obs: jax.Array | None = None  # [T, B, *obs_shape] the observation it reached
    # Reward scaling only (None otherwise):
    discounted_return: jax.Array | None = None  # [T, B] R_t of the raw rewards


class RolloutBuffer:
    """One FIFO column of `Experience` chunks per actor."""

    def __init__(self, num_actors: int):
        self.columns: list[collections.deque[Experience]] = [
            collections.deque() for _ in range(num_actors)
        ]

    def add(self, experience: Experience) -> None:
        self.columns[experience.actor_id].append(experience)

    def ready(self) -> bool:
        """Every column holds at least one chunk (``num_steps`` rows)."""
        return all(self.columns)

    def pop_batch(self) -> list[Experience]:
        """The oldest chunk of every column, in actor order."""
        if not self.ready():
            raise RuntimeError("pop_batch on a buffer with an empty column")
        return [column.popleft() for column in self.columns]


def stack_experiences(experiences: Sequence[Experience], lags: Sequence[int] | None = None) -> Batch:
    """Concatenate chunks along the env axis, in the order given (numpy).

    ``lags``: each chunk's policy lag in learner updates (default 0), copied
    to every env of its chunk.
    """

    def cat(arrays, axis):
        return np.concatenate(arrays, axis=axis)

    trajectories = [e.trajectory for e in experiences]
    recurrent = trajectories[0].hidden is not None
    final_obs = trajectories[0].final_obs is not None
    lags = [0] * len(experiences) if lags is None else lags
    return Batch(
        obs=cat([t.obs for t in trajectories], 1),
        action=cat([t.action for t in trajectories], 1),
        reward=cat([t.reward for t in trajectories], 1),
        done=cat([t.terminated | t.truncated for t in trajectories], 1),
        behaviour_logp=cat([t.behaviour_logp for t in trajectories], 1),
        behaviour_value=cat([t.behaviour_value for t in trajectories], 1),
        bootstrap_obs=cat([e.bootstrap_obs for e in experiences], 0),
        bootstrap_value=cat([e.bootstrap_value for e in experiences], 0),
        # Only the state at the chunk's start crosses to the learner: it
        # re-unrolls the rest under its own params.
        reset=cat([t.reset for t in trajectories], 1) if recurrent else None,
        initial_hidden=cat([t.hidden[0] for t in trajectories], 0) if recurrent else None,
        policy_lag=cat([np.full(t.reward.shape[1], lag, np.int32)
                        for t, lag in zip(trajectories, lags, strict=True)], 0),
        truncated=cat([t.truncated for t in trajectories], 1) if final_obs else None,
        final_obs=cat([t.final_obs for t in trajectories], 1) if final_obs else None,
        discounted_return=(cat([t.discounted_return for t in trajectories], 1)
                           if trajectories[0].discounted_return is not None else None),
    )


class ProximalAverage(NamedTuple):
    """The bias-corrected moving average of the learner's params (``ppo_ratio_anchor='ewma'``).

    With decay ``beta``, ``m_t = beta * m_{t-1} + (1 - beta) * theta_t`` from
    ``m_0 = 0``, and the average is ``m_t / (1 - beta^t)`` (Adam's bias
    correction; Hilton et al. 2021). ``theta_1`` is the initial params and
    every optimizer step adds the next; ``params`` holds the corrected
    average itself, updated as ``avg += (1 - beta) / (1 - beta^t) * (theta_t - avg)``.
    """

    params: Any
    count: jax.Array  # int32 t, the params averaged so far


def average_in(average: ProximalAverage, params: Any, decay: float) -> ProximalAverage:
    """``average`` after one more params ``theta_{t+1}`` (see `ProximalAverage`)."""
    count = average.count + 1
    step = (1.0 - decay) / (1.0 - jnp.power(jnp.float32(decay), count.astype(jnp.float32)))
    return ProximalAverage(
        jax.tree.map(lambda a, p: a + step * (p - a), average.params, params), count
    )


class LearnerState(NamedTuple):
    """What the update step carries from one update to the next."""

    # network params on the learner device; with normalization, a
    # `ppo_async.core.normalization.NormalizedPolicy` (params and statistics)
    params: Any
    opt_state: Any  # optax state
    key: jax.Array  # PRNG key for minibatch shuffling
    proximal: ProximalAverage | None = None  # with ppo_ratio_anchor='ewma' only


class LearningRateSchedule(NamedTuple):
    """One linear piece of the annealed learning rate, in optimizer steps.

    The rate is ``begin_value`` up to ``begin_step`` and falls linearly to 0
    at ``end_step``. A fresh run's piece is ``(0, learning_rate,
    num_updates * num_epochs * num_minibatches)``. A run resumed with another
    budget or ``learning_rate`` is re-planned as if it had been planned so
    from the start: ``(0, learning_rate, new end)`` (`continue_schedule`).
    (Checkpoints of older versions may hold a piece with ``begin_step > 0``;
    resumed with their own budget, they keep it.)
    """

    begin_step: int
    begin_value: float
    end_step: int

    def __call__(self, step: Any) -> Any:
        return _linear(self)(step)


def _linear(schedule: LearningRateSchedule) -> optax.Schedule:
    if schedule.begin_step == 0:
        return optax.linear_schedule(schedule.begin_value, 0.0, schedule.end_step)
    return optax.linear_schedule(
        schedule.begin_value, 0.0, schedule.end_step - schedule.begin_step,
        transition_begin=schedule.begin_step,
    )


def optimizer_steps_per_update(config: AsyncActorLearnerConfig) -> int:
    return config.num_epochs * config.num_minibatches


def default_schedule(config: AsyncActorLearnerConfig) -> LearningRateSchedule:
    """The schedule of a fresh run: ``learning_rate`` to 0 over the whole budget."""
    return LearningRateSchedule(
        0, float(config.learning_rate), config.num_updates * optimizer_steps_per_update(config)
    )


def continue_schedule(
    schedule: LearningRateSchedule, end_step: int, learning_rate: float,
    saved_learning_rate: float,
) -> LearningRateSchedule:
    """The schedule of a resumed run that now ends at optimizer step ``end_step``.

    ``schedule`` and ``saved_learning_rate`` are the checkpoint's;
    ``learning_rate`` is the resuming config's. The same end and rate keep the
    piece as it was, so an interrupted run resumed with its own budget computes
    exactly the rates an uninterrupted one would. Otherwise the schedule is
    re-planned from the initial rate over the new total,
    ``(0, learning_rate, end_step)``: at the resume point, after
    ``steps_done`` optimizer steps, the rate is
    ``learning_rate * (1 - steps_done / end_step)``, the schedule of a run
    planned for the new budget from the start. (``end_step`` counts the
    optimizer steps taken so far plus those of the updates left, at the
    resuming config's ``num_epochs * num_minibatches``, so the rate reaches 0
    at the last step even if the batch changed.)
    """
    if end_step == schedule.end_step and learning_rate == saved_learning_rate:
        return schedule
    return LearningRateSchedule(0, float(learning_rate), end_step)


def make_optimizer(
    config: AsyncActorLearnerConfig, schedule: LearningRateSchedule | None = None
) -> optax.GradientTransformation:
    """Adam after global-norm clipping; with ``anneal_lr``, ``schedule`` (default: a fresh run's)."""
    if config.anneal_lr:
        learning_rate = _linear(schedule if schedule is not None else default_schedule(config))
    else:
        learning_rate = config.learning_rate
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate, eps=1e-5),
    )


@functools.lru_cache(maxsize=8)
def _optimizer_init(config: AsyncActorLearnerConfig) -> Callable[[Any], Any]:
    # Jitted: run eagerly, the zeros of every distinct leaf shape compile on
    # their own, a dozen small compiles on the way to a run's first update.
    return jax.jit(make_optimizer(config).init)


def init_learner_state(
    config: AsyncActorLearnerConfig, params: Any, key: jax.Array
) -> LearnerState:
    proximal = None
    if config.ppo_ratio_anchor == "ewma":
        # t = 1: the average of the initial params alone is those params.
        proximal = ProximalAverage(jax.tree.map(jnp.array, network_params(params)),
                                   jnp.ones((), jnp.int32))
    return LearnerState(params, _optimizer_init(config)(network_params(params)), key, proximal)


UpdateFn = Callable[[LearnerState, Batch], tuple[LearnerState, dict[str, jax.Array]]]


class Targets(NamedTuple):
    """What the PPO epochs train towards, for every sample of a batch (`batch_targets`)."""

    advantages: jax.Array  # [T, B]
    value_targets: jax.Array  # [T, B]
    old_values: jax.Array  # [T, B] the values the estimate started from
    # log pi_prox(a|x) of a fixed anchor ('behaviour' or 'learner'); None for
    # 'ewma', whose anchor moves with every optimizer step.
    proximal_logp: jax.Array | None
    mask: jax.Array | None  # [T, B] float32, 0 where max_policy_lag drops the sample
    metrics: dict[str, jax.Array]


def batch_targets(
    config: AsyncActorLearnerConfig, network: ActorCritic | RecurrentActorCritic,
    params: Any, batch: Batch,
) -> Targets:
    """Advantages, value targets, the ratio's anchor and the lag mask of ``batch``.

    Without V-trace: GAE on the behaviour values, with the truncation
    bootstrap the actors folded into the rewards. With V-trace: the batch is
    re-evaluated under ``params`` (the learner's current policy pi and critic
    V), truncated steps get ``gamma * V(final_obs)`` added to their reward
    (`AsyncActorLearnerConfig.learner_bootstraps_truncation`), and V-trace
    runs with ``log_rho = log pi(a|x) - log mu(a|x)``. The anchor is mu
    (``'behaviour'``) or pi at the update's start (``'learner'``). Pure and
    jittable; `make_update_fn` calls it first.
    """
    anchor = config.ppo_ratio_anchor
    metrics: dict[str, jax.Array] = {}
    learner_logp = learner_values = learner_bootstrap = None
    if config.use_vtrace or anchor == "learner":
        if is_recurrent(network):
            learner_logp, learner_values, learner_bootstrap = reevaluate_recurrent(
                network, params, batch
            )
        else:
            dist, learner_values = network.apply(params, batch.obs)
            learner_logp = dist.log_prob(batch.action)
            _, learner_bootstrap = network.apply(params, batch.bootstrap_obs)
    reward = batch.reward
    if batch.final_obs is not None:
        _, final_values = network.apply(params, batch.final_obs)
        reward = reward + config.gamma * jnp.where(batch.truncated, final_values, 0.0)
    discounts = config.gamma * (1.0 - batch.done.astype(jnp.float32))
    if config.use_vtrace:
        out = vtrace(
            reward, learner_values, discounts, learner_bootstrap,
            learner_logp - batch.behaviour_logp,
            lambda_=config.vtrace_lambda, rho_bar=config.vtrace_rho_bar,
            c_bar=config.vtrace_c_bar, pg_rho_bar=config.vtrace_pg_rho_bar,
            weight_pg=config.vtrace_pg_rho_bar is not None,
        )
        advantages, value_targets, old_values = out.pg_advantages, out.value_targets, learner_values
        metrics["vtrace_clipped_rho_mean"] = jnp.mean(out.clipped_rhos)
    else:
        advantages, value_targets = gae(
            reward, batch.behaviour_value, discounts, batch.bootstrap_value,
            lambda_=config.gae_lambda,
        )
        old_values = batch.behaviour_value
    proximal_logp = {"behaviour": batch.behaviour_logp, "learner": learner_logp}.get(anchor)
    mask = None
    if config.max_policy_lag is not None:
        fresh = batch.policy_lag <= config.max_policy_lag  # [B]
        mask = jnp.broadcast_to(fresh, batch.reward.shape).astype(jnp.float32)
        metrics["dropped_fraction"] = 1.0 - jnp.mean(mask)
    return Targets(advantages, value_targets, old_values, proximal_logp, mask, metrics)


class Samples(NamedTuple):
    """Flat ``[N]`` samples a feed-forward minibatch trains on (None: not used by this config)."""

    obs: jax.Array
    action: jax.Array
    proximal_logp: jax.Array | None
    behaviour_logp: jax.Array | None
    advantages: jax.Array
    old_values: jax.Array
    value_targets: jax.Array
    mask: jax.Array | None


def make_update_fn(
    config: AsyncActorLearnerConfig, network: ActorCritic,
    schedule: LearningRateSchedule | None = None,
) -> UpdateFn:
    """A jitted ``update(state, batch) -> (state, metrics)``: one learner update.

    `batch_targets` first, then ``num_epochs x num_minibatches`` steps of
    `ppo_loss` with the ratio centred on ``config.ppo_ratio_anchor``: the
    behaviour log-probs, the learner's at the update's start, or (``'ewma'``)
    those of `ProximalAverage`'s params, re-evaluated on every minibatch and
    averaged forward after every optimizer step. For the last two, each
    sample's surrogate is weighted by ``min(pi_prox / mu, is_weight_max)``.

    ``schedule``: the learning-rate schedule with ``anneal_lr`` (default: a
    fresh run's, `default_schedule`). A recurrent ``network`` re-unrolls every
    env's sequence from the state its chunk started with
    (``batch.initial_hidden``), zeroing it where ``batch.reset``, for the
    V-trace targets and inside every minibatch; the minibatches are whole env
    sequences (see `recurrent_sequences`).
    """
    optimizer = make_optimizer(config, schedule)
    recurrent = is_recurrent(network)
    anchor = config.ppo_ratio_anchor
    weighted = anchor != "behaviour"  # the surrogate carries pi_prox / mu

    def learning_rate_at(opt_state) -> jax.Array:
        """The rate of the update's first optimizer step (what the curves show)."""
        if not config.anneal_lr:
            return jnp.float32(config.learning_rate)
        steps = optax.tree_utils.tree_get_all_with_path(opt_state, "count")[-1][1]
        rate = _linear(schedule if schedule is not None else default_schedule(config))
        return jnp.asarray(rate(steps), jnp.float32)

    def loss(logp, values, entropy, proximal_logp, minibatch):
        return ppo_loss(
            logp, proximal_logp, minibatch.advantages, values, minibatch.old_values,
            minibatch.value_targets, entropy,
            clip_eps=config.clip_eps, vf_coef=config.vf_coef, ent_coef=config.ent_coef,
            behaviour_logp=minibatch.behaviour_logp, is_weight_max=config.is_weight_max,
            mask=minibatch.mask,
        )

    def minibatch_loss(params, proximal, minibatch: Samples):
        dist, values = network.apply(params, minibatch.obs)
        proximal_logp = minibatch.proximal_logp
        if proximal_logp is None:  # 'ewma': the average as it stands now
            proximal_logp = network.apply(proximal.params, minibatch.obs)[0].log_prob(
                minibatch.action)
        return loss(dist.log_prob(minibatch.action), values, dist.entropy(), proximal_logp,
                    minibatch)

    def recurrent_minibatch_loss(params, proximal, minibatch: Sequences):
        unrolled = unroll(network, params, minibatch.initial_hidden, minibatch.obs,
                          minibatch.reset)
        proximal_logp = minibatch.old_logp
        if proximal_logp is None:
            proximal_logp = unroll(
                network, proximal.params, minibatch.initial_hidden, minibatch.obs,
                minibatch.reset,
            ).distribution.log_prob(minibatch.action)
        per_step = Samples(None, None, None, minibatch.behaviour_logp, minibatch.advantages,
                           minibatch.old_values, minibatch.value_targets, minibatch.mask)
        flat = jax.tree.map(lambda x: x.reshape(-1), per_step)
        return loss(
            unrolled.distribution.log_prob(minibatch.action).reshape(-1),
            unrolled.value.reshape(-1), unrolled.distribution.entropy().reshape(-1),
            proximal_logp.reshape(-1), flat,
        )

    loss_fn = recurrent_minibatch_loss if recurrent else minibatch_loss

    def sgd_step(carry, minibatch):
        params, opt_state, proximal = carry
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, proximal, minibatch
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if proximal is not None:
            proximal = average_in(proximal, params, config.proximal_ewma_decay)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return (params, opt_state, proximal), metrics

    @jax.jit
    def update(state: LearnerState, batch: Batch):
        targets = batch_targets(config, network, state.params, batch)
        behaviour_logp = batch.behaviour_logp if weighted else None
        if recurrent:
            flat = Sequences(batch.initial_hidden, batch.obs, batch.action, batch.reset,
                             targets.proximal_logp, targets.advantages, targets.old_values,
                             targets.value_targets, behaviour_logp, targets.mask)
        else:
            flat = jax.tree.map(
                lambda x: x.reshape(config.batch_size, *x.shape[2:]),
                Samples(batch.obs, batch.action, targets.proximal_logp, behaviour_logp,
                        targets.advantages, targets.old_values, targets.value_targets,
                        targets.mask),
            )

        def epoch(carry, key):
            if recurrent:
                minibatches = recurrent_sequences(key, flat, config.num_minibatches)
                return jax.lax.scan(sgd_step, carry, minibatches)
            permutation = jax.random.permutation(key, config.batch_size)
            minibatches = jax.tree.map(
                lambda x: x[permutation].reshape(
                    config.num_minibatches, config.minibatch_size, *x.shape[1:]
                ),
                flat,
            )
            return jax.lax.scan(sgd_step, carry, minibatches)

        key, epoch_key = jax.random.split(state.key)
        (params, opt_state, proximal), metrics = jax.lax.scan(
            epoch, (state.params, state.opt_state, state.proximal),
            jax.random.split(epoch_key, config.num_epochs),
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics.update(targets.metrics)
        metrics["advantage_mean"] = jnp.mean(targets.advantages)
        metrics["value_target_mean"] = jnp.mean(targets.value_targets)
        metrics["learning_rate"] = learning_rate_at(state.opt_state)
        metrics["params_finite"] = jnp.all(
            jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(params)])
        ).astype(jnp.float32)
        return LearnerState(params, opt_state, key, proximal), metrics

    return update


def with_normalization(update: UpdateFn, options: NormalizationOptions) -> UpdateFn:
    """``update`` for a learner whose params are a `NormalizedPolicy` (``update`` itself if off).

    The statistics take the batch first (raw observations; with reward
    scaling, the actors' discounted returns), in consumption order; then
    ``update`` trains the network params on the batch with its observations
    (and bootstrap observations) normalized by the new statistics, and the
    new statistics travel with the new params. Rewards arrive scaled: the
    actors scale them with the statistics they acted under.
    """
    if not options.enabled:
        return update

    @jax.jit
    def normalized_update(state: LearnerState, batch: Batch):
        policy = update_statistics(state.params, batch.obs, batch.discounted_return)
        if policy.obs_stats is not None:
            def normalize(obs):
                return normalize_observation(policy.obs_stats, obs, clip=options.obs_clip)

            batch = batch._replace(
                obs=normalize(batch.obs), bootstrap_obs=normalize(batch.bootstrap_obs),
                final_obs=None if batch.final_obs is None else normalize(batch.final_obs),
            )
        inner, metrics = update(state._replace(params=policy.params), batch)
        if policy.return_stats is not None:
            metrics["return_std"] = jnp.sqrt(policy.return_stats.var)
        return inner._replace(params=policy._replace(params=inner.params)), metrics

    return normalized_update


def reevaluate_recurrent(
    network: RecurrentActorCritic, params: Any, batch: Batch
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(logp [T, B], value [T, B], bootstrap_value [B])`` of ``batch`` under ``params``.

    Re-unrolls each env's sequence from ``batch.initial_hidden`` with the
    resets the actor made, then values the bootstrap observation with the
    state the next chunk will start from (zeroed where the last step ended
    an episode, as the actor's next chunk will).
    """
    unrolled = unroll(network, params, batch.initial_hidden, batch.obs, batch.reset)
    hidden = reset_hidden(unrolled.final_hidden, batch.done[-1])
    _, _, bootstrap_value = network.apply(params, hidden, batch.bootstrap_obs)
    return unrolled.distribution.log_prob(batch.action), unrolled.value, bootstrap_value


class Sequences(NamedTuple):
    """What the recurrent PPO epochs train on: whole sequences of ``B`` envs.

    In a minibatch from `recurrent_sequences`, ``B`` is ``B // M`` and every
    field gains a leading ``[M]`` axis.
    """

    initial_hidden: jax.Array  # [B, state_size] the state the chunk's first step acted with
    obs: jax.Array  # [T, B, *obs_shape]
    action: jax.Array  # [T, B] or [T, B, action_dim]
    reset: jax.Array  # [T, B] bool, zero the state before this step
    old_logp: jax.Array | None  # [T, B] the ratio's anchor (None: 'ewma', evaluated per minibatch)
    advantages: jax.Array  # [T, B]
    old_values: jax.Array  # [T, B]
    value_targets: jax.Array  # [T, B]
    behaviour_logp: jax.Array | None = None  # [T, B] when the surrogate is weighted by pi_prox / mu
    mask: jax.Array | None = None  # [T, B] 0 where max_policy_lag drops the sample


def recurrent_sequences(key: jax.Array, sequences: Sequences, num_minibatches: int) -> Sequences:
    """``sequences`` split into ``num_minibatches`` shuffled groups of whole envs.

    Returns `Sequences` with a leading minibatch axis: ``initial_hidden``
    ``[M, B // M, S]``, the rest ``[M, T, B // M, ...]``. Never split along
    time: a minibatch re-unrolls each of its sequences from the state it
    started with, so a sequence must arrive whole.
    """
    num_envs = sequences.initial_hidden.shape[0]
    time_major = sequences._replace(initial_hidden=None)
    chex.assert_equal_shape_prefix(jax.tree.leaves(time_major), 2)
    chex.assert_equal(time_major.obs.shape[1], num_envs)
    permutation = jax.random.permutation(key, num_envs)
    size = num_envs // num_minibatches
    hidden = sequences.initial_hidden[permutation].reshape(num_minibatches, size, -1)
    split = jax.tree.map(
        lambda x: jnp.moveaxis(
            x[:, permutation].reshape(x.shape[0], num_minibatches, size, *x.shape[2:]), 1, 0
        ),
        time_major,
    )
    return split._replace(initial_hidden=hidden)


RECENT_EPISODES = 100  # episode_return_mean averages this many latest episodes


@dataclasses.dataclass
class LearnerReport:
    """Summary of a run, returned by `learner_loop` (and in `TrainResult`)."""

    updates: int = 0  # learner updates done
    env_steps: int = 0  # env steps consumed by the learner
    wall_time_s: float = 0.0  # from the learner's start to its last update (this segment)
    env_steps_per_s: float = 0.0  # segment_env_steps per second of wall_time_s
    policy_lag_mean: float = 0.0  # learner updates, averaged over every consumed step
    policy_lag_max: int = 0
    policy_lag_counts: dict[int, int] = dataclasses.field(default_factory=dict)  # lag -> chunks
    episode_return_mean: float = float("nan")  # mean of recent_returns
    recent_returns: list[float] = dataclasses.field(default_factory=list)  # last 100 episodes
    episodes: int = 0  # training episodes finished in consumed experience
    learner_wait_s: float = 0.0  # time the learner blocked on the experience queue
    actor_stats: list[ActorStats] = dataclasses.field(default_factory=list)
    actor_restarts: int = 0  # actors replaced by the supervisor after they raised
    eval_returns: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (version, mean)
    eval_requests_skipped: int = 0  # evaluations replaced by a newer one before they started
    # This segment (a resumed run continues the counters above; these say what it added):
    start_update: int = 0  # updates already done when this segment started
    segment_env_steps: int = 0  # env steps consumed in this segment (env_steps_per_s divides these)

    def record_update(
        self, config: AsyncActorLearnerConfig, experiences: Sequence[Experience],
        lags: Sequence[int],
    ) -> None:
        """Count one update that consumed ``experiences`` with these policy lags."""
        self.updates += 1
        self.env_steps += config.batch_size
        for experience in experiences:
            finished = experience.trajectory.episode_length > 0
            self.recent_returns.extend(experience.trajectory.episode_return[finished].tolist())
            self.episodes += int(finished.sum())
        del self.recent_returns[:-RECENT_EPISODES]
        for lag in lags:
            self.policy_lag_counts[lag] = self.policy_lag_counts.get(lag, 0) + 1
        self.refresh_summaries()

    def refresh_summaries(self) -> None:
        """Recompute the means and maxima from ``recent_returns`` and ``policy_lag_counts``."""
        if self.recent_returns:
            self.episode_return_mean = float(np.mean(self.recent_returns))
        if self.policy_lag_counts:
            chunks = sum(self.policy_lag_counts.values())
            # Every chunk holds the same number of steps, so this is the per-step mean.
            self.policy_lag_mean = (
                sum(k * n for k, n in self.policy_lag_counts.items()) / chunks
            )
            self.policy_lag_max = max(self.policy_lag_counts)


class LearnerChannels(NamedTuple):
    """The learner's ends: the actors' transport and the evaluator's queues."""

    transport: LearnerTransport  # experience (and failures of any thread) in, broadcasts out
    evaluator_queue: queue.Queue | None = None  # EvalRequests (None: the evaluator ends)
    eval_results: queue.Queue | None = None  # EvalOutcomes back


class EvalRequest(NamedTuple):
    """One evaluation asked of the evaluator thread."""

    broadcast: PolicyBroadcast  # the params after update ``broadcast.version``
    env_steps: int  # env steps consumed by that update


class EvalOutcome(NamedTuple):
    """One finished evaluation, back from the evaluator thread."""

    version: int  # the update whose params were evaluated
    env_steps: int  # env steps consumed by that update
    result: EvalResult


def drain_evaluations(channels: LearnerChannels, report: LearnerReport) -> list[dict[str, float]]:
    """The evaluations finished since the last call, each counted in ``report.eval_returns``.

    Each is a metrics line of its own, keyed by the ``update`` and
    ``env_steps`` it evaluated: an evaluation finishes updates after the one
    it belongs to, whose line is already written by then
    (`ppo_async.runs.analysis.read_metrics` merges it into that update's row).
    """
    lines = []
    while channels.eval_results is not None:
        try:
            outcome = channels.eval_results.get_nowait()
        except queue.Empty:
            break
        report.eval_returns.append((outcome.version, outcome.result.mean_return))
        lines.append({"update": outcome.version, "env_steps": outcome.env_steps,
                      "eval_return_mean": outcome.result.mean_return,
                      "eval_return_std": outcome.result.std_return,
                      "eval_policy_version": outcome.version})
    return lines


# on_actor_failure(failure, produced_steps) -> restarted?
ActorFailureHandler = Callable[[ActorFailure, int], bool]
# on_stuck_actors(actor_ids, produced_steps) -> every one of them killed and restarted?
StuckActorHandler = Callable[[list[int], int], bool]


def _check_finite(metrics: dict[str, float], update: int) -> None:
    """Raise `NonFiniteError` naming the first non-finite metric of ``update``."""
    if metrics["params_finite"] != 1.0:
        raise NonFiniteError(f"update {update}: the updated params contain NaN or inf")
    for name, value in metrics.items():
        if not np.isfinite(value):
            raise NonFiniteError(f"update {update}: metric {name} is {value}")


# after_update(state, report, actor_carries): called after every update with a
# state that passed the NaN check and the carries of each actor's last consumed
# chunk (where each actor resumes from): what a checkpoint saves.
AfterUpdate = Callable[[LearnerState, "LearnerReport", list[Any]], None]


def _request_evaluation(channels: LearnerChannels, message: EvalRequest) -> bool:
    """Queue ``message`` for the evaluator, replacing a request it has not started.

    The evaluator may be slower than the learner; only the newest policy is
    worth evaluating, so at most one request waits. True if one was replaced.
    """
    try:
        channels.evaluator_queue.get_nowait()
        replaced = True
    except queue.Empty:
        replaced = False
    channels.evaluator_queue.put(message)
    return replaced


def _stuck_actors(buffer: RolloutBuffer, last_chunk_at: list[float], timeout_s: float,
                  now: float) -> list[int]:
    """Actors the learner waits on (empty column) that sent nothing for ``timeout_s``."""
    return [
        actor_id for actor_id, column in enumerate(buffer.columns)
        if not column and now - last_chunk_at[actor_id] >= timeout_s
    ]


class _InFlight(NamedTuple):
    """An update handed to the device that the learner has not read back yet."""

    state: LearnerState  # not yet checked for NaN: never published or saved before it is
    metrics: dict[str, jax.Array]
    experiences: list[Experience]
    lags: list[int]  # each chunk's policy lag


def learner_loop(
    config: AsyncActorLearnerConfig,
    network: ActorCritic,
    state: LearnerState,
    channels: LearnerChannels,
    device: jax.Device,
    on_update: Callable[[dict[str, float]], None] | None = None,
    on_actor_failure: ActorFailureHandler | None = None,
    on_stuck_actors: StuckActorHandler | None = None,
    after_update: AfterUpdate | None = None,
    report: LearnerReport | None = None,
    update: UpdateFn | None = None,
    end_update: int | None = None,
    pipeline: bool = True,
    on_evaluation: Callable[[dict[str, float]], None] | None = None,
    heartbeat: Callable[[int], None] | None = None,
) -> tuple[LearnerState, LearnerReport]:
    """Consume experience until ``end_update`` (default ``config.num_updates``) updates are done.

    ``state`` must already be on ``device`` and its params already published
    on ``channels.transport``. ``on_update`` receives each update's flat
    metrics dict (host floats). When an actor fails, ``on_actor_failure`` may
    restart it (returning True): it is told how many rows the learner counts as
    produced by that actor (consumed plus buffered). When actors the learner
    waits on send nothing for ``learner_timeout_s``, ``on_stuck_actors`` may
    kill and restart them (returning True; only a transport of processes can).
    ``after_update`` is called after every update with the good state (see
    `AfterUpdate`; `train` checkpoints from it). ``on_update`` may raise
    `StopTraining` to end the run there. A resumed run passes the saved
    ``report`` to continue counting. ``update`` is the jitted update to use
    (default: a new ``make_update_fn(config, network)``); `train` passes one
    it has already compiled. ``pipeline``: when the next batch is complete
    by the time an update is dispatched, dispatch the next update before
    reading the first one back, so that the learner's Python (stacking the
    next batch, the metrics, the broadcast) runs while the device computes;
    False reads every update back before the next (``experiments/bench_learner.py``
    and ``experiments/bench_throughput.py`` measure both). ``heartbeat`` is
    called with the updates done so far on every wait and after every update
    (`train` re-arms its freeze watchdog there: `ppo_async.runtime.watchdog`).

    ``on_evaluation`` receives each periodic evaluation's metrics line
    (`drain_evaluations`) as it arrives, updates after the one it evaluated.

    Raises `ActorError` (chained to the actor's exception) for a failure not
    restarted, `LearnerTimeoutError` naming the actors the learner waits on
    that sent nothing for ``learner_timeout_s`` (however busy the others
    are), and `NonFiniteError` when an update produces NaN or inf (before the
    bad params are broadcast or checkpointed).
    """
    update = update if update is not None else make_update_fn(config, network)
    buffer = RolloutBuffer(config.num_actors)
    report = report if report is not None else LearnerReport()
    start, start_env_steps = time.perf_counter(), report.env_steps
    report.start_update = report.updates
    # When each actor last delivered a chunk, started, or was last given a
    # chance to (a broadcast): the hang detector.
    last_chunk_at = [time.monotonic()] * config.num_actors
    timeout_s = config.learner_timeout_s
    end_update = config.num_updates if end_update is None else end_update
    dispatched = report.updates  # updates handed to the device: each consumed one chunk per actor

    def wait_budget() -> float | None:
        """How long the learner may wait for the actors it waits on.

        None if some had sent nothing for ``learner_timeout_s`` and were
        restarted; raises `LearnerTimeoutError` naming them if they cannot be.
        """
        now = time.monotonic()
        stuck = _stuck_actors(buffer, last_chunk_at, timeout_s, now)
        if stuck and on_stuck_actors is not None and on_stuck_actors(
            stuck, dispatched * config.num_steps  # their columns are empty
        ):
            for actor_id in stuck:
                last_chunk_at[actor_id] = time.monotonic()  # fresh actors
            return None
        if stuck:
            names = ", ".join(f"actor {i}" for i in stuck)
            others = [i for i in range(config.num_actors) if i not in stuck]
            raise LearnerTimeoutError(
                f"{names} sent no experience for learner_timeout_s={timeout_s} s while "
                f"the learner waited for it at update {report.updates + 1}"
                + (f" (actors {others} kept sending)" if others else "")
                + "; its env or rollout is stuck or far slower than the timeout allows",
                stuck,
            )
        waited_on = [last_chunk_at[i] for i, column in enumerate(buffer.columns) if not column]
        return max(min(waited_on) + timeout_s - now, 1e-3)

    def take_experience(wait: bool) -> None:
        """Move delivered chunks into the buffer until it is ready.

        Without ``wait``, only what has already arrived: the learner never
        blocks on the actors while an update's params are still unpublished.
        """
        while not buffer.ready():
            if heartbeat is not None:
                heartbeat(report.updates)
            wait_s = wait_budget() if wait else 0.0
            if wait_s is None:
                continue  # fresh actors
            wait_start = time.perf_counter()
            item = channels.transport.receive(wait_s)
            report.learner_wait_s += time.perf_counter() - wait_start
            if item is None:
                if not wait:
                    return
                continue  # the check above names the actor
            if isinstance(item, ActorFailure):
                # Chunks the actor sent before failing were queued before this
                # message, so they are in the buffer and are kept. (The
                # evaluator thread reports under a negative id and owns no column.)
                buffered = len(buffer.columns[item.actor_id]) if item.actor_id >= 0 else 0
                produced = (dispatched + buffered) * config.num_steps
                if on_actor_failure is None or not on_actor_failure(item, produced):
                    raise ActorError(item.actor_id, item.formatted_traceback) from item.error
                if item.actor_id >= 0:
                    last_chunk_at[item.actor_id] = time.monotonic()  # a fresh actor
                continue
            last_chunk_at[item.actor_id] = time.monotonic()
            buffer.add(item)

    def dispatch(state: LearnerState) -> _InFlight:
        """Start the update on the buffer's oldest batch; returns without waiting for it."""
        nonlocal dispatched
        experiences = buffer.pop_batch()
        lags = [dispatched - e.policy_version for e in experiences]
        dispatched += 1
        batch = place(stack_experiences(experiences, lags), device)
        new_state, metrics = update(state, batch)
        return _InFlight(new_state, metrics, experiences, lags)

    def finish(done: _InFlight) -> bool:
        """Read ``done`` back, check it, count it, publish it; False if ``on_update`` stopped the run."""
        # Waits for this update only: one dispatched after it may still be running.
        host_metrics = {k: float(v) for k, v in jax.device_get(done.metrics).items()}
        _check_finite(host_metrics, report.updates + 1)
        state, experiences, lags = done.state, done.experiences, done.lags
        report.record_update(config, experiences, lags)
        report.wall_time_s = time.perf_counter() - start
        report.segment_env_steps = report.env_steps - start_env_steps
        report.env_steps_per_s = report.segment_env_steps / report.wall_time_s

        broadcast_s = 0.0
        if report.updates % config.broadcast_every == 0 and report.updates < end_update:
            # Only params that passed the finiteness check above are published; the
            # publisher thread serializes and delivers, so this is a hand-over.
            broadcast_start = time.perf_counter()
            channels.transport.publish(state.params, report.updates)
            broadcast_s = time.perf_counter() - broadcast_start
        # An actor held back by the valve could not send until this update (and
        # the broadcast after it), so every actor's silence counts from here.
        last_chunk_at[:] = [time.monotonic()] * config.num_actors
        if channels.evaluator_queue is not None and config.eval_every_updates and (
            report.updates % config.eval_every_updates == 0
        ):
            # Serialized here, apart from the publisher's bytes: evaluations are rare.
            eval_message = PolicyBroadcast(
                report.updates, report.updates, serialize_policy(state.params)
            )
            report.eval_requests_skipped += _request_evaluation(
                channels, EvalRequest(eval_message, report.env_steps))
        for evaluation in drain_evaluations(channels, report):
            if on_evaluation is not None:
                on_evaluation(evaluation)
        carries = [e.env_carry for e in experiences]
        if on_update is None:
            if after_update is not None:
                after_update(state, report, carries)
            return True
        host_metrics.update(
            update=report.updates,
            env_steps=report.env_steps,
            env_steps_per_s=report.env_steps_per_s,
            episode_return=report.episode_return_mean,
            policy_lag_mean=float(np.mean(lags)),
            policy_lag_max=max(lags),
            queue_depth=channels.transport.queue_depth(),
            learner_wait_s=report.learner_wait_s,
            broadcast_s=broadcast_s,
        )
        try:
            on_update(host_metrics)  # writes this update's metrics line...
        except StopTraining:
            return False
        finally:
            # ...before a checkpoint of it, so a run directory never holds a
            # checkpoint past its metrics; also when on_update stops the run.
            if after_update is not None:
                after_update(state, report, carries)
        return True

    in_flight: _InFlight | None = None
    while report.updates < end_update:
        if in_flight is None:
            take_experience(wait=True)
            in_flight = dispatch(state)
        # While that update runs, take what the actors have sent; if the next
        # batch is already complete, dispatch it on the new (not yet checked)
        # state before reading this update back, so that the device never
        # idles while the learner's Python catches up. If the check fails, the
        # next update's result is dropped with it.
        following = None
        if pipeline and report.updates + 1 < end_update:
            take_experience(wait=False)
            if buffer.ready():
                following = dispatch(in_flight.state)
        going_on = finish(in_flight)
        if heartbeat is not None:
            heartbeat(report.updates)
        state, in_flight = in_flight.state, following
        if not going_on:
            break
    return state, report
