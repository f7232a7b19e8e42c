"""Host environments: simulators stepped in Python, behind one vector-env contract.

The gymnax backend (`ppo_async.envs.gymnax_env`) jits the envs into the rollout. Many
simulators cannot be jitted -- Atari, MuJoCo, a lab's own Python code -- and
this module wraps them instead; `ppo_async.envs.host_rollout` steps them
with one jitted policy call per env step.

The env id's prefix picks the backend (`split_env_id`):

==================== ===================================================
``CartPole-v1``      gymnax (jitted; `ppo_async.envs.gymnax_env`), the default
``gymnax:NAME``      the same, spelled out
``gymnasium:NAME``   ``gymnasium.make_vec(NAME, vectorization_mode="sync")``
                     with ``AutoresetMode.SAME_STEP``; ``gymnasium:MODULE:NAME``
                     imports ``MODULE`` first (which registers ``NAME``)
``envpool:NAME``     ``envpool.make(NAME, env_type="gymnasium")``, made
                     same-step by resetting ended envs at once; Atari
                     games get the standard settings
                     (`ppo_async.envs.registry.ATARI_TRAIN_KWARGS`)
``host:NAME``        a factory registered with `register_host_env` (a batch),
                     or `register_single_env` (one ``gymnasium.Env``)
==================== ===================================================

Every host backend presents the `HostVectorEnv` contract below: same-step
auto-reset, so ``step`` returns the next episode's first observation where an
episode ended, and the observation the ended episode reached as
``final_obs``.

Plugging in your own simulator: one ``gymnasium.Env`` is enough::

    register_single_env("mysim", MySimEnv)   # MySimEnv() -> a gymnasium.Env
    train(AsyncActorLearnerConfig(env_id="host:mysim"))

With the registration in a module ``my_sims.py``, the config's
``env_modules=("my_sims",)`` (``ppo-async train --env-module my_sims``)
imports it, and the run's config.json remembers it, so that ``ppo-async
eval``, ``enjoy`` and ``--resume`` rebuild the env in a fresh process.

or, for a simulator that steps a batch itself::

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

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from ppo_async.envs.registry import (
    ENVPOOL,
    GYMNASIUM,
    HOST,
    BackendNotInstalledError,
    UnknownEnvError,
    envpool_make_kwargs,
    host_env_factory,
    import_envpool,
    register_host_env,
    split_env_id,
)


class HostEnvError(RuntimeError):
    """A host env broke the `HostVectorEnv` contract (a wrong shape, a missing attribute)."""


class EnvContractError(HostEnvError):
    """An env's output (``obs``, ``reward``, a flag) of the wrong shape or dtype, in one line.

    ``problem`` says what came and what was expected; the actor, the env and the
    step are added (`locate`) by the layers that know them, as the error passes.
    """

    def __init__(self, env_id: str, field: str, problem: str, *, actor: str = "",
                 env: int | None = None, step: int | None = None):
        self.env_id, self.field, self.problem = env_id, field, problem
        self.actor, self.env, self.step = actor, env, step
        super().__init__(self._message())

    def _message(self) -> str:
        where = [self.actor] if self.actor else []
        if self.env is not None:
            where.append(f"env {self.env}")
        if self.step is not None:
            where.append("at reset" if self.step == 0 else f"step {self.step}")
        return (f"{self.env_id}: {self.field} {self.problem}"
                + (f" ({', '.join(where)})" if where else ""))

    def __reduce__(self):  # an env worker sends it pickled
        return _contract_error, (self.env_id, self.field, self.problem, self.actor, self.env,
                                 self.step)

    def locate(self, *, actor: str = "", env_offset: int = 0, step: int | None = None) -> None:
        """Add where it happened, in place (so that a bare ``raise`` keeps the traceback):
        the actor and the step unless known, and ``env_offset`` to the env's index in its batch."""
        self.actor = self.actor or actor
        if self.env is not None:
            self.env += env_offset
        if self.step is None:
            self.step = step
        self.args = (self._message(),)


def _contract_error(env_id, field, problem, actor, env, step) -> EnvContractError:
    return EnvContractError(env_id, field, problem, actor=actor, env=env, step=step)


# The dtype kinds each output may have: observations any number (the actor casts them to
# float32), rewards an int or float, flags bool.
OBS_KINDS, REWARD_KINDS, FLAG_KINDS = "biuf", "iuf", "b"
_KIND_NAMES = {OBS_KINDS: "numbers (bool, int or float)", REWARD_KINDS: "a number (int or float)",
               FLAG_KINDS: "bool"}
_PYTHON_KINDS = {bool: "b", int: "i", float: "f"}


def contract_problem(value: Any, shape: tuple[int, ...], kinds: str) -> str | None:
    """What is wrong with an env's output ``value`` that should have ``shape`` and a dtype of
    ``kinds`` (None: nothing). An array's shape and dtype are compared, never copied."""
    kind = _PYTHON_KINDS.get(type(value))
    if kind is not None:  # a Python scalar (a single env's reward or flag): no array made
        if shape != ():
            return f"is a Python {type(value).__name__}, expected shape {shape}"
        return None if kind in kinds else (f"is a Python {type(value).__name__}, expected "
                                           f"{_KIND_NAMES[kinds]}")
    if type(value) is not np.ndarray:
        try:
            value = np.asarray(value)
        except ValueError as error:  # a ragged list
            return f"is not an array ({error})"
    if value.shape != shape:
        return f"has shape {value.shape}, expected {shape}"
    if value.dtype.kind not in kinds:
        return f"has dtype {value.dtype}, expected {_KIND_NAMES[kinds]}"
    return None


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

    Optional: ``step_async(actions)`` and ``step_wait()``, a step started and
    collected apart (`steps_natively_async`), for a simulator that steps elsewhere.
    """

    observation_shape: tuple[int, ...]
    action_space: Any

    def reset(self, seed: int) -> np.ndarray:
        """Fresh episodes in every env, seeded from ``seed``; returns obs ``[E, *obs_shape]``."""
        ...

    def step(self, actions: np.ndarray) -> HostStep:
        """One step of every env: ``(obs, reward, terminated, truncated, final_obs)``."""
        ...


def steps_natively_async(envs: Any) -> bool:
    """Whether ``envs`` has its own ``step_async(actions)`` / ``step_wait()`` pair.

    Optional in the `HostVectorEnv` contract, for a simulator that steps
    elsewhere (its own threads, a process, a socket): ``step_async`` starts
    a step and returns at once, ``step_wait`` returns what ``step`` would
    have. With the pair, a lock-step sampler (``sampler="shared"``) starts
    and waits for the envs from its own thread, with no stepper thread per
    batch, and env groups of one actor step while the policy computes the
    next group's actions. envpool ids have it (envpool's ``send`` / ``recv``).
    """
    return callable(getattr(envs, "step_async", None)) and callable(
        getattr(envs, "step_wait", None))


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

    Observations: a ``Box`` as it is; a ``Discrete`` space's states (FrozenLake,
    CliffWalking) one-hot, ``(n,)``. Any other space (``Tuple``, ``Dict``) is a
    `HostEnvError` that says how to flatten it.
    """

    def __init__(self, name: str, num_envs: int, *,
                 env_fns: list[Callable[[], Any]] | None = None, **make_kwargs: Any):
        import gymnasium
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        if env_fns is None:
            self.env = gymnasium.make_vec(
                name, num_envs=num_envs, vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **make_kwargs,
            )
        else:  # the user's env, one copy each (`SingleEnvFactory`)
            self.env = SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
        space = self.env.single_observation_space
        self._states = _discrete_states(name, space)  # None: a Box, as it is
        self.observation_shape = ((self._states,) if self._states is not None
                                  else tuple(space.shape))
        self.action_space = self.env.single_action_space

    def _features(self, obs: np.ndarray) -> np.ndarray:
        if self._states is None:
            return obs
        return np.eye(self._states, dtype=np.float32)[np.asarray(obs, np.int64)]

    def reset(self, seed: int) -> np.ndarray:
        obs, _ = self.env.reset(seed=seed)
        return self._features(obs)

    def step(self, actions: np.ndarray) -> HostStep:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        final_obs = obs
        if "_final_obs" in info and np.any(info["_final_obs"]):
            final_obs = np.array(obs)
            for i in np.flatnonzero(info["_final_obs"]):
                final_obs[i] = info["final_obs"][i]
        return HostStep(self._features(obs), reward, terminated, truncated,
                        self._features(final_obs))

    def render(self) -> np.ndarray:
        """``[E, H, W, 3]`` uint8 frames (made with ``render_mode="rgb_array"``)."""
        return np.stack(self.env.render())

    def close(self) -> None:
        self.env.close()


def _discrete_states(name: str, space: Any) -> int | None:
    """How many states a gymnasium ``Discrete`` observation space has (the start must be 0),
    None for a ``Box``; `HostEnvError` for any other space."""
    import gymnasium

    if isinstance(space, gymnasium.spaces.Box):
        return None
    if isinstance(space, gymnasium.spaces.Discrete) and int(space.start) == 0:
        return int(space.n)
    raise HostEnvError(
        f"{name}: observation space {space} is not supported: ppo_async takes a Box, or "
        "a Discrete space (from 0, one-hot); flatten the observations in a factory of "
        "your own, e.g. ppo_async.register_single_env(NAME, lambda: "
        "gymnasium.wrappers.FlattenObservation(gymnasium.make(...))) and env_id host:NAME")


class EnvpoolVectorEnv:
    """``envpool.make(name, env_type="gymnasium", num_envs=E)`` in sync mode, made same-step.

    envpool auto-resets next-step: the step where an episode ends returns its
    last observation, and the following ``step`` ignores that env's action and
    returns a reset. Resetting the ended envs explicitly (``reset(env_ids)``)
    at once turns that into the same-step contract, so no transition is spent
    on a reset. Image observations come channels-first ``[C, H, W]``
    (Atari's frame stack); they are handed on channels-last ``[H, W, C]``,
    the layout of `ppo_async.networks.actor_critic`' conv torso.
    ``step_async`` / ``step_wait`` are envpool's ``send`` / ``recv``
    (`steps_natively_async`).
    """

    def __init__(self, name: str, num_envs: int, **make_kwargs: Any):
        self._envpool = import_envpool()
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
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: np.ndarray) -> None:
        """Start a step in envpool's threads (``send``); `step_wait` collects it."""
        self.env.send(actions)

    def step_wait(self) -> HostStep:
        final_obs, reward, terminated, truncated, _ = self.env.recv()
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


class SingleEnvFactory:
    """A host-env factory from a factory of ONE ``gymnasium.Env`` (`register_single_env`).

    ``make_env()`` returns a fresh env (``reset(seed=...)``, ``step(action)``
    with gymnasium's 5-tuple, a ``Discrete`` or 1-D ``Box`` action space);
    ``factory(num_envs)`` runs ``num_envs`` of them in gymnasium's
    ``SyncVectorEnv`` with same-step auto-reset, the `HostVectorEnv` contract.
    A ``make_env`` that takes ``render_mode`` can also be watched (``ppo-async enjoy``).
    """

    def __init__(self, make_env: Callable[..., Any]):
        self.make_env = make_env

    def takes_render_mode(self) -> bool:
        """Whether ``make_env`` takes a ``render_mode`` argument (True where its signature
        cannot be read: calling it tells)."""
        try:
            parameters = inspect.signature(self.make_env).parameters.values()
        except (TypeError, ValueError):
            return True
        return any(p.name == "render_mode" or p.kind is p.VAR_KEYWORD for p in parameters)

    def __call__(self, num_envs: int, render_mode: str | None = None,
                 env_id: str | None = None) -> GymnasiumVectorEnv:
        """``num_envs`` envs; ``env_id`` (default ``host:<make_env's name>``) names them in
        `EnvContractError`."""
        env_fn = (self.make_env if render_mode is None
                  else functools.partial(self.make_env, render_mode=render_mode))
        name = getattr(self.make_env, "__name__", "env")
        env_id = env_id or f"{HOST}:{name}"
        return GymnasiumVectorEnv(name, num_envs, env_fns=[
            functools.partial(_api_checked, env_fn, name, env_id, i) for i in range(num_envs)])


def _api_checked(make_env: Callable[[], Any], name: str, env_id: str, index: int) -> Any:
    """``make_env()``, a user's ``gymnasium.Env`` (env ``index`` of its batch), whose resets and
    steps are checked against gymnasium's API (an env of the old gym API otherwise failed
    inside gymnasium's vector env with ``not enough values to unpack``) and its observation
    space (`EnvContractError`, where gymnasium's vector env said ``Output array is the wrong
    shape``)."""
    import gymnasium

    env = make_env()
    if not isinstance(env, gymnasium.Env):
        return env  # duck-typed: gymnasium's vector env says what it lacks
    return _api_checked_env_class()(env, name, env_id, index)


@functools.cache
def _api_checked_env_class() -> type:
    """The wrapper of `_api_checked` (built once, so that importing this module imports no gymnasium)."""
    import gymnasium

    class ApiCheckedEnv(gymnasium.Wrapper):
        def __init__(self, env: Any, name: str, env_id: str, index: int):
            super().__init__(env)
            self.checked_name, self.env_id, self.index = name, env_id, index
            shape = getattr(env.observation_space, "shape", None)  # None: a space without one
            self.obs_shape = None if shape is None else tuple(shape)

        def reset(self, **kwargs):
            result = self.env.reset(**kwargs)
            if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
                raise HostEnvError(
                    f"{self.checked_name}: reset() returned {_described(result)}; gymnasium's "
                    "API returns (obs, info) (the old gym API returned the observation alone)")
            self._check("obs", result[0], self.obs_shape, OBS_KINDS)
            return result

        def step(self, action):
            result = self.env.step(action)
            if not (isinstance(result, tuple) and len(result) == 5):
                raise HostEnvError(
                    f"{self.checked_name}: step() returned {_described(result)}; gymnasium's "
                    "API returns five: (obs, reward, terminated, truncated, info) (the old gym "
                    "API returned four: obs, reward, done, info)")
            obs, reward, terminated, truncated, _ = result
            # The usual types in one expression; anything else is looked at field by field.
            if not (type(obs) is np.ndarray and obs.shape == self.obs_shape
                    and obs.dtype.kind in OBS_KINDS and type(reward) in _REWARD_TYPES
                    and type(terminated) in _FLAG_TYPES and type(truncated) in _FLAG_TYPES):
                self._check("obs", obs, self.obs_shape, OBS_KINDS)
                self._check("reward", reward, (), REWARD_KINDS)
                self._check("terminated", terminated, (), FLAG_KINDS)
                self._check("truncated", truncated, (), FLAG_KINDS)
            return result

        def _check(self, field: str, value: Any, shape: tuple[int, ...] | None,
                   kinds: str) -> None:
            problem = None if shape is None else contract_problem(value, shape, kinds)
            if problem is not None:
                raise EnvContractError(self.env_id, field, problem, env=self.index)

    return ApiCheckedEnv


_REWARD_TYPES = (float, int, np.float32, np.float64)
_FLAG_TYPES = (bool, np.bool_)


def _described(result: Any) -> str:
    return (f"{len(result)} values" if isinstance(result, tuple)
            else f"one value of type {type(result).__name__}")


def register_single_env(name: str, make_env: Callable[..., Any]) -> None:
    """Make ``host:<name>`` an env id from ``make_env()``, a factory of one ``gymnasium.Env``.

    The simplest way to train your own simulator: a ``gymnasium.Env``
    subclass (or any callable returning one) is enough; each actor batches
    ``envs_per_actor`` copies (`SingleEnvFactory`). For a simulator that
    steps a batch itself, use `ppo_async.envs.registry.register_host_env`.
    """
    if not callable(make_env):
        raise TypeError(f"host env {name!r}: make_env {make_env!r} is not callable")
    register_host_env(name, SingleEnvFactory(make_env))


def make_host_env(env_id: str, num_envs: int, *, envpool_kwargs: Any = (),
                  gymnasium_kwargs: Any = (), evaluation: bool = False,
                  render: bool = False) -> HostVectorEnv:
    """A batch of ``num_envs`` host envs for a ``gymnasium:``, ``envpool:`` or ``host:`` id.

    ``envpool:`` envs get `envpool_make_kwargs` (for Atari games the standard
    training settings, or with ``evaluation`` the evaluation ones, then the
    config's ``envpool_kwargs``); ``gymnasium:`` envs get the config's
    ``gymnasium_kwargs`` (pairs or a mapping). ``render`` makes gymnasium and envpool envs
    with ``render_mode="rgb_array"``, so that their ``render()`` returns frames.
    """
    backend, name = split_env_id(env_id)
    render_kwargs = {"render_mode": "rgb_array"} if render else {}
    if backend == GYMNASIUM:
        import gymnasium

        try:
            return GymnasiumVectorEnv(name, num_envs, **dict(gymnasium_kwargs), **render_kwargs)
        except gymnasium.error.DependencyNotInstalled as error:  # Box2D, MuJoCo, ...
            raise BackendNotInstalledError(f"{env_id}: {error}") from error
        except TypeError as error:  # an argument the env's constructor does not take
            if not gymnasium_kwargs:
                raise
            raise HostEnvError(f"{env_id} with gymnasium_kwargs {tuple(gymnasium_kwargs)!r}: "
                               f"{error}") from error
    if backend == ENVPOOL:
        make_kwargs = envpool_make_kwargs(env_id, envpool_kwargs, evaluation=evaluation)
        return EnvpoolVectorEnv(name, num_envs, **make_kwargs, **render_kwargs)
    if backend == HOST:
        factory = host_env_factory(name)
        if isinstance(factory, SingleEnvFactory):
            envs = factory(num_envs, **render_kwargs, env_id=env_id)
        else:
            envs = factory(num_envs)
        for attribute in ("observation_shape", "action_space", "reset", "step"):
            if not hasattr(envs, attribute):
                raise HostEnvError(
                    f"host env {name!r}: {type(envs).__name__} has no {attribute!r} "
                    "(see ppo_async.envs.host.HostVectorEnv)"
                )
        return envs
    raise UnknownEnvError(f"env id {env_id!r} is a gymnax id; use ppo_async.envs.gymnax_env.BatchedEnv")


def envpool_threads(pools: int) -> int:
    """envpool threads for each of ``pools`` pools that step at once (one per actor and env
    group): the cores divided among them, at least one.

    envpool's own default gives every pool ``min(num_envs, cores)`` threads,
    so two actors' pools on two cores ran four env threads beside the
    actors' policy calls, and collection on Atari Pong ran 25-35% slower
    than with one thread a pool (docs/benchmarks.md). A ``num_threads`` in
    the config's ``envpool_kwargs`` overrides this.
    """
    return max(1, (os.cpu_count() or 1) // max(1, pools))


def checked_array(env_id: str, field: str, value: Any, shape: tuple[int, ...],
                  dtype=np.float32, kinds: str = OBS_KINDS) -> np.ndarray:
    """A copy of an env's output ``field`` as ``dtype``; `EnvContractError` unless it has
    ``shape`` and a dtype of ``kinds`` (`contract_problem`).

    It copies: an env may hand back a buffer it overwrites on its next step.
    """
    problem = contract_problem(value, shape, kinds)
    if problem is not None:
        raise EnvContractError(env_id, field, problem)
    return np.array(value, dtype=dtype)


def close_envs(envs: Any) -> None:
    """Close a host env batch if it can be closed (the contract does not require ``close``)."""
    close = getattr(envs, "close", None)
    if callable(close):
        close()
