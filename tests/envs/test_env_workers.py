"""Env workers (`ppo_async.envs.workers`): host envs stepped in processes that never import JAX.

What they must keep: the envs an in-process batch would give (same seeds,
same steps), runs fixed by their seed and env groups whatever the number of
workers (and so equal to thread-stepped groups, as Ray actors use), and
clean ends: a worker that raises, dies or hangs is named, and no worker
outlives its owner.
"""

import dataclasses
import functools
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import jax
import numpy as np
import psutil
import pytest

from ppo_async import ActorError, AsyncActorLearnerConfig, ConfigError, register_single_env, train
from ppo_async.envs.backends import make_actor_program
from ppo_async.envs.host import EnvContractError, HostEnvError, make_host_env
from ppo_async.envs.host_rollout import HostRollout
from ppo_async.envs.payload import HostEnvPayload
from ppo_async.envs.registry import register_host_env
from ppo_async.envs.workers import EnvGroups, EnvWorkerError, EnvWorkers
from ppo_async.errors import one_line
from ppo_async.runtime.layout import env_workers_and_groups, resolve_layout

from breaking_env import BreakingEnv, Broken, ShapeShifting
from run_helpers import raised_in_actor_thread

CARTPOLE = "gymnasium:CartPole-v1"


def cartpole_workers(num_envs=4, workers=2, groups=2, **kwargs) -> EnvWorkers:
    probe = make_host_env(CARTPOLE, 1)
    return EnvWorkers(CARTPOLE, num_envs, workers=workers, groups=groups,
                      observation_shape=probe.observation_shape, action_space=probe.action_space,
                      owner="actor 7", **kwargs)


def alive(pids) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def workers_left() -> list:
    """This process's env workers still running (not its multiprocessing resource tracker)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "ppo_async.envs.workers" in " ".join(child.cmdline()) and alive([child.pid]):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def test_workers_step_the_envs_an_in_process_batch_steps():
    pool, batch = cartpole_workers(), make_host_env(CARTPOLE, 4)
    try:
        np.testing.assert_array_equal(pool.reset(11), batch.reset(11))  # env i: seed 11 + i
        rng = np.random.default_rng(0)
        ended = 0
        for _ in range(120):
            actions = rng.integers(0, 2, 4).astype(np.int32)
            mine, theirs = pool.step(actions), batch.step(actions)
            for a, b in zip(mine, theirs):
                np.testing.assert_array_equal(a, b)
            ended += int(np.sum(mine[2] | mine[3]))
        assert ended > 0  # auto-resets and final observations were compared too
        # The halves step on their own: group 1 waits while group 0 steps twice.
        pool.step_async(np.zeros(2, np.int32), 0)
        first = np.array(pool.step_wait(0).obs)
        pool.step_async(np.zeros(2, np.int32), 0)
        assert not np.array_equal(first, pool.step_wait(0).obs)
    finally:
        pool.close()
    assert alive(pool.pids) == []


def test_a_worker_process_imports_no_jax(tmp_path, monkeypatch):
    (tmp_path / "jax_probe_env.py").write_text(textwrap.dedent("""
        import sys
        import gymnasium
        import numpy as np
        from ppo_async import register_single_env

        class Probe(gymnasium.Env):
            observation_space = gymnasium.spaces.Box(0, 1, (1,), np.float32)
            action_space = gymnasium.spaces.Discrete(2)

            def reset(self, seed=None, options=None):
                return np.array([float("jax" in sys.modules)], np.float32), {}

            def step(self, action):
                return self.reset()[0], 0.0, False, False, {}

        register_single_env("jax-probe", Probe)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import jax_probe_env  # noqa: F401 - registers host:jax-probe here

    probe = make_host_env("host:jax-probe", 1)
    from ppo_async.envs.workers import portable_factory

    payload, problem = portable_factory("host:jax-probe")
    assert problem is None
    pool = EnvWorkers("host:jax-probe", 2, workers=1, groups=1,
                      observation_shape=probe.observation_shape, action_space=probe.action_space,
                      env_modules=("jax_probe_env",), payload=payload)
    try:
        assert "jax" in sys.modules
        np.testing.assert_array_equal(pool.reset(0), [[0.0], [0.0]])
        rss = psutil.Process(pool.pids[0]).memory_info().rss
        assert rss < 200 * 2**20, rss  # numpy and gymnasium; JAX alone is more
    finally:
        pool.close()


# --- runs -------------------------------------------------------------------------------

TINY = AsyncActorLearnerConfig(
    env_id=CARTPOLE, num_actors=2, envs_per_actor=4, num_steps=16, num_epochs=1,
    num_minibatches=2, total_env_steps=2 * 4 * 16 * 4, hidden_sizes=(16,), seed=3,
)


def final_params(config) -> list[np.ndarray]:
    result = train(config, progress=False)
    return [np.asarray(x) for x in jax.tree.leaves(result.params)]


def test_a_run_is_fixed_by_its_seed_and_groups_not_by_where_its_envs_step():
    in_workers = final_params(dataclasses.replace(TINY, env_workers=2, env_groups=2))
    assert workers_left() == []  # the run's workers ended with it
    again = final_params(dataclasses.replace(TINY, env_workers=2, env_groups=2))
    one_worker = final_params(dataclasses.replace(TINY, env_workers=1, env_groups=2))
    in_thread = final_params(dataclasses.replace(TINY, env_workers=0, env_groups=2))
    for other in (again, one_worker, in_thread):
        assert all(np.array_equal(a, b) for a, b in zip(in_workers, other))
    ungrouped = final_params(dataclasses.replace(TINY, env_workers=0, env_groups=1))
    assert not all(np.array_equal(a, b) for a, b in zip(in_workers, ungrouped))


def test_the_layout_defaults_and_bad_layouts():
    def workers_and_groups(**changes):
        return env_workers_and_groups(dataclasses.replace(TINY, **changes))

    assert workers_and_groups() == (0, 1)  # the actor's thread, one group: the runs of before
    assert workers_and_groups(env_workers=2) == (2, 2)
    assert workers_and_groups(env_workers=1, envs_per_actor=3) == (1, 1)
    assert workers_and_groups(env_groups=2) == (0, 2)
    assert env_workers_and_groups(AsyncActorLearnerConfig(env_id="CartPole-v1")) == (0, 1)
    assert resolve_layout(dataclasses.replace(TINY, env_workers=2)).pin(TINY).env_groups == 2
    with pytest.raises(ConfigError, match="env_workers.*gymnasium: and host: envs only"):
        AsyncActorLearnerConfig(env_id="CartPole-v1", env_workers=2)
    with pytest.raises(ConfigError, match="env_groups.*divisible by 3"):
        dataclasses.replace(TINY, env_groups=3, env_workers=1)
    with pytest.raises(ConfigError, match=r"env_groups=3: 3 groups need envs_per_actor \(4\) "
                                          r"divisible by 3$"):
        dataclasses.replace(TINY, env_groups=3)
    with pytest.raises(ConfigError, match="at least 4 envs per group"):  # 2 groups by default
        resolve_layout(dataclasses.replace(TINY, env_workers=4))


def breaking_workers(mode: str, **kwargs) -> EnvWorkers:
    import cloudpickle
    import functools
    import gymnasium

    return EnvWorkers("host:breaking", 4, workers=2, groups=1, observation_shape=(2,),
                      action_space=gymnasium.spaces.Discrete(2), owner="actor 3",
                      payload=HostEnvPayload("breaking", cloudpickle.dumps(
                          functools.partial(BreakingEnv, mode=mode))),
                      **kwargs)


@pytest.mark.parametrize("mode, says", [
    ("raise", "(?s)raised during its step of group 0:.*the simulator broke"),
    ("die", "died \\(killed by signal 9\\) during its step of group 0"),
    ("hang", "no answer to its step of group 0 within 1 s; the worker was killed"),
])
def test_a_worker_that_raises_dies_or_hangs_is_named(mode, says):
    pool = breaking_workers(mode, reply_timeout_s=1.0)
    started = time.monotonic()
    try:
        pool.reset(0)
        with pytest.raises(EnvWorkerError, match=says) as error:
            for _ in range(5):
                pool.step(np.zeros(4, np.int32))
        assert time.monotonic() - started < 15
        message = str(error.value)
        assert "host:breaking: env worker 0 of actor 3 (envs 0-1, pid " in message
        assert str(pool.pids[0]) in message
        if mode == "raise":  # the simulator's own exception, where it pickles
            assert isinstance(error.value.__cause__, Broken)
    finally:
        pool.close()
    assert alive(pool.pids) == []


def test_a_run_whose_env_worker_raises_names_actor_worker_and_pid():
    register_host_env("breaking", BreakingEnv)
    config = dataclasses.replace(TINY, env_id="host:breaking", env_workers=1,
                                 total_env_steps=2 * 4 * 16 * 50)
    with pytest.raises(ActorError, match=r"actor [01] failed") as info:
        train(config, progress=False)
    assert isinstance(info.value.__cause__, EnvWorkerError)
    assert "env worker 0 of actor" in str(info.value) and "the simulator broke" in str(info.value)
    assert workers_left() == []


# --- the env's contract, and restarts ---------------------------------------------------

@pytest.mark.parametrize("env_workers", [1, 0])
def test_an_env_breaking_the_contract_is_named_in_one_line_wherever_it_steps(env_workers):
    register_single_env("shape-shifting", ShapeShifting)
    register_host_env("breaking-flags", functools.partial(BreakingEnv, mode="flags"))
    for env_id, says in [
        ("host:shape-shifting", "obs has shape (3,), expected (2,) (actor 3, env 3, step 5)"),
        ("host:breaking-flags", "terminated has dtype int8, expected bool (actor 3, step 5)"),
    ]:
        ShapeShifting.made = 0  # env 3 of each 4 made here breaks (the workers count their own)
        config = dataclasses.replace(TINY, env_id=env_id, num_actors=1, env_workers=env_workers,
                                     env_groups=2)  # env 3 is env 1 of group 1
        program = make_actor_program(config)
        device = jax.devices("cpu")[0]
        params = jax.device_put(program.params_template, device)
        carries = []

        def reset_and_roll_out():
            carries.append(program.reset(jax.random.key(0), device))
            program.rollout(params, carries[0])

        try:
            error = raised_in_actor_thread(reset_and_roll_out)
            assert isinstance(carries[0].envs, EnvWorkers if env_workers else EnvGroups)
        finally:
            program.close(carries[0])
        assert isinstance(error, EnvContractError)
        assert str(error) == f"{env_id}: {says}"
    assert workers_left() == []


def test_an_env_breaking_the_contract_fails_the_run_once_its_restarts_are_spent(tmp_path,
                                                                               caplog):
    register_single_env("shape-shifting", ShapeShifting)
    config = dataclasses.replace(TINY, env_id="host:shape-shifting", num_actors=1,
                                 env_workers=1, max_actor_restarts=1)
    run_dir = tmp_path / "run"
    with caplog.at_level("WARNING", logger="ppo_async.runtime.supervisor"), pytest.raises(
            ActorError) as info:
        train(config, run_dir=run_dir, progress=False)
    said = ("EnvContractError: host:shape-shifting: obs has shape (3,), expected (2,) "
            "(actor 0, env 3, step 5)")
    assert one_line(info.value) == f"actor 0 failed: {said}"
    # Restarted once (its new worker's env 3 broke again at its step 5), then the run failed.
    assert _restart_notices(caplog) == [
        f"actor 0 failed; restarting it (restart 1 of 1): {said} "
        f"(traceback in {run_dir / 'log.txt'})"]
    assert workers_left() == []


def _restart_notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ppo_async.runtime.supervisor"]


def test_an_env_worker_restart_is_one_line_with_its_traceback_in_the_run_log(tmp_path, caplog):
    register_host_env("breaking-once", functools.partial(
        BreakingEnv, mode="raise-once", marker=str(tmp_path / "broke")))
    config = dataclasses.replace(TINY, env_id="host:breaking-once", num_actors=1,
                                 env_workers=1, max_actor_restarts=1)
    run_dir = tmp_path / "run"
    with caplog.at_level("WARNING", logger="ppo_async.runtime.supervisor"):
        report = train(config, run_dir=run_dir, progress=False).report
    assert report.updates == config.num_updates and report.actor_restarts == 1
    (notice,) = _restart_notices(caplog)
    assert re.fullmatch(
        r"actor 0 failed; restarting it \(restart 1 of 1\): EnvWorkerError: host:breaking-once: "
        r"env worker 0 of actor 0 \(envs [-0-9, ]+, pid \d+\) raised during its step of group 0: "
        r"Broken: the simulator broke \(traceback in " + re.escape(str(run_dir / "log.txt"))
        + r"\)", notice), notice
    log = (run_dir / "log.txt").read_text()
    assert log.startswith("actor 0 failed; restarting it (restart 1 of 1):\n")
    assert "Traceback (most recent call last)" in log
    # the worker's traceback, quoted by the actor's: the env's line that raised
    assert 'breaking_env.py", line' in log and "Broken: the simulator broke" in log
    assert workers_left() == []


def test_no_worker_outlives_a_killed_parent(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{os.path.dirname(__file__)!r}, {os.path.dirname(os.path.dirname(__file__))!r}]
        from test_env_workers import cartpole_workers
        pool = cartpole_workers()
        print(" ".join(map(str, pool.pids)), flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(alive(pids)) == 2
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive(pids) == []


def test_a_factory_that_cannot_travel_is_refused_with_env_workers():
    lock = threading.Lock()

    class Locked(BreakingEnv):
        def __init__(self, num_envs):
            super().__init__(num_envs)
            self.lock = lock

        def step(self, actions):
            self.steps = 0  # never breaks
            return super().step(actions)

    register_host_env("locked", Locked)
    config = dataclasses.replace(TINY, env_id="host:locked", env_workers=1)
    with pytest.raises(ConfigError, match="env_workers=1: host:locked: its factory .* cannot "
                                          "be sent.*or set env_workers=0"):
        resolve_layout(config)
    with pytest.raises(HostEnvError, match="env_workers=1: host:locked: its factory"):
        HostRollout(config)


def test_idle_workers_spin_only_while_the_run_has_a_core_for_each():
    from ppo_async.envs.workers import _SPIN_S, spin_seconds

    assert spin_seconds(1) == _SPIN_S > 0
    assert spin_seconds((os.cpu_count() or 1) + 1) == 0.0  # more workers than cores: they sleep
