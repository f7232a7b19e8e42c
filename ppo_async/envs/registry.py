"""Env ids: which backend an id names, whether it can run, and the host-env registry.

An env id is ``PREFIX:NAME`` (no prefix means gymnax). Each prefix names one
`ppo_async.envs.backends.EnvBackend`; `env_backend` is the one place that
picks it, so the actors, the evaluator, the video player and the twin never
ask which family an env belongs to. The built-in backends are imported by
module path only when first asked for, and the config validates ``env_id``
here: importing this module imports nothing else of the package and builds
no env.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from typing import Any


class UnknownEnvError(ValueError):
    """An env id that no backend knows (the message lists the valid ones)."""


GYMNAX, GYMNASIUM, ENVPOOL, HOST = "gymnax", "gymnasium", "envpool", "host"
ENV_BACKENDS = (GYMNAX, GYMNASIUM, ENVPOOL, HOST)  # the built-in prefixes, in the order docs list them

# prefix -> the module whose ``backend(prefix)`` builds its EnvBackend (imported when first asked)
_BUILTIN_BACKENDS = {
    GYMNAX: "ppo_async.envs.gymnax_backend",
    GYMNASIUM: "ppo_async.envs.host_backend",
    ENVPOOL: "ppo_async.envs.host_backend",
    HOST: "ppo_async.envs.host_backend",
}
_BACKENDS: dict[str, Any] = {}  # prefix -> EnvBackend, built or registered


class BackendNotInstalledError(ImportError):
    """The env id names a backend whose package is not installed."""


class EnvModuleError(ImportError):
    """A module named to register envs (the config's ``env_modules``) cannot be imported."""


def import_env_modules(modules: Any) -> None:
    """Import each of ``modules`` (module names), which register custom envs as they import.

    The config's ``env_modules``: the config's validation calls this before it
    looks its env id up, and so does every process that rebuilds a config
    without validating it (a Ray actor), so that ``host:NAME`` and
    ``gymnasium:NAME`` ids registered by a module exist there too. Importing a
    module twice is a no-op. Raises `EnvModuleError` (one line: the module and
    what its import raised) for a module that cannot be imported.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - user code: any failure, said in one line
            message = " ".join(str(error).split()) or "(no message)"
            name = getattr(error, "name", None) or ""
            not_found = isinstance(error, ModuleNotFoundError) and (
                module == name or module.startswith(name + "."))
            where = ("it must be importable here: on PYTHONPATH, installed, or in the current "
                     "directory for ppo-async" if not_found else "its code raised it")
            raise EnvModuleError(
                f"cannot import {module!r} ({type(error).__name__}: {message}); {where} "
                f"(python -c 'import {module}' shows the traceback)"
            ) from error


# factory(num_envs) -> a batch of num_envs envs (a ppo_async.envs.host.HostVectorEnv)
HostEnvFactory = Callable[[int], Any]

_REGISTRY: dict[str, HostEnvFactory] = {}


def register_host_env(name: str, factory: HostEnvFactory) -> None:
    """Make ``host:<name>`` an env id: ``factory(num_envs)`` returns a `HostVectorEnv`.

    Each actor calls the factory once, so every actor owns its own envs.
    Registering a name again replaces its factory (re-running a notebook cell
    that defines the simulator should just work).
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"host env name {name!r}: must be a non-empty string without ':'")
    if not callable(factory):
        raise TypeError(f"host env {name!r}: factory {factory!r} is not callable")
    gymnasium = sys.modules.get("gymnasium")  # a gymnasium.Env subclass has imported it
    if gymnasium is not None and isinstance(factory, type) and issubclass(factory, gymnasium.Env):
        raise TypeError(
            f"host env {name!r}: {factory!r} is one gymnasium.Env, and register_host_env takes "
            "a factory of a batch (factory(num_envs) -> HostVectorEnv); register it with "
            "ppo_async.register_single_env, which batches copies of it")
    try:
        inspect.signature(factory).bind(1)
    except TypeError as error:
        raise TypeError(f"host env {name!r}: factory {factory!r} cannot be called as "
                        f"factory(num_envs) ({error})") from None
    except ValueError:  # no signature to read (some builtins): calling it will tell
        pass
    _REGISTRY[name] = factory


def registered_host_envs() -> tuple[str, ...]:
    """Names registered with `register_host_env`, sorted."""
    return tuple(sorted(_REGISTRY))


# --------------------------------------------------------------------------
# Env ids.
# --------------------------------------------------------------------------


def host_env_factory(name: str) -> HostEnvFactory:
    """The factory `register_host_env` registered under ``name`` (`UnknownEnvError` if none)."""
    if name not in _REGISTRY:
        raise UnknownEnvError(env_id_problem(f"{HOST}:{name}"))
    return _REGISTRY[name]


def env_prefixes() -> tuple[str, ...]:
    """Every env id prefix: the built-in ones, then those added by `register_env_backend`."""
    return ENV_BACKENDS + tuple(p for p in _BACKENDS if p not in _BUILTIN_BACKENDS)


def _unknown_prefix(backend: str) -> str:
    return (f"unknown backend prefix {backend!r}; valid prefixes: "
            + ", ".join(f"{b}:" for b in env_prefixes()) + " (no prefix means gymnax:)")


def split_env_id(env_id: str) -> tuple[str, str]:
    """``(backend, name)`` of an env id; no prefix means gymnax.

    Only the first ``:`` separates, so gymnasium's own ``module:Name-v0``
    syntax survives: ``gymnasium:ale_py:ALE/Pong-v5``.
    """
    backend, sep, name = env_id.partition(":")
    if not sep:
        return GYMNAX, env_id
    if backend not in _BUILTIN_BACKENDS and backend not in _BACKENDS:
        raise UnknownEnvError(f"env id {env_id!r}: {_unknown_prefix(backend)}")
    return backend, name


def register_env_backend(prefix: str, backend: Any) -> None:
    """Make ``PREFIX:NAME`` env ids run on ``backend`` (a `ppo_async.envs.backends.EnvBackend`).

    The built-in prefixes cannot be taken; registering a prefix again
    replaces its backend. Thread actors, evaluation, videos and the twin (where
    the backend jits its envs) then run its envs with no other change.
    """
    if not isinstance(prefix, str) or not prefix.isidentifier():
        raise ValueError(f"env backend prefix {prefix!r}: must be a name such as 'mysim'")
    if prefix in _BUILTIN_BACKENDS:
        raise ValueError(f"env backend prefix {prefix!r} is built in; choose another name")
    _BACKENDS[prefix] = backend


def env_backend(env_id: str) -> Any:
    """The `ppo_async.envs.backends.EnvBackend` that runs ``env_id`` (built once per prefix)."""
    prefix = split_env_id(env_id)[0]
    if prefix not in _BACKENDS:
        module = importlib.import_module(_BUILTIN_BACKENDS[prefix])
        _BACKENDS[prefix] = module.backend(prefix)
    return _BACKENDS[prefix]


def env_id_problem(env_id: Any) -> str | None:
    """Why ``env_id`` cannot run here, as a fix for the user; None if it can.

    Used by the config's validation, so it only looks names up: each
    backend's `id_problem` builds no env.
    """
    if not isinstance(env_id, str):
        return "must be a string such as 'CartPole-v1' or 'gymnasium:CartPole-v1'"
    try:
        backend, name = split_env_id(env_id)
    except UnknownEnvError:
        return _unknown_prefix(env_id.partition(":")[0])
    return env_backend(env_id).id_problem(name)


def import_envpool():
    try:
        return importlib.import_module("envpool")
    except ImportError as error:
        raise BackendNotInstalledError(
            "envpool is not installed; install it with pip install 'ppo-async[gym]' "
            f"(wheels exist for Linux x86_64) or pip install envpool ({error})"
        ) from error


# --------------------------------------------------------------------------
# envpool's Atari: the standard settings.
# --------------------------------------------------------------------------

# The Atari preprocessing of Mnih et al. (2015) as envpool names it: 4 frames
# repeated per action (max-pooled over the last two), 84x84 grey frames
# stacked 4 deep, up to 30 no-ops at reset, and a cap of 108,000 frames
# (27,000 agent steps) per episode.
ATARI_COMMON_KWARGS: dict[str, Any] = dict(
    frame_skip=4, img_height=84, img_width=84, gray_scale=True, stack_num=4,
    noop_max=30, max_episode_steps=27_000,
)
# Training: an episode ends at each lost life (the env resets only when the
# game is over) and rewards are clipped to their sign, as in the DQN and PPO
# papers; no sticky actions.
ATARI_TRAIN_KWARGS: dict[str, Any] = dict(
    ATARI_COMMON_KWARGS, episodic_life=True, reward_clip=True, repeat_action_probability=0.0,
)
# Evaluation (and watching): whole games with the game's own score, and the
# sticky actions Machado et al. (2018) recommend (the previous action repeats
# with probability 0.25), so a memorised action sequence does not score.
ATARI_EVAL_KWARGS: dict[str, Any] = dict(
    ATARI_COMMON_KWARGS, episodic_life=False, reward_clip=False, repeat_action_probability=0.25,
)
# make() arguments the envpool backend sets itself: not overridable.
ENVPOOL_RESERVED_KWARGS = ("num_envs", "batch_size", "seed", "env_type")


def _envpool_module(env_id: str) -> str | None:
    """The envpool module that holds the spec of an ``envpool:`` id (``envpool.atari``).

    None without envpool installed, or for an id that is not envpool's.
    """
    try:
        backend, name = split_env_id(env_id)
    except UnknownEnvError:
        return None
    if backend != ENVPOOL:
        return None
    try:
        envpool = import_envpool()
    except BackendNotInstalledError:
        return None
    spec = envpool.registration.registry.specs.get(name)
    return None if spec is None else spec[0]


def is_envpool_atari(env_id: str) -> bool:
    """Whether ``env_id`` is an ``envpool:`` id of an Atari game (e.g. ``envpool:Pong-v5``)."""
    return _envpool_module(env_id) == "envpool.atari"


def is_envpool_gym_mujoco(env_id: str) -> bool:
    """Whether ``env_id`` is envpool's copy of a gymnasium MuJoCo task (``envpool:Hopper-v4``).

    envpool has them as ``*-v3``, ``*-v4`` and ``*-v5``: the same models,
    observations and rewards as gymnasium's envs of the same id, stepped in C++.
    """
    return _envpool_module(env_id) == "envpool.mujoco.gym"


def envpool_make_kwargs(env_id: str, overrides: Any = (), *, evaluation: bool = False
                        ) -> dict[str, Any]:
    """The keyword arguments ``envpool.make`` gets for ``env_id`` (besides num_envs and seed).

    Atari games start from `ATARI_TRAIN_KWARGS`, or `ATARI_EVAL_KWARGS` with
    ``evaluation``; other envpool envs from envpool's own defaults (nothing).
    ``overrides`` (``(name, value)`` pairs or a mapping, the config's
    ``envpool_kwargs``) replace those values for training and evaluation alike.
    """
    kwargs: dict[str, Any] = {}
    if is_envpool_atari(env_id):
        kwargs.update(ATARI_EVAL_KWARGS if evaluation else ATARI_TRAIN_KWARGS)
    kwargs.update(dict(overrides))
    return kwargs


# The one argument of gymnasium.make itself that gymnasium_kwargs may hold (a time limit).
GYMNASIUM_TIME_LIMIT = "max_episode_steps"


def gymnasium_kwargs_problem(env_id: str, kwargs: Any) -> str | None:
    """Why ``kwargs`` cannot be given to ``gymnasium.make_vec`` for ``env_id``, or None.

    Checked by the config: only ``gymnasium:`` ids take them, and an env
    class whose constructor takes no ``**kwargs`` must name each of them;
    ``max_episode_steps`` is ``gymnasium.make``'s own (a `TimeLimit`, for
    any env), a positive integer.
    """
    if not kwargs:
        return None
    backend, name = split_env_id(env_id)
    if backend != GYMNASIUM:
        return f"only gymnasium: env ids take gymnasium make() arguments (env_id is {env_id!r})"
    limit = dict(kwargs).get(GYMNASIUM_TIME_LIMIT)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        return f"{GYMNASIUM_TIME_LIMIT}={limit!r}: must be an integer >= 1"
    kwargs = [(key, value) for key, value in kwargs if key != GYMNASIUM_TIME_LIMIT]
    if not kwargs:
        return None
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    entry_point = gymnasium.spec(name).entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    try:
        parameters = inspect.signature(creator).parameters
    except (TypeError, ValueError):  # a signature inspect cannot read: gymnasium decides
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    for key, _ in kwargs:
        if key not in parameters:
            return (f"{key!r} is not an argument of {name}'s constructor; choose from "
                    + ", ".join(sorted(p for p in parameters if p != "self"))
                    + f" (or {GYMNASIUM_TIME_LIMIT}, gymnasium.make's time limit)")
    return None


def envpool_kwargs_problem(env_id: str, overrides: Any) -> str | None:
    """Why ``overrides`` cannot be given to ``envpool.make`` for ``env_id``, or None.

    Checked by the config: only ``envpool:`` ids take them, and every name
    must be a setting of that env's envpool spec (``envpool.make_spec(name).config``).
    """
    if not overrides:
        return None
    backend, name = split_env_id(env_id)
    if backend != ENVPOOL:
        return f"only envpool: env ids take envpool make() arguments (env_id is {env_id!r})"
    envpool = import_envpool()
    settings = set(envpool.make_spec(name).config._fields) - set(ENVPOOL_RESERVED_KWARGS)
    for key, _ in overrides:
        if key not in settings:
            return (f"{key!r} is not an envpool setting of {name} that can be overridden; "
                    "choose from " + ", ".join(sorted(settings)))
    return None
