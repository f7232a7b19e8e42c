"""The actor program of host envs: a Python loop over env steps, one jitted policy call each.

An actor owns a batch of ``E`` host envs (`ppo_async.envs.host`). Per env step
it runs ONE jitted policy call on the whole batch (action, log-prob, value,
and for a recurrent network the states), copies its outputs to numpy in one
transfer, and steps the envs. What it stores is what the gymnax rollout
stores (`ppo_async.envs.gymnax_env.Trajectory`): at a truncated (and not
terminated) step ``gamma * V(final_obs)`` is folded into the reward -- or,
when the learner bootstraps truncations, the final observation is kept for
it -- and ``episode_return`` / ``episode_length`` are nonzero only at done
steps. The learner cannot tell a host rollout from a gymnax one: same fields,
shapes and dtypes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core.normalization import (
    NormalizationOptions,
    accumulate_return,
    acting_apply,
    scale_reward,
    wrap_params,
)
from ppo_async.envs.gymnax_env import Trajectory
from ppo_async.envs.host import (
    HostEnvError,
    HostVectorEnv,
    checked_array,
    close_envs,
    make_host_env,
)
from ppo_async.envs.program import ActorProgram
from ppo_async.networks.actor_critic import (
    is_recurrent,
    make_config_network,
    params_template,
    reset_hidden,
)


class HostCarry(NamedTuple):
    """What one actor's host envs carry from one chunk to the next."""

    envs: HostVectorEnv  # this actor's own E env instances
    obs: np.ndarray  # [E, *obs_shape] float32, the observation to act on next
    episode_return: np.ndarray  # [E] float32, undiscounted return so far
    episode_length: np.ndarray  # [E] int32, steps so far in the episode
    key: jax.Array  # PRNG key for actions, on the actor device
    hidden: np.ndarray | None = None  # [E, state_size] float32, recurrent networks only
    discounted_return: np.ndarray | None = None  # [E] float32, reward scaling only (as EnvCarry's)


class PolicyStep(NamedTuple):
    """One policy call's outputs for the ``E`` envs, on the host."""

    action: np.ndarray  # [E] int32 or [E, action_dim] float32
    logp: np.ndarray  # [E] float32
    value: np.ndarray  # [E] float32
    hidden: np.ndarray | None  # [E, S] the state the step acted with (recurrent only)
    next_hidden: np.ndarray | None  # [E, S] the state after it (recurrent only)


class EnvStep(NamedTuple):
    """One step of the ``E`` host envs, checked against the `HostVectorEnv` contract."""

    obs: np.ndarray  # [E, *obs_shape] the next observation (the next episode's first where one ended)
    reward: np.ndarray  # [E] float32
    terminated: np.ndarray  # [E] bool
    truncated: np.ndarray  # [E] bool, and not terminated
    final_obs: Any  # the env's final observations, checked only where a step was truncated


class HostPolicy:
    """The jitted policy calls of a host actor program, one device-to-host copy per env step.

    ``act`` returns action, log-prob and value (and the states) side by side
    in ONE float32 array, ``[action | logp | value | hidden | next_hidden]``
    per env: each device-to-host copy costs tens of microseconds, and int32
    actions are exact in float32. `unpack` reads that row back.
    """

    def __init__(self, apply, num_envs: int, action_space: Any, state_size: int):
        self.continuous = not hasattr(action_space, "n")
        self.action_shape = (int(action_space.shape[0]),) if self.continuous else ()
        self.action_dtype = np.float32 if self.continuous else np.int32
        self.action_dim = self.action_shape[0] if self.continuous else 1
        self.num_envs, self.state_size = num_envs, state_size
        self._apply = apply
        self.act = jax.jit(self._act_recurrent if state_size else self._act)
        self.value = jax.jit(self._value_recurrent if state_size else self._value)

    def _pack(self, action, dist, value, *states) -> jax.Array:
        return jnp.concatenate(
            [action.reshape(self.num_envs, self.action_dim).astype(jnp.float32),
             dist.log_prob(action)[:, None], value[:, None], *states],
            axis=1,
        )

    def _act(self, params, hidden, obs, reset, key):
        del hidden, reset  # a feed-forward network has no state
        key, action_key = jax.random.split(key)
        dist, value = self._apply(params, obs)
        return key, self._pack(dist.sample(action_key), dist, value)

    def _act_recurrent(self, params, hidden, obs, reset, key):
        """The state is zeroed where ``reset`` (as in `ppo_async.envs.gymnax_env.make_rollout`)."""
        key, action_key = jax.random.split(key)
        hidden = reset_hidden(hidden, reset)
        next_hidden, dist, value = self._apply(params, hidden, obs)
        return key, self._pack(dist.sample(action_key), dist, value, hidden, next_hidden)

    def _value(self, params, hidden, obs):
        del hidden
        return self._apply(params, obs)[1]

    def _value_recurrent(self, params, hidden, obs):
        return self._apply(params, hidden, obs)[2]

    def unpack(self, packed: jax.Array) -> PolicyStep:
        """`PolicyStep` of one ``act`` row; waits for the policy (the envs need the actions now)."""
        packed = np.asarray(packed)
        a, s = self.action_dim, self.state_size
        action = packed[:, :a].reshape(self.num_envs, *self.action_shape).astype(self.action_dtype)
        hidden = packed[:, a + 2: a + 2 + s] if s else None
        next_hidden = packed[:, a + 2 + s:] if s else None
        return PolicyStep(action, packed[:, a], packed[:, a + 1], hidden, next_hidden)


class HostRollout:
    """The `ActorProgram` of one host env id (`make_host_actor_program`)."""

    def __init__(self, config: AsyncActorLearnerConfig):
        self.config = config
        self.env_id, self.num_envs = config.env_id, config.envs_per_actor
        probe = make_host_env(self.env_id, self.num_envs, envpool_kwargs=config.envpool_kwargs)
        self.observation_shape = tuple(int(d) for d in probe.observation_shape)
        action_space = probe.action_space
        close_envs(probe)
        self.network = make_config_network(config, self.observation_shape, action_space)
        self.options = NormalizationOptions.from_config(config)
        self.recurrent = is_recurrent(self.network)
        state_size = self.network.state_size if self.recurrent else 0
        self.policy = HostPolicy(acting_apply(self.network.apply, self.options), self.num_envs,
                                 action_space, state_size)
        self.low = np.asarray(getattr(action_space, "low", -np.inf), np.float32)
        self.high = np.asarray(getattr(action_space, "high", np.inf), np.float32)
        self.gamma = np.float32(config.gamma)
        self.obs_batch_shape = (self.num_envs, *self.observation_shape)

    def program(self) -> ActorProgram:
        template = wrap_params(params_template(self.network, self.observation_shape),
                               self.observation_shape, self.options)
        return ActorProgram(self.observation_shape, self.network, template, self.reset,
                            self.rollout, close=self.close)

    def reset(self, key: jax.Array, device: jax.Device) -> HostCarry:
        """This actor's own ``envs_per_actor`` envs, made and seeded from ``key``."""
        env_key, action_key = jax.random.split(key)
        seed = int(jax.random.randint(env_key, (), 0, np.iinfo(np.int32).max))
        envs = make_host_env(self.env_id, self.num_envs, envpool_kwargs=self.config.envpool_kwargs)
        try:
            obs = self._checked(envs.reset(seed), "reset obs", self.obs_batch_shape, np.float32)
        except BaseException:
            close_envs(envs)
            raise
        return HostCarry(
            envs=envs, obs=obs, episode_return=np.zeros((self.num_envs,), np.float32),
            episode_length=np.zeros((self.num_envs,), np.int32),
            key=jax.device_put(action_key, device),
            hidden=(np.zeros((self.num_envs, self.policy.state_size), np.float32)
                    if self.recurrent else None),
            discounted_return=(np.zeros((self.num_envs,), np.float32) if self.options.rewards
                               else None),
        )

    def close(self, carry: HostCarry) -> None:
        close_envs(carry.envs)

    def rollout(self, params, carry: HostCarry):
        """``num_steps`` env steps: ``(carry, trajectory [T, E, ...], bootstrap_obs [E, ...], bootstrap_value [E])``."""
        envs, obs, episode_return, episode_length, key = carry[:5]
        hidden, carried_return = carry.hidden, carry.discounted_return
        trajectory = self._empty_trajectory()  # fresh every chunk: the learner keeps the last
        for t in range(self.config.num_steps):
            reset = episode_length == 0 if self.recurrent else None  # an episode's first obs
            key, packed = self.policy.act(params, hidden, obs, reset, key)
            acted = self.policy.unpack(packed)
            if self.recurrent:
                trajectory.reset[t], trajectory.hidden[t] = reset, acted.hidden
                hidden = acted.next_hidden
            if self.policy.continuous:
                step = self._step(envs, np.clip(acted.action, self.low, self.high))
            else:
                step = self._step(envs, acted.action)
            done = step.terminated | step.truncated
            learn_reward = step.reward
            if self.options.rewards:  # as gymnax_env.make_rollout, with the same pure functions
                discounted_return, carried_return = accumulate_return(
                    carried_return, step.reward, done, gamma=self.config.gamma)
                trajectory.discounted_return[t] = discounted_return
                carried_return = np.asarray(carried_return)
                learn_reward = np.asarray(scale_reward(
                    params.return_stats, step.reward, clip=self.options.reward_clip))
            learn_reward = self._bootstrap_truncated(params, hidden, step, learn_reward,
                                                     trajectory, t)
            episode_return = episode_return + step.reward
            episode_length = episode_length + np.int32(1)
            trajectory.obs[t] = obs
            trajectory.action[t] = acted.action
            trajectory.reward[t] = learn_reward
            trajectory.terminated[t] = step.terminated
            trajectory.truncated[t] = step.truncated
            trajectory.behaviour_logp[t] = acted.logp
            trajectory.behaviour_value[t] = acted.value
            trajectory.episode_return[t] = np.where(done, episode_return, np.float32(0))
            trajectory.episode_length[t] = np.where(done, episode_length, np.int32(0))
            episode_return = np.where(done, np.float32(0), episode_return)
            episode_length = np.where(done, np.int32(0), episode_length)
            obs = step.obs
        if self.recurrent:  # the state the next chunk starts from: zero where an episode starts
            hidden_next = np.where((episode_length == 0)[:, None], np.float32(0), hidden)
            bootstrap_value = self.policy.value(params, hidden_next, obs)
        else:
            bootstrap_value = self.policy.value(params, None, obs)
        carry = HostCarry(envs, obs, episode_return, episode_length, key, hidden, carried_return)
        return carry, trajectory, obs, bootstrap_value

    def _checked(self, value: Any, field: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        return checked_array(self.env_id, field, value, shape, dtype)

    def _step(self, envs: HostVectorEnv, action: np.ndarray) -> EnvStep:
        step = envs.step(action)
        if len(step) != 5:
            raise HostEnvError(
                f"{self.env_id}: step returned {len(step)} values, expected 5 "
                "(obs, reward, terminated, truncated, final_obs)"
            )
        num_envs = (self.num_envs,)
        terminated = self._checked(step[2], "terminated", num_envs, bool)
        return EnvStep(
            obs=self._checked(step[0], "obs", self.obs_batch_shape, np.float32),
            reward=self._checked(step[1], "reward", num_envs, np.float32),
            terminated=terminated,
            truncated=self._checked(step[3], "truncated", num_envs, bool) & ~terminated,
            final_obs=step[4],
        )

    def _bootstrap_truncated(self, params, hidden, step: EnvStep, learn_reward: np.ndarray,
                             trajectory: Trajectory, t: int) -> np.ndarray:
        """The reward to learn from after a step where some episode hit its time limit.

        With the learner bootstrapping truncations (V-trace) the final
        observation is stored for its critic; otherwise, as in
        `ppo_async.envs.gymnax_env.make_rollout`, a time limit is not a
        terminal, so the episode's tail value ``gamma * V(final_obs)`` goes
        into its last reward.
        """
        if not step.truncated.any():
            return learn_reward
        final_obs = self._checked(step.final_obs, "final_obs", self.obs_batch_shape, np.float32)
        if self.config.learner_bootstraps_truncation:
            trajectory.final_obs[t] = final_obs
            return learn_reward
        # The final observation continues the episode: the state after this step reads it.
        final_value = np.asarray(jax.device_get(self.policy.value(params, hidden, final_obs)))
        return learn_reward + self.gamma * np.where(step.truncated, final_value, np.float32(0))

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
