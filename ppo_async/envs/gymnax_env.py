"""gymnax environments, batched and auto-reset, and the jitted rollout.

`BatchedEnv` wraps one gymnax environment id in ``jax.vmap`` over ``E``
copies. gymnax (>= 1.0.1) auto-resets and separates ``terminated`` (the MDP
ended) from ``truncated`` (the time limit hit), and hands back the episode's
final observation in ``info["final_observation"]``.

`make_rollout` returns one jitted function that steps ``E`` envs ``T`` times
under fixed policy parameters with ``lax.scan`` and returns a time-major
`Trajectory`. Truncation is resolved here: at a step that
was truncated (and not terminated) the rollout adds ``gamma * V(final_obs)``
to the stored reward, and ``done`` is set, so the learner's
``discount = gamma * (1 - done)`` is 0 and no value leaks from the next
episode's first observation into this one. In V-trace mode the learner
bootstraps instead, with its current critic: the rollout then keeps the final
observations and folds nothing (``keep_final_obs``).

Recurrent policies (``make_rollout(..., recurrent=True)``) carry their hidden
state in `EnvCarry.hidden`, across chunks and across policy updates. The state
is zeroed (`ppo_async.networks.actor_critic.reset_hidden`) right before the network acts on
the first observation of an episode -- which is where ``episode_length`` is 0 --
and the trajectory records each step's ``reset`` flag and the state the step
acted with, so the learner can re-unroll the chunk exactly.

`make_gymnax_actor_program` builds an actor's `ActorProgram` from both.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core import keys
from ppo_async.core.normalization import (
    NormalizationOptions,
    NormalizedPolicy,
    accumulate_return,
    acting_apply,
    scale_reward,
    wrap_params,
)
from ppo_async.envs.program import (
    ActorProgram,
    BatchedInference,
    Trajectory,
    reattached,
    unattached,
)
from ppo_async.envs.registry import UnknownEnvError, split_env_id
from ppo_async.networks.actor_critic import (
    is_recurrent,
    params_template,
    reset_hidden,
)


# gymnax imports every env when it is imported, and five of them import
# matplotlib.pyplot (Pong seaborn too) at the top, for their renderers only:
# about 1.8 s of every process that makes a gymnax env. Until something reads
# an attribute of them, a stand-in holds their place.
_RENDER_MODULES = ("matplotlib.pyplot", "seaborn")
_import_lock = threading.Lock()


def import_gymnax():
    """``import gymnax``, with its render-only modules imported when first used.

    Imported here, not at the top of a module: ``import ppo_async`` does not pay for it.
    """
    if "gymnax" not in sys.modules:
        for name in _RENDER_MODULES:
            if name not in sys.modules:
                spec = importlib.util.find_spec(name)
                if spec is not None:  # not installed: gymnax's import says so
                    _ImportedOnUse(name, spec)
    import gymnax

    return gymnax


class _ImportedOnUse(types.ModuleType):
    """Sits in ``sys.modules`` for a module; the first attribute read imports it.

    (``importlib.util.LazyLoader`` cannot do this on Python 3.11: an ``import``
    statement reads the module's ``__spec__``, which loads it.)
    """

    def __init__(self, name: str, spec):
        super().__init__(name)
        self.__spec__ = spec
        sys.modules[name] = self
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, self)

    def __getattr__(self, attr: str):
        module = self.__dict__.get("_imported")
        if module is None:
            with _import_lock:
                if sys.modules.get(self.__name__) is self:
                    del sys.modules[self.__name__]
                module = importlib.import_module(self.__name__)
            self.__dict__["_imported"] = module
        return getattr(module, attr)


def make_gymnax_env(env_id: str):
    """``(env, env_params)`` for a gymnax id; unknown ids list the valid ones."""
    gymnax = import_gymnax()

    if env_id not in gymnax.registered_envs:
        raise UnknownEnvError(
            f"unknown env_id {env_id!r}; valid gymnax ids: "
            + ", ".join(gymnax.registered_envs)
        )
    return gymnax.make(env_id)


class EnvCarry(NamedTuple):
    """State a batch of ``E`` envs carries from one rollout to the next."""

    env_state: Any  # gymnax state pytree, leaves [E, ...]
    obs: jax.Array  # [E, *obs_shape] float32, the observation to act on next
    episode_return: jax.Array  # [E] float32, undiscounted return so far
    episode_length: jax.Array  # [E] int32, steps so far in the episode
    key: jax.Array  # PRNG key for actions and env transitions
    # Recurrent policies only (None otherwise): the state after the last step
    # acted, before any reset for the next one.
    hidden: jax.Array | None = None  # [E, state_size] float32
    # Reward scaling only (None otherwise): the discounted return R_{t-1}, 0
    # after an episode ended (`ppo_async.core.normalization.accumulate_return`).
    discounted_return: jax.Array | None = None  # [E] float32


class BatchedEnv:
    """``num_envs`` copies of one gymnax env, stepped together with ``vmap``.

    Observations leave it as float32; an env whose observations are one of
    ``n`` discrete states (a ``Discrete`` space, as FrozenLake-misc's) gives
    them one-hot, ``(n,)``.
    """

    def __init__(self, env_id: str, num_envs: int):
        self.env_id = env_id
        self.num_envs = num_envs
        self.env, self.env_params = make_gymnax_env(env_id)
        space = self.env.observation_space(self.env_params)
        self._states = int(space.n) if hasattr(space, "n") else None  # Discrete: one-hot
        self.observation_shape = ((self._states,) if self._states is not None
                                  else tuple(space.shape))
        self.action_space = self.env.action_space(self.env_params)
        self.continuous = not hasattr(self.action_space, "n")
        self.max_episode_steps = int(self.env_params.max_steps_in_episode)

    def _features(self, obs: jax.Array) -> jax.Array:
        """gymnax observations ``[E, ...]`` as the float32 ones of `observation_shape`."""
        if self._states is not None:
            return jax.nn.one_hot(obs, self._states, dtype=jnp.float32)
        return obs.astype(jnp.float32)

    def reset(self, key: jax.Array, state_size: int | None = None, *,
              track_return: bool = False) -> EnvCarry:
        """Fresh episodes in every env (and, given ``state_size``, a zero hidden state).

        ``track_return``: the carry holds a zero discounted return (reward scaling).
        """
        reset_key, carry_key = jax.random.split(key)
        return self.reset_from(jax.random.split(reset_key, self.num_envs), carry_key, state_size,
                               track_return=track_return)

    def reset_from(self, env_keys: jax.Array, carry_key: jax.Array, state_size: int | None = None,
                   *, track_return: bool = False) -> EnvCarry:
        """`reset` from the keys it splits ``key`` into: one per env (``env_keys``, ``[E]``) and the carry's.

        An actor splits them on the host (`ppo_async.core.keys`), so that its
        compiled reset holds one hash (gymnax's own draws) instead of three.
        """
        obs, env_state = jax.vmap(self.env.reset, in_axes=(0, None))(env_keys, self.env_params)
        # gymnax's reset leaves some leaves weakly typed while step does not; a
        # carry that changes weak-typedness between calls recompiles the rollout.
        env_state = jax.tree.map(lambda x: jnp.asarray(x, dtype=x.dtype), env_state)
        return EnvCarry(
            env_state=env_state,
            obs=self._features(obs),
            episode_return=jnp.zeros((self.num_envs,), jnp.float32),
            episode_length=jnp.zeros((self.num_envs,), jnp.int32),
            key=carry_key,
            hidden=None if state_size is None else jnp.zeros(
                (self.num_envs, state_size), jnp.float32
            ),
            discounted_return=jnp.zeros((self.num_envs,), jnp.float32) if track_return else None,
        )

    def step(self, key: jax.Array, env_state: Any, action: jax.Array):
        """``(next_obs, env_state, reward, terminated, truncated, final_obs)``, each ``[E, ...]``.

        ``next_obs`` is already the first observation of a new episode where
        one ended; ``final_obs`` is the observation the ended episode reached.
        """
        if self.continuous:
            action = jnp.clip(action, self.action_space.low, self.action_space.high)
        obs, env_state, reward, terminated, truncated, info = jax.vmap(
            self.env.step, in_axes=(0, 0, 0, None)
        )(jax.random.split(key, self.num_envs), env_state, action, self.env_params)
        return (
            self._features(obs),
            env_state,
            reward.astype(jnp.float32),
            terminated.astype(bool),
            truncated.astype(bool) & ~terminated.astype(bool),
            self._features(info["final_observation"]),
        )


PolicyApply = Callable[[Any, jax.Array], tuple[Any, jax.Array]]


class _Stepped(NamedTuple):
    """What one env step of `make_rollout` computed before the final observations' value."""

    key: jax.Array  # the carry's next key
    reset: jax.Array | None  # recurrent only: the state was zeroed (an episode's first obs)
    hidden: jax.Array | None  # recurrent only: the state the step acted with
    next_hidden: jax.Array | None  # recurrent only: the state after it
    value: jax.Array
    action: jax.Array
    logp: jax.Array
    next_obs: jax.Array
    env_state: Any
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array


def make_rollout(
    env: BatchedEnv, apply_fn: PolicyApply, num_steps: int, gamma: float,
    *, recurrent: bool = False, reward_clip: float | None = None,
    keep_final_obs: bool = False, actor_axis: bool = False,
) -> Callable[[Any, EnvCarry], tuple[EnvCarry, Trajectory, jax.Array]]:
    """A jitted ``rollout(params, carry) -> (carry, trajectory, bootstrap_value)``.

    ``apply_fn(params, obs)`` must return ``(distribution, value)`` for a batch
    of observations (a `ppo_async.networks.actor_critic.ActorCritic`'s ``apply``). With
    ``recurrent``, ``apply_fn(params, hidden, obs)`` returns ``(hidden,
    distribution, value)`` (a `RecurrentActorCritic`'s), the carry must hold a
    ``hidden`` state, and the trajectory gets ``reset`` and ``hidden``.
    ``bootstrap_value`` ``[E]`` is V of the observation after the last step,
    under the same params. With ``keep_final_obs`` (the learner bootstraps
    truncations with its own critic, ``config.learner_bootstraps_truncation``)
    the trajectory keeps each step's ``final_obs`` and folds nothing into the
    reward. The function is compiled once per params structure
    and batch shape; later calls reuse it.

    ``reward_clip`` turns on reward scaling: ``params`` is then a
    `NormalizedPolicy` (``apply_fn`` one of
    `ppo_async.core.normalization.acting_apply`), the carry holds a
    ``discounted_return``, each env reward becomes ``scale_reward(
    params.return_stats, r, clip=reward_clip)`` before the truncation
    bootstrap (in the value's scaled units) is added, and the trajectory
    records every ``R_t`` of the raw rewards for the learner's statistics.

    ``actor_axis``: the chunks of ``N`` actors as one program. Every leaf of
    the carry has a leading actor axis (each actor's envs, key and state its
    own), and so do ``bootstrap_value`` and the trajectory's leaves after
    their time axis (``[T, N, E, ...]``). Actor ``i``'s part is what its own
    rollout gives (to rounding) and depends on its carry alone. It is the
    per-actor step vmapped, except that the value of the final observations
    is computed only at steps where some actor's episode was truncated: a
    ``cond`` under ``vmap`` would compute it at every step.
    """
    # The per-actor parts of a step, vmapped over the actor axis when there is one.
    per_actor = jax.vmap if actor_axis else (lambda fn, in_axes: fn)

    def act_and_step(params, carry: EnvCarry) -> _Stepped:
        key, action_key, step_key = jax.random.split(carry.key, 3)
        reset = hidden = next_hidden = None
        if recurrent:
            reset = carry.episode_length == 0  # this obs is an episode's first
            hidden = reset_hidden(carry.hidden, reset)
            next_hidden, dist, value = apply_fn(params, hidden, carry.obs)
        else:
            dist, value = apply_fn(params, carry.obs)
        action = dist.sample(action_key)
        next_obs, env_state, reward, terminated, truncated, final_obs = env.step(
            step_key, carry.env_state, action
        )
        return _Stepped(key, reset, hidden, next_hidden, value, action, dist.log_prob(action),
                        next_obs, env_state, reward, terminated, truncated, final_obs)

    def final_value(params, stepped: _Stepped) -> jax.Array:
        # The final observation continues the ended episode: its state is the one
        # this step produced.
        if recurrent:
            return apply_fn(params, stepped.next_hidden, stepped.final_obs)[2]
        return apply_fn(params, stepped.final_obs)[1]

    def finish(params, carry: EnvCarry, stepped: _Stepped, final_value: jax.Array | None):
        s = stepped
        done = s.terminated | s.truncated
        discounted_return, carried_return = None, None
        if reward_clip is not None:
            discounted_return, carried_return = accumulate_return(
                carry.discounted_return, s.reward, done, gamma=gamma)
            assert isinstance(params, NormalizedPolicy)
            learn_reward = scale_reward(params.return_stats, s.reward, clip=reward_clip)
        else:
            learn_reward = s.reward
        if final_value is not None:
            learn_reward = learn_reward + gamma * jnp.where(s.truncated, final_value, 0.0)

        episode_return = carry.episode_return + s.reward
        episode_length = carry.episode_length + 1
        step = Trajectory(
            obs=carry.obs,
            action=s.action,
            reward=learn_reward,
            terminated=s.terminated,
            truncated=s.truncated,
            behaviour_logp=s.logp,
            behaviour_value=s.value,
            episode_return=jnp.where(done, episode_return, 0.0),
            episode_length=jnp.where(done, episode_length, 0),
            reset=s.reset,
            hidden=s.hidden,
            final_obs=s.final_obs if keep_final_obs else None,
            discounted_return=discounted_return,
        )
        carry = EnvCarry(
            env_state=s.env_state,
            obs=s.next_obs,
            episode_return=jnp.where(done, 0.0, episode_return),
            episode_length=jnp.where(done, 0, episode_length),
            key=s.key,
            hidden=s.next_hidden,
            discounted_return=carried_return,
        )
        return carry, step

    def env_step(params, carry: EnvCarry, _):
        stepped = per_actor(act_and_step, in_axes=(None, 0))(params, carry)
        if keep_final_obs:
            value_of_final = None  # the learner adds gamma * V(final_obs) itself
        else:
            # Only evaluate the final observations when some episode was truncated:
            # on most steps none is, and the conv critic is not free.
            value_of_final = jax.lax.cond(
                jnp.any(stepped.truncated),
                lambda: per_actor(final_value, in_axes=(None, 0))(params, stepped),
                lambda: jnp.zeros_like(stepped.value),
            )
        return per_actor(finish, in_axes=(None, 0, 0, 0))(params, carry, stepped, value_of_final)

    def bootstrap(params, carry: EnvCarry) -> jax.Array:
        if recurrent:
            # As the next chunk's first step will see it: reset if an episode starts there.
            hidden = reset_hidden(carry.hidden, carry.episode_length == 0)
            return apply_fn(params, hidden, carry.obs)[2]
        return apply_fn(params, carry.obs)[1]

    @jax.jit
    def rollout(params, carry: EnvCarry):
        carry, trajectory = jax.lax.scan(
            lambda c, x: env_step(params, c, x), carry, None, length=num_steps
        )
        return carry, trajectory, per_actor(bootstrap, in_axes=(None, 0))(params, carry)

    return rollout


def make_gymnax_actor_program(config: AsyncActorLearnerConfig) -> ActorProgram:
    """The `ActorProgram` of a gymnax id: ``num_steps`` env steps in one jitted ``lax.scan``.

    Its compiled programs are held for the process (`_gymnax_programs`): a
    run that repeats another's env, network and chunk finds them compiled.
    """
    name = split_env_id(config.env_id)[1]
    return _actor_program(config, BatchedEnv(name, config.envs_per_actor),
                          functools.partial(_gymnax_programs, name, config.envs_per_actor))


def make_jitted_actor_program(config: AsyncActorLearnerConfig, env: Any) -> ActorProgram:
    """The `ActorProgram` of ``envs_per_actor`` envs that jit (any env with `BatchedEnv`'s interface)."""
    return _actor_program(config, env, functools.partial(_actor_jits, env))


class _ActorJits(NamedTuple):
    """The compiled programs of an actor: a run's other parts are built around them."""

    reset: Callable[..., EnvCarry]  # fresh episodes (and zero states), from reset_keys(key)
    reset_keys: Callable[[jax.Array], tuple[jax.Array, ...]]  # an actor's key as reset's arguments
    rollout: Callable[..., Any]  # one actor's chunk: `make_rollout`
    rollout_all: Callable[..., Any]  # the chunks of N actors as one program (`BatchedInference`)


def _actor_jits(env: Any, network: Any, options: NormalizationOptions, num_steps: int,
                gamma: float, keep_final_obs: bool) -> _ActorJits:
    recurrent = is_recurrent(network)
    rollout_of = functools.partial(
        make_rollout, env, acting_apply(network.apply, options), num_steps, gamma,
        recurrent=recurrent, reward_clip=options.reward_clip if options.rewards else None,
        keep_final_obs=keep_final_obs)
    fused_rollout = rollout_of(actor_axis=True)

    @jax.jit
    def rollout_all(params, carries: tuple[EnvCarry, ...]):
        """The chunks of ``N`` actors as one program: their carries stacked on an actor axis."""
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *carries)
        carry, trajectory, bootstrap_value = fused_rollout(params, stacked)
        return tuple((jax.tree.map(lambda x: x[i], carry),
                      jax.tree.map(lambda x: x[:, i], trajectory), bootstrap_value[i])
                     for i in range(len(carries)))

    # One compiled program: run eagerly, the reset's key splits, gymnax reset,
    # dtype fixes and zeros are each compiled (and cached) on their own, a
    # dozen small compiles on every actor's way to its first chunk. Where the
    # env takes its keys split (`BatchedEnv.reset_from`), they are split on the
    # host: their hashes need not compile.
    state_size = network.state_size if recurrent else None
    split_on_host = hasattr(env, "reset_from")
    reset = jax.jit(functools.partial(env.reset_from if split_on_host else env.reset,
                                      state_size=state_size, track_return=options.rewards))

    def reset_keys(key: jax.Array) -> tuple[jax.Array, ...]:
        if not split_on_host:
            return (key,)
        reset_key, carry_key = keys.split(key)
        return keys.split_array(reset_key, env.num_envs), carry_key

    return _ActorJits(reset, reset_keys, rollout_of(), rollout_all)


# Held for the process, like jit's own cache: a notebook's second run, a
# sweep's next seed or a resumed run calls the programs the first one traced
# and compiled. The key is everything they are built from (the network a
# frozen dataclass and the options a named tuple, both equal by value).
@functools.lru_cache(maxsize=32)
def _gymnax_programs(name: str, num_envs: int, network: Any, options: NormalizationOptions,
                     num_steps: int, gamma: float, keep_final_obs: bool) -> _ActorJits:
    return _actor_jits(BatchedEnv(name, num_envs), network, options, num_steps, gamma,
                       keep_final_obs)


def _actor_program(config: AsyncActorLearnerConfig, env: Any,
                   jits_of: Callable[..., _ActorJits]) -> ActorProgram:
    network = config.make_network(env.observation_shape, env.action_space)
    options = config.normalization_options()
    template = wrap_params(params_template(network, env.observation_shape),
                           env.observation_shape, options)
    # A recurrent actor's hidden state lives in its EnvCarry: it crosses chunk
    # boundaries and policy updates (new params meet the state the old ones
    # built, as in IMPALA) and is checkpointed with the carry.
    jits = jits_of(network, options, config.num_steps, config.gamma,
                   config.learner_bootstraps_truncation)

    def reset(key: jax.Array, device: jax.Device) -> EnvCarry:
        return jax.device_put(jits.reset(*jits.reset_keys(key)), device)

    def rollout(params, carry: EnvCarry):
        carry, client = unattached(carry)
        if client is None:
            carry, trajectory, bootstrap_value = jits.rollout(params, carry)
        else:  # this actor's part of one rollout of every actor of the device
            carry, trajectory, bootstrap_value = client(params, carry)
        return reattached(carry, client), trajectory, carry.obs, bootstrap_value

    def rollouts(params, per_actor: list[tuple[EnvCarry]]):
        return jits.rollout_all(params, tuple(carry for (carry,) in per_actor))

    def rollout_group(params, carries: list[EnvCarry]):
        return [(carry, trajectory, carry.obs, bootstrap_value) for carry, trajectory,
                bootstrap_value in jits.rollout_all(params, tuple(carries))]

    # Traced, not run: the shapes and dtypes the learner's batches will have.
    carry_spec = jax.eval_shape(jits.reset, *jits.reset_keys(keys.key(0)))
    _, *chunk_spec = jax.eval_shape(rollout, template, carry_spec)
    return ActorProgram(
        env.observation_shape, network, template, reset, rollout, tuple(chunk_spec),
        inference=BatchedInference(rollouts, gather_s=0.002),
        rollout_group=rollout_group,
        identity=jits,
        carry_spec=carry_spec,
    )
