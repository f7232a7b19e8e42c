"""Actors as Ray processes (`ppo_async.runtime.ray_transport`): the same runs as threads, past the GIL.

Every Ray process here runs on this machine: a private instance that train()
starts and stops, a module-scoped local instance shared by most tests, and a
`ray.cluster_utils.Cluster` of two nodes on this machine. The host envs are
defined in this file and in run_helpers.py; their code travels to the actor
processes by value.
"""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import warnings

import flax.serialization
import numpy as np
import pytest

from ppo_async import (
    ActorError,
    AsyncActorLearnerConfig,
    ConfigError,
    train,
)

from run_helpers import assert_spinning_actor_was_killed, register_misbehaving_env
from timing_cases import RAY_CARTPOLE

ray = pytest.importorskip("ray")

RAY_TINY = AsyncActorLearnerConfig(
    num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=1, num_minibatches=2,
    total_env_steps=2 * 2 * 8 * 6, learner_timeout_s=60.0, seed=0, actor_backend="ray",
    shutdown_timeout_s=20.0,
)
LOCK_STEP = dataclasses.replace(RAY_TINY, max_lead_steps=RAY_TINY.num_steps)
_RUNS: dict[str, bytes] = {}  # params bytes of the lock-step runs, compared across tests


def _bytes(params) -> bytes:
    return flax.serialization.to_bytes(params)


def _wait_gone(pids, timeout_s=10.0) -> list[int]:
    """The pids still alive after ``timeout_s``."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if psutil.pid_exists(pid)
                 and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


# --- no Ray unless asked for ------------------------------------------------------------

def test_importing_ppo_async_does_not_import_ray():
    code = "import sys, ppo_async, ppo_async.train, ppo_async.tools.cli; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_ray_fields_are_validated():
    with pytest.raises(ConfigError, match="actor_backend"):
        AsyncActorLearnerConfig(actor_backend="forks")
    with pytest.raises(ConfigError, match="ray_num_cpus_per_actor"):
        AsyncActorLearnerConfig(actor_backend="ray", ray_num_cpus_per_actor=-1)
    with pytest.raises(ConfigError, match="ray_actor_resources"):
        AsyncActorLearnerConfig(actor_backend="ray", ray_actor_resources=(("", 1),))
    with pytest.raises(ConfigError, match="ray_address"):
        AsyncActorLearnerConfig(actor_backend="ray", ray_address="")
    with pytest.raises(ConfigError, match="actor_device"):
        AsyncActorLearnerConfig(actor_backend="ray", actor_device="cpu:1")
    # config.json stores the pairs as lists; they come back as tuples.
    config = AsyncActorLearnerConfig(actor_backend="ray", ray_actor_resources=[["node_b", 1]])
    assert config.ray_actor_resources == (("node_b", 1),)


def test_without_ray_installed_the_config_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'ppo-async\[ray\]'"):
        AsyncActorLearnerConfig(actor_backend="ray")


# --- a private instance: started and stopped by train() -----------------------------------

def test_lock_step_ray_run_on_a_private_instance_equals_the_thread_run():
    assert not ray.is_initialized()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(LOCK_STEP, progress=False)
    # ray.init fork+execs Ray's processes after JAX started its threads; JAX's
    # deadlock warning does not apply to them (ray_transport.ray_processes_start) and is not shown.
    assert not [w for w in caught if "os.fork() was called" in str(w.message)]
    # train started Ray, so it stopped it, and no actor process is left.
    assert not ray.is_initialized()
    pids = [stats.pid for stats in result.report.actor_stats]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert _wait_gone(pids) == []
    # On a private instance each actor process ran on a core of its own (pin_actor_processes).
    mine = tuple(sorted(os.sched_getaffinity(0)))
    assert sorted(s.cpus for s in result.report.actor_stats) == (
        [(c,) for c in mine[:2]] if len(mine) >= 2 else [mine, mine])
    assert result.report.updates == 6 and result.report.policy_lag_max == 0
    threads = train(dataclasses.replace(LOCK_STEP, actor_backend="threads", sampler="actors"),
                    progress=False)
    assert all(s.cpus == mine for s in threads.report.actor_stats)  # the learner's process
    # The actor processes run XLA with one thread, the thread actors with the
    # learner's settings: the rollouts still agree to the bit.
    assert _bytes(result.params) == _bytes(threads.params)
    _RUNS["private"] = _bytes(result.params)


# --- two nodes on this machine ------------------------------------------------------------

def test_actors_are_placed_on_the_node_with_their_custom_resource():
    from ray.cluster_utils import Cluster

    from ppo_async.runtime.ray_transport import ray_processes_start  # the nodes fork+exec too

    os.environ["RAY_AUTH_MODE"] = "disabled"
    with ray_processes_start():
        cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=1, include_dashboard=False, object_store_memory=100 * 1024**2))
    try:
        with ray_processes_start():
            second = cluster.add_node(num_cpus=2, resources={"actor_node": 2},
                                      object_store_memory=100 * 1024**2)
        cluster.wait_for_nodes()
        config = dataclasses.replace(
            RAY_TINY, ray_address=cluster.address, ray_actor_resources=(("actor_node", 1),),
            total_env_steps=RAY_TINY.batch_size * 8,
        )
        result = train(config, progress=False)
        assert not ray.is_initialized()  # train joined the cluster and left it...
        assert cluster.head_node.remaining_processes_alive()  # ...running
        assert result.report.updates == 8
        assert {stats.node_id for stats in result.report.actor_stats} == {second.node_id}
        assert second.node_id != cluster.head_node.node_id
        assert np.isfinite(result.report.episode_return_mean)
        # An actor that no node can place is refused before it queues forever.
        with pytest.raises(ConfigError, match="ray_actor_resources"):
            train(dataclasses.replace(config, ray_actor_resources=(("actor_node", 5),)),
                  progress=False)
        assert not ray.is_initialized()
    finally:
        cluster.shutdown()


@pytest.mark.slow  # two clusters' starts and four actor processes' JAX imports: about 40 s
def test_a_lost_nodes_actors_restart_on_the_surviving_node_or_fail_naming_it(tmp_path, caplog):
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ppo_async.errors import one_line
    from ppo_async.runtime.ray_transport import ray_processes_start

    os.environ["RAY_AUTH_MODE"] = "disabled"
    node_args = dict(num_cpus=2, resources={"actor_node": 2}, object_store_memory=100 * 1024**2)
    with ray_processes_start():
        cluster = Cluster(initialize_head=True,
                          head_node_args=dict(include_dashboard=False, **node_args))
    try:
        with ray_processes_start():
            ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        head = cluster.head_node.node_id

        @ray.remote(num_cpus=0, resources={"actor_node": 2})
        class Holder:
            def ping(self):
                return True

        def run(max_actor_restarts, run_dir):
            """A run whose actors start on a second node, lost at update 3."""
            with ray_processes_start():
                second = cluster.add_node(**node_args)
            cluster.wait_for_nodes()
            # The head has room for the actors too, held here until the second node is
            # lost: they start there, and restarted actors may land on the head.
            holder = Holder.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
            assert ray.get(holder.ping.remote(), timeout=60)

            def lose_the_node(metrics):
                if metrics["update"] == 3:
                    ray.kill(holder)
                    cluster.remove_node(second, allow_graceful=False)

            config = dataclasses.replace(
                RAY_TINY, ray_address=cluster.address, ray_actor_resources=(("actor_node", 1),),
                total_env_steps=RAY_TINY.batch_size * 8, max_actor_restarts=max_actor_restarts)
            return second.node_id, lambda: train(config, run_dir=run_dir, progress=False,
                                                  on_update=lose_the_node)

        # With restarts: both actors start again on the head, and every update is logged in order.
        lost, train_it = run(1, tmp_path / "restarted")
        with caplog.at_level("WARNING", logger="ppo_async.runtime.supervisor"):
            report = train_it().report
        assert report.updates == 8 and report.actor_restarts == 2
        assert {stats.node_id for stats in report.actor_stats} == {head}
        lines = (tmp_path / "restarted" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["update"] for line in lines] == list(range(1, 9))
        notices = sorted(r.getMessage() for r in caplog.records
                         if r.name == "ppo_async.runtime.supervisor")
        assert len(notices) == 2
        for actor_id, notice in enumerate(notices):
            assert notice.startswith(f"actor {actor_id} failed; restarting it (restart 1 of 1): "
                                     f"RayNodeLostError: Ray node {lost} (")
            assert "was lost, and with it actors 0, 1 (traceback in " in notice

        # Without: the run fails in one line naming the node and its actors.
        lost, train_it = run(0, tmp_path / "failed")
        with pytest.raises(ActorError) as info:
            train_it()
        assert re.fullmatch(
            rf"actor [01] failed: RayNodeLostError: Ray node {lost} \([^()]+\) was lost, and "
            r"with it actors 0, 1", one_line(info.value)), one_line(info.value)
    finally:
        ray.shutdown()
        cluster.shutdown()


# --- a local instance shared by the tests below -------------------------------------------

@pytest.fixture(scope="module")
def ray_local():
    from ppo_async.runtime.ray_transport import ray_processes_start  # as train's ray.init

    os.environ["RAY_AUTH_MODE"] = "disabled"
    with ray_processes_start():
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2,
                 log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _no_run_actors_alive(result_or_pids):
    pids = result_or_pids
    assert _wait_gone(pids) == [], "actor processes outlived the run"


def test_two_lock_step_ray_runs_are_byte_identical(ray_local):
    first = train(LOCK_STEP, progress=False)
    assert ray.is_initialized()  # the caller's Ray is left as it was
    _no_run_actors_alive([s.pid for s in first.report.actor_stats])
    # (test_runtime shows that another seed gives other params: the check can fail.)
    if "private" in _RUNS:
        assert _bytes(first.params) == _RUNS["private"]
    else:  # run alone
        second = train(LOCK_STEP, progress=False)
        assert _bytes(first.params) == _bytes(second.params)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnasium:CartPole-v1"])
def test_exact_lag_ray_actors_give_the_bytes_of_thread_actors(ray_local, env_id):
    config = dataclasses.replace(RAY_TINY, env_id=env_id, exact_policy_lag=1, num_actors=3,
                                 envs_per_actor=1, num_minibatches=1, ray_num_cpus_per_actor=0.5)
    over_ray = train(config, progress=False)
    # Ray actors are processes of one actor each: they call their policy alone, as thread
    # actors do without batched inference (a batched call gives other bits, though a
    # batched run is as fixed by its seed).
    threads = train(dataclasses.replace(config, actor_backend="threads", batch_inference=False,
                                        sampler="actors"), progress=False)
    assert _bytes(over_ray.params) == _bytes(threads.params)
    assert over_ray.report.policy_lag_counts == threads.report.policy_lag_counts == {
        0: 3, 1: 3 * (config.num_updates - 1)}


def test_two_ray_actors_learn_cartpole_with_the_lag_bound(ray_local):
    """Timing-dependent (tests/timing_cases.py): 10 reruns ended between 177.2
    and 371.2 (median 267.7), lag max 2 in each (experiments/timing_spread.py,
    2-core machine under a load of 5-7); a random policy scores about 22, so
    the bound of 100 is far below the spread and far above chance."""
    config = RAY_CARTPOLE
    assert config == dataclasses.replace(  # RAY_TINY's settings but the run's size
        RAY_TINY, envs_per_actor=4, num_steps=32, num_epochs=4, num_minibatches=4,
        total_env_steps=60_000, max_lead_steps=3 * 32,
    )
    report = train(config, progress=False).report
    assert report.updates == config.num_updates
    assert report.policy_lag_max <= config.lead_steps // config.num_steps - 1
    print(f"CartPole-v1, 2 Ray actors, {config.total_env_steps} steps: "
          f"return {report.episode_return_mean:.1f}, lag max {report.policy_lag_max}")
    assert report.episode_return_mean > 100, report.episode_return_mean


def _misbehaving_env(tmp_path: pathlib.Path, how: str) -> tuple[str, pathlib.Path]:
    return register_misbehaving_env(tmp_path, how, "scripted")


def _host_config(env_id: str, **changes) -> AsyncActorLearnerConfig:
    changes.setdefault("total_env_steps", RAY_TINY.batch_size * 16)
    # The env steps in the actor's own process, which these tests kill or stall; env
    # workers' own faults are tests/envs/test_env_workers.py's.
    changes.setdefault("env_workers", 0)
    return dataclasses.replace(RAY_TINY, env_id=env_id, **changes)


def test_a_killed_actor_process_is_restarted_and_the_run_completes(ray_local, tmp_path):
    env_id, marker = _misbehaving_env(tmp_path, "kill")
    report = train(_host_config(env_id, max_actor_restarts=1), progress=False).report
    killed_pid = int(marker.read_text())
    assert report.updates == 16
    assert report.actor_restarts == 1
    (restarted,) = [s for s in report.actor_stats if s.restarts == 1]
    assert restarted.pid != killed_pid  # a new process took its place
    assert report.policy_lag_max <= RAY_TINY.max_lead_chunks - 1
    _no_run_actors_alive([s.pid for s in report.actor_stats])


def test_a_killed_actor_process_without_restarts_is_named(ray_local, tmp_path):
    env_id, marker = _misbehaving_env(tmp_path, "kill")
    config = _host_config(env_id, max_actor_restarts=0, learner_timeout_s=20.0,
                          total_env_steps=RAY_TINY.batch_size * 200)
    with pytest.raises(ActorError, match=r"actor \d failed") as info:
        train(config, progress=False)
    raised_at = time.time()
    killed_pid = int(marker.read_text())
    assert f"actor {info.value.actor_id}'s process (pid {killed_pid}) ended" in str(info.value)
    assert isinstance(info.value.__cause__, ray.exceptions.RayActorError)
    # Found at once (not by the timeout), and well within learner_timeout_s plus a few seconds.
    assert raised_at - marker.stat().st_mtime < config.learner_timeout_s + 5


def test_an_actor_spinning_forever_is_killed_and_named(ray_local, tmp_path):
    env_id, marker = _misbehaving_env(tmp_path, "spin")
    config = _host_config(env_id, learner_timeout_s=6.0, total_env_steps=RAY_TINY.batch_size * 200)
    assert_spinning_actor_was_killed(train, config, marker, _wait_gone)


def test_a_spinning_actor_is_killed_and_restarted_under_the_budget(ray_local, tmp_path):
    env_id, _ = _misbehaving_env(tmp_path, "spin")
    config = _host_config(env_id, learner_timeout_s=6.0, max_actor_restarts=1)
    report = train(config, progress=False).report
    assert report.updates == 16 and report.actor_restarts == 1
    _no_run_actors_alive([s.pid for s in report.actor_stats])


def test_a_ray_run_resumed_from_its_checkpoint_equals_the_uninterrupted_run(ray_local, tmp_path):
    def stop_at_four(metrics):
        if metrics["update"] == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(LOCK_STEP, run_dir=tmp_path, progress=False, on_update=stop_at_four)
    # The actors' env states came back from their processes into the checkpoint.
    resumed = train(LOCK_STEP, resume_from=tmp_path, progress=False)
    assert resumed.report.updates == 6
    whole = _RUNS.get("private") or _bytes(
        train(dataclasses.replace(LOCK_STEP, actor_backend="threads", sampler="actors"),
              progress=False).params)
    assert _bytes(resumed.params) == whole


def test_cli_trains_with_ray_actors(ray_local, tmp_path, capsys):
    from ppo_async.tools.cli import main

    main(["train", "--actor-backend", "ray", "--num-actors", "2", "--envs-per-actor", "2",
          "--num-steps", "8", "--num-epochs", "1", "--num-minibatches", "2",
          "--total-env-steps", "64", "--no-progress", "--run-root", str(tmp_path)])
    assert "final return" in capsys.readouterr().out
    (run_dir,) = tmp_path.iterdir()
    summary = (run_dir / "summary.json").read_text()
    assert '"node_id": "' in summary and '"node_id": ""' not in summary
