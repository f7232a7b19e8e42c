"""Actors as processes of this machine (`ppo_async.runtime.process_transport`), without Ray.

Each test starts actor processes, each importing JAX (seconds on 2 cores),
so the runs are tiny and each test checks several things of one run. The
host env that misbehaves is run_helpers.py's; its code travels to the actor
processes by value.
"""

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import flax.serialization
import psutil
import pytest

from ppo_async import AsyncActorLearnerConfig, ConfigError, train
from ppo_async.envs.registry import register_host_env
from ppo_async.runtime import layout
from ppo_async.runtime.layout import EnvProbe, actors_per_process, resolve_layout
from ppo_async.runtime.process_transport import ProcessTransport, actor_env_vars
from run_helpers import (
    MisbehavingEnv,
    assert_spinning_actor_was_killed,
    register_misbehaving_env,
)

TINY = AsyncActorLearnerConfig(
    env_id="gymnasium:CartPole-v1", num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=1,
    num_minibatches=2, total_env_steps=2 * 2 * 8 * 6, seed=0, exact_policy_lag=1,
    actor_backend="processes", learner_timeout_s=60.0, shutdown_timeout_s=20.0,
)


SLOW_STEP = EnvProbe(step_us=500.0, cpu_share=1.0, steps=10, seconds=0.01)


def _gone(pids, timeout_s=10.0) -> list[int]:
    """The pids still alive (and not zombies) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pid in pids if psutil.pid_exists(pid)
                 and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def test_processes_take_a_cpu_actor_device_only():
    with pytest.raises(ConfigError, match="each actor process has one CPU device"):
        dataclasses.replace(TINY, actor_device="cpu:1")
    with pytest.raises(ConfigError, match="'threads', 'processes' or 'ray'"):
        dataclasses.replace(TINY, actor_backend="forks")
    with pytest.raises(ConfigError, match="actors_per_process=0: must be None"):
        dataclasses.replace(TINY, actors_per_process=0)
    with pytest.raises(ConfigError, match="applies to actor_backend='processes' only"):
        dataclasses.replace(TINY, actor_backend="threads", actors_per_process=2)
    assert actors_per_process(dataclasses.replace(TINY, actors_per_process=5)) == 2


@pytest.mark.real_layout
def test_exact_lag_actor_processes_give_the_bytes_of_thread_actors(monkeypatch):
    send = ProcessTransport._send

    def send_then_wait_for_the_end(process, message):
        # Each process has exited before the learner reads its last stats: they must still count.
        send(process, message)
        if message == ("stop",):
            process.process.wait(20)

    monkeypatch.setattr(ProcessTransport, "_send", staticmethod(send_then_wait_for_the_end))
    # actor_backend='auto' for a host env: processes, the bytes of threads.
    monkeypatch.setattr(layout, "probe_host_env", lambda config: SLOW_STEP)
    over_processes = train(dataclasses.replace(TINY, actor_backend="auto"), progress=False)
    monkeypatch.undo()
    assert over_processes.report.layout["collection"] == "processes"
    pids = [s.pid for s in over_processes.report.actor_stats]
    assert len(set(pids)) == 2 and os.getpid() not in pids  # two processes of their own
    assert _gone(pids) == [], "actor processes outlived the run"
    # One actor per process calls its policy alone, as thread actors do without batching.
    threads = train(dataclasses.replace(TINY, actor_backend="threads", batch_inference=False),
                    progress=False)
    assert (flax.serialization.to_bytes(over_processes.params)
            == flax.serialization.to_bytes(threads.params))
    assert over_processes.report.policy_lag_counts == threads.report.policy_lag_counts
    assert sum(s.env_steps for s in over_processes.report.actor_stats) >= TINY.total_env_steps
    # Both actors as threads of one process: the same bytes again.
    shared = train(dataclasses.replace(TINY, actors_per_process=2), progress=False)
    assert len({s.pid for s in shared.report.actor_stats}) == 1
    assert (flax.serialization.to_bytes(shared.params)
            == flax.serialization.to_bytes(threads.params))


def _affinity_recorder(path: str):
    """``make_env`` of a CartPole that appends ``pid cpu,cpu,...`` (where it was made) to ``path``."""
    def make_env():
        import os

        import gymnasium

        with open(path, "a") as record:
            record.write(f"{os.getpid()} {','.join(map(str, sorted(os.sched_getaffinity(0))))}\n")
        return gymnasium.make("CartPole-v1")
    return make_env


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
def test_actor_processes_run_on_a_core_each_and_their_env_workers_on_all(tmp_path):
    from ppo_async import register_single_env
    from ppo_async.runtime.process_transport import actor_cpus

    mine = sorted(os.sched_getaffinity(0))
    assert actor_cpus(TINY, len(mine)) == mine
    assert actor_cpus(TINY, len(mine) + 1) == [None] * (len(mine) + 1)  # more than cores
    assert actor_cpus(dataclasses.replace(TINY, pin_actor_processes=False), 1) == [None]

    record = tmp_path / "affinity.txt"
    register_single_env("affinity-recorder", _affinity_recorder(str(record)))
    config = dataclasses.replace(TINY, env_id="host:affinity-recorder", env_workers=1,
                                 num_actors=min(2, len(mine)), total_env_steps=2 * 2 * 8 * 2)
    result = train(config, progress=False)
    actors = {s.pid for s in result.report.actor_stats}
    seen = {int(pid): cpus for pid, cpus in (line.split() for line in record.read_text().split("\n")
                                             if line)}
    # Each actor process made its probe env on one CPU, a different one each (as its
    # stats say) ...
    assert sorted(seen[pid] for pid in actors) == [str(c) for c in mine[:len(actors)]]
    assert sorted(s.cpus for s in result.report.actor_stats) == [(c,) for c in mine[:len(actors)]]
    # ... and its env workers (the other pids, not this process) got every CPU back.
    workers = set(seen) - actors - {os.getpid()}
    assert len(workers) == len(actors)
    assert {seen[pid] for pid in workers} == {",".join(map(str, mine))}


def _misbehaving(tmp_path: pathlib.Path, how: str, **changes) -> tuple[AsyncActorLearnerConfig,
                                                                     pathlib.Path]:
    env_id, marker = register_misbehaving_env(tmp_path, how, "misbehaves")
    changes.setdefault("total_env_steps", TINY.batch_size * 12)
    return dataclasses.replace(TINY, env_id=env_id, env_workers=0, **changes), marker


def test_a_killed_actor_process_is_named_and_restarted(tmp_path: pathlib.Path, caplog):
    config, marker = _misbehaving(tmp_path, "kill", max_actor_restarts=1)
    with caplog.at_level("WARNING"):
        report = train(config, progress=False).report
    killed = int(marker.read_text())
    assert report.updates == 12 and report.actor_restarts == 1
    (restarted,) = [s for s in report.actor_stats if s.restarts == 1]
    assert restarted.pid != killed  # a new process took its place
    # The supervisor logged the death with the actor, its pid and the signal.
    assert f"(pid {killed}) ended: killed by signal SIGKILL" in caplog.text
    assert _gone([s.pid for s in report.actor_stats]) == []


def test_an_actor_process_spinning_forever_is_killed_and_named(tmp_path: pathlib.Path):
    config, marker = _misbehaving(tmp_path, "spin", learner_timeout_s=6.0,
                                  total_env_steps=TINY.batch_size * 200)
    assert_spinning_actor_was_killed(train, config, marker, _gone)


def test_an_actor_that_raises_is_restarted_in_its_process(tmp_path: pathlib.Path, caplog):
    config, marker = _misbehaving(tmp_path, "raise", actors_per_process=2, max_actor_restarts=1)
    # The restart's traceback, kept off stderr, is at the supervisor's DEBUG level.
    with caplog.at_level("DEBUG", logger="ppo_async.runtime.supervisor"):
        report = train(config, progress=False).report
    assert report.updates == 12 and report.actor_restarts == 1
    # The process that ran both actors runs the restarted one too.
    assert {s.pid for s in report.actor_stats} == {int(marker.read_text())}
    assert "RuntimeError: the env failed on purpose" in caplog.text
    # The env's code traveled by value; its traceback names its file and shows the line.
    assert 'run_helpers.py", line' in caplog.text and "<dynamic-code>" not in caplog.text
    assert 'raise RuntimeError("the env failed on purpose")' in caplog.text


def test_a_spinning_actor_takes_the_actors_of_its_process_along(tmp_path: pathlib.Path, caplog):
    config, marker = _misbehaving(tmp_path, "spin", actors_per_process=2, max_actor_restarts=1,
                                  learner_timeout_s=6.0)
    with caplog.at_level("WARNING"):
        report = train(config, progress=False).report
    spinning_pid = int(marker.read_text())
    assert report.updates == 12
    # The hung actor was killed with its process; the other actor it ran was reported
    # failed, naming the one it went with, and both run again in one new process.
    assert [s.restarts for s in report.actor_stats] == [1, 1]
    (new_pid,) = {s.pid for s in report.actor_stats}
    assert new_pid != spinning_pid and _gone([spinning_pid, new_pid]) == []
    assert f"(pid {spinning_pid}) was killed with actor" in caplog.text


def test_actors_of_one_process_found_stuck_together_are_restarted_once_each():
    """Two hung actors of one process: killing the first takes the second along and reports
    it; the supervisor then kills the second itself, which voids that report (else the
    second would be restarted twice, the second time killing the first's new process)."""
    import socket
    from multiprocessing.connection import Connection

    from ppo_async.runtime.process_transport import ProcessTransport, _Member, _Process

    transport = ProcessTransport(dataclasses.replace(TINY, actors_per_process=2), None)
    try:
        mine, theirs = socket.socketpair()
        theirs.close()

        def hung_process():
            process = _Process(subprocess.Popen([sys.executable, "-c", "import time; "
                                                 "time.sleep(60)"]),
                               Connection(os.dup(mine.fileno())))
            process.members = {0: _Member(started=True), 1: _Member(started=True)}
            return process

        transport.processes[0] = first = hung_process()
        assert transport.kill_actor(0) and transport.kill_actor(1)
        assert first.process.wait(5) == -signal.SIGKILL
        assert transport.receive(0.0) is None and transport.late_failures() == []
        # Actor 0 alone hung: actor 1 is reported, naming the actor it went with.
        transport.processes[0] = second = hung_process()
        transport.kill_actor(0)
        failure = transport.receive(0.0)
        assert failure.actor_id == 1
        assert f"(pid {second.process.pid}) was killed with actor 0" in str(failure.error)
        assert transport.receive(0.0) is None
    finally:
        transport.stop(1.0)
        mine.close()


_SCRIPT = """
import sys, psutil
from ppo_async import AsyncActorLearnerConfig, train

def on_update(metrics):
    if metrics["update"] == 2:
        print(" ".join(str(c.pid) for c in psutil.Process().children()), flush=True)

config = AsyncActorLearnerConfig(env_id="gymnasium:CartPole-v1", num_actors=2, envs_per_actor=2,
                                 num_steps=8, num_epochs=1, num_minibatches=2,
                                 total_env_steps=10**9, actor_backend="processes")
train(config, progress=False, on_update=on_update)
"""


def test_a_killed_learner_leaves_no_actor_process():
    learner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SCRIPT)],
                               stdout=subprocess.PIPE, text=True)
    try:
        line = learner.stdout.readline()  # written once both actors have sent chunks
        actor_pids = [int(pid) for pid in line.split()]
        assert len(actor_pids) == 2, line
        assert _gone(actor_pids, timeout_s=0.5) == actor_pids  # running
        learner.send_signal(signal.SIGKILL)
        learner.wait(10)
        assert _gone(actor_pids) == [], "actor processes outlived their learner"
    finally:
        learner.kill()
        learner.wait(10)


@pytest.mark.real_layout
def test_an_env_that_cannot_leave_the_process_is_refused_in_processes_and_auto_keeps_it():
    import threading

    lock = threading.Lock()  # held by the factory: it cannot be pickled

    def make(num_envs):
        with lock:
            return MisbehavingEnv(num_envs)  # no marker: it never misbehaves

    register_host_env("held-by-a-lock", make)
    config = dataclasses.replace(TINY, env_id="host:held-by-a-lock", env_workers=0)
    with pytest.raises(ConfigError, match=r"actor_backend='processes': host:held-by-a-lock's "
                                          r"factory cannot be sent to another process \("):
        train(config, progress=False)
    layout = resolve_layout(dataclasses.replace(config, actor_backend="auto"))
    assert (layout.collection, layout.probe) == ("threads", None)
    assert "the env's factory cannot leave this process" in layout.describe()


class _SentByValue:
    """A host env class of this (test) module: its code travels to actor processes by value."""

    def __init__(self, num_envs):
        self.num_envs = num_envs

    def step(self, actions):
        raise NotImplementedError


def _one_env():
    raise NotImplementedError


def test_code_sent_by_value_gets_its_file_back_in_the_actor_process():
    """cloudpickle names the file of code it sends by value ``<dynamic-code>``; registered in
    an actor process, a class's methods, a single-env factory and a class behind a
    ``functools.partial`` get this file back."""
    import functools
    import pickle

    import cloudpickle

    from ppo_async.envs.host import register_single_env
    from ppo_async.envs.registry import host_env_factory
    from ppo_async.envs.payload import host_env_payload, register_host_env_payload

    register_host_env("sent-by-value", _SentByValue)
    register_single_env("single-sent-by-value", _one_env)
    register_host_env("partial-sent-by-value", functools.partial(_SentByValue))
    for name, code_of in [("sent-by-value", lambda factory: factory.step.__code__),
                          ("single-sent-by-value", lambda factory: factory.make_env.__code__),
                          ("partial-sent-by-value", lambda factory: factory.func.step.__code__)]:
        payload = host_env_payload(cloudpickle, f"host:{name}")
        assert payload.filename == __file__
        assert code_of(pickle.loads(payload.factory)).co_filename == "<dynamic-code>"
        register_host_env_payload(payload._replace(name=f"{name}-here"), pickle.loads)
        assert code_of(host_env_factory(f"{name}-here")).co_filename == __file__
        # sent on from here (to env workers), it goes as it came, file included
        assert host_env_payload(cloudpickle, f"host:{name}-here") == payload._replace(
            name=f"{name}-here")


def test_code_from_a_script_gets_the_scripts_file_back(tmp_path: pathlib.Path):
    """A factory defined in the script being run (``__main__``, sent by value whatever
    cloudpickle is told) gets the script's file back, as a module's does: registered from
    its payload, and in an env worker process, whose traceback shows the env's line."""
    script = tmp_path / "my_training_script.py"
    script.write_text(textwrap.dedent("""
        import pickle

        import cloudpickle
        import gymnasium
        import numpy as np

        from ppo_async.envs.payload import host_env_payload, register_host_env_payload
        from ppo_async.envs.registry import host_env_factory, register_host_env
        from ppo_async.envs.workers import EnvWorkerError, EnvWorkers, portable_factory


        class MyEnv:
            observation_shape = (2,)
            action_space = gymnasium.spaces.Discrete(2)

            def __init__(self, num_envs):
                self.num_envs = num_envs

            def reset(self, seed):
                return np.zeros((self.num_envs, 2), np.float32)

            def step(self, actions):
                raise NotImplementedError("the scripted env has no step")


        register_host_env("scripted", MyEnv)
        payload = host_env_payload(cloudpickle, "host:scripted")
        print(pickle.loads(payload.factory).step.__code__.co_filename)
        register_host_env_payload(payload._replace(name="scripted-here"), pickle.loads)
        print(host_env_factory("scripted-here").step.__code__.co_filename)
        pool = EnvWorkers("host:scripted", 2, workers=1, groups=1, observation_shape=(2,),
                          action_space=MyEnv.action_space,
                          payload=portable_factory("host:scripted")[0])
        try:
            pool.reset(0)
            pool.step(np.zeros(2, np.int32))
        except EnvWorkerError as error:
            print(error)
        finally:
            pool.close()
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["<dynamic-code>", str(script)]
    raising = 'raise NotImplementedError("the scripted env has no step")'
    line = [raising in text for text in script.read_text().splitlines()].index(True) + 1
    assert f'File "{script}", line {line}, in step\n    {raising}' in done.stdout


def test_every_xla_flag_of_an_actor_process_is_one_xla_parses(monkeypatch):
    # XLA's parser ignores a token without a leading "--" and every flag after it.
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/xla-dump "
                       "--xla_force_host_platform_device_count=2")
    flags = actor_env_vars()["XLA_FLAGS"].split()
    assert flags == ["--xla_dump_to=/tmp/xla-dump", "--xla_cpu_multi_thread_eigen=false"]
