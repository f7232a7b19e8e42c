"""The public API: the names ``ppo_async`` exports, and the old import paths that still work.

The list of public names is written out here, so that adding or dropping one
is a decision this file records. The old module paths (before the layout
change put modules into subpackages) import for one release with a
DeprecationWarning naming the new path (`ppo_async._deprecated`).
"""

import importlib
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import warnings

import pytest

import ppo_async
from ppo_async import _deprecated

PUBLIC_NAMES = [
    "ActorChannels", "ActorError", "ActorHandle", "ActorStats", "ActorThrottle",
    "AsyncActorLearnerConfig", "BackendNotInstalledError", "CheckpointError", "ConfigError",
    "Experience", "HostEnvError", "LearnerHooks", "LearnerReport", "LearnerTimeoutError", "NonFiniteError",
    "PBTInterrupted", "PolicyBroadcast", "PolicyLoadError", "QueueEndpoint", "RolloutBuffer",
    "ShutdownTimeoutError", "StopTraining", "SweepInterrupted", "TrainResult",
    "TrainingInterrupted", "UnknownEnvError", "VTraceOutput", "__version__", "actor_thread",
    "evaluate", "gae", "learner_loop", "load_policy_from_broadcast", "load_run", "ppo_loss",
    "preset", "register_host_env", "register_single_env", "run_actor", "run_pbt", "run_sweep",
    "serialize_policy", "spawn_actor", "train", "vtrace",
]

# Every module path that moved, old -> new.
OLD_MODULE_PATHS = {
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

# The public names of the module sweep.py, now the package ppo_async.sweep.
OLD_SWEEP_NAMES = {
    "BACKENDS", "ERROR_PREFIX", "LOGS_SUBDIR", "POLL_S", "RUNS_FILE", "RUN_COLUMNS",
    "STOP_TIMEOUT_S", "SUMMARY_COLUMNS", "SUMMARY_CSV", "SUMMARY_MD", "SWEEP_FILE", "SWEEP_KEYS",
    "SweepInterrupted", "SweepPlan", "SweepRun", "SweepSpec", "SweepWarning",
    "TWIN_STOP_TIMEOUT_S", "TWIN_XLA_FLAG", "continue_command", "default_workers",
    "execute_sweep", "load_sweep", "plan_sweep", "point_label", "run_job", "run_name",
    "run_state", "run_sweep", "summarize", "summary_markdown",
}


def test_the_public_names():
    assert ppo_async.__all__ == PUBLIC_NAMES


def test_the_user_facing_names_are_the_objects_where_they_live():
    from ppo_async.envs.registry import register_host_env
    from ppo_async.presets import preset
    from ppo_async.resume import load_run
    from ppo_async.runtime.evaluate import evaluate
    from ppo_async.sweep.execute import run_sweep

    assert (ppo_async.evaluate, ppo_async.preset, ppo_async.load_run, ppo_async.run_sweep,
            ppo_async.register_host_env) == (evaluate, preset, load_run, run_sweep,
                                             register_host_env)


def test_train_refuses_a_config_that_is_not_one_naming_what_it_takes():
    # A dict of fields (as run_sweep takes) failed deep inside with "'dict' object
    # has no attribute 'compilation_cache_dir'".
    for config in ({"env_id": "CartPole-v1"}, "CartPole-v1"):
        with pytest.raises(TypeError, match="config must be an AsyncActorLearnerConfig "
                                            r"\(AsyncActorLearnerConfig\(\*\*fields\), or "
                                            r"ppo_async.preset\(NAME\)\), not "):
            ppo_async.train(config, progress=False)


def test_load_run_gives_a_run_directorys_config_and_params(tmp_path):
    import flax.serialization
    import jax

    from ppo_async.envs.backends import make_actor_program

    config = ppo_async.AsyncActorLearnerConfig(env_id="CartPole-v1", num_actors=1,
                                               envs_per_actor=2, num_steps=8)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    params = make_actor_program(config).params_template
    (tmp_path / "params.msgpack").write_bytes(flax.serialization.to_bytes(params))
    loaded_config, loaded_params = ppo_async.load_run(tmp_path)
    assert loaded_config.to_dict() == config.to_dict()
    assert jax.tree.structure(loaded_params) == jax.tree.structure(params)
    # A directory that is not there is said to be missing; one without a config.json, so.
    with pytest.raises(ppo_async.ConfigError, match="missing': no such directory"):
        ppo_async.load_run(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ppo_async.ConfigError, match="no config.json there"):
        ppo_async.load_run(tmp_path / "empty")
    # A sweep's directory (its runs below it): told to name one of them.
    (tmp_path / "sweep" / "seed=0").mkdir(parents=True)
    (tmp_path / "sweep" / "seed=0" / "config.json").write_text(json.dumps(config.to_dict()))
    with pytest.raises(ppo_async.ConfigError, match=r"sweep' is not a run but holds 1 run "
                       r"directory \(a sweep's or a population's\); name one, e.g. .*seed=0'"):
        ppo_async.load_run(tmp_path / "sweep")


def test_the_table_of_old_paths_is_the_list_of_moves():
    assert _deprecated.MOVED_MODULES == OLD_MODULE_PATHS
    assert set(_deprecated.MOVED_NAMES["ppo_async.sweep"]) == OLD_SWEEP_NAMES


@pytest.mark.parametrize("old, new", OLD_MODULE_PATHS.items())
def test_every_old_module_path_imports_the_new_module_with_a_warning(old, new):
    sys.modules.pop(old, None)  # an alias only: the module itself stays imported under new
    moved = rf"{re.escape(old)} .* moved to {re.escape(new)}\b"
    with pytest.warns(DeprecationWarning, match=moved):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert callable(ppo_async.evaluate)  # ppo_async.evaluate stays the function


@pytest.mark.parametrize("package, name", [
    *(("ppo_async.sweep", name) for name in sorted(OLD_SWEEP_NAMES)),
    ("ppo_async.tools.cli", "load_run_config"), ("ppo_async.tools.cli", "load_run_params"),
])
def test_every_name_that_left_a_module_still_resolves_there_with_a_warning(package, name):
    module = importlib.import_module(package)
    new = _deprecated.MOVED_NAMES[package][name]
    vars(module).pop(name, None)  # found once, then kept: start from not found
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(f'{package}.{name}')} .* moved to "
                                                rf"{re.escape(f'{new}.{name}')}\b"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        module.not_a_name_it_ever_had  # noqa: B018


def test_an_old_path_warns_once_at_the_importing_line_and_gives_the_same_objects(tmp_path):
    # A fresh interpreter: this one has imported the old paths already.
    script = tmp_path / "old_paths.py"
    script.write_text(textwrap.dedent("""
        import warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            import ppo_async.host_envs
            from ppo_async.host_envs import HostEnvError
            import ppo_async.host_envs
            from ppo_async.sweep import run_sweep
            from ppo_async.sweep import run_sweep
            import ppo_async.evaluate
            from ppo_async.evaluate import Evaluator
        import ppo_async
        from ppo_async.envs.host import HostEnvError as new_error
        from ppo_async.runtime.evaluate import Evaluator as new_evaluator, evaluate
        for w in caught:
            print(w.category.__name__, w.filename == __file__, w.lineno, w.message)
        print(HostEnvError is new_error, run_sweep is ppo_async.run_sweep,
              Evaluator is new_evaluator, ppo_async.evaluate is evaluate)
    """))
    # The script's folder is first on its path: this checkout's ppo_async goes before it.
    root = pathlib.Path(ppo_async.__file__).resolve().parents[1]
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, env=env)
    assert done.returncode == 0, done.stderr
    *warned, same = done.stdout.strip().splitlines()
    assert [line.split(" is deprecated")[0] for line in warned] == [
        "DeprecationWarning True 5 ppo_async.host_envs",
        "DeprecationWarning True 8 ppo_async.sweep.run_sweep",
        "DeprecationWarning True 10 ppo_async.evaluate",
    ]
    assert "moved to ppo_async.envs.host." in warned[0]
    assert same == "True True True True"


def test_old_paths_do_not_shadow_modules_that_exist():
    # The hook answers only for its table, after every other finder.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import ppo_async.envs
        import ppo_async.networks
        import ppo_async.presets
        import ppo_async.resume  # noqa: F401
    assert importlib.util.find_spec("ppo_async.envs").origin.endswith("envs/__init__.py")
