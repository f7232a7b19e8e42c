"""`ppo_async.runtime.layout`: every layout field decided once, set fields obeyed, the
decision visible (config.json, summary.json, ``--dry-run``)."""

import dataclasses
import json
import time

import numpy as np
import pytest

from ppo_async import AsyncActorLearnerConfig, ConfigError, train
from ppo_async.envs.registry import register_host_env
from ppo_async.runtime import layout
from ppo_async.runtime.layout import EnvProbe, Machine, probe_host_env, resolve_layout

pytestmark = pytest.mark.real_layout  # auto chooses here as it does outside the suite

HOST = AsyncActorLearnerConfig(env_id="gymnasium:CartPole-v1", num_actors=2, envs_per_actor=2,
                               num_steps=8, num_epochs=1, num_minibatches=2,
                               total_env_steps=2 * 2 * 8 * 3)
TWO_CORES = Machine(cores=2)


def probe(step_us: float) -> EnvProbe:
    return EnvProbe(step_us=step_us, cpu_share=1.0, steps=10, seconds=0.01)


class _Envs:
    """Two envs whose step sleeps (``sleep_s``) or computes (``spin_s``) for a while."""

    sleep_s, spin_s = 0.0, 0.0

    def __init__(self, num_envs):
        self.num_envs, self.observation_shape = num_envs, (3,)
        self.action_space = type("Discrete", (), {"n": 2})()

    def reset(self, seed):
        return np.zeros((self.num_envs, 3), np.float32)

    def step(self, actions):
        time.sleep(self.sleep_s)
        end = time.perf_counter() + self.spin_s
        while time.perf_counter() < end:
            pass
        zeros = np.zeros(self.num_envs, np.float32)
        obs = np.zeros((self.num_envs, 3), np.float32)
        return obs, zeros, zeros.astype(bool), zeros.astype(bool), obs


def test_auto_chooses_from_the_env_and_the_machine():
    jitted = AsyncActorLearnerConfig()
    assert resolve_layout(jitted, TWO_CORES).collection == "learner"
    free = resolve_layout(dataclasses.replace(jitted, exact_policy_lag=None), TWO_CORES)
    assert (free.collection, free.sampler) == ("threads", "shared")  # one thread collects all
    # A host env: actor processes, one per core, whatever its step costs (shown, not used).
    for step_us in (500.0, 1.0):
        host = resolve_layout(HOST, TWO_CORES, probe=probe(step_us))
        assert (host.collection, host.actors_per_process, host.num_processes) == (
            "processes", 1, 2)
        assert f"env step {step_us:.0f} us, 100% on a CPU; 2 cores" in host.describe()
    assert resolve_layout(HOST, Machine(cores=1), probe=probe(500.0)).collection == "threads"
    on_gpu = dataclasses.replace(HOST, actor_device="gpu:0")  # not checked until a run
    assert resolve_layout(on_gpu, TWO_CORES, probe=probe(500.0)).collection == "threads"
    assert resolve_layout(dataclasses.replace(HOST, ray_address="auto"),
                          TWO_CORES).collection == "ray"
    many = resolve_layout(dataclasses.replace(HOST, num_actors=32, envs_per_actor=1,
                                              total_env_steps=32 * 8), TWO_CORES, probe=probe(10.0))
    assert (many.collection, many.actors_per_process, many.sampler, many.batch_inference) == (
        "processes", 16, "shared", True)  # 16 a process: the shared sampler


def test_a_field_the_user_set_is_obeyed():
    threads = resolve_layout(dataclasses.replace(HOST, actor_backend="threads"), TWO_CORES,
                             probe=probe(500.0))
    assert (threads.collection, threads.probe) == ("threads", None)  # nothing measured
    alone = resolve_layout(dataclasses.replace(HOST, num_actors=32, envs_per_actor=1,
                                               total_env_steps=32 * 8, sampler="actors",
                                               batch_inference=False, actor_backend="threads"),
                           TWO_CORES, probe=probe(10.0))
    assert (alone.collection, alone.sampler, alone.batch_inference) == ("threads", "actors", False)
    per_process = resolve_layout(dataclasses.replace(HOST, actors_per_process=2), TWO_CORES)
    assert (per_process.collection, per_process.num_processes) == ("processes", 1)
    jitted = dataclasses.replace(AsyncActorLearnerConfig(), sampler="actors")
    assert resolve_layout(jitted, TWO_CORES).collection == "threads"


def test_a_pinned_config_resolves_to_the_same_layout_without_measuring(monkeypatch):
    for config, measured in ((AsyncActorLearnerConfig(), None), (HOST, probe(500.0)),
                             (HOST, probe(10.0)),
                             (dataclasses.replace(HOST, env_workers=1), None)):
        decided = resolve_layout(config, TWO_CORES, probe=measured)
        monkeypatch.setattr(layout, "probe_host_env", lambda config: pytest.fail("measured"))
        again = resolve_layout(decided.pin(config), TWO_CORES)
        monkeypatch.undo()
        assert dataclasses.replace(again, reason="", probe=None) == dataclasses.replace(
            decided, reason="", probe=None), config.env_id


def test_the_probe_measures_a_waiting_and_a_computing_env():
    sleeping = type("Sleeping", (_Envs,), {"sleep_s": 0.001})
    spinning = type("Spinning", (_Envs,), {"spin_s": 0.0004})
    register_host_env("layout-sleeping", sleeping)
    register_host_env("layout-spinning", spinning)
    start = time.perf_counter()
    waits = probe_host_env(dataclasses.replace(HOST, env_id="host:layout-sleeping"))
    computes = probe_host_env(dataclasses.replace(HOST, env_id="host:layout-spinning"))
    assert time.perf_counter() - start < 2 * layout.PROBE_BUDGET_S + 1.0
    assert waits.step_us >= 400 and computes.step_us >= 150  # 1 and 0.4 ms a step over 2 envs
    # The share of a step spent on a CPU: the wait's is the smaller, however loaded the machine.
    assert waits.cpu_share < 0.2 and computes.cpu_share > 2 * waits.cpu_share
    assert waits.steps >= 10 and computes.steps >= 10


def test_set_fields_that_cannot_work_are_refused_in_one_line():
    import threading

    lock = threading.Lock()

    def make(num_envs):
        with lock:  # the factory holds a lock: it cannot be sent to another process
            return _Envs(num_envs)

    register_host_env("layout-locked", make)
    locked = dataclasses.replace(HOST, env_id="host:layout-locked")
    with pytest.raises(ConfigError, match="actor_backend='processes': host:layout-locked's "
                                          "factory cannot be sent"):
        resolve_layout(dataclasses.replace(locked, actor_backend="processes"), TWO_CORES)
    auto = resolve_layout(locked, TWO_CORES)
    assert auto.collection == "threads" and "cannot leave this process" in auto.reason
    with pytest.raises(ConfigError, match="env_workers=4: 2 groups of 4 env workers"):
        resolve_layout(dataclasses.replace(HOST, envs_per_actor=4, env_workers=4), TWO_CORES)


def test_the_layout_is_recorded_and_shown(tmp_path, capsys):
    from ppo_async.tools.cli import main

    result = train(AsyncActorLearnerConfig(num_steps=8, total_env_steps=2 * 4 * 8 * 2),
                   run_dir=tmp_path / "run", progress=False)
    assert result.report.layout["collection"] == "learner"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["layout"]["collection"] == "learner" and summary["layout"]["reason"]
    fields = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (fields["actor_backend"], fields["sampler"]) == ("threads", "learner")  # pinned
    main(["train", "--dry-run", "--run-root", str(tmp_path / "none"), "--env-id", "Acrobot-v1"])
    assert capsys.readouterr().out.startswith(
        "layout: the learner's program collects 2 x 4 envs, exact lag 1 (")
    assert not (tmp_path / "none").exists()
