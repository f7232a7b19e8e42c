"""Host environments: simulators the actor steps in Python, one batched policy step per env step.

The gymnax backend (`ppo_async.envs.gymnax_env`) jits the envs into the rollout. Many
simulators cannot be jitted -- Atari, MuJoCo, a lab's own Python code -- and
this module runs them instead. An actor owns a batch of ``E`` host envs; per
env step it runs ONE jitted policy call on the whole batch (action, log-prob,
value) on the actor device, copies the actions to numpy, and steps the envs.

The env id's prefix picks the backend (`split_env_id`):

==================== ===================================================
``CartPole-v1``      gymnax (jitted; `ppo_async.envs.gymnax_env`), the default
``gymnax:NAME``      the same, spelled out
``gymnasium:NAME``   ``gymnasium.make_vec(NAME, vectorization_mode="sync")``
                     with ``AutoresetMode.SAME_STEP``
``envpool:NAME``     ``envpool.make(NAME, env_type="gymnasium")``, made
                     same-step by resetting ended envs at once; Atari
                     games get the standard settings
                     (`ppo_async.envs.registry.ATARI_TRAIN_KWARGS`)
``host:NAME``        a factory registered with `register_host_env`
==================== ===================================================

Every host backend presents the `HostVectorEnv` contract below: same-step
auto-reset, so ``step`` returns the next episode's first observation where an
episode ended, and the observation the ended episode reached as
``final_obs``. The rollout then stores exactly what the gymnax rollout stores
(see `ppo_async.envs.gymnax_env.Trajectory`): at a truncated (and not terminated) step
``gamma * V(final_obs)`` is folded into the reward and the step counts as
done, so the learner's discount there is 0; ``episode_return`` /
``episode_length`` are nonzero only at done steps. The learner cannot tell a
host rollout from a gymnax one: same fields, shapes and dtypes.

Recurrent networks (``network="lstm"`` / ``"gru"``) work here too: the hidden
state rides in `HostCarry` (on the host, copied out with the actions in the
same packed array), is zeroed in the jitted policy call at each episode's first
step, and the trajectory records the reset flags and states as the gymnax
rollout does.

Plugging in your own simulator::

    class MySim:                       # E copies, numpy in and out
        observation_shape = (8,)
        action_space = gymnasium.spaces.Discrete(3)   # or a 1-D Box

        def __init__(self, num_envs): ...
        def reset(self, seed):         # -> obs [E, 8]
            ...
        def step(self, actions):       # actions [E] int32 -> HostStep / 5-tuple
            ...                        # (obs, reward, terminated, truncated, final_obs)

    register_host_env("mysim", MySim)  # factory(num_envs) -> HostVectorEnv
    train(AsyncActorLearnerConfig(env_id="host:mysim"))
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.envs.program import ActorProgram
from ppo_async.config import AsyncActorLearnerConfig, make_config_network
from ppo_async.envs.registry import (  # noqa: F401 - re-exported: their historical home
    _REGISTRY,
    ENV_BACKENDS,
    ENVPOOL,
    GYMNASIUM,
    GYMNAX,
    HOST,
    BackendNotInstalledError,
    HostEnvFactory,
    _import_envpool,
    env_id_problem,
    envpool_make_kwargs,
    is_host_env_id,
    register_host_env,
    registered_host_envs,
    split_env_id,
)
from ppo_async.envs.gymnax_env import Trajectory, UnknownEnvError
from ppo_async.networks.actor_critic import is_recurrent, params_template, reset_hidden
from ppo_async.core.normalization import (
    NormalizationOptions,
    accumulate_return,
    acting_apply,
    scale_reward,
    wrap_params,
)



class HostEnvError(RuntimeError):
    """A host env broke the `HostVectorEnv` contract (a wrong shape, a missing attribute)."""


# --------------------------------------------------------------------------
# The contract every host backend presents.
# --------------------------------------------------------------------------


class HostStep(NamedTuple):
    """What `HostVectorEnv.step` returns for a batch of ``E`` envs (any 5-sequence will do)."""

    obs: np.ndarray  # [E, *obs_shape] next observation; a new episode's first where one ended
    reward: np.ndarray  # [E] reward of this step
    terminated: np.ndarray  # [E] bool, the MDP ended at this step
    truncated: np.ndarray  # [E] bool, a time limit ended the episode at this step
    final_obs: np.ndarray  # [E, *obs_shape] observation the ended episode reached (rows where done; others ignored)


@runtime_checkable
class HostVectorEnv(Protocol):
    """``E`` host environments stepped together; numpy in and out.

    Auto-reset is same-step: where an episode ends at a step, ``step`` already
    returns the first observation of the next episode as ``obs`` and the
    observation the ended episode reached as ``final_obs``. Observations may
    be any numeric dtype (the actor casts them to float32).

    Attributes:
      observation_shape: shape of one observation, ``(D,)`` or ``(H, W, C)``.
      action_space: a discrete space with ``n`` (actions arrive as int32
        ``[E]``) or a 1-D box with ``shape`` (actions arrive as float32
        ``[E, action_dim]``, clipped to ``low``/``high`` when the space has them).
    """

    observation_shape: tuple[int, ...]
    action_space: Any

    def reset(self, seed: int) -> np.ndarray:
        """Fresh episodes in every env, seeded from ``seed``; returns obs ``[E, *obs_shape]``."""
        ...

    def step(self, actions: np.ndarray) -> HostStep:
        """One step of every env: ``(obs, reward, terminated, truncated, final_obs)``."""
        ...


# --------------------------------------------------------------------------
# Backends.
# --------------------------------------------------------------------------


class GymnasiumVectorEnv:
    """``gymnasium.make_vec(name, num_envs, vectorization_mode="sync")``, same-step auto-reset.

    With ``AutoresetMode.SAME_STEP`` gymnasium resets an ended sub-env inside
    the step that ended it, returns the new episode's first observation, and
    puts the ended episode's last one in ``info["final_obs"]`` (masked by
    ``info["_final_obs"]``): exactly the `HostVectorEnv` contract. gymnasium's
    ``TimeLimit`` sets ``truncated``; an MDP end sets ``terminated``.
    """

    def __init__(self, name: str, num_envs: int, **make_kwargs: Any):
        import gymnasium
        from gymnasium.vector import AutoresetMode

        self.env = gymnasium.make_vec(
            name, num_envs=num_envs, vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **make_kwargs,
        )
        self.observation_shape = tuple(self.env.single_observation_space.shape)
        self.action_space = self.env.single_action_space

    def reset(self, seed: int) -> np.ndarray:
        obs, _ = self.env.reset(seed=seed)
        return obs

    def step(self, actions: np.ndarray) -> HostStep:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        final_obs = obs
        if "_final_obs" in info and np.any(info["_final_obs"]):
            final_obs = np.array(obs)
            for i in np.flatnonzero(info["_final_obs"]):
                final_obs[i] = info["final_obs"][i]
        return HostStep(obs, reward, terminated, truncated, final_obs)

    def render(self) -> np.ndarray:
        """``[E, H, W, 3]`` uint8 frames (made with ``render_mode="rgb_array"``)."""
        return np.stack(self.env.render())

    def close(self) -> None:
        self.env.close()


class EnvpoolVectorEnv:
    """``envpool.make(name, env_type="gymnasium", num_envs=E)`` in sync mode, made same-step.

    envpool auto-resets next-step: the step where an episode ends returns its
    last observation, and the following ``step`` ignores that env's action and
    returns a reset. Resetting the ended envs explicitly (``reset(env_ids)``)
    at once turns that into the same-step contract, so no transition is spent
    on a reset. Image observations come channels-first ``[C, H, W]``
    (Atari's frame stack); they are handed on channels-last ``[H, W, C]``,
    the layout of `ppo_async.networks.actor_critic`' conv torso.
    """

    def __init__(self, name: str, num_envs: int, **make_kwargs: Any):
        self._envpool = _import_envpool()
        self._name, self._num_envs, self._make_kwargs = name, num_envs, make_kwargs
        self.env = self._make(seed=0)
        shape = tuple(self.env.observation_space.shape)
        self._channels_first = len(shape) == 3
        self.observation_shape = shape[1:] + shape[:1] if self._channels_first else shape
        self.action_space = self.env.action_space

    def _make(self, seed: int):
        return self._envpool.make(
            self._name, env_type="gymnasium", num_envs=self._num_envs, seed=seed,
            **self._make_kwargs,
        )

    def _layout(self, obs: np.ndarray) -> np.ndarray:
        return np.moveaxis(obs, 1, -1) if self._channels_first else obs

    def reset(self, seed: int) -> np.ndarray:
        # envpool seeds at construction (env i gets seed + i).
        self.env.close()
        self.env = self._make(seed=seed)
        obs, _ = self.env.reset()
        return self._layout(obs)

    def step(self, actions: np.ndarray) -> HostStep:
        final_obs, reward, terminated, truncated, _ = self.env.step(actions)
        obs = final_obs
        ended = np.flatnonzero(np.logical_or(terminated, truncated))
        if ended.size:
            obs = np.array(final_obs)
            reset_obs, reset_info = self.env.reset(ended.astype(np.int32))
            obs[reset_info["env_id"]] = reset_obs
        return HostStep(self._layout(obs), reward, terminated, truncated, self._layout(final_obs))

    def render(self) -> np.ndarray:
        """``[E, H, W, 3]`` uint8 frames (made with ``render_mode="rgb_array"``)."""
        return np.asarray(self.env.render())

    def close(self) -> None:
        self.env.close()


def make_host_env(env_id: str, num_envs: int, *, envpool_kwargs: Any = (),
                  evaluation: bool = False, render: bool = False) -> HostVectorEnv:
    """A batch of ``num_envs`` host envs for a ``gymnasium:``, ``envpool:`` or ``host:`` id.

    ``envpool:`` envs get `envpool_make_kwargs` (for Atari games the standard
    training settings, or with ``evaluation`` the evaluation ones, then the
    config's ``envpool_kwargs``). ``render`` makes gymnasium and envpool envs
    with ``render_mode="rgb_array"``, so that their ``render()`` returns frames.
    """
    backend, name = split_env_id(env_id)
    render_kwargs = {"render_mode": "rgb_array"} if render else {}
    if backend == GYMNASIUM:
        return GymnasiumVectorEnv(name, num_envs, **render_kwargs)
    if backend == ENVPOOL:
        make_kwargs = envpool_make_kwargs(env_id, envpool_kwargs, evaluation=evaluation)
        return EnvpoolVectorEnv(name, num_envs, **make_kwargs, **render_kwargs)
    if backend == HOST:
        if name not in _REGISTRY:
            raise UnknownEnvError(env_id_problem(env_id))
        envs = _REGISTRY[name](num_envs)
        for attribute in ("observation_shape", "action_space", "reset", "step"):
            if not hasattr(envs, attribute):
                raise HostEnvError(
                    f"host env {name!r}: {type(envs).__name__} has no {attribute!r} "
                    "(see ppo_async.envs.host.HostVectorEnv)"
                )
        return envs
    raise UnknownEnvError(f"env id {env_id!r} is a gymnax id; use ppo_async.envs.gymnax_env.BatchedEnv")


# --------------------------------------------------------------------------
# The actor program.
# --------------------------------------------------------------------------


class HostCarry(NamedTuple):
    """What one actor's host envs carry from one chunk to the next."""

    envs: HostVectorEnv  # this actor's own E env instances
    obs: np.ndarray  # [E, *obs_shape] float32, the observation to act on next
    episode_return: np.ndarray  # [E] float32, undiscounted return so far
    episode_length: np.ndarray  # [E] int32, steps so far in the episode
    key: jax.Array  # PRNG key for actions, on the actor device
    hidden: np.ndarray | None = None  # [E, state_size] float32, recurrent networks only
    discounted_return: np.ndarray | None = None  # [E] float32, reward scaling only (as EnvCarry's)


def _batch(env_id: str, field: str, value: Any, shape: tuple[int, ...], dtype) -> np.ndarray:
    # np.array copies: an env may hand back a buffer it overwrites on its next step.
    array = np.array(value, dtype=dtype)
    if array.shape != shape:
        raise HostEnvError(
            f"{env_id}: {field} has shape {array.shape}, expected {shape} "
            "(see ppo_async.envs.host.HostVectorEnv)"
        )
    return array


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
    env_id, num_envs, num_steps = config.env_id, config.envs_per_actor, config.num_steps
    probe = make_host_env(env_id, num_envs, envpool_kwargs=config.envpool_kwargs)
    observation_shape = tuple(int(d) for d in probe.observation_shape)
    action_space = probe.action_space
    _close_envs(probe)
    network = make_config_network(config, observation_shape, action_space)
    options = NormalizationOptions.from_config(config)
    template = wrap_params(params_template(network, observation_shape), observation_shape,
                           options)
    apply = acting_apply(network.apply, options)
    scale_rewards = options.rewards
    recurrent = is_recurrent(network)
    state_size = network.state_size if recurrent else 0

    continuous = not hasattr(action_space, "n")
    action_shape = (int(action_space.shape[0]),) if continuous else ()
    action_dtype = np.float32 if continuous else np.int32
    low = np.asarray(getattr(action_space, "low", -np.inf), np.float32)
    high = np.asarray(getattr(action_space, "high", np.inf), np.float32)
    gamma = np.float32(config.gamma)
    keep_final_obs = config.learner_bootstraps_truncation
    obs_batch_shape = (num_envs, *observation_shape)

    action_dim = action_shape[0] if continuous else 1

    @jax.jit
    def act(params, obs, key):
        """``(key, [E, action_dim + 2] float32)``: action, log-prob and value side by side."""
        key, action_key = jax.random.split(key)
        dist, value = apply(params, obs)
        action = dist.sample(action_key)
        # One array, so one device->host copy per step (each copy costs tens of
        # microseconds); int32 actions are exact in float32.
        packed = jnp.concatenate(
            [action.reshape(num_envs, action_dim).astype(jnp.float32),
             dist.log_prob(action)[:, None], value[:, None]],
            axis=1,
        )
        return key, packed

    @jax.jit
    def value_of(params, obs):
        return apply(params, obs)[1]

    @jax.jit
    def act_recurrent(params, hidden, obs, reset, key):
        """`act` for a recurrent network: ``(key, [E, action_dim + 2 + 2 * S])``.

        The state is zeroed where ``reset`` (as in `ppo_async.envs.gymnax_env.make_rollout`);
        the packed row ends with the state the step acted with and the next one.
        """
        key, action_key = jax.random.split(key)
        hidden = reset_hidden(hidden, reset)
        next_hidden, dist, value = apply(params, hidden, obs)
        action = dist.sample(action_key)
        packed = jnp.concatenate(
            [action.reshape(num_envs, action_dim).astype(jnp.float32),
             dist.log_prob(action)[:, None], value[:, None], hidden, next_hidden],
            axis=1,
        )
        return key, packed

    @jax.jit
    def value_of_recurrent(params, hidden, obs):
        return apply(params, hidden, obs)[2]

    def reset(key: jax.Array, device: jax.Device) -> HostCarry:
        env_key, action_key = jax.random.split(key)
        seed = int(jax.random.randint(env_key, (), 0, np.iinfo(np.int32).max))
        envs = make_host_env(env_id, num_envs, envpool_kwargs=config.envpool_kwargs)
        try:
            obs = _batch(env_id, "reset obs", envs.reset(seed), obs_batch_shape, np.float32)
        except BaseException:
            _close_envs(envs)
            raise
        return HostCarry(
            envs=envs,
            obs=obs,
            episode_return=np.zeros((num_envs,), np.float32),
            episode_length=np.zeros((num_envs,), np.int32),
            key=jax.device_put(action_key, device),
            hidden=np.zeros((num_envs, state_size), np.float32) if recurrent else None,
            discounted_return=np.zeros((num_envs,), np.float32) if scale_rewards else None,
        )

    def rollout(params, carry: HostCarry):
        envs, obs, episode_return, episode_length, key = carry[:5]
        hidden, carried_return = carry.hidden, carry.discounted_return
        # Fresh arrays every chunk: the learner keeps the ones it was sent.
        trajectory = Trajectory(
            obs=np.empty((num_steps, *obs_batch_shape), np.float32),
            action=np.empty((num_steps, num_envs, *action_shape), action_dtype),
            reward=np.empty((num_steps, num_envs), np.float32),
            terminated=np.empty((num_steps, num_envs), bool),
            truncated=np.empty((num_steps, num_envs), bool),
            behaviour_logp=np.empty((num_steps, num_envs), np.float32),
            behaviour_value=np.empty((num_steps, num_envs), np.float32),
            episode_return=np.empty((num_steps, num_envs), np.float32),
            episode_length=np.empty((num_steps, num_envs), np.int32),
            reset=np.empty((num_steps, num_envs), bool) if recurrent else None,
            hidden=np.empty((num_steps, num_envs, state_size), np.float32) if recurrent else None,
            final_obs=np.zeros((num_steps, *obs_batch_shape), np.float32)
            if keep_final_obs else None,
            discounted_return=(np.empty((num_steps, num_envs), np.float32) if scale_rewards
                               else None),
        )
        for t in range(num_steps):
            if recurrent:
                reset = episode_length == 0  # this obs is an episode's first
                key, packed = act_recurrent(params, hidden, obs, reset, key)
                packed = np.asarray(packed)
                trajectory.reset[t] = reset
                trajectory.hidden[t] = packed[:, action_dim + 2: action_dim + 2 + state_size]
                hidden = packed[:, action_dim + 2 + state_size:]
            else:
                key, packed = act(params, obs, key)
                packed = np.asarray(packed)  # waits for the policy: the envs need the actions now
            action = packed[:, :action_dim].reshape(num_envs, *action_shape).astype(action_dtype)
            logp, value = packed[:, action_dim], packed[:, action_dim + 1]
            env_action = np.clip(action, low, high) if continuous else action
            step = envs.step(env_action)
            if len(step) != 5:
                raise HostEnvError(
                    f"{env_id}: step returned {len(step)} values, expected 5 "
                    "(obs, reward, terminated, truncated, final_obs)"
                )
            next_obs = _batch(env_id, "obs", step[0], obs_batch_shape, np.float32)
            reward = _batch(env_id, "reward", step[1], (num_envs,), np.float32)
            terminated = _batch(env_id, "terminated", step[2], (num_envs,), bool)
            truncated = _batch(env_id, "truncated", step[3], (num_envs,), bool) & ~terminated

            done = terminated | truncated
            learn_reward = reward
            if scale_rewards:
                # As in envs.make_rollout, with the same pure functions.
                discounted_return, carried_return = accumulate_return(
                    carried_return, reward, done, gamma=config.gamma)
                trajectory.discounted_return[t] = discounted_return
                carried_return = np.asarray(carried_return)
                learn_reward = np.asarray(scale_reward(
                    params.return_stats, reward, clip=options.reward_clip))
            if truncated.any() and keep_final_obs:
                # The learner values it with its own critic (V-trace mode).
                trajectory.final_obs[t] = _batch(
                    env_id, "final_obs", step[4], obs_batch_shape, np.float32)
            elif truncated.any():
                # As in envs.make_rollout: a time limit is not a terminal, so the
                # episode's tail value V(final_obs) goes into its last reward.
                final_obs = _batch(env_id, "final_obs", step[4], obs_batch_shape, np.float32)
                final_value = np.asarray(jax.device_get(
                    # The final observation continues the episode: this step's next state.
                    value_of_recurrent(params, hidden, final_obs) if recurrent
                    else value_of(params, final_obs)
                ))
                learn_reward = learn_reward + gamma * np.where(truncated, final_value,
                                                               np.float32(0))

            episode_return = episode_return + reward
            episode_length = episode_length + np.int32(1)
            trajectory.obs[t] = obs
            trajectory.action[t] = action
            trajectory.reward[t] = learn_reward
            trajectory.terminated[t] = terminated
            trajectory.truncated[t] = truncated
            trajectory.behaviour_logp[t] = logp
            trajectory.behaviour_value[t] = value
            trajectory.episode_return[t] = np.where(done, episode_return, np.float32(0))
            trajectory.episode_length[t] = np.where(done, episode_length, np.int32(0))
            episode_return = np.where(done, np.float32(0), episode_return)
            episode_length = np.where(done, np.int32(0), episode_length)
            obs = next_obs
        if recurrent:
            start = (episode_length == 0)[:, None]
            bootstrap_value = value_of_recurrent(
                params, np.where(start, np.float32(0), hidden), obs)
        else:
            bootstrap_value = value_of(params, obs)
        carry = HostCarry(envs, obs, episode_return, episode_length, key, hidden,
                          carried_return)
        return carry, trajectory, obs, bootstrap_value

    def close(carry: HostCarry) -> None:
        _close_envs(carry.envs)

    return ActorProgram(observation_shape, network, template, reset, rollout, close=close)


def _close_envs(envs: Any) -> None:
    """Close a host env batch if it can be closed (the contract does not require ``close``)."""
    close = getattr(envs, "close", None)
    if callable(close):
        close()
