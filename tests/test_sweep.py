"""Sweeps (`ppo_async.sweep`): grids x seeds in worker processes, Ray tasks or the vmapped twin.

Every run is CartPole-v1 with one actor of two envs and 20 updates of 32
env steps: seconds each, most of them the worker's start. One 2 x 2 sweep
(two grid points, two seeds) is shared by the tests that read its outputs.
The workers inherit this process's compilation cache (tests/conftest.py).
"""

import csv
import json
import math
import os
import pathlib
import signal
import threading
import time
import warnings

import numpy as np
import pytest

from ppo_async.config import ConfigError
from ppo_async.runs.analysis import expand_sweep_dirs, group_runs, iqm, load_runs
from ppo_async.sweep.execute import SweepInterrupted, SweepWarning, plan_sweep, run_sweep
from ppo_async.sweep.spec import SweepSpec, load_sweep, run_name
from ppo_async.sweep.table import SUMMARY_COLUMNS, run_state
from ppo_async.tools import cli

from run_helpers import interrupt_at

TINY = dict(env_id="CartPole-v1", num_actors=1, envs_per_actor=2, num_steps=16, num_epochs=1,
            num_minibatches=1, total_env_steps=640)
SWEEP_TOML = """\
seeds = [0, 1]
[base]
env_id = "CartPole-v1"
num_actors = 1
envs_per_actor = 2
num_steps = 16
num_epochs = 1
num_minibatches = 1
total_env_steps = 640
[grid]
use_vtrace = [false, true]
"""
NAMES = ["use_vtrace=false,seed=0", "use_vtrace=false,seed=1", "use_vtrace=true,seed=0",
         "use_vtrace=true,seed=1"]


def read_rows(path: pathlib.Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def no_worker_left() -> list:
    """The sweep's worker processes still alive (other tests' helpers, wandb's service, are not)."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE
            and "ppo_async.sweep.pools import _worker_main" in " ".join(p.cmdline())]


# --- the sweep file -----------------------------------------------------------------------


def test_the_grid_expands_to_every_combination_and_seed_with_readable_names():
    spec = load_sweep({"seeds": [0, 1], "base": TINY,
                       "grid": {"learning_rate": [3e-4, 1e-3], "use_vtrace": [False, True]}})
    runs = spec.runs()
    assert [run.name for run in runs[:3]] == [
        "learning_rate=0.0003,use_vtrace=false,seed=0",
        "learning_rate=0.0003,use_vtrace=false,seed=1",
        "learning_rate=0.0003,use_vtrace=true,seed=0"]
    assert len(runs) == 8 and len({run.name for run in runs}) == 8
    assert {(r.config.learning_rate, r.config.use_vtrace, r.config.seed) for r in runs} == {
        (lr, v, s) for lr in (3e-4, 1e-3) for v in (False, True) for s in (0, 1)}
    assert all(r.config.num_steps == 16 for r in runs)  # [base] reaches every run
    # [[points]] change fields together, crossed with the grid.
    base = {k: v for k, v in TINY.items() if k not in ("num_actors", "envs_per_actor")}
    spec = load_sweep({"base": base, "grid": {"use_vtrace": [True]},
                       "points": [{"num_actors": 1, "envs_per_actor": 2},
                                  {"num_actors": 2, "envs_per_actor": 1}]})
    assert [r.name for r in spec.runs()] == [
        "num_actors=1,envs_per_actor=2,use_vtrace=true,seed=0",
        "num_actors=2,envs_per_actor=1,use_vtrace=true,seed=0"]
    # Names are filesystem-safe; long ones end in a hash, and so do collisions.
    assert run_name({"env_id": "gymnasium:CartPole-v1"}, 3) == "env_id=gymnasium_CartPole-v1,seed=3"
    assert run_name({"hidden_sizes": (64, 64)}, 0) == "hidden_sizes=64-64,seed=0"
    assert run_name({}, 2) == "seed=2"
    long = run_name({f"x{i}": "a" * 20 for i in range(8)}, 0)
    assert len(long) < 120 and long != run_name({f"x{i}": "b" * 20 for i in range(8)}, 0)
    spec = load_sweep({"base": TINY, "grid": {"learner_device": ["cpu:0", "cpu_0"]}})
    names = [r.name for r in spec.runs()]
    assert len(set(names)) == 2 and all(n.startswith("learner_device=cpu_0,seed=0-") for n in names)
    # sweep.toml records the sweep; it reads back to the same runs.
    again = SweepSpec.from_table(load_sweep(
        {"preset": "cartpole", "seeds": [0, 1], "base": {"num_steps": 16},
         "grid": {"learning_rate": [3e-4]}}).to_table())
    assert again.preset == "cartpole" and again.seeds == (0, 1)


@pytest.mark.parametrize("table, message", [
    ({"grid": {"learning_rate": [3e-4, -1.0]}},
     r"grid point learning_rate=-1.0: learning_rate=-1.0: must be"),
    ({"grid": {"learning_rate": 3e-4}}, r"\[grid\] learning_rate = 0.0003: must be a non-empty list"),
    ({"grid": {"learning_rat": [3e-4]}}, r"'learning_rat' is not a config field; did you mean"),
    ({"grid": {"use_vtrace": [True, True]}}, r"lists True twice"),
    ({"seeds": [0, 0]}, r"lists a seed twice"),
    ({"seeds": 3}, r"seeds = 3: must be a non-empty list of integers"),
    ({"base": {"seed": 1}}, r"list the seeds at the top"),
    ({"base": {"num_steps": 8}, "grid": {"num_steps": [16]}}, r"num_steps is in \[base\] and in \[grid\]"),
    ({"learning_rate": 3e-4}, r"'learning_rate' is not a sweep key \(a config field: put it under"),
    ({"preset": "cartpol"}, r"unknown preset \(did you mean 'cartpole'\?\)"),
    ({"base": {"num_minibatches": 3}}, r"\[base\]: .*num_minibatches"),
])
def test_a_bad_sweep_is_one_error_naming_the_field(table, message):
    with pytest.raises(ConfigError, match=message):
        load_sweep(table).runs()


def test_a_bad_grid_value_is_refused_before_any_run_starts(tmp_path, monkeypatch):
    path = tmp_path / "bad.toml"
    path.write_text(SWEEP_TOML.replace("use_vtrace = [false, true]",
                                       "use_vtrace = [false, true]\nlearning_rate = [1e-3, -1.0]"))
    started = []
    monkeypatch.setattr("subprocess.Popen", lambda *a, **k: started.append(a))
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as error:
        run_sweep(path, out, progress=False)
    message = str(error.value)
    assert message.startswith(
        f"sweep file {str(path)!r}, grid point use_vtrace=false,learning_rate=-1.0: "
        "learning_rate=-1.0: must be")
    assert message.endswith("(2 of 4 grid points are invalid)")
    assert "\n" not in message and started == [] and not out.exists()
    # The command line says the same in one line, exit code 2.
    with pytest.raises(SystemExit) as stop:
        cli.main(["sweep", str(path), "--out", str(out), "--no-progress"])
    assert stop.value.code == 2 and not out.exists()
    # A twin needs gymnax envs: refused before anything runs too.
    with pytest.raises(ConfigError, match="--twin runs gymnax envs only"):
        run_sweep({"base": {**TINY, "env_id": "gymnasium:CartPole-v1"}}, out, twin=True)
    assert not out.exists()


# --- one 2 x 2 sweep, read by several tests -------------------------------------------------


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    path = root / "sweep.toml"
    path.write_text(SWEEP_TOML)
    out = root / "out"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = run_sweep(path, out, workers=2, progress=False)
    return path, out, summary, [str(w.message) for w in caught if w.category is SweepWarning]


def test_a_2x2_sweep_with_2_workers_writes_4_runs_and_a_2_row_summary(local_sweep):
    path, out, summary, sweep_warnings = local_sweep
    assert sorted(p.name for p in out.iterdir() if "seed=" in p.name) == NAMES
    assert all(run_state(out / name) == "done" for name in NAMES)
    rows = read_rows(out / "runs.csv")
    assert [r["run"] for r in rows] == NAMES
    assert [(r["use_vtrace"], r["seed"], r["status"]) for r in rows] == [
        ("false", "0", "done"), ("false", "1", "done"), ("true", "0", "done"), ("true", "1", "done")]
    assert all(math.isfinite(float(r["final_return"])) and float(r["wall_time_s"]) > 0
               and int(r["env_steps"]) == 640 and r["error"] == "" for r in rows)
    # The summary: one row per grid point, the IQM over its seeds with its interval.
    saved = read_rows(out / "summary.csv")
    assert list(saved[0]) == ["use_vtrace", *SUMMARY_COLUMNS] and len(saved) == 2
    assert list(summary.columns) == list(saved[0]) and len(summary) == 2
    for row, vtrace in zip(summary.itertuples(), (False, True)):
        finals = [float(r["final_return"]) for r in rows if r["use_vtrace"] == str(vtrace).lower()]
        assert row.iqm == pytest.approx(iqm(finals)) and row.mean == pytest.approx(np.mean(finals))
        assert row.iqm_low <= row.iqm <= row.iqm_high and row.iqm_low < row.iqm_high
        assert (row.seeds, row.done, row.failed) == (2, 2, 0)
        assert 0 < row.policy_lag_mean <= 1 and row.wall_time_s > 0
    # Two runs of two threads each (learner, actor) oversubscribe fewer than 4 cores: a warning.
    oversubscribed = (os.cpu_count() or 1) < 4
    assert [w.startswith("--workers 2: 2 runs at once") for w in sweep_warnings] == (
        [True] if oversubscribed else [])
    markdown = (out / "summary.md").read_text().splitlines()
    assert len(markdown) == 4 and markdown[2].startswith("| false | 2/2 |")
    assert load_sweep(out / "sweep.toml").to_table() == load_sweep(path).to_table()


def test_the_rerun_trains_nothing(local_sweep, monkeypatch, capsys):
    path, out, summary, _ = local_sweep
    metrics_times = {n: (out / n / "metrics.jsonl").stat().st_mtime_ns for n in NAMES}

    def no_worker(*args, **kwargs):
        raise AssertionError("a finished sweep started a worker")

    monkeypatch.setattr("subprocess.Popen", no_worker)
    with pytest.warns(SweepWarning, match=r"all 4 runs in .* are done already: skipped them all"):
        again = run_sweep(path, out, workers=2, progress=False)
    assert again.equals(summary)
    assert {n: (out / n / "metrics.jsonl").stat().st_mtime_ns for n in NAMES} == metrics_times
    assert all(len(json.loads((out / n / "segments.json").read_text())) == 1 for n in NAMES)
    dry = run_sweep(path, out, dry_run=True)
    assert list(dry["state"]) == ["done"] * 4 and list(dry["run"]) == NAMES
    cli.main(["sweep", str(path), "--out", str(out), "--dry-run"])
    assert "4 runs (2 grid points x 2 seeds): 4 done, 0 to resume, 0 to start" in (
        capsys.readouterr().out)


def test_plot_overlays_the_grid_points_of_a_sweep_directory(local_sweep, capsys):
    _, out, _, _ = local_sweep
    groups = group_runs(load_runs(expand_sweep_dirs([out])))
    assert {label: len(runs) for label, runs in groups.items()} == {
        "use_vtrace=False": 2, "use_vtrace=True": 2}
    cli.main(["plot", str(out)])
    assert (out / "curves.png").stat().st_size > 10_000
    assert f"wrote {out / 'curves.png'}" in capsys.readouterr().out


def test_the_twin_gives_the_same_summary_shape(local_sweep, tmp_path):
    path, local_out, local_summary, _ = local_sweep
    summary = run_sweep(path, tmp_path, twin=True, progress=False)
    assert list(summary.columns) == list(local_summary.columns) and len(summary) == 2
    assert list(summary["use_vtrace"]) == list(local_summary["use_vtrace"])
    assert (summary["done"] == 2).all() and summary["iqm"].notna().all()
    twin_rows, local_rows = read_rows(tmp_path / "runs.csv"), read_rows(local_out / "runs.csv")
    assert [r["run"] for r in twin_rows] == NAMES
    # The twin acts at the config's exact lag (1), as the single actor did.
    for twin, local in zip(twin_rows, local_rows):
        assert (twin["status"], twin["env_steps"], twin["policy_lag_mean"]) == (
            "done", local["env_steps"], local["policy_lag_mean"])
    run = load_runs([tmp_path / NAMES[0]])[0]
    assert run.num_updates == 20 and np.isfinite(run.final("episode_return"))
    assert json.loads((tmp_path / NAMES[0] / "summary.json").read_text())["trainer"] == "sync twin"
    assert len(list((tmp_path / "logs").iterdir())) == 2  # one worker per grid point


# --- resuming, failures, Ctrl-C ------------------------------------------------------------------


def test_an_interrupted_run_resumes_and_a_failing_run_is_recorded(tmp_path):
    from ppo_async.train import TrainingInterrupted, train

    # The second point names a device this machine lacks: train refuses it in the worker.
    table = {"base": TINY, "grid": {"learner_device": ["cpu:0", "cpu:7"]}}
    plan = plan_sweep(table, tmp_path)
    interrupted, failing = plan.runs
    with pytest.raises(TrainingInterrupted):  # a sweep stopped during this run left this
        train(interrupted.config, run_dir=tmp_path / interrupted.name, progress=False,
              on_update=interrupt_at(5))
    assert plan_sweep(table, tmp_path).states == {interrupted.name: "resume",
                                                  failing.name: "fresh"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SweepWarning)  # 2 runs at once on 2 cores
        summary = run_sweep(table, tmp_path, workers=2, progress=False)
    segments = json.loads((tmp_path / interrupted.name / "segments.json").read_text())
    assert len(segments) == 2 and segments[1]["start_update"] == 5
    assert segments[1]["resumed_from_checkpoint"].endswith("ckpt_000000005.msgpack")
    updates = [json.loads(line)["update"] for line in
               (tmp_path / interrupted.name / "metrics.jsonl").read_text().splitlines()]
    assert updates == list(range(1, 21))
    rows = {r["run"]: r for r in read_rows(tmp_path / "runs.csv")}
    assert rows[interrupted.name]["status"] == "done"
    assert rows[failing.name]["status"] == "failed"
    assert "cpu:7" in rows[failing.name]["error"] and "\n" not in rows[failing.name]["error"]
    assert list(summary["done"]) == [1, 0] and list(summary["failed"]) == [0, 1]
    assert math.isfinite(summary["iqm"][0]) and math.isnan(summary["iqm"][1])


def test_ctrl_c_stops_every_worker_and_prints_the_command_that_continues(tmp_path):
    long = {**TINY, "total_env_steps": 32 * 5000}  # minutes: the interrupt lands mid-run
    table = {"seeds": [0, 1], "base": long}
    path = tmp_path / "long.toml"
    path.write_text(load_sweep(table).to_toml())
    out = tmp_path / "out"
    names = ["seed=0", "seed=1"]
    main = threading.main_thread().ident

    def press_ctrl_c():  # once both workers have made an update
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                (out / n / "metrics.jsonl").is_file()
                and (out / n / "metrics.jsonl").stat().st_size > 0 for n in names):
            time.sleep(0.1)
        signal.pthread_kill(main, signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c)
    presser.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(SweepInterrupted) as stopped:
                run_sweep(path, out, workers=2, progress=False)
    finally:
        presser.join(timeout=130)
    assert str(stopped.value) == (
        f"sweep stopped: 0 of 2 runs finished; continue with: ppo-async sweep {path} "
        f"--out {out} --workers 2")
    assert no_worker_left() == []
    rows = read_rows(out / "runs.csv")
    assert [r["status"] for r in rows] == ["interrupted", "interrupted"]
    # Each run checkpointed as it stopped: the same command resumes it.
    assert [run_state(out / n) for n in names] == ["resume", "resume"]
    assert plan_sweep(path, out).states == {n: "resume" for n in names}
    assert os.path.getsize(out / "summary.csv") > 0


def test_the_ray_backend_runs_each_run_as_a_task_on_a_local_instance(tmp_path):
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    summary = run_sweep({"seeds": [0, 1], "base": TINY}, tmp_path, backend="ray",
                        progress=False)
    assert not ray.is_initialized()  # the sweep started a private instance, and stopped it
    assert [r["status"] for r in read_rows(tmp_path / "runs.csv")] == ["done", "done"]
    assert (len(summary), summary["done"][0]) == (1, 2)
    for name in ("seed=0", "seed=1"):  # trained in a Ray worker process, not in this one
        segment = json.loads((tmp_path / name / "segments.json").read_text())[0]
        assert "default_worker" in " ".join(segment["provenance"]["command_line"])


def test_a_default_of_one_worker_on_too_few_cores_says_so(tmp_path, monkeypatch):
    # cpu_count // threads came out as 0 and was made 1 without a word: a sweep that
    # seemed stuck on one run at a time.
    from ppo_async.sweep import execute

    class Started(Exception):
        pass

    def pool(out):
        raise Started

    monkeypatch.setattr(execute.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(execute, "LocalPool", pool)
    sweep = {"seeds": [0, 1], "base": {**TINY, "num_actors": 4}}
    with pytest.warns(SweepWarning) as caught, pytest.raises(Started):
        run_sweep(sweep, tmp_path / "out", progress=False)
    (message,) = [str(w.message) for w in caught]
    assert message.startswith("2 runs one at a time: a run keeps 5 threads busy (its learner "
                              "and actors) and this machine has 2 cores"), message
    # Runs that fit (2 threads each on 2 cores), or --workers 1 asked for: nothing to say.
    with warnings.catch_warnings():
        warnings.simplefilter("error", SweepWarning)
        with pytest.raises(Started):
            run_sweep({**sweep, "base": TINY}, tmp_path / "fits", progress=False)
        with pytest.raises(Started):
            run_sweep(sweep, tmp_path / "asked", workers=1, progress=False)
