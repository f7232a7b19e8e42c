"""The learner's update: one jitted step from a batch of trajectories to new params.

`make_update_fn` builds ``update(state, batch) -> (state, metrics)``:
`batch_targets` first -- advantages by GAE on the behaviour values, or by
V-trace re-evaluated under the current params (Espeholt et al. 2018,
arXiv:1802.01561) -- then ``num_epochs x num_minibatches`` steps of the clipped
PPO loss with optax, the ratio centred on the anchor
``options.ppo_ratio_anchor`` names (Hilton et al. 2021, arXiv:2110.00641). A
recurrent network is re-unrolled from each chunk's stored initial state
(`reevaluate_recurrent`) and trained on minibatches of whole env sequences
(`recurrent_sequences`). `with_normalization` wraps the step for a policy that
carries running observation and reward statistics.

Pure and jittable, and takes named hyperparameters (`UpdateOptions`), never
the config: the runtime's learner loop (`ppo_async.runtime.learner`) and the
fully jitted twin (`ppo_async.sync`) call the same step, with the options
``AsyncActorLearnerConfig.update_options()`` builds; a notebook builds its own.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from ppo_async.core.advantages import gae, vtrace
from ppo_async.core.devices import ENV_FIRST_FIELDS, env_axis_spec, host_zeros, replicated
from ppo_async.core.losses import ppo_loss
from ppo_async.core.normalization import (
    NormalizationOptions,
    network_params,
    normalize_observation,
    update_statistics,
)
from ppo_async.networks.actor_critic import (
    ActorCritic,
    RecurrentActorCritic,
    is_recurrent,
    reset_hidden,
    unroll,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpdateOptions:
    """The hyperparameters of one learner update, named (the config's fields of the same names).

    Frozen and hashable: the jitted update closes over it, so a new value is
    a new program. The defaults are the config's; ``num_updates`` has none.
    """

    # --- schedule and optimizer ---
    num_updates: int  # updates in the run: the annealed learning rate reaches 0 after the last
    learning_rate: float = 5e-4  # Adam's learning rate (the annealed schedule's start)
    anneal_lr: bool = True  # decay the learning rate linearly to 0 over num_updates
    max_grad_norm: float = 0.5  # global gradient-norm clip before Adam
    num_epochs: int = 4  # passes over each batch per update
    num_minibatches: int = 4  # minibatches per epoch; divides the batch (recurrent: its envs)
    # --- advantages and value targets ---
    gamma: float = 0.99  # discount factor
    gae_lambda: float = 0.95  # GAE lambda (without V-trace)
    use_vtrace: bool = False  # V-trace under the learner's current critic instead of GAE
    vtrace_lambda: float = 1.0  # V-trace lambda
    vtrace_rho_bar: float = 1.0  # V-trace clip on the importance weight in the TD errors
    vtrace_c_bar: float = 1.0  # V-trace clip on the trace-cutting coefficients
    vtrace_pg_rho_bar: float | None = None  # clip weighting the pg advantage; None: unweighted
    max_policy_lag: int | None = None  # samples older than this many updates are masked out
    # --- the ratio's anchor ---
    ppo_ratio_anchor: Literal["behaviour", "learner", "ewma"] = "behaviour"
    proximal_ewma_decay: float = 0.9  # decay of the 'ewma' anchor's average per optimizer step
    is_weight_max: float = 100.0  # cap on pi_prox / mu ('learner' and 'ewma' anchors)
    # --- the PPO loss (`ppo_async.core.losses.ppo_loss`) ---
    clip_eps: float = 0.2  # surrogate clip epsilon
    value_clip_eps: float | None = None  # value clip around the old values; None: none
    normalize_advantages: bool = True  # standardise each minibatch's advantages
    vf_coef: float = 0.5  # weight of the value loss
    ent_coef: float = 0.01  # weight of the entropy bonus


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
    # When the learner bootstraps truncations (the config's learner_bootstraps_truncation;
    # None otherwise): ``reward`` has nothing folded in, and at truncated steps
    # the learner adds gamma * V(final_obs) under its current critic.
    truncated: jax.Array | None = None  # [T, B] bool, the time limit ended the episode
    final_obs: jax.Array | None = None  # [T, B, *obs_shape] the observation it reached
    # Reward scaling only (None otherwise):
    discounted_return: jax.Array | None = None  # [T, B] R_t of the raw rewards

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


def _traced_linear(schedule: LearningRateSchedule) -> optax.Schedule:
    """`_linear` for a piece whose numbers are arrays (the update's argument), to the bit.

    With the numbers as constants, XLA compiles ``optax.linear_schedule``'s
    ``count / span`` as ``count * (1 / span)``, the reciprocal rounded to
    float32 (its algebraic simplifier rewrites a division by a constant), and
    drops ``+ 0``. The same operations here give the rates of the program
    with constants, so a run's bytes do not depend on which it ran. The
    piece must fall over a positive span (`_rate_argument`).
    """
    def rate(count):
        span = schedule.end_step - schedule.begin_step
        done = jnp.clip(count - schedule.begin_step, 0, span).astype(jnp.float32)
        return schedule.begin_value * (1 - done * (1 / span.astype(jnp.float32)))

    return rate


def _rate_argument(
    options: UpdateOptions, schedule: LearningRateSchedule | None
) -> tuple[str, LearningRateSchedule]:
    """``(kind, piece)``: how the update program computes its rate, and the numbers it gets.

    The numbers travel as the program's argument, not as constants inside
    it, so runs that differ only in their budget or learning rate (a sweep, a
    resumed run) compile one update. ``kind``: ``'constant'`` (no
    ``anneal_lr``; the rate is ``begin_value``), ``'flat'`` (annealed over a
    span of no steps: optax's constant schedule) or ``'linear'``.
    """
    if not options.anneal_lr:
        kind, piece = "constant", LearningRateSchedule(0, float(options.learning_rate), 0)
    else:
        piece = schedule if schedule is not None else default_schedule(options)
        begin = max(int(piece.begin_step), 0)  # optax's rule for a negative transition_begin
        piece = LearningRateSchedule(begin, float(piece.begin_value), int(piece.end_step))
        kind = "linear" if piece.end_step - piece.begin_step > 0 else "flat"
    return kind, LearningRateSchedule(
        np.int32(piece.begin_step), np.float32(piece.begin_value), np.int32(piece.end_step))


def _rate_of(kind: str, piece: LearningRateSchedule) -> Any:
    """The learning rate `optax.adam` gets for ``(kind, piece)`` of `_rate_argument`."""
    if kind == "constant":
        return piece.begin_value
    if kind == "flat":
        return lambda count: piece.begin_value
    return _traced_linear(piece)


def optimizer_steps_per_update(options: UpdateOptions) -> int:
    return options.num_epochs * options.num_minibatches


def default_schedule(options: UpdateOptions) -> LearningRateSchedule:
    """The schedule of a fresh run: ``learning_rate`` to 0 over the whole budget."""
    return LearningRateSchedule(
        0, float(options.learning_rate), options.num_updates * optimizer_steps_per_update(options)
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
    options: UpdateOptions, schedule: LearningRateSchedule | None = None
) -> optax.GradientTransformation:
    """Adam after global-norm clipping; with ``anneal_lr``, ``schedule`` (default: a fresh run's)."""
    if options.anneal_lr:
        learning_rate = _linear(schedule if schedule is not None else default_schedule(options))
    else:
        learning_rate = options.learning_rate
    return _adam(options, learning_rate)


def _adam(options: UpdateOptions, learning_rate: Any) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(options.max_grad_norm),
        optax.adam(learning_rate, eps=1e-5),
    )


def _unscheduled(options: UpdateOptions) -> UpdateOptions:
    """``options`` less the schedule's numbers, the key of the programs held below.

    The update program reads its rate from its argument, and the optimizer's
    initial state (zeros and a count) holds no rate: runs that differ only in
    ``num_updates`` or ``learning_rate`` share both programs.
    """
    return dataclasses.replace(options, num_updates=1, learning_rate=0.0)


def initial_optimizer_state(options: UpdateOptions, params: Any) -> Any:
    """The state of `make_optimizer`'s optimizer before its first step, for ``params``.

    Adam's moments and step count, and the schedule's step counter, all
    zeros. Outside a trace it is built on the host, numpy zeros in the
    shapes of optax's ``init`` (traced, never run): compiled, ``init`` cost
    about 0.1 s of CPU on the way to a run's first update
    (``experiments/startup_timeline.py``), and run eagerly a small compile
    per leaf shape. tests/core/test_update.py checks it against optax's own
    ``init``. Inside a trace (the jitted twin) it is optax's ``init``, part
    of the caller's program.
    """
    init = make_optimizer(_unscheduled(options)).init
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(params)):
        return init(params)
    return host_zeros(jax.eval_shape(init, params))


def init_learner_state(options: UpdateOptions, params: Any, key: jax.Array) -> LearnerState:
    """The state before a run's first update: fresh optimizer state (and proximal average)."""
    proximal = None
    if options.ppo_ratio_anchor == "ewma":
        # t = 1: the average of the initial params alone is those params.
        proximal = ProximalAverage(jax.tree.map(jnp.array, network_params(params)),
                                   jnp.ones((), jnp.int32))
    return LearnerState(params, initial_optimizer_state(options, network_params(params)),
                        key, proximal)


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
    options: UpdateOptions, network: ActorCritic | RecurrentActorCritic,
    params: Any, batch: Batch,
) -> Targets:
    """Advantages, value targets, the ratio's anchor and the lag mask of ``batch``.

    Without V-trace: GAE on the behaviour values, with the truncation
    bootstrap the actors folded into the rewards. With V-trace: the batch is
    re-evaluated under ``params`` (the learner's current policy pi and critic
    V), truncated steps get ``gamma * V(final_obs)`` added to their reward
    (the config's ``learner_bootstraps_truncation``), and V-trace
    runs with ``log_rho = log pi(a|x) - log mu(a|x)``. The anchor is mu
    (``'behaviour'``) or pi at the update's start (``'learner'``). Pure and
    jittable; `make_update_fn` calls it first.
    """
    anchor = options.ppo_ratio_anchor
    metrics: dict[str, jax.Array] = {}
    learner_logp = learner_values = learner_bootstrap = None
    if options.use_vtrace or anchor == "learner":
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
        reward = reward + options.gamma * jnp.where(batch.truncated, final_values, 0.0)
    discounts = options.gamma * (1.0 - batch.done.astype(jnp.float32))
    if options.use_vtrace:
        out = vtrace(
            reward, learner_values, discounts, learner_bootstrap,
            learner_logp - batch.behaviour_logp,
            lambda_=options.vtrace_lambda, rho_bar=options.vtrace_rho_bar,
            c_bar=options.vtrace_c_bar, pg_rho_bar=options.vtrace_pg_rho_bar,
            weight_pg=options.vtrace_pg_rho_bar is not None,
        )
        advantages, value_targets, old_values = out.pg_advantages, out.value_targets, learner_values
        metrics["vtrace_clipped_rho_mean"] = jnp.mean(out.clipped_rhos)
    else:
        advantages, value_targets = gae(
            reward, batch.behaviour_value, discounts, batch.bootstrap_value,
            lambda_=options.gae_lambda,
        )
        old_values = batch.behaviour_value
    proximal_logp = {"behaviour": batch.behaviour_logp, "learner": learner_logp}.get(anchor)
    mask = None
    if options.max_policy_lag is not None:
        fresh = batch.policy_lag <= options.max_policy_lag  # [B]
        mask = jnp.broadcast_to(fresh, batch.reward.shape).astype(jnp.float32)
        metrics["dropped_fraction"] = 1.0 - jnp.mean(mask)
    return Targets(advantages, value_targets, old_values, proximal_logp, mask, metrics)


class Samples(NamedTuple):
    """Flat ``[N]`` samples a feed-forward minibatch trains on (None: not used by these options)."""

    obs: jax.Array
    action: jax.Array
    proximal_logp: jax.Array | None
    behaviour_logp: jax.Array | None
    advantages: jax.Array
    old_values: jax.Array
    value_targets: jax.Array
    mask: jax.Array | None


def _minibatch_loss(options: UpdateOptions, network: ActorCritic | RecurrentActorCritic):
    """``loss(params, proximal, minibatch) -> (loss, metrics)`` of one minibatch: `ppo_loss`.

    A feed-forward minibatch is flat `Samples`; a recurrent one is whole
    `Sequences`, re-unrolled from the state each started with. With
    ``ppo_ratio_anchor='ewma'`` the anchor is the moving average ``proximal``
    as it stands at this optimizer step.
    """

    def loss(logp, values, entropy, proximal_logp, minibatch):
        return ppo_loss(
            logp, proximal_logp, minibatch.advantages, values, minibatch.old_values,
            minibatch.value_targets, entropy,
            clip_eps=options.clip_eps, vf_coef=options.vf_coef, ent_coef=options.ent_coef,
            value_clip_eps=options.value_clip_eps,
            normalize_advantages=options.normalize_advantages,
            behaviour_logp=minibatch.behaviour_logp, is_weight_max=options.is_weight_max,
            mask=minibatch.mask,
        )

    def feed_forward(params, proximal, minibatch: Samples):
        dist, values = network.apply(params, minibatch.obs)
        proximal_logp = minibatch.proximal_logp
        if proximal_logp is None:  # 'ewma': the average as it stands now
            proximal_logp = network.apply(proximal.params, minibatch.obs)[0].log_prob(
                minibatch.action)
        return loss(dist.log_prob(minibatch.action), values, dist.entropy(), proximal_logp,
                    minibatch)

    def recurrent(params, proximal, minibatch: Sequences):
        unrolled = unroll(network, params, minibatch.initial_hidden, minibatch.obs,
                          minibatch.reset)
        proximal_logp = minibatch.proximal_logp
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

    return recurrent if is_recurrent(network) else feed_forward


def _training_samples(options: UpdateOptions, batch: Batch, targets: Targets,
                      recurrent: bool) -> Samples | Sequences:
    """What the epochs shuffle: flat ``[T * B]`` samples, or whole env sequences (recurrent)."""
    # The surrogate carries pi_prox / mu unless the anchor is the behaviour policy itself.
    behaviour_logp = batch.behaviour_logp if options.ppo_ratio_anchor != "behaviour" else None
    if recurrent:
        return Sequences(batch.initial_hidden, batch.obs, batch.action, batch.reset,
                         targets.proximal_logp, targets.advantages, targets.old_values,
                         targets.value_targets, behaviour_logp, targets.mask)
    return jax.tree.map(
        lambda x: x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]),
        Samples(batch.obs, batch.action, targets.proximal_logp, behaviour_logp,
                targets.advantages, targets.old_values, targets.value_targets, targets.mask),
    )


def _minibatches(num_minibatches: int, key: jax.Array,
                 samples: Samples | Sequences) -> Samples | Sequences:
    """One epoch's shuffled minibatches, stacked on a leading ``[num_minibatches]`` axis."""
    if isinstance(samples, Sequences):
        return recurrent_sequences(key, samples, num_minibatches)
    batch_size = samples.advantages.shape[0]
    if batch_size % num_minibatches:
        raise ValueError(f"num_minibatches={num_minibatches} does not divide the batch's "
                         f"{batch_size} samples")
    permutation = jax.random.permutation(key, batch_size)
    return jax.tree.map(
        lambda x: x[permutation].reshape(
            num_minibatches, batch_size // num_minibatches, *x.shape[1:]
        ),
        samples,
    )


def _split_over(mesh: Mesh | None, tree: Any, env_axis: Callable[[str], int]) -> Any:
    """``tree`` (a NamedTuple of arrays) constrained to split field ``f`` along ``env_axis(f)``.

    The identity without a mesh. Inside the jitted update this is what makes
    it data-parallel: XLA's partitioner runs each device's share of whatever
    reads the constrained arrays and sums partial reductions across devices.
    """
    if mesh is None:
        return tree
    return type(tree)(**{
        name: None if value is None else jax.lax.with_sharding_constraint(
            value, NamedSharding(mesh, env_axis_spec(env_axis(name))))
        for name, value in tree._asdict().items()
    })


def shard_batch(mesh: Mesh | None, batch: Batch) -> Batch:
    """``batch`` split along its envs over ``mesh`` (whole env sequences per device)."""
    return _split_over(mesh, batch, lambda name: 0 if name in ENV_FIRST_FIELDS else 1)


def _shard_minibatches(mesh: Mesh | None,
                       minibatches: Samples | Sequences) -> Samples | Sequences:
    """Every stacked minibatch split across ``mesh``: samples, or (recurrent) whole sequences."""
    if isinstance(minibatches, Sequences):  # [M, b, S] hidden; [M, T, b, ...] the rest
        return _split_over(mesh, minibatches,
                           lambda name: 1 if name == "initial_hidden" else 2)
    return _split_over(mesh, minibatches, lambda name: 1)  # [M, mb, ...]


def replicate(mesh: Mesh | None, tree: Any) -> Any:
    """``tree`` constrained to live whole on every device of ``mesh`` (the identity without one)."""
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, replicated(mesh))


def make_update_fn(
    options: UpdateOptions, network: ActorCritic | RecurrentActorCritic, *,
    schedule: LearningRateSchedule | None = None, mesh: Mesh | None = None,
) -> UpdateFn:
    """A jitted ``update(state, batch) -> (state, metrics)``: one learner update.

    `batch_targets` first, then ``num_epochs x num_minibatches`` steps of
    `ppo_loss` with the ratio centred on ``options.ppo_ratio_anchor``: the
    behaviour log-probs, the learner's at the update's start, or (``'ewma'``)
    those of `ProximalAverage`'s params, re-evaluated on every minibatch and
    averaged forward after every optimizer step. For the last two, each
    sample's surrogate is weighted by ``min(pi_prox / mu, is_weight_max)``.

    ``schedule``: the learning-rate schedule with ``anneal_lr`` (default: a
    fresh run's, `default_schedule`). The rate's numbers are an argument of
    the compiled program, not constants in it (`ScheduledUpdate`): updates
    that differ only in their budget or learning rate compile (and cache)
    one program. A recurrent ``network`` re-unrolls every
    env's sequence from the state its chunk started with
    (``batch.initial_hidden``), zeroing it where ``batch.reset``, for the
    V-trace targets and inside every minibatch; the minibatches are whole env
    sequences (see `recurrent_sequences`).

    ``mesh``: a 1-D mesh of learner devices (`ppo_async.core.devices`) to
    run the update data-parallel over: the batch split along its envs, every
    minibatch split across the devices, the state replicated. The result is
    the one-device update's up to the order of floating-point sums. None:
    one device, no constraint.
    """
    kind, rate = _rate_argument(options, schedule)
    return ScheduledUpdate(_update_program(_unscheduled(options), network, mesh, kind), rate)


class ScheduledUpdate:
    """``update(state, batch)``: a compiled update program and the learning-rate piece it takes.

    The piece is the program's third argument (see `_rate_argument`), so
    every run whose update differs only in its budget or learning rate runs
    (and caches on disk) one program. ``program(state, batch, rate)`` is the
    jitted function; `with_normalization` wraps it, keeping ``rate`` an
    argument.
    """

    def __init__(self, program: Callable[..., Any], rate: LearningRateSchedule | None):
        self.program, self.rate = program, rate

    def __call__(self, state: LearnerState, batch: Batch) -> tuple[LearnerState, dict[str, Any]]:
        return self.program(state, batch, self.rate)

    def _cache_size(self) -> int:
        return self.program._cache_size()


# Held for the process, like jit's own cache: a run that repeats another's
# options, network and mesh (a notebook's second run, a sweep's next seed, a
# resumed run) calls the program the first one traced and compiled, instead
# of tracing, lowering and loading it again. Every input of the program is in
# the key, all hashable values (frozen dataclasses, a named tuple, a mesh).
@functools.lru_cache(maxsize=32)
def _update_program(
    options: UpdateOptions, network: ActorCritic | RecurrentActorCritic, mesh: Mesh | None,
    kind: str,
) -> Callable[..., Any]:
    """The jitted ``update(state, batch, rate)`` of `make_update_fn`."""
    recurrent = is_recurrent(network)
    loss_fn = _minibatch_loss(options, network)

    def learning_rate_at(rate: LearningRateSchedule, opt_state) -> jax.Array:
        """The rate of the update's first optimizer step (what the curves show)."""
        if kind == "constant":
            return jnp.asarray(rate.begin_value, jnp.float32)
        steps = optax.tree_utils.tree_get_all_with_path(opt_state, "count")[-1][1]
        return jnp.asarray(_rate_of(kind, rate)(steps), jnp.float32)

    @jax.jit
    def update(state: LearnerState, batch: Batch, rate: LearningRateSchedule):
        optimizer = _adam(options, _rate_of(kind, rate))

        def sgd_step(carry, minibatch):
            params, opt_state, proximal = carry
            (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params, proximal, minibatch
            )
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            if proximal is not None:
                proximal = average_in(proximal, params, options.proximal_ewma_decay)
            metrics["grad_norm"] = optax.tree.norm(grads)
            return (params, opt_state, proximal), metrics

        state, batch = replicate(mesh, state), shard_batch(mesh, batch)
        targets = batch_targets(options, network, state.params, batch)
        samples = _training_samples(options, batch, targets, recurrent)

        def epoch(carry, key):
            minibatches = _shard_minibatches(
                mesh, _minibatches(options.num_minibatches, key, samples))
            return jax.lax.scan(sgd_step, carry, minibatches)

        key, epoch_key = jax.random.split(state.key)
        (params, opt_state, proximal), metrics = jax.lax.scan(
            epoch, (state.params, state.opt_state, state.proximal),
            jax.random.split(epoch_key, options.num_epochs),
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics.update(targets.metrics)
        metrics["advantage_mean"] = jnp.mean(targets.advantages)
        metrics["value_target_mean"] = jnp.mean(targets.value_targets)
        metrics["learning_rate"] = learning_rate_at(rate, state.opt_state)
        metrics["params_finite"] = jnp.all(jnp.isfinite(jnp.concatenate(
            [leaf.ravel() for leaf in jax.tree.leaves(params)]))).astype(jnp.float32)
        return replicate(mesh, LearnerState(params, opt_state, key, proximal)), metrics

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
    if isinstance(update, ScheduledUpdate):
        return ScheduledUpdate(_normalized_program(update.program, options), update.rate)

    def inner_program(state, batch, _):
        return update(state, batch)

    # A new closure on every call: nothing to find again, so past the cache.
    return ScheduledUpdate(_normalized_program.__wrapped__(inner_program, options), None)


@functools.lru_cache(maxsize=32)  # keyed on the inner program itself, as `_update_program`
def _normalized_program(inner_program: Callable[..., Any],
                        options: NormalizationOptions) -> Callable[..., Any]:
    """The jitted ``normalized_update(state, batch, rate)`` of `with_normalization`."""

    @jax.jit
    def normalized_update(state: LearnerState, batch: Batch, rate: LearningRateSchedule | None):
        policy = update_statistics(state.params, batch.obs, batch.discounted_return)
        if policy.obs_stats is not None:
            def normalize(obs):
                return normalize_observation(policy.obs_stats, obs, clip=options.obs_clip)

            batch = batch._replace(
                obs=normalize(batch.obs), bootstrap_obs=normalize(batch.bootstrap_obs),
                final_obs=None if batch.final_obs is None else normalize(batch.final_obs),
            )
        inner, metrics = inner_program(state._replace(params=policy.params), batch, rate)
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
    proximal_logp: jax.Array | None  # [T, B] the ratio's anchor (None: 'ewma', evaluated per minibatch)
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
