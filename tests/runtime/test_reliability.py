"""Runs that survive: checkpoints by default, resume that continues the same run,
faults named within the timeout, safe run directories, one-line CLI errors.

Each test backs one promise of docs/reliability.md (summed up in the guide's
docs/guide/checkpoints.md and docs/guide/troubleshooting.md).
"""

import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import flax.serialization
import flax.traverse_util
import jax
import numpy as np
import pytest

from ppo_async import (
    ActorError,
    AsyncActorLearnerConfig,
    ConfigError,
    LearnerTimeoutError,
    train,
)
from ppo_async.core.update import LearningRateSchedule, continue_schedule, default_schedule
from ppo_async.envs.host import HostStep
from ppo_async.envs.registry import register_host_env
from ppo_async.runtime.actor import current_actor
from ppo_async.runs.checkpoint import CheckpointWarning, encode_checkpoint, list_checkpoints
from ppo_async.resume import TopologyChangeWarning
from ppo_async.runs.run_dir import ERROR_FILE, unique_run_dir, write_atomically
from ppo_async.train import ShutdownTimeoutError, TrainingInterrupted

from run_helpers import break_actor_once, interrupt_at, patch_rollout

TINY = AsyncActorLearnerConfig(
    num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=1, num_minibatches=2,
    total_env_steps=2 * 2 * 8 * 6, learner_timeout_s=30.0, shutdown_timeout_s=10.0, seed=0,
)
CLI_TINY = ["--num-actors", "2", "--envs-per-actor", "2", "--num-steps", "8",
            "--num-epochs", "1", "--num-minibatches", "2", "--no-progress"]


def _updates(run_dir):
    return [json.loads(line)["update"] for line in (run_dir / "metrics.jsonl").open()]


def _wait_for_run_threads(timeout_s=30.0):
    from conftest import run_threads_alive

    deadline = time.monotonic() + timeout_s
    while run_threads_alive() and time.monotonic() < deadline:
        time.sleep(0.05)


# --- checkpoints by default, and resume that continues the same run ---------------


def test_a_default_cli_run_can_be_resumed_and_evaluated(tmp_path, capsys):
    from ppo_async.tools.cli import main

    # No checkpoint flag: the run checkpoints at its end by default.
    main(["train", *CLI_TINY, "--total-env-steps", "96", "--run-root", str(tmp_path)])
    (run_dir,) = tmp_path.iterdir()
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["ckpt_000000003.msgpack"]
    # --resume=DIR (with "=") continues this run with its own config.json as defaults.
    main(["train", f"--resume={run_dir}", "--total-env-steps", "160"])
    assert _updates(run_dir) == [1, 2, 3, 4, 5]
    segments = json.loads((run_dir / "segments.json").read_text())
    assert [s["start_update"] for s in segments] == [0, 3]
    assert [s["config"]["total_env_steps"] for s in segments] == [96, 160]
    assert segments[1]["config"]["envs_per_actor"] == 2  # from config.json, not the default 4
    assert "(64 in this segment, from update 3)" in capsys.readouterr().out
    main(["eval", str(run_dir), "--num-episodes", "2"])
    assert "CartPole-v1: return" in capsys.readouterr().out


def test_learning_rate_on_resume_sets_the_new_initial_rate(tmp_path, caplog):
    from ppo_async.tools.cli import main

    main(["train", *CLI_TINY, "--total-env-steps", "96", "--run-root", str(tmp_path)])
    (run_dir,) = tmp_path.iterdir()
    # A finished run (rate 0 at its end), extended to 6 updates with a new initial rate.
    main(["train", "--resume", str(run_dir), "--total-env-steps", "192", "--learning-rate", "1e-3"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    rates = [r["learning_rate"] for r in records if r["update"] > 3]
    assert rates == pytest.approx([1e-3 * (1 - u / 6) for u in (3, 4, 5)], rel=1e-6)
    (line,) = [r.getMessage() for r in caplog.records if "learning rate" in r.getMessage()]
    assert "changes from 0 to 0.0005" in line


def test_resume_flag_without_a_directory_is_one_line(capsys):
    from ppo_async.tools.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--total-env-steps", "64", "--resume"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--resume needs a run directory" in err


def test_resume_refuses_run_root_and_names_the_flag_when_there_is_no_checkpoint(tmp_path, capsys):
    from ppo_async.tools.cli import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(TINY.to_dict()))
    for args, expected in [
        (["--run-root", str(tmp_path / "elsewhere")], "--run-root with --resume"),
        ([f"--run-root={tmp_path / 'elsewhere'}"], "--run-root with --resume"),
        # Named for CLI and Python users alike.
        ([], "nothing to resume (ppo-async train --resume, train(resume_from=...))"),
    ]:
        with pytest.raises(SystemExit) as info:
            main(["train", "--resume", str(run_dir), "--no-progress", *args])
        err = capsys.readouterr().err.strip()
        assert info.value.code == 2 and len(err.splitlines()) == 1 and expected in err, err
    assert not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json"]


def test_resume_with_another_topology_starts_fresh_episodes_with_a_warning(tmp_path):
    with pytest.raises(TrainingInterrupted):
        train(TINY, run_dir=tmp_path, progress=False, on_update=interrupt_at(3))
    # The budget counts env steps: 3 updates of 32, then 3 of 48.
    wider = dataclasses.replace(TINY, num_actors=3, envs_per_actor=2, num_minibatches=3,
                                total_env_steps=3 * 32 + 3 * 48)
    with pytest.warns(TopologyChangeWarning, match=r"actors \[2\] start fresh episodes"):
        report = train(wider, resume_from=tmp_path, progress=False).report
    assert report.updates == 6 and report.env_steps == 240 and len(report.actor_stats) == 3
    narrower = dataclasses.replace(TINY, num_actors=1, envs_per_actor=4,
                                   total_env_steps=240 + 2 * 32)
    with pytest.warns(TopologyChangeWarning, match=r"actors \[0\] start fresh episodes"):
        report = train(narrower, resume_from=tmp_path, progress=False).report
    assert report.updates == 8 and report.env_steps == 304


def test_an_extended_budget_re_plans_the_learning_rate_from_the_initial_rate(tmp_path):
    seen = []
    config = dataclasses.replace(TINY, total_env_steps=TINY.batch_size * 10)
    with pytest.raises(TrainingInterrupted):
        train(config, run_dir=tmp_path, progress=False,
              on_update=lambda m: (seen.append(m), interrupt_at(6)(m)))
    longer = dataclasses.replace(config, total_env_steps=config.batch_size * 20)
    train(longer, resume_from=tmp_path, progress=False, on_update=seen.append)
    rates = [m["learning_rate"] for m in seen]
    # Update u+1 starts at optimizer step 2u: the first segment follows the
    # 10-update plan, the second the 20-update plan, as if planned so from the start.
    planned = ([config.learning_rate * (1 - u / 10) for u in range(6)]
               + [config.learning_rate * (1 - u / 20) for u in range(6, 20)])
    assert rates == pytest.approx(planned, rel=1e-5)


def test_continue_schedule_keeps_an_unchanged_plan_and_re_plans_a_new_one():
    schedule = default_schedule(
        dataclasses.replace(TINY, total_env_steps=TINY.batch_size * 10).update_options())
    assert schedule == LearningRateSchedule(0, TINY.learning_rate, 20)
    rate = TINY.learning_rate
    assert continue_schedule(schedule, 20, rate, rate) is schedule
    # An older version's continued piece is kept too, when nothing changed.
    piece = LearningRateSchedule(8, 0.6 * rate, 20)
    assert continue_schedule(piece, 20, rate, rate) is piece
    # A new end, or a new initial rate, re-plans from step 0.
    assert continue_schedule(piece, 40, rate, rate) == LearningRateSchedule(0, rate, 40)
    assert continue_schedule(schedule, 20, 2 * rate, rate) == LearningRateSchedule(0, 2 * rate, 20)
    extended = continue_schedule(schedule, 40, rate, rate)
    for step in (8, 9, 20, 39, 40):
        assert float(extended(step)) == pytest.approx(rate * (1 - step / 40), rel=1e-5, abs=1e-9)


def test_progress_and_throughput_count_from_the_resume_point(tmp_path):
    with pytest.raises(TrainingInterrupted):
        train(TINY, run_dir=tmp_path, progress=False, on_update=interrupt_at(4))
    report = train(TINY, resume_from=tmp_path, progress=False).report
    assert report.start_update == 4 and report.updates == 6
    assert report.segment_env_steps == 2 * TINY.batch_size
    assert report.env_steps_per_s == pytest.approx(report.segment_env_steps / report.wall_time_s)


def test_a_checkpoint_with_a_malformed_counter_falls_back_like_a_damaged_file(tmp_path):
    with pytest.raises(TrainingInterrupted):
        train(dataclasses.replace(TINY, checkpoint_every_updates=2), run_dir=tmp_path,
              progress=False, on_update=interrupt_at(4))
    newest = list_checkpoints(tmp_path / "checkpoints")[-1]
    content = flax.serialization.msgpack_restore(newest.read_bytes())
    payload = flax.serialization.msgpack_restore(content["payload"])
    # Sound bytes, checksum and all, but nonsense inside: more recent returns than episodes.
    payload["counters"]["recent_count"] = 10_000
    state = flax.serialization.from_state_dict(payload["state"], payload["state"])
    newest.write_bytes(encode_checkpoint(
        step=payload["step"], state=state, counters=payload["counters"],
        config_dict=json.loads(payload["config_json"]),
    ))
    with pytest.warns(CheckpointWarning, match="recent_count"):
        resumed = train(TINY, resume_from=tmp_path, progress=False)
    assert resumed.report.start_update == 2 and resumed.report.updates == 6


def test_resuming_a_finished_run_without_a_larger_budget_is_a_config_error(tmp_path):
    train(TINY, run_dir=tmp_path, progress=False)
    with pytest.raises(ConfigError, match="total_env_steps.*larger"):
        train(TINY, resume_from=tmp_path, progress=False)


# --- faults named within the timeout ------------------------------------------------


@pytest.mark.parametrize("sampler", ["actors", None], ids=["a-thread-each", "one-thread"])
def test_a_hung_actor_is_named_within_the_timeout_whatever_the_lead(monkeypatch, sampler):
    release = threading.Event()

    def wrap(rollout):
        def maybe_hang(params, carry):
            if current_actor() == 1:
                release.wait(120)  # an env that never returns (until the test ends)
            return rollout(params, carry)
        return maybe_hang

    patch_rollout(monkeypatch, wrap)
    # A long lead: with a thread each, actor 0 keeps sending, so a learner that times out
    # on "any experience" would never notice. From one thread (the default for gymnax),
    # actor 0 waits with it, and both are named, with the thread and the actor it is in.
    config = dataclasses.replace(TINY, learner_timeout_s=3.0, max_lead_steps=50 * 8,
                                 total_env_steps=TINY.batch_size * 100, sampler=sampler)
    start = time.monotonic()
    try:
        with pytest.raises(LearnerTimeoutError, match="actor 1 sent no experience"
                           if sampler else "actor 0, actor 1 sent no experience") as info:
            train(config, progress=False)
        elapsed = time.monotonic() - start
    finally:
        release.set()
        _wait_for_run_threads()
    assert info.value.actor_ids == ((1,) if sampler else (0, 1))
    assert elapsed < config.learner_timeout_s + 8  # compile, then the timeout; no long join
    thread = "ppo-actor-1 (" if sampler else "ppo-actors-0-1 (in actor 1's chunk"
    assert any(thread in note and "maybe_hang" in note for note in info.value.__notes__)


def _block_final_evaluation(monkeypatch, final_version, action):
    from ppo_async.runtime.evaluate import Evaluator

    original = Evaluator.evaluate_broadcast

    def evaluate_broadcast(self, broadcast, seed=0):
        if broadcast.version == final_version:
            action()
        return original(self, broadcast, seed)

    monkeypatch.setattr(Evaluator, "evaluate_broadcast", evaluate_broadcast)


def test_a_finished_run_writes_its_results_before_reporting_a_thread_that_would_not_stop(
    tmp_path, monkeypatch
):
    # The final evaluation hangs inside a host env's step (its own instance, not an actor's).
    from ppo_async.envs.host_backend import HostEpisodes

    release, final_started = threading.Event(), threading.Event()
    _block_final_evaluation(monkeypatch, 6, final_started.set)
    original_step = HostEpisodes.step

    def step(self, action):
        if final_started.is_set():
            release.wait(120)
        return original_step(self, action)

    monkeypatch.setattr(HostEpisodes, "step", step)
    config = dataclasses.replace(TINY, env_id="gymnasium:CartPole-v1", eval_every_updates=3,
                                 shutdown_timeout_s=1.0)
    try:
        with pytest.raises(ShutdownTimeoutError, match="ppo-evaluator") as info:
            train(config, run_dir=tmp_path, progress=False)
    finally:
        release.set()
        _wait_for_run_threads()
    assert info.value.result.report.updates == 6
    assert (tmp_path / "params.msgpack").stat().st_size > 0
    assert json.loads((tmp_path / "summary.json").read_text())["updates"] == 6
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["ckpt_000000006.msgpack"]


def test_an_evaluator_failure_while_the_run_stops_is_reported(tmp_path, monkeypatch):
    def explode():
        raise RuntimeError("final evaluation exploded")

    _block_final_evaluation(monkeypatch, 6, explode)
    config = dataclasses.replace(TINY, eval_every_updates=3)
    with pytest.raises(ActorError, match="evaluator thread failed") as info:
        train(config, run_dir=tmp_path, progress=False)
    assert "final evaluation exploded" in str(info.value)
    assert (tmp_path / "params.msgpack").is_file()  # the finished run's results are kept


def _slow_compile(monkeypatch):
    """The warm-up's compile takes 8 s: the update's first call on arrays (thread
    actors), or the compile of the learner's program, which the caller's thread has
    traced and lowered (its trace of the update is not slowed)."""
    train_module = importlib.import_module("ppo_async.train")
    original_make, original_warm_up = train_module.make_update_fn, train_module.warm_up_loop

    def slow_update_fn(*args, **mesh):
        update = original_make(*args, **mesh)
        calls = {"n": 0}

        def slow(state, batch):
            if not isinstance(batch.reward, jax.core.Tracer):
                calls["n"] += 1
                if calls["n"] == 1:
                    time.sleep(8)
            return update(state, batch)
        return slow

    def slow_warm_up_loop(warm_up):
        time.sleep(8)
        original_warm_up(warm_up)

    monkeypatch.setattr(train_module, "make_update_fn", slow_update_fn)
    monkeypatch.setattr(train_module, "warm_up_loop", slow_warm_up_loop)
    return train_module


def test_an_actor_failing_during_start_up_is_reported_without_waiting_for_the_compile(
    monkeypatch
):
    _slow_compile(monkeypatch)

    def wrap(rollout):
        def broken(params, carry):
            raise RuntimeError("env broke at once")
        return broken

    patch_rollout(monkeypatch, wrap)
    start = time.monotonic()
    with pytest.raises(ActorError, match="env broke at once"):
        train(dataclasses.replace(TINY, shutdown_timeout_s=1.0), progress=False)
    assert time.monotonic() - start < 6
    _wait_for_run_threads()


def test_ctrl_c_during_start_up_does_not_wait_for_the_compile(monkeypatch):
    train_module = _slow_compile(monkeypatch)

    def interrupted_init(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "init_params", interrupted_init)
    config = dataclasses.replace(TINY, shutdown_timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        train(config, progress=False)
    assert time.monotonic() - start < 6
    _wait_for_run_threads()


def test_a_ctrl_c_whose_interrupt_was_dropped_still_stops_the_run(monkeypatch):
    """A SIGINT whose KeyboardInterrupt is dropped (raised inside a garbage-collector
    callback, as JAX has one: Python ignores it) stops the run at the next update,
    and prints no traceback of that callback."""
    import gc

    updates, reported = [], []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: reported.append(report.exc_type))
    hook = sys.unraisablehook

    def interrupted_collection(phase, info):
        if phase == "start":
            signal.raise_signal(signal.SIGINT)

    def on_update(metrics):
        updates.append(metrics["update"])
        if len(updates) == 2:
            gc.callbacks.append(interrupted_collection)
            try:
                gc.collect()  # the KeyboardInterrupt is raised in the callback and dropped
            finally:
                gc.callbacks.remove(interrupted_collection)

    with pytest.raises(TrainingInterrupted):
        train(dataclasses.replace(TINY, total_env_steps=TINY.num_actors * TINY.envs_per_actor
                                  * TINY.num_steps * 50), progress=False, on_update=on_update)
    assert len(updates) == 2
    assert reported == []  # not printed as "Exception ignored in ..."
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    assert sys.unraisablehook is hook
    _wait_for_run_threads()


def test_host_envs_are_closed_on_every_exit(monkeypatch):
    made, closed = [], []

    class CountedEnv:
        observation_shape = (2,)
        import gymnasium
        action_space = gymnasium.spaces.Discrete(2)

        def __init__(self, num_envs):
            self.num_envs = num_envs
            self.t = np.zeros(num_envs)
            made.append(self)

        def reset(self, seed):
            return np.zeros((self.num_envs, 2))

        def step(self, actions):
            self.t += 1
            done = self.t >= 5
            self.t[done] = 0
            obs = np.stack([self.t, self.t], -1)
            return HostStep(obs, np.ones(self.num_envs), done, np.zeros(self.num_envs, bool), obs)

        def close(self):
            closed.append(self)

    register_host_env("counted", CountedEnv)
    break_actor_once(monkeypatch, actor_id=0, chunk=2)
    # In the actor's thread: the batches made are counted in this process.
    config = dataclasses.replace(TINY, env_id="host:counted", max_actor_restarts=1,
                                 env_workers=0)
    report = train(config, progress=False).report
    assert report.actor_restarts == 1
    # One probe, two actors, one restarted actor: every env batch made was closed.
    assert len(made) == 4 and sorted(map(id, closed)) == sorted(map(id, made))


# --- the run directory ---------------------------------------------------------------


def test_a_fresh_run_into_a_used_directory_is_a_config_error(tmp_path):
    (tmp_path / "notes.txt").write_text("someone's")
    with pytest.raises(ConfigError, match="not empty.*resume"):
        train(TINY, run_dir=tmp_path, progress=False)


def _ray_with_one_cpu(monkeypatch):
    """Ray as a one-CPU cluster, without starting it: the resource check refuses 2 actors."""
    import ray

    from ppo_async.runtime import ray_transport

    monkeypatch.setattr(ray_transport, "connect", lambda ray, config: False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0})


def _refused(capsys, args):
    from ppo_async.tools.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_a_refused_config_leaves_no_run_directory(tmp_path, capsys, monkeypatch):
    _ray_with_one_cpu(monkeypatch)
    err = _refused(capsys, ["train", *CLI_TINY, "--actor-backend", "ray",
                            "--total-env-steps", "64", "--run-root", str(tmp_path / "runs")])
    assert "ray_num_cpus_per_actor" in err
    assert list((tmp_path / "runs").iterdir()) == []
    # The same from Python, and for a late error of another kind (W&B refusing the login).
    ray_config = dataclasses.replace(TINY, actor_backend="ray")
    with pytest.raises(ConfigError, match="Ray cluster has 1.0 CPU"):
        train(ray_config, run_dir=tmp_path / "python", progress=False)
    monkeypatch.undo()

    def not_logged_in(*args, **kwargs):
        raise ConfigError("wandb: not logged in")

    from ppo_async.runs import run_log
    from ppo_async.runs.wandb_log import WandbSettings

    monkeypatch.setattr(run_log, "WandbRun", not_logged_in)
    with pytest.raises(ConfigError, match="not logged in"):
        train(TINY, run_dir=tmp_path / "python", progress=False, wandb=WandbSettings("p"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_a_refused_resume_leaves_the_run_as_it_was(tmp_path, capsys, monkeypatch):
    from ppo_async.tools.cli import main

    main(["train", *CLI_TINY, "--total-env-steps", "64", "--run-root", str(tmp_path)])
    (run_dir,) = tmp_path.iterdir()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    _ray_with_one_cpu(monkeypatch)
    _refused(capsys, ["train", "--resume", str(run_dir), "--actor-backend", "ray",
                      "--total-env-steps", "128", "--no-progress"])
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_nothing_a_run_writes_follows_a_symlink(tmp_path):
    train(TINY, run_dir=tmp_path / "run", progress=False)
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    for name in ("metrics.jsonl", "config.json"):
        target = tmp_path / "run" / name
        target.unlink()
        target.symlink_to(outside)
        longer = dataclasses.replace(TINY, total_env_steps=TINY.batch_size * 8)
        with pytest.raises(ConfigError, match="symbolic link"):
            train(longer, resume_from=tmp_path / "run", progress=False)
        target.unlink()
        target.write_text("{}" if name == "config.json" else "")
    link = tmp_path / "run" / "params.msgpack"
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_atomically(link, b"x")
    assert outside.read_text() == "precious"


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    write_atomically(path, b"old")

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, b"new contents")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temp file left


def test_run_directories_made_in_the_same_second_are_unique(tmp_path):
    made = []
    threads = [threading.Thread(target=lambda: made.append(unique_run_dir(tmp_path, "same")))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(set(made)) == 8 and all(p.is_dir() for p in made)


def test_metrics_are_strict_json_and_provenance_is_recorded(tmp_path):
    train(TINY, run_dir=tmp_path, progress=False)

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    records = [json.loads(line, parse_constant=refuse)
               for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # CartPole episodes last longer than the first 8-step chunk: no return yet, written as null.
    assert records[0]["episode_return"] is None
    json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    (segment,) = json.loads((tmp_path / "segments.json").read_text())
    provenance = segment["provenance"]
    assert provenance["package_version"] == "0.1.0"
    assert provenance["git_commit"] and provenance["jax_backend"] == "cpu"
    assert provenance["jax_devices"] and provenance["command_line"] and provenance["started_at"]


# --- one-line CLI errors ------------------------------------------------------------------


@pytest.mark.parametrize("args, expected", [
    (["plot", "{empty}"], "no metrics"),
    (["plot", "{empty}/does-not-exist"], "does-not-exist': no such directory; give a run "),
    (["eval", "{empty}"], "no config.json"),
    (["eval", "{empty}/does-not-exist"], "does-not-exist': no such directory; give a run directory"),
    (["enjoy", "{empty}/does-not-exist"], "no such directory"),
    (["train", "--resume", "{empty}/does-not-exist"], "no such directory"),
    (["train", "--resume", "{empty}"], "no config.json"),
    # Bad numbers for eval and enjoy, refused before the run is read.
    (["eval", "{empty}", "--num-episodes", "0"], "--num-episodes 0: must be an integer >= 1"),
    (["eval", "{empty}", "--num-episodes", "-3"], "--num-episodes -3: must be an integer >= 1"),
    (["eval", "{empty}", "--seed", "-1"], "--seed -1: must be an integer >= 0"),
    (["enjoy", "{empty}", "--seed", "-2"], "--seed -2: must be an integer >= 0"),
    (["enjoy", "{empty}", "--fps", "inf"], "--fps inf: must be a finite number > 0"),
    (["enjoy", "{empty}", "--episodes", "0"], "--episodes 0: must be an integer >= 1"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, args, expected):
    from ppo_async.tools.cli import main

    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as info:
        main([a.replace("{empty}", str(tmp_path / "empty")) for a in args])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_ctrl_c_in_eval_says_interrupted(monkeypatch, capsys):
    # A bare KeyboardInterrupt (eval, enjoy, plot) printed "ppo-async: " and nothing else.
    from ppo_async import resume
    from ppo_async.tools.cli import main

    def interrupted(run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(resume, "load_run_config", interrupted)
    with pytest.raises(SystemExit) as info:
        main(["eval", "some-run"])
    assert info.value.code == 130
    assert capsys.readouterr().err.strip() == "ppo-async: interrupted"


def test_unknown_fields_of_a_run_config_are_named_in_one_warning_line(tmp_path, capsys):
    from ppo_async.resume import (
        load_run_config,  # what eval, enjoy and --resume read a run with
    )

    fields = dict(TINY.to_dict(), added_later=1, also_unknown=True)
    (tmp_path / "config.json").write_text(json.dumps(fields))
    assert load_run_config(tmp_path).to_dict() == TINY.to_dict()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ppo-async: warning: ")
    assert "ignoring added_later, also_unknown" in err[0] and "config.json" in err[0]
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_dict()))
    load_run_config(tmp_path)
    assert capsys.readouterr().err == ""  # nothing to say about a config of this version


@pytest.mark.parametrize("field, value", [("learning_rate", -1.0), ("num_steps", "many")])
def test_an_invalid_run_config_names_its_file_as_a_config_files_error_does(tmp_path, capsys,
                                                                           field, value):
    from ppo_async.tools.cli import main

    (tmp_path / "config.json").write_text(json.dumps(dict(TINY.to_dict(), **{field: value})))
    for command in (["eval", str(tmp_path)], ["train", "--resume", str(tmp_path)]):
        with pytest.raises(SystemExit) as info:
            main(command)
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and line.startswith(
            f"ppo-async: invalid configuration: {tmp_path / 'config.json'}: {field}="), line


def test_a_failed_runs_one_line_says_what_the_actor_or_its_env_raised():
    from ppo_async.envs.host import HostEnvError
    from ppo_async.envs.workers import EnvWorkerError
    from ppo_async.errors import one_line

    error = ActorError(1, "Traceback (most recent call last):\n  ...\nHostEnvError: ...\n")
    error.__cause__ = HostEnvError("host:x: obs has shape (4, 3), expected (4, 2)")
    assert one_line(error) == (
        "actor 1 failed: HostEnvError: host:x: obs has shape (4, 3), expected (4, 2)")
    # an env worker's error quotes the worker's traceback: its last line says what broke
    error.__cause__ = EnvWorkerError(
        "host:x: env worker 0 of actor 1 (envs 0-1, pid 7) raised during its step of group 0:"
        "\nTraceback (most recent call last):\n  File \"my_env.py\", line 3, in step\n"
        "RuntimeError: it broke\n")
    assert one_line(error) == (
        "actor 1 failed: EnvWorkerError: host:x: env worker 0 of actor 1 (envs 0-1, pid 7) "
        "raised during its step of group 0: RuntimeError: it broke")
    assert one_line(LearnerTimeoutError("nothing came\nfrom anyone")) == "nothing came"


@pytest.mark.parametrize("args, expected", [
    # A misspelled flag keeps tyro's suggestion.
    (["train", "--num-actor", "4"], ["--num-actor", "perhaps you meant: --num-actors INT",
                                     "see ppo-async train --help"]),
    # enjoy's --episodes and eval's --num-episodes are each the other's alias: listed once.
    (["enjoy", "r", "--episodez", "3"], ["perhaps you meant: --episodes, --num-episodes INT;"]),
    (["train", "--num-actors", "x"], ["Error parsing --num-actors", "'x'", "--num-actors INT"]),
    (["train", "--network", "cnn"], ["invalid choice 'cnn'", "'mlp', 'lstm', 'gru'"]),
    (["eval"], ["Missing from ppo-async eval", "see ppo-async eval --help"]),
    (["eval", "r", "--num-episodes"], ["Missing value for argument '--episodes/--num-episodes'"]),
    (["evaluate", "r"], ["Unrecognized options: evaluate", "train, eval, enjoy, plot",
                         "see ppo-async --help"]),
    ([], ["Missing subcommand", "train, eval, enjoy, plot"]),
])
def test_cli_parse_errors_are_one_line_with_the_suggestion(capsys, args, expected):
    from ppo_async.tools.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("ppo-async: ") and not set(err) & set("╭╰│─"), err
    for part in expected:
        assert part in err, err


def test_a_utf8_error_box_becomes_one_line_too():
    from ppo_async.tools.cli import one_line_parse_error

    # tyro draws this box when stdout's encoding is UTF-8 (pytest's capture is not).
    box = "\n".join([
        "╭─ Unrecognized options ──────────────────────╮",
        "│ Unrecognized options: --num-actor, 4        │",
        "│ ─────────────────────────────────────────── │",
        "│ Perhaps you meant:                          │",
        "│     --num-actors INT                        │",
        "│         Actors (threads or processes). (de- │",
        "│         fault: 2)                           │",
        "│         in ppo-async train --help           │",
        "│ ─────────────────────────────────────────── │",
        "│ For full helptext, run ppo-async --help     │",
        "╰─────────────────────────────────────────────╯",
    ])
    assert one_line_parse_error(box, "ppo-async train --help") == (
        "Unrecognized options: --num-actor, 4; perhaps you meant: --num-actors INT; "
        "see ppo-async train --help")


def test_cli_help_still_prints_the_whole_help(capsys):
    from ppo_async.tools.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    out, err = capsys.readouterr()
    assert err == "" and len(out.splitlines()) > 100 and "--num-actors" in out


def test_cli_help_names_every_option_and_its_real_default(capsys):
    from ppo_async.tools.cli import main

    def help_text(args):
        with pytest.raises(SystemExit):
            main([*args, "--help"])
        return " ".join(capsys.readouterr().out.replace("│", " ").split())

    train_help = help_text(["train"])
    assert "--resume RUN_DIR Continue this run directory from its newest checkpoint" in train_help
    lead = train_help.split("--max-lead-steps")[1].split("--learner-timeout-s")[0]
    assert "(default: (exact_policy_lag + broadcast_every) * num_steps; free-running: " \
        "2 * num_steps * broadcast_every)" in lead and "128" not in lead
    assert "--network {mlp,lstm,gru}" in train_help
    # Optional choices and paths without tyro's "None" among them.
    assert "--preset {cartpole,acrobot," in train_help
    assert "--config FILE A TOML file" in train_help
    assert "{None" not in train_help.split("--preset")[1].split("--resume")[0]
    assert "--wandb-project NAME Also log" in train_help and "--wandb-group GROUP" in train_help
    assert "--env-module MODULE [MODULE ...] Python modules imported before the env id" in train_help
    assert "--torso {auto,none,minatar,nature}" in train_help
    eval_help = help_text(["eval"])
    for description in ("The run directory", "Whole episodes to play", "Seeds the env resets",
                        "Take the most likely action"):
        assert description in eval_help


def test_cli_resume_help_shows_the_runs_own_lead(tmp_path, capsys):
    from ppo_async.tools.cli import main

    config = dataclasses.replace(TINY, max_lead_steps=24)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    with pytest.raises(SystemExit):
        main(["train", "--resume", str(tmp_path), "--help"])
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "(default: 24)" in out.split("--max-lead-steps")[1].split("--learner-timeout-s")[0]


def test_cli_eval_runs_greedy_episodes_of_a_gymnasium_run(tmp_path, capsys):
    from ppo_async.tools.cli import main

    main(["train", "--env-id", "gymnasium:CartPole-v1", *CLI_TINY, "--total-env-steps", "64",
          "--run-root", str(tmp_path)])
    (run_dir,) = tmp_path.iterdir()
    main(["eval", str(run_dir), "--num-episodes", "3"])
    out = capsys.readouterr().out
    assert "gymnasium:CartPole-v1: return" in out and "over 3 episodes" in out


def _damage_params(name, good: bytes) -> bytes:
    """``params.msgpack`` damaged as ``name`` says (the real file's bytes are ``good``)."""
    if name == "truncated":
        return good[: len(good) // 2]
    if name == "empty":
        return b""
    if name == "garbage":
        return b"\xc1 not msgpack at all"
    tree = flax.serialization.msgpack_restore(good)
    if name == "another run's keys":
        return flax.serialization.msgpack_serialize({"params": {"Dense_9": {"kernel": np.ones(3)}}})
    # "another run's shapes": the same keys, one kernel wider (flax alone would load it).
    flat = flax.traverse_util.flatten_dict(tree)
    path = next(iter(flat))
    flat[path] = np.zeros((*np.shape(flat[path])[:-1], np.shape(flat[path])[-1] + 1), np.float32)
    return flax.serialization.msgpack_serialize(flax.traverse_util.unflatten_dict(flat))


def test_a_budget_rounded_down_by_a_percent_or_more_is_noted_and_the_default_is_not():
    from ppo_async.tools.cli import _rounding_note

    # The default budget loses 288 of 500,000 env steps (0.06%) to whole batches of 512.
    assert _rounding_note(AsyncActorLearnerConfig()) is None
    assert _rounding_note(AsyncActorLearnerConfig(total_env_steps=10_240)) is None  # whole
    note = _rounding_note(AsyncActorLearnerConfig(total_env_steps=10_000))  # 272 left out
    assert note is not None and "the run trains 19 updates, 9728 env steps" in note


def test_damaged_or_foreign_params_fall_back_to_the_newest_checkpoint_in_one_line(
        tmp_path, capsys):
    from ppo_async.tools.cli import main

    main(["train", *CLI_TINY, "--total-env-steps", "100", "--run-root", str(tmp_path)])
    (run_dir,) = tmp_path.iterdir()
    # The budget rounds down to whole batches, and the run says so before it trains.
    note = ("ppo-async: note: total_env_steps=100 is not a whole number of batches of 32 env "
            "steps (num_actors * envs_per_actor * num_steps): the run trains 3 updates, 96 "
            "env steps")
    assert capsys.readouterr().err.strip().splitlines() == [note]
    params_file = run_dir / "params.msgpack"
    good = params_file.read_bytes()
    for damage in ("truncated", "empty", "garbage", "another run's keys", "another run's shapes"):
        params_file.write_bytes(_damage_params(damage, good))
        main(["eval", str(run_dir), "--num-episodes", "2"])
        out, err = capsys.readouterr()
        assert "CartPole-v1: return" in out, damage
        (line,) = err.strip().splitlines()
        assert line.startswith(f"ppo-async: warning: {params_file} ") and line.endswith(
            "using the params of the newest valid checkpoint, ckpt_000000003.msgpack (update 3)"
        ), (damage, line)
    main(["enjoy", str(run_dir), "--episodes", "1", "--out", str(tmp_path / "v.gif")])
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    # No checkpoint to fall back to: one line naming the file and the fix, exit code 2.
    for checkpoint in (run_dir / "checkpoints").iterdir():
        checkpoint.unlink()
    for command in ("eval", "enjoy"):
        with pytest.raises(SystemExit) as info:
            main([command, str(run_dir), "--out" if command == "enjoy" else "--seed",
                  str(tmp_path / "v.gif") if command == "enjoy" else "0"])
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and line.startswith(f"ppo-async: invalid configuration: "
                                                        f"{params_file} does not fit"), line
        assert line.endswith("restore params.msgpack from a copy, or train the run again"), line


def test_ctrl_c_in_the_cli_prints_the_update_and_the_resume_command(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "ppo_async.tools.cli", "train", *CLI_TINY,
         "--total-env-steps", str(32 * 100_000), "--run-root", str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("*/metrics.jsonl")) or not (
            next(tmp_path.glob("*/metrics.jsonl")).read_text().count("\n") >= 3
        ):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    (run_dir,) = tmp_path.iterdir()
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "stopped at update" in lines[0] and f"ppo-async train --resume {run_dir}" in lines[0]
    reached = int(lines[0].split("stopped at update ")[1].split(";")[0])
    assert list_checkpoints(run_dir / "checkpoints")[-1].name == f"ckpt_{reached:09d}.msgpack"


def test_ctrl_c_before_the_first_update_says_nothing_was_saved(tmp_path, monkeypatch):
    # It said "stopped at update 0", as if a checkpoint of update 0 could be resumed.
    train_module = importlib.import_module("ppo_async.train")  # the name is shadowed by train()

    def ctrl_c(*args, **kwargs):  # pressed after the actors started, before any update
        raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted) as info:
        train(TINY, run_dir=tmp_path / "fresh", progress=False, on_update=interrupt_at(1))
    assert str(info.value).startswith("stopped at update 1; resume with: ")
    for name in ("learner_loop", "in_learner_loop"):
        monkeypatch.setattr(train_module, name, ctrl_c)
    with pytest.raises(TrainingInterrupted) as info:
        train(TINY, run_dir=tmp_path / "new", progress=False)
    assert str(info.value) == "stopped before the first update finished; nothing was saved"
    assert info.value.checkpoint is None and not (tmp_path / "new" / "checkpoints").exists()
    # A resumed run stopped so still has the checkpoint it resumed from.
    with pytest.raises(TrainingInterrupted) as info:
        train(TINY, resume_from=tmp_path / "fresh", progress=False)
    assert str(info.value) == (f"stopped at update 1; resume with: ppo-async train --resume "
                               f"{tmp_path / 'fresh'}")
    assert str(TrainingInterrupted(4, None, None)) == (
        "stopped at update 4; nothing was saved (no run directory)")


# A host env whose step, once update 2 is checkpointed, spins in one C call: the GIL is
# never released, so no other Python thread runs (the learner, Ctrl-C's handler).
_FREEZING_RUN = """
import pathlib, sys
import gymnasium, numpy as np
from ppo_async import AsyncActorLearnerConfig, train
from ppo_async.envs.registry import register_host_env

run_dir = pathlib.Path(sys.argv[1])

class FreezesAfterTwoCheckpoints:
    observation_shape = (3,)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, num_envs):
        self.num_envs = num_envs

    def reset(self, seed):
        return np.zeros((self.num_envs, 3), np.float32)

    def step(self, actions):
        if len(list((run_dir / "checkpoints").glob("ckpt_*.msgpack"))) >= 2:
            sum(range(10**15))
        obs = np.zeros((self.num_envs, 3), np.float32)
        done = np.zeros(self.num_envs, bool)
        return obs, np.ones(self.num_envs, np.float32), done, done, obs

register_host_env("freezes", FreezesAfterTwoCheckpoints)
train(AsyncActorLearnerConfig(
    env_id="host:freezes", num_actors=1, envs_per_actor=1, num_steps=8, num_epochs=1,
    num_minibatches=1, learner_timeout_s=5.0, checkpoint_every_updates=1,
    total_env_steps=8 * 100_000, env_workers=0, actor_backend="threads"),
    run_dir=run_dir, progress=False)
"""


def test_an_env_holding_the_gil_ends_the_process_with_the_stuck_threads_stack(tmp_path):
    script, run_dir = tmp_path / "freezing_run.py", tmp_path / "run"
    script.write_text(_FREEZING_RUN)
    # Before the watchdog, this process never ended: the timeout keeps the test from hanging.
    run = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 1, run.stderr
    err = run.stderr
    assert "the learner could not run for 10 s (2 x learner_timeout_s)" in err
    assert "actor_backend='processes' or 'ray'" in err and f"--resume {run_dir}" in err
    # The dump names threads only by id; the line before it says which id is the actor.
    actor_id = err.split("ppo-actor-0 is Thread ")[1].split(",")[0].split()[0]
    blocks = err.split("hread " + actor_id)
    assert len(blocks) >= 3, err  # named, then dumped ("Thread 0x..." / "Current thread 0x...")
    actor_stack = blocks[-1].split("\n\n")[0]
    assert f'File "{script}"' in actor_stack and "in step" in actor_stack, err
    assert (run_dir / "error.txt").read_text().strip() == err.strip()
    assert len(list_checkpoints(run_dir / "checkpoints")) >= 2  # written before the freeze stay


def test_the_watchdog_is_released_on_every_way_out_and_says_nothing_after_a_normal_run(
        tmp_path, monkeypatch):
    from ppo_async.runtime import watchdog

    relays = []
    original = watchdog._start_relay

    def start_relay(error_file):
        fd, relay = original(error_file)
        relays.append(relay)
        return fd, relay

    monkeypatch.setattr(watchdog, "_start_relay", start_relay)
    train(TINY, run_dir=tmp_path / "run", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(TINY, progress=False, on_update=interrupt_at(2))
    assert watchdog._owner is None  # released: the next run (or the program) may arm it
    assert len(relays) == 2 and all(relay.poll() is not None for relay in relays)
    assert not (tmp_path / "run" / ERROR_FILE).exists()
    # Not armed with actor processes (a stuck one is killed), when switched off, or while
    # another run holds it.
    for config in (dataclasses.replace(TINY, actor_backend="ray"),
                   dataclasses.replace(TINY, actor_backend="processes"),
                   dataclasses.replace(TINY, freeze_watchdog=False)):
        assert watchdog.FreezeWatchdog.for_run(config, None, 0) is None
    threads = dataclasses.replace(TINY, actor_backend="threads")  # as train pins the layout
    held = watchdog.FreezeWatchdog.for_run(threads, None, 0)
    try:
        assert held is not None and watchdog.FreezeWatchdog.for_run(threads, None, 0) is None
    finally:
        held.close()


# --- the lag bound is reached, not only respected ---------------------------------------


def test_the_allowed_lead_is_used_and_lag_reaches_its_bound():
    # A learner slower than the actors: they run ahead as far as the valve allows.
    config = dataclasses.replace(TINY, max_lead_steps=3 * 8, total_env_steps=TINY.batch_size * 12)
    report = train(config, progress=False, on_update=lambda m: time.sleep(0.05)).report
    assert report.policy_lag_max == config.max_lead_chunks - 1 == 2
    assert report.policy_lag_counts[2] >= 12  # most chunks arrive at the bound
