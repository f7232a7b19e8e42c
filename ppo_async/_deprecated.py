"""Old import paths that work for one more release, with a DeprecationWarning naming the new one.

The layout change moved modules into subpackages (``ppo_async.host_envs`` is
now ``ppo_async.envs.host``), and later changes moved a few names. Rather than
a shim file per old module, one import hook answers for every old path in
`MOVED_MODULES`: importing it warns once and gives the new module itself, so
``from ppo_async.host_envs import HostEnvError`` is the very same class. Names
that left a module that still exists (`MOVED_NAMES`: ``ppo_async.sweep``,
now a package; ``ppo_async.tools.cli``) are looked up by a module
``__getattr__`` that warns once per name.

Two old paths are not answered, because the names are now packages:
``ppo_async.envs`` (was the gymnax env module, now ``ppo_async.envs.gymnax_env``)
and ``ppo_async.networks`` (now ``ppo_async.networks.actor_critic``).

``ppo_async.evaluate`` is the function `ppo_async.runtime.evaluate.evaluate`
(the public API). ``import ppo_async.evaluate`` and ``from ppo_async.evaluate
import Evaluator`` still resolve the old module path, with the warning, but the
package's attribute stays the function: after ``import ppo_async.evaluate``,
``ppo_async.evaluate`` is the function, not the module (`install` keeps an
import of a submodule from replacing a package attribute that is not a module).

The targets are named as strings and imported only when an old path is used,
so importing this module imports nothing of the package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import types
import warnings
from typing import Any

# old module path -> the module that holds its contents now
MOVED_MODULES = {
    "ppo_async.advantages": "ppo_async.core.advantages",
    "ppo_async.losses": "ppo_async.core.losses",
    "ppo_async.normalization": "ppo_async.core.normalization",
    "ppo_async.host_envs": "ppo_async.envs.host",
    "ppo_async.actor_program": "ppo_async.envs.program",
    "ppo_async.env_registry": "ppo_async.envs.registry",
    "ppo_async.distributions": "ppo_async.networks.distributions",
    "ppo_async.analysis": "ppo_async.runs.analysis",
    "ppo_async.checkpoint": "ppo_async.runs.checkpoint",
    "ppo_async.compile_cache": "ppo_async.runs.compile_cache",
    "ppo_async.plotting": "ppo_async.runs.plotting",
    "ppo_async.run_dir": "ppo_async.runs.run_dir",
    "ppo_async.run_log": "ppo_async.runs.run_log",
    "ppo_async.wandb_log": "ppo_async.runs.wandb_log",
    "ppo_async.runs.resume": "ppo_async.resume",
    "ppo_async.actor": "ppo_async.runtime.actor",
    "ppo_async.evaluate": "ppo_async.runtime.evaluate",
    "ppo_async.learner": "ppo_async.runtime.learner",
    "ppo_async.policy_io": "ppo_async.runtime.messages",
    "ppo_async.ray_transport": "ppo_async.runtime.ray_transport",
    "ppo_async.supervisor": "ppo_async.runtime.supervisor",
    "ppo_async.transport": "ppo_async.runtime.transport",
    "ppo_async.watchdog": "ppo_async.runtime.watchdog",
    "ppo_async.runtime.devices": "ppo_async.core.devices",
    "ppo_async.cli": "ppo_async.tools.cli",
    "ppo_async.video": "ppo_async.tools.video",
    "ppo_async.tools.presets": "ppo_async.presets",
}


def _names(spaced: dict[str, str]) -> dict[str, str]:
    """``{module: "name name ..."}`` -> ``{name: module}``."""
    return {name: module for module, names in spaced.items() for name in names.split()}


# module that still exists -> {name that left it: the module that holds it now}
MOVED_NAMES = {
    # The sweep module became a package (its __init__ holds only its docstring).
    "ppo_async.sweep": _names({
        "ppo_async.sweep.spec": "SWEEP_FILE SWEEP_KEYS SweepRun SweepSpec load_sweep point_label "
                                "run_name",
        "ppo_async.sweep.table": "RUNS_FILE SUMMARY_CSV SUMMARY_MD RUN_COLUMNS SUMMARY_COLUMNS "
                                 "run_state summarize summary_markdown",
        "ppo_async.sweep.pools": "LOGS_SUBDIR STOP_TIMEOUT_S TWIN_STOP_TIMEOUT_S ERROR_PREFIX "
                                 "TWIN_XLA_FLAG run_job",
        "ppo_async.sweep.execute": "BACKENDS POLL_S SweepWarning SweepInterrupted SweepPlan "
                                   "default_workers plan_sweep continue_command execute_sweep "
                                   "run_sweep",
    }),
    "ppo_async.tools.cli": _names({"ppo_async.resume": "load_run_config load_run_params"}),
}

# Frames the warning must not point at: the import system's and this module's.
_IMPORT_FRAMES = ("<frozen importlib", os.path.dirname(importlib.__file__) + os.sep, __file__)


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside the import machinery: the line that imported."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_IMPORT_FRAMES):
        frame = frame.f_back
        # warnings.warn does not count importlib's bootstrap frames (warnings._is_internal_frame).
        if frame is not None and not _is_bootstrap(frame.f_code.co_filename):
            level += 1
    return level


def _is_bootstrap(filename: str) -> bool:
    return "importlib" in filename and "_bootstrap" in filename


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated: it moved to {new}. The old path works until the next "
                  "release.", DeprecationWarning, stacklevel=_caller_stacklevel())


class _MovedModuleLoader(importlib.abc.Loader):
    """Loads an old path as the new module itself (the import system returns what
    ``sys.modules`` holds under the name after ``exec_module``)."""

    def create_module(self, spec: Any) -> None:
        return None  # a placeholder; exec_module puts the new module in its place

    def exec_module(self, module: types.ModuleType) -> None:
        old, new = module.__name__, MOVED_MODULES[module.__name__]
        _warn(old, new)
        sys.modules[old] = importlib.import_module(new)


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers for the old paths of `MOVED_MODULES` only; last on ``sys.meta_path``, so a
    module that exists is always found first."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(name, _MovedModuleLoader())


def moved_name_getattr(module_name: str, namespace: dict[str, Any]):
    """A module ``__getattr__`` for the names that left ``module_name`` (`MOVED_NAMES`).

    ``namespace``: the module's globals, where a name found once is kept (so
    it warns once). Named apart from the module: ``python -m`` runs it as ``__main__``.
    """
    moved = MOVED_NAMES[module_name]

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        _warn(f"{module_name}.{name}", f"{moved[name]}.{name}")
        namespace[name] = getattr(importlib.import_module(moved[name]), name)
        return namespace[name]

    return __getattr__


class _Package(types.ModuleType):
    """``ppo_async`` itself: importing an old module path such as ``ppo_async.evaluate``
    does not replace the attribute of that name when it is not a module (the function)."""

    def __setattr__(self, name: str, value: Any) -> None:
        current = self.__dict__.get(name)
        if (isinstance(value, types.ModuleType) and current is not None
                and not isinstance(current, types.ModuleType)):
            return
        super().__setattr__(name, value)


def install(package: types.ModuleType) -> None:
    """Answer the old paths: called once by ``ppo_async/__init__.py`` with the package."""
    package.__class__ = _Package
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
    # ppo_async.tools.cli sets its own (importing it here would import tyro with the package).
    sweep = importlib.import_module("ppo_async.sweep")
    sweep.__getattr__ = moved_name_getattr("ppo_async.sweep", vars(sweep))
