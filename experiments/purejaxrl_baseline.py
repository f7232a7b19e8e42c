"""purejaxrl's own PPO as a baseline: imported from a checkout of it, run, and its metrics read.

``experiments/robustness.py`` (32 seeds, vmapped), ``bench_time_to_solve.py``
and ``bench_throughput.py`` (one seed a fresh process) run purejaxrl's
``purejaxrl/ppo.py`` ``make_train`` from the checkout given by their
``--purejaxrl`` (github.com/luchris429/purejaxrl; nothing of it is copied
here), with the config dict of its ``__main__`` read from that file, ``DEBUG``
set False (True prints every episode from inside the jit). This module sets
no XLA flag: purejaxrl runs as its users run it.

Stand-ins for purejaxrl: ``ppo.py`` imports ``distrax`` and its
``wrappers.py`` imports ``brax``, ``brax.envs.wrappers.training`` and
``navix`` at module level; none is a dependency here. Those not installed
are stood in, in ``sys.modules`` during the import only; and gymnax 1.0
changed ``step`` under it. What is stood in (robustness.py records it in its
``summary.json``):

* ``distrax.Categorical`` (`StandInCategorical`): the only distrax use in
  ``ppo.py`` is ``Categorical(logits=...)`` with ``.sample(seed=)``,
  ``.log_prob()`` and ``.entropy()``; written here from the definitions
  (``jax.random.categorical``, ``log_softmax``), so sampled actions need not
  match distrax bit for bit, only in distribution.
* ``brax``, ``brax.envs``, ``brax.envs.wrappers.training.{EpisodeWrapper,
  AutoResetWrapper}`` and ``navix`` (``make``): placeholders that raise if
  used. Only ``wrappers.py``'s Brax and Navix wrappers touch them, and
  ``ppo.py`` uses its ``LogWrapper`` and ``FlattenObservationWrapper`` alone.

* ``gymnax.make``, as ``ppo.py`` sees it (its module global ``gymnax`` is
  replaced after the import; the real package stays in ``sys.modules``), when
  gymnax >= 1.0 is installed (here 1.0.1; purejaxrl was written against
  0.0.x): the env it returns is wrapped in `FiveTupleStep`, because gymnax 1.0's
  ``step`` returns ``terminated`` and ``truncated`` apart, six values where
  purejaxrl's wrappers unpack five. ``done = terminated | truncated`` is
  gymnax 0.0.x's ``done`` (CartPole's 500-step limit counted as terminal), so
  purejaxrl still treats truncation as termination, as it always has.

``ppo.py`` and ``wrappers.py`` use no JAX API that JAX 0.10.2 removed
(``jax.tree_util.tree_map``, not ``jax.tree_map``), so JAX itself is not
shimmed.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.metadata
import importlib.util
import pathlib
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from common import MIN_EPISODES


class StandInCategorical:
    """``distrax.Categorical(logits=...)`` as purejaxrl's ``ppo.py`` uses it.

    ``logits``: ``[..., num_actions]``; ``sample``, ``log_prob`` and
    ``entropy`` return ``[...]``.
    """

    def __init__(self, logits):
        self.logits = jax.nn.log_softmax(logits, axis=-1)  # normalized, as distrax keeps them

    def sample(self, *, seed):
        return jax.random.categorical(seed, self.logits, axis=-1)

    def log_prob(self, value):
        return jnp.take_along_axis(self.logits, jnp.asarray(value, jnp.int32)[..., None], -1)[..., 0]

    def entropy(self):
        return -jnp.sum(jnp.exp(self.logits) * self.logits, axis=-1)


def _unavailable(name: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{name} is a stand-in (purejaxrl_baseline.py): only "
                           "purejaxrl's gymnax CartPole path is supported here")
    return refuse


def _placeholder_class(name: str) -> type:
    return type(name.rsplit(".", 1)[-1], (), {"__init__": _unavailable(name)})


def stand_in_modules() -> dict[str, types.ModuleType]:
    """The modules purejaxrl imports at module level that are not installed here, by name."""
    modules: dict[str, types.ModuleType] = {}
    if importlib.util.find_spec("distrax") is None:
        modules["distrax"] = types.ModuleType("distrax", "stand-in: Categorical only")
        modules["distrax"].Categorical = StandInCategorical
    if importlib.util.find_spec("brax") is None:
        names = ("brax", "brax.envs", "brax.envs.wrappers", "brax.envs.wrappers.training")
        for name in names:
            modules[name] = types.ModuleType(name, "stand-in: raises if used")
        for parent, child in zip(names, names[1:]):
            setattr(modules[parent], child.rsplit(".", 1)[-1], modules[child])
        modules["brax.envs"].get_environment = _unavailable("brax.envs.get_environment")
        for cls in ("EpisodeWrapper", "AutoResetWrapper"):
            setattr(modules["brax.envs.wrappers.training"], cls,
                    _placeholder_class(f"brax.envs.wrappers.training.{cls}"))
    if importlib.util.find_spec("navix") is None:
        modules["navix"] = types.ModuleType("navix", "stand-in: raises if used")
        modules["navix"].make = _unavailable("navix.make")
    return modules


@contextlib.contextmanager
def modules_installed(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    """``modules`` in ``sys.modules`` for the block only; what was there before comes back."""
    before = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in before.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


class FiveTupleStep:
    """A gymnax env whose ``step`` returns gymnax 0.0.x's ``(obs, state, reward, done, info)``.

    gymnax 1.0 splits ``done`` into ``terminated`` and ``truncated``;
    purejaxrl's wrappers unpack five values. ``done = terminated | truncated``
    is what gymnax 0.0.x's CartPole reported (its time limit counted as
    terminal), so purejaxrl sees the env it was written against.
    """

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


def gymnax_with_five_tuple_step() -> types.ModuleType | None:
    """A stand-in for the ``gymnax`` that ``ppo.py`` calls ``make`` on, if gymnax >= 1.0 (else None)."""
    import gymnax

    if int(importlib.metadata.version("gymnax").split(".")[0]) < 1:
        return None
    module = types.ModuleType("gymnax", "stand-in: make() with gymnax 0.0.x's five-value step")

    def make(env_id, **kwargs):
        env, env_params = gymnax.make(env_id, **kwargs)
        return FiveTupleStep(env), env_params

    module.make = make
    return module


def purejaxrl_folder(path: str) -> pathlib.Path | None:
    """The folder holding ``ppo.py`` and ``wrappers.py``: ``path`` or ``path/purejaxrl`` (None if neither)."""
    root = pathlib.Path(path).expanduser()
    for folder in (root, root / "purejaxrl"):
        if (folder / "ppo.py").is_file() and (folder / "wrappers.py").is_file():
            return folder.resolve()
    return None


def purejaxrl_folder_or_exit(parser: argparse.ArgumentParser, path: str | None) -> pathlib.Path:
    """`purejaxrl_folder` of ``--purejaxrl``, or ``parser.error`` saying what is missing."""
    if path is None:
        parser.error("--modes purejaxrl needs --purejaxrl DIR, a checkout of "
                     "github.com/luchris429/purejaxrl")
    folder = purejaxrl_folder(path)
    if folder is None:
        parser.error(f"--purejaxrl {path}: no ppo.py and wrappers.py there or in "
                     "its purejaxrl/ folder")
    return folder


def _load(name: str, path: pathlib.Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def import_purejaxrl_ppo(folder: pathlib.Path) -> tuple[types.ModuleType, list[str]]:
    """purejaxrl's ``ppo`` module from ``folder``, and the names stood in while importing it.

    ``ppo.py`` imports its neighbour as ``from wrappers import ...``, so
    ``wrappers.py`` is loaded under that name first; neither name stays in
    ``sys.modules`` afterwards (the module objects live on in ``ppo``'s globals).
    """
    stand_ins = stand_in_modules()
    # None: absent for the import (a stray `wrappers` elsewhere must not be found), and
    # what was there before is put back after it, as for the stand-ins.
    with modules_installed({**stand_ins, "wrappers": None, "purejaxrl_ppo": None}):
        _load("wrappers", folder / "wrappers.py")
        ppo = _load("purejaxrl_ppo", folder / "ppo.py")
    # Its module global, not sys.modules: wrappers.py needs the real gymnax's submodules.
    gymnax = gymnax_with_five_tuple_step()
    if gymnax is not None:
        ppo.gymnax = gymnax
        stand_ins["gymnax.make (five-value step)"] = gymnax
    return ppo, sorted(stand_ins)


def purejaxrl_default_config(ppo_path: pathlib.Path) -> dict[str, Any]:
    """The ``config = {...}`` literal under ``if __name__ == "__main__":`` in ``ppo.py``."""
    tree = ast.parse(ppo_path.read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            for statement in node.body:
                if (isinstance(statement, ast.Assign)
                        and [ast.unparse(t) for t in statement.targets] == ["config"]):
                    return ast.literal_eval(statement.value)
    raise ValueError(f"no `config = {{...}}` under __main__ in {ppo_path}")


def purejaxrl_config(ppo_path: pathlib.Path, budget_scale: float) -> dict[str, Any]:
    """Its default config, ``DEBUG`` off, ``TOTAL_TIMESTEPS`` scaled (at least two updates)."""
    config = {**purejaxrl_default_config(ppo_path), "DEBUG": False}
    if budget_scale != 1:
        batch = config["NUM_ENVS"] * config["NUM_STEPS"]
        config["TOTAL_TIMESTEPS"] = max(2 * batch, int(config["TOTAL_TIMESTEPS"] * budget_scale))
    return config


def _episode_metrics(returned_episode_returns, returned_episode) -> tuple[np.ndarray, np.ndarray]:
    """One seed's ``[updates, steps, envs]`` episode returns and ends, checked."""
    returns = np.asarray(returned_episode_returns, np.float64)
    ended = np.asarray(returned_episode, bool)
    if returns.ndim != 3 or returns.shape != ended.shape:
        raise ValueError(f"expected two [updates, steps, envs] arrays, got shapes "
                         f"{returns.shape} and {ended.shape}")
    return returns, ended


def last_episodes_return_mean(returned_episode_returns, returned_episode,
                              min_episodes: int = MIN_EPISODES) -> float:
    """Mean return of the last ``min_episodes`` episodes to end (all if fewer; NaN if none).

    Both arrays are one seed's purejaxrl metrics, ``[updates, steps, envs]``:
    ``returned_episode`` is True where an episode ended, and
    ``returned_episode_returns`` holds that episode's return there. Flattened
    in C order they run in time order (envs ending at the same step in env
    order), as ``LearnerReport.episode_return_mean`` counts episodes.
    """
    returns, ended = _episode_metrics(returned_episode_returns, returned_episode)
    finished = returns.reshape(-1)[ended.reshape(-1)]
    return float(np.mean(finished[-min_episodes:])) if finished.size else float("nan")


def _train_timed(ppo: types.ModuleType, config: dict[str, Any], keys, vmapped: bool) -> dict[str, Any]:
    """purejaxrl's ``make_train(config)`` jitted (over ``keys`` vmapped, or one key), compiled,
    run and its episode metrics read back: `run_purejaxrl_once`'s fields."""
    config = dict(config)  # make_train writes NUM_UPDATES and MINIBATCH_SIZE into it
    start = time.perf_counter()  # from make_train on, which makes the env
    train = ppo.make_train(config)
    train = jax.jit(jax.vmap(train) if vmapped else train).lower(keys).compile()
    compile_s = time.perf_counter() - start
    start, cpu_start = time.perf_counter(), time.process_time()
    metrics = train(keys)["metrics"]
    returns, ended = jax.device_get((metrics["returned_episode_returns"],
                                     metrics["returned_episode"]))
    return dict(compile_s=compile_s, run_s=time.perf_counter() - start,
                run_cpu_s=time.process_time() - cpu_start, returns=returns, ended=ended,
                updates=int(config["NUM_UPDATES"]),
                batch=int(config["NUM_STEPS"] * config["NUM_ENVS"]))


def run_purejaxrl(ppo: types.ModuleType, config: dict[str, Any],
                  seeds: list[int]) -> list[dict[str, Any]]:
    """purejaxrl's ``make_train(config)``, ``seeds`` vmapped in one jit: a row per seed."""
    run = _train_timed(ppo, config, jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds)), True)
    wall = run["compile_s"] + run["run_s"]
    return [dict(final_return=last_episodes_return_mean(run["returns"][i], run["ended"][i]),
                 env_steps=run["updates"] * run["batch"], wall_time_s=round(wall, 2),
                 compile_s=round(run["compile_s"], 2))
            for i in range(len(seeds))]


def run_purejaxrl_once(folder: pathlib.Path, total_env_steps: int, seed: int) -> dict[str, Any]:
    """One seed of purejaxrl's ``make_train``, jitted as its ``__main__`` runs it (not vmapped).

    Its default config with ``DEBUG`` off and ``TOTAL_TIMESTEPS`` set to
    ``total_env_steps``. Returns ``compile_s``, ``run_s`` and ``run_cpu_s``
    (the call and the metrics' readback, compile excluded; CPU of every thread
    of this process), the episode metrics ``returns`` and ``ended``
    (``[updates, steps, envs]``), ``updates`` and ``batch`` (env steps an update).
    """
    ppo, _ = import_purejaxrl_ppo(folder)
    config = {**purejaxrl_config(folder / "ppo.py", 1), "TOTAL_TIMESTEPS": total_env_steps}
    return _train_timed(ppo, config, jax.random.PRNGKey(seed), False)


def first_solved_update(returned_episode_returns, returned_episode, target: float,
                        min_episodes: int = MIN_EPISODES) -> int | None:
    """The first update after which the last ``min_episodes`` episodes to end average ``target``.

    The arrays are one seed's purejaxrl metrics, ``[updates, steps, envs]``
    (``returned_episode`` True where an episode ended, with its return in
    ``returned_episode_returns``); fewer episodes than ``min_episodes`` so far
    average all of them, as the runtime's ``episode_return_mean`` does. None if
    no update reaches ``target``.
    """
    returns, ended = _episode_metrics(returned_episode_returns, returned_episode)
    updates = returns.shape[0]
    ended = ended.reshape(updates, -1)
    finished = returns.reshape(updates, -1)[ended]  # in time order: C order within an update
    through = np.cumsum(ended.sum(axis=1))  # episodes ended by the end of each update
    sums = np.concatenate([[0.0], np.cumsum(finished)])
    first = np.maximum(through - min_episodes, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (sums[through] - sums[first]) / (through - first)
    solved = np.nonzero((through > 0) & (means >= target))[0]
    return int(solved[0]) if solved.size else None
