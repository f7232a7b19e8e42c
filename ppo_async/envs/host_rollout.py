"""The actor program of host envs: a Python loop over env steps, one jitted policy call each.

An actor owns a batch of ``E`` host envs (`ppo_async.envs.host`). Per env step
it gets action, log-prob, value (and for a recurrent network the states) of
the whole batch from ONE jitted policy call and ONE device-to-host copy --
its own call, or its row of a call made for every thread actor of its device
(`BatchedInference`, `ppo_async.runtime.inference`) -- and steps the envs;
the rest (unpacking, episode statistics, reward scaling) is done once per
chunk. What it stores is what the gymnax rollout stores
(`ppo_async.envs.gymnax_env.Trajectory`): at a truncated (and not
terminated) step ``gamma * V(final_obs)`` is folded into the reward -- or,
when the learner bootstraps truncations, the final observation is kept for
it -- and ``episode_return`` / ``episode_length`` are nonzero only at done
steps. The learner cannot tell a host rollout from a gymnax one: same fields,
shapes and dtypes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core import keys
from ppo_async.core.devices import to_host
from ppo_async.core.normalization import (
    accumulate_return,
    acting_apply,
    scale_reward,
    wrap_params,
)
from ppo_async.envs.gymnax_env import Trajectory
from ppo_async.envs.registry import ENVPOOL, split_env_id
from ppo_async.envs.host import (
    FLAG_KINDS,
    OBS_KINDS,
    REWARD_KINDS,
    EnvContractError,
    HostEnvError,
    HostVectorEnv,
    checked_array,
    close_envs,
    contract_problem,
    envpool_threads,
    make_host_env,
)
from ppo_async.envs.workers import (
    EnvGroups,
    EnvWorkers,
    portable_factory,
    spin_seconds,
)
from ppo_async.envs.program import (
    ActorProgram,
    BatchedInference,
    ChunkClient,
    ChunkEnd,
    reattached,
    unattached,
)
from ppo_async.networks.actor_critic import (
    is_recurrent,
    params_template,
    reset_hidden,
)


class HostCarry(NamedTuple):
    """What one actor's host envs carry from one chunk to the next."""

    envs: HostVectorEnv  # this actor's own E env instances
    obs: np.ndarray  # [E, *obs_shape] float32, the observation to act on next
    episode_return: np.ndarray  # [E] float32, undiscounted return so far
    episode_length: np.ndarray  # [E] int32, steps so far in the episode
    key: np.ndarray  # [G, 2] uint32 raw data of each env group's PRNG key for actions (key_data)
    hidden: np.ndarray | None = None  # [E, state_size] float32, recurrent networks only
    discounted_return: np.ndarray | None = None  # [E] float32, reward scaling only (as EnvCarry's)


class PolicyStep(NamedTuple):
    """One policy call's outputs for the ``E`` envs, on the host."""

    action: np.ndarray  # [E] int32 or [E, action_dim] float32
    logp: np.ndarray  # [E] float32
    value: np.ndarray  # [E] float32
    hidden: np.ndarray | None  # [E, S] the state the step acted with (recurrent only)
    next_hidden: np.ndarray | None  # [E, S] the state after it (recurrent only)


class HostPolicy:
    """The jitted policy calls of a host actor program, one device-to-host copy per env step.

    ``act(params, hidden, obs, reset, key)`` is the call of ``N`` actors at
    once (a leading actor axis on every array; ``N = 1`` for an actor on its
    own): per actor it returns ONE float32 row, ``[action | logp | value |
    hidden | next_hidden]`` per env followed by the actor's next key (its
    bits), because each device-to-host copy costs tens of microseconds and
    int32 actions are exact in float32. `unpack` reads a row back. Keys are
    raw key data (``jax.random.key_data``), so that they stack across actors.
    """

    def __init__(self, apply, num_envs: int, action_space: Any, state_size: int):
        self.continuous = not hasattr(action_space, "n")
        self.action_shape = (int(action_space.shape[0]),) if self.continuous else ()
        self.action_dtype = np.float32 if self.continuous else np.int32
        self.action_dim = self.action_shape[0] if self.continuous else 1
        self.num_envs, self.state_size = num_envs, state_size
        self.columns = self.action_dim + 2 + 2 * state_size
        # Where each env's packed outputs hold the two states (see the class docstring).
        a = self.action_dim
        self.hidden_columns = slice(a + 2, a + 2 + state_size)
        self.next_hidden_columns = slice(a + 2 + state_size, self.columns)
        self._apply = apply
        self.act = jax.jit(jax.vmap(self._act_one, in_axes=(None, 0, 0, 0, 0)))
        self.value = jax.jit(self._value_recurrent if state_size else self._value)

    def _act_one(self, params, hidden, obs, reset, key_data):
        """One actor's row; the state is zeroed where ``reset`` (as `gymnax_env.make_rollout` does)."""
        key, action_key = jax.random.split(jax.random.wrap_key_data(key_data))
        if self.state_size:
            hidden = reset_hidden(hidden, reset)
            next_hidden, dist, value = self._apply(params, hidden, obs)
            states = (hidden, next_hidden)
        else:
            dist, value = self._apply(params, obs)
            states = ()
        action = dist.sample(action_key)
        packed = jnp.concatenate(
            [action.reshape(self.num_envs, self.action_dim).astype(jnp.float32),
             dist.log_prob(action)[:, None], value[:, None], *states],
            axis=1,
        )
        key_bits = jax.lax.bitcast_convert_type(jax.random.key_data(key), jnp.float32)
        return jnp.concatenate([packed.reshape(-1), key_bits])

    def act_batched(self, params, per_actor: list[tuple]) -> np.ndarray:
        """``act`` on the ``(hidden, obs, reset, key)`` of every actor, stacked: row ``i`` is actor ``i``'s."""
        # np.array of a list of equal arrays stacks them, at a third of np.stack's cost.
        stacked = (None if column[0] is None else np.array(column) for column in zip(*per_actor))
        return np.asarray(self.act(params, *stacked))

    def act_alone(self, params, hidden, obs, reset, key) -> np.ndarray:
        """One actor's row of ``act``, called for it alone."""
        batched = (None if a is None else a[None] for a in (hidden, obs, reset, key))
        return np.asarray(self.act(params, *batched))[0]

    def _value(self, params, hidden, obs):
        del hidden
        return self._apply(params, obs)[1]

    def _value_recurrent(self, params, hidden, obs):
        return self._apply(params, hidden, obs)[2]

    def split(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One actor's row of ``act`` as ``([E, columns] packed outputs, next key)`` (views)."""
        size = self.num_envs * self.columns
        return row[:size].reshape(self.num_envs, self.columns), row[size:].view(np.uint32)

    def actions(self, packed: np.ndarray) -> np.ndarray:
        """The actions ``[E]`` int32 or ``[E, action_dim]`` float32 of ``[E, columns]`` packed outputs."""
        if self.continuous:
            return packed[:, :self.action_dim].copy()
        return packed[:, 0].astype(np.int32)

    def unpack(self, packed: np.ndarray) -> PolicyStep:
        """The `PolicyStep` of packed outputs ``[..., columns]`` (one step's, or a chunk's ``[T, E, ...]``)."""
        a, s = self.action_dim, self.state_size
        lead = packed.shape[:-1]
        action = packed[..., :a].reshape(*lead, *self.action_shape).astype(self.action_dtype)
        hidden = packed[..., self.hidden_columns] if s else None
        next_hidden = packed[..., self.next_hidden_columns] if s else None
        return PolicyStep(action, packed[..., a], packed[..., a + 1], hidden, next_hidden)


class HostRollout:
    """The `ActorProgram` of one host env id (`make_host_actor_program`)."""

    def __init__(self, config: AsyncActorLearnerConfig):
        self.config = config
        self.env_id, self.num_envs = config.env_id, config.envs_per_actor
        probe = make_host_env(self.env_id, self.num_envs, **config.env_make_kwargs())
        self.observation_shape = tuple(int(d) for d in probe.observation_shape)
        self.action_space = action_space = probe.action_space
        close_envs(probe)
        # As the run's layout decided them: train pins env_groups (ppo_async.runtime.layout).
        self.workers, self.groups = config.env_workers, config.env_groups or 1
        self.payload = None  # a host: id's factory, on its way to the env workers
        if self.workers:
            self.payload, problem = portable_factory(self.env_id)
            if problem is not None:
                raise HostEnvError(f"env_workers={self.workers}: {self.env_id}: {problem}")
        self.network = config.make_network(self.observation_shape, action_space)
        self.options = config.normalization_options()
        self.recurrent = is_recurrent(self.network)
        state_size = self.network.state_size if self.recurrent else 0
        self.policy = HostPolicy(acting_apply(self.network.apply, self.options),
                                 self.num_envs // self.groups, action_space, state_size)
        self.low = np.asarray(getattr(action_space, "low", -np.inf), np.float32)
        self.high = np.asarray(getattr(action_space, "high", np.inf), np.float32)
        self.gamma = np.float32(config.gamma)
        self.obs_batch_shape = (self.num_envs, *self.observation_shape)
        self._chunk_rewards = jax.jit(self._discount_and_scale)

    def _discount_and_scale(self, return_stats, carried, reward, done):
        """Reward scaling of a chunk ``[T, E]``: ``(R_t, carried', scaled rewards)``."""
        def step(carried, reward_and_done):
            discounted, carried = accumulate_return(carried, *reward_and_done,
                                                    gamma=self.config.gamma)
            return carried, discounted

        carried, discounted = jax.lax.scan(step, carried, (reward, done))
        return discounted, carried, scale_reward(return_stats, reward,
                                                 clip=self.options.reward_clip)

    def program(self) -> ActorProgram:
        template = wrap_params(params_template(self.network, self.observation_shape),
                               self.observation_shape, self.options)
        return ActorProgram(self.observation_shape, self.network, template, self.reset,
                            self.rollout, close=self.close,
                            inference=BatchedInference(self.policy.act_batched,
                                                       lockstep=True))

    def reset(self, key: jax.Array, device: jax.Device) -> HostCarry:
        """This actor's own ``envs_per_actor`` envs, made and seeded from ``key``.

        Env ``i`` is seeded with ``seed + i`` however the envs are split into
        groups and workers (for gymnasium ids, as one batch of them would be);
        each group's actions draw on its own key.
        """
        env_key, action_key = keys.split(key)
        seed = int(jax.random.randint(env_key, (), 0, np.iinfo(np.int32).max))
        group_keys = keys.split(action_key, self.groups) if self.groups > 1 else (action_key,)
        envs = self._make_envs()
        try:
            obs = checked_array(self.env_id, "obs", envs.reset(seed), self.obs_batch_shape)
        except BaseException as error:
            close_envs(envs)
            if isinstance(error, EnvContractError):
                error.locate(actor=envs.owner, step=0)
            raise
        return HostCarry(
            envs=envs, obs=obs, episode_return=np.zeros((self.num_envs,), np.float32),
            episode_length=np.zeros((self.num_envs,), np.int32),
            key=np.stack([np.asarray(jax.random.key_data(k)) for k in group_keys]),
            hidden=(np.zeros((self.num_envs, self.policy.state_size), np.float32)
                    if self.recurrent else None),
            discounted_return=(np.zeros((self.num_envs,), np.float32) if self.options.rewards
                               else None),
        )

    def _make_envs(self) -> EnvWorkers | EnvGroups:
        """This actor's envs: in env worker processes, or in its thread (`EnvGroups`)."""
        owner = threading.current_thread().name.replace("ppo-actor-", "actor ")
        if self.workers:
            return EnvWorkers(
                self.env_id, self.num_envs, workers=self.workers, groups=self.groups,
                observation_shape=self.observation_shape, action_space=self.action_space,
                env_modules=self.config.env_modules, payload=self.payload,
                make_kwargs=self.config.env_make_kwargs(),
                owner=owner, reply_timeout_s=self.config.learner_timeout_s / 2,
                spin_s=spin_seconds(self.config.num_actors * self.workers))
        size = self.num_envs // self.groups
        make_kwargs = self.config.env_make_kwargs()
        if split_env_id(self.env_id)[0] == ENVPOOL and "num_threads" not in dict(self.config.envpool_kwargs):
            threads = envpool_threads(self.config.num_actors * self.groups)
            make_kwargs["envpool_kwargs"] = (*make_kwargs["envpool_kwargs"],
                                             ("num_threads", threads))
        return EnvGroups([make_host_env(self.env_id, size, **make_kwargs)
                          for _ in range(self.groups)], size, owner=owner)

    def close(self, carry: HostCarry) -> None:
        close_envs(unattached(carry)[0].envs)

    def rollout(self, params, carry: HostCarry, next_params: Callable[[], Any] | None = None):
        """``num_steps`` env steps: ``(carry, trajectory [T, E, ...], bootstrap_obs [E, ...], bootstrap_value [E])``.

        Each step's `HostPolicy.act` row comes from the client of an `AttachedCarry`
        (a call shared by the device's actors) or from `HostPolicy.act_alone`. A
        step does only what the next one needs (the policy call, the env step, its
        checks and stores into the chunk); the rest (unpacking the policy's outputs,
        episode statistics, reward scaling) is done once per chunk on ``[T, E]``
        arrays, since with many actors each one's Python per step is what the GIL
        serializes.

        With ``G`` env groups (`EnvGroups`) each step asks for group ``g``'s
        actions and starts its envs, then waits for group ``g + 1``'s previous
        step and does the same: while env workers step one group, the policy
        computes the next one's actions. One group is the plain loop.

        The steps are a generator (`chunk_steps`); a `ChunkClient` (a lock-step
        sampler shared by the actors of a process) drives it among other
        actors' chunks, else this thread drives it alone. With a sampler,
        ``next_params()`` (None: not at hand) gives the params of this actor's
        next chunk, asked by the sampler as this one ends: with them it begins
        the next chunk there (`ChunkEnd.follow`) before this thread has
        finished and sent this one, and the next call's chunk is that one.
        """
        carry, client = unattached(carry)
        if isinstance(client, ChunkClient):
            # The sampler's thread must never block on one env: each steps in a thread.
            client.adopt(carry.envs.step_in_threads(client.stopped))
            end = client.drive(params, self.chunk_steps(params, carry), next_params, carry.envs)
        else:
            act = client or self.policy.act_alone
            steps = self.chunk_steps(params, carry)
            request = next(steps)
            try:
                while True:
                    request = steps.send(None if request is None else act(params, *request))
            except StopIteration as finished:
                end = finished.value
        carry, *chunk = end.finish(carry)
        return reattached(carry, client), *chunk

    def chunk_steps(self, params, carry: HostCarry):
        """`rollout`'s steps as a generator: it yields ``(hidden, obs, reset, key)`` for each
        policy call and takes back that call's `HostPolicy.act` row, and yields None once a
        group's envs were started (its driver may let other actors' envs start before this
        one waits for them). It returns a `ChunkEnd`: ``finish(carry)`` finishes the chunk
        (`_finish_chunk`: its once-per-chunk work, the bootstrap value's policy call
        among it) and returns ``(carry, trajectory, bootstrap_obs, bootstrap_value)``:
        called by the actor's own thread, it keeps a shared sampler's thread free to step
        the other actors."""
        return self._steps(params, carry.envs, carry.obs, carry.episode_length == 0, carry.key,
                           carry.hidden)

    def _steps(self, params, envs: HostVectorEnv, obs: np.ndarray, first_reset: np.ndarray,
               key_data: np.ndarray, hidden: np.ndarray | None):
        """`chunk_steps` from where a chunk starts: ``first_reset`` marks the envs whose
        observation begins an episode (their recurrent state is zeroed)."""
        key_data = np.array(key_data)
        steps = self.config.num_steps
        trajectory = self._empty_trajectory()  # fresh every chunk: the learner keeps the last
        packed_outputs = np.empty((steps, self.num_envs, self.policy.columns), np.float32)
        bonus = np.zeros((steps, self.num_envs), np.float32)  # gamma V(final_obs) at time limits
        next_obs = np.empty(self.obs_batch_shape, np.float32)
        hidden = np.array(hidden) if self.recurrent else None
        reset = first_reset.copy() if self.recurrent else None
        trajectory.obs[0] = obs
        try:
            for t in range(steps + 1):
                for g, (lo, hi) in enumerate(envs.groups):
                    if t:  # the group's previous step, started one round ago
                        self._store_step(params, envs.step_wait(g), t - 1, lo, hi, trajectory,
                                         next_obs, hidden, reset, bonus)
                    if t == steps:
                        continue
                    packed, key_data[g] = self.policy.split((yield (
                        None if hidden is None else hidden[lo:hi], trajectory.obs[t, lo:hi],
                        None if reset is None else reset[lo:hi], key_data[g])))
                    packed_outputs[t, lo:hi] = packed
                    if self.recurrent:
                        hidden[lo:hi] = packed[:, self.policy.next_hidden_columns]
                    action = self.policy.actions(packed)
                    if self.policy.continuous:
                        np.clip(action, self.low, self.high, out=action)
                    envs.step_async(action, g)
                    yield None
        except EnvContractError as error:  # a try costs nothing until it catches (3.11+)
            error.locate(actor=envs.owner, step=envs.steps[g])
            raise
        return ChunkEnd(
            functools.partial(self._finish_chunk, params, trajectory, packed_outputs, bonus,
                              first_reset, next_obs, key_data, hidden),
            # Called (by a sampler) before finish, which leaves the flags as they are.
            lambda next_params: self._steps(
                next_params, envs, next_obs,
                trajectory.terminated[-1] | trajectory.truncated[-1], key_data, hidden))

    def _store_step(self, params, step: Any, t: int, lo: int, hi: int, trajectory: Trajectory,
                    next_obs: np.ndarray, hidden: np.ndarray | None, reset: np.ndarray | None,
                    bonus: np.ndarray) -> None:
        """Step ``t`` of envs ``lo:hi`` (a group) into the chunk."""
        if len(step) != 5:
            raise HostEnvError(
                f"{self.env_id}: step returned {len(step)} values, expected 5 "
                "(obs, reward, terminated, truncated, final_obs)"
            )
        into = trajectory.obs[t + 1] if t + 1 < len(trajectory.obs) else next_obs
        self._store(into[lo:hi], step[0], "obs", OBS_KINDS)
        self._store(trajectory.reward[t, lo:hi], step[1], "reward", REWARD_KINDS)
        terminated = self._store(trajectory.terminated[t, lo:hi], step[2], "terminated",
                                 FLAG_KINDS)
        truncated = self._store(trajectory.truncated[t, lo:hi], step[3], "truncated", FLAG_KINDS)
        np.greater(truncated, terminated, out=truncated)  # truncated and not terminated, in place
        if np.count_nonzero(truncated):
            self._bootstrap_truncated(params, None if hidden is None else hidden[lo:hi],
                                      step[4], truncated, trajectory, bonus, t, lo, hi)
        if reset is not None:
            reset[lo:hi] = terminated | truncated

    def _finish_chunk(self, params, trajectory: Trajectory, packed_outputs: np.ndarray,
                      bonus: np.ndarray, first_reset: np.ndarray, obs: np.ndarray,
                      key_data: np.ndarray, hidden: np.ndarray | None, carry: HostCarry):
        """The chunk's `Trajectory` fields from what its steps stored, and the next carry
        (``carry``: the one the chunk started from, whose episode counters go on)."""
        acted = self.policy.unpack(packed_outputs)
        trajectory.action[:] = acted.action
        trajectory.behaviour_logp[:] = acted.logp
        trajectory.behaviour_value[:] = acted.value
        done = trajectory.done
        if self.recurrent:
            trajectory.hidden[:] = acted.hidden
            trajectory.reset[0], trajectory.reset[1:] = first_reset, done[:-1]
        stats = episode_statistics(trajectory.reward, done, carry.episode_return,
                                   carry.episode_length)
        trajectory.episode_return[:], trajectory.episode_length[:] = stats[:2]
        carried_return = carry.discounted_return
        if self.options.rewards:  # as gymnax_env.make_rollout, with the same pure functions
            discounted, carried_return, scaled = self._chunk_rewards(
                params.return_stats, carried_return, trajectory.reward, done)
            trajectory.discounted_return[:] = discounted
            trajectory.reward[:] = scaled
        trajectory.reward[:] += bonus
        if self.recurrent:  # the state the next chunk starts from: zero where an episode starts
            hidden_next = np.where(done[-1][:, None], np.float32(0), hidden)
            bootstrap_value = self.policy.value(params, hidden_next, obs)
        else:
            bootstrap_value = self.policy.value(params, None, obs)
        carry = HostCarry(carry.envs, obs, stats[2], stats[3], key_data, hidden,
                          None if carried_return is None else np.asarray(carried_return))
        return carry, trajectory, obs, bootstrap_value

    def _store(self, into: np.ndarray, value: Any, field: str, kinds: str) -> np.ndarray:
        """``value`` copied into ``into`` (cast to its dtype); `EnvContractError` unless it
        has its shape and a dtype of ``kinds``.

        A copy: an env may hand back a buffer it overwrites on its next step.
        """
        if (type(value) is not np.ndarray or value.shape != into.shape  # assigning would broadcast
                or value.dtype.kind not in kinds):
            problem = contract_problem(value, into.shape, kinds)
            if problem is not None:
                raise EnvContractError(self.env_id, field, problem)
        into[...] = value
        return into

    def _bootstrap_truncated(self, params, hidden, final_obs: Any, truncated: np.ndarray,
                             trajectory: Trajectory, bonus: np.ndarray, t: int, lo: int,
                             hi: int) -> None:
        """Step ``t`` ended some episode of envs ``lo:hi`` at its time limit (``truncated``).

        With the learner bootstrapping truncations (V-trace) the final
        observation is stored for its critic; otherwise, as in
        `ppo_async.envs.gymnax_env.make_rollout`, a time limit is not a
        terminal, so the episode's tail value ``gamma * V(final_obs)`` goes
        into its last reward (``bonus``, added after any reward scaling).
        """
        final_obs = checked_array(self.env_id, "final_obs", final_obs,
                                  (hi - lo, *self.observation_shape))
        if self.config.learner_bootstraps_truncation:
            trajectory.final_obs[t, lo:hi] = final_obs
            return
        # The final observation continues the episode: the state after this step reads it.
        final_value = to_host(self.policy.value(params, hidden, final_obs))
        bonus[t, lo:hi] = self.gamma * np.where(truncated, final_value, np.float32(0))

    def _empty_trajectory(self) -> Trajectory:
        steps, num_envs, state_size = self.config.num_steps, self.num_envs, self.policy.state_size
        per_step = (steps, num_envs)
        recurrent, policy = self.recurrent, self.policy
        return Trajectory(
            obs=np.empty((steps, *self.obs_batch_shape), np.float32),
            action=np.empty((*per_step, *policy.action_shape), policy.action_dtype),
            reward=np.empty(per_step, np.float32),
            terminated=np.empty(per_step, bool),
            truncated=np.empty(per_step, bool),
            behaviour_logp=np.empty(per_step, np.float32),
            behaviour_value=np.empty(per_step, np.float32),
            episode_return=np.empty(per_step, np.float32),
            episode_length=np.empty(per_step, np.int32),
            reset=np.empty(per_step, bool) if recurrent else None,
            hidden=np.empty((*per_step, state_size), np.float32) if recurrent else None,
            final_obs=(np.zeros((steps, *self.obs_batch_shape), np.float32)
                       if self.config.learner_bootstraps_truncation else None),
            discounted_return=np.empty(per_step, np.float32) if self.options.rewards else None,
        )


def episode_statistics(reward: np.ndarray, done: np.ndarray, return_before: np.ndarray,
                       length_before: np.ndarray):
    """Episode returns and lengths of a chunk, computed for all its steps at once.

    ``reward`` and ``done`` are ``[T, E]``; ``return_before`` and
    ``length_before`` ``[E]`` are the undiscounted return and length of each
    env's episode so far. Returns ``(episode_return [T, E], episode_length
    [T, E], return_after [E], length_after [E])``: the return and length of
    the episode that ended at each done step (0 elsewhere), and those of each
    env's unfinished episode after the chunk. Sums are taken in float64 (a
    difference of cumulative sums) and rounded to float32.
    """
    steps = reward.shape[0]
    total = np.cumsum(reward, axis=0, dtype=np.float64)
    if not done.any():  # no episode ended (most chunks): the same numbers, in fewer numpy calls
        return (np.zeros(reward.shape, np.float32), np.zeros(reward.shape, np.int32),
                (total[-1] + return_before.astype(np.float64)).astype(np.float32),
                (steps + length_before).astype(np.int32))
    t = np.arange(steps)[:, None]
    # The last step before t that ended an episode (-1: none in this chunk).
    last_end = np.maximum.accumulate(np.where(done, t, -1), axis=0)
    previous_end = np.concatenate([np.full_like(last_end[:1], -1), last_end[:-1]])
    in_chunk = previous_end >= 0
    before = np.take_along_axis(total, np.maximum(previous_end, 0), axis=0)
    returns = np.where(in_chunk, total - before, total + return_before.astype(np.float64))
    lengths = np.where(in_chunk, t - previous_end, t + 1 + length_before)
    returns, lengths = returns.astype(np.float32), lengths.astype(np.int32)
    return (np.where(done, returns, np.float32(0)), np.where(done, lengths, np.int32(0)),
            np.where(done[-1], np.float32(0), returns[-1]),
            np.where(done[-1], np.int32(0), lengths[-1]))


def make_host_actor_program(config: AsyncActorLearnerConfig) -> ActorProgram:
    """The `ActorProgram` for a host env id: a Python loop over env steps.

    ``reset(key, device)`` builds this actor's own ``envs_per_actor`` envs,
    seeded from ``key``. ``rollout(params, carry)`` steps them
    ``num_steps`` times; each step is one jitted policy call on the whole
    batch (plus one value call on the final observations at steps where some
    episode was truncated) and returns numpy `Trajectory` ``[T, E, ...]``,
    ``bootstrap_obs`` ``[E, ...]`` and ``bootstrap_value`` ``[E]``, with the
    dtypes of the gymnax path.
    """
    return HostRollout(config).program()
