"""Smoke tests of the experiment scripts: they run end to end at a tiny scale and write their files.

The sweep is imported by path and driven through ``main(argv)``. The learning
results script runs in a subprocess, as a user runs it: it must set an XLA flag
before JAX starts (see ``experiments/common.py``), which this process, with
JAX already running, cannot do. The benchmarks that measure in fresh
processes start those themselves (one per row or figure), so their ``main``
runs in this process too: only the children need to be fresh.
"""

import csv
import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

EXPERIMENTS = pathlib.Path(__file__).resolve().parent.parent / "experiments"
REPO_ROOT = EXPERIMENTS.parent


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"experiments_{name}", EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def script(monkeypatch):
    """`load_script`, with experiments/ on ``sys.path`` for the scripts that import their
    sibling ``common``."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    return load_script


@pytest.fixture(scope="module")
def sweep():
    return load_script("sweep_staleness")


def read_rows(path: pathlib.Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_sweep_dry_run_lists_the_whole_grid(sweep, tmp_path, capsys):
    result = sweep.main(["--dry-run", "--out", str(tmp_path)])
    # num_actors (1, 2, 4, 8) x V-trace (off, on) x lead (1, 2, 4, 8 chunks).
    assert len(result["cells"]) == 4 * 2 * 4
    assert len(result["todo"]) == 4 * 2 * 4 * 3  # 3 seeds by default
    out = capsys.readouterr().out
    assert out.count("  cell ") == 32
    assert "reproduce" not in out and not (tmp_path / "results.csv").exists()
    # Every cell keeps 8 envs in all, so the batch per update is the same.
    configs = [sweep.make_config(sweep.parse_args([]), cell, 0) for cell in result["cells"]]
    assert {c.num_envs for c in configs} == {8}
    assert {c.max_lead_chunks for c in configs} == {1, 2, 4, 8}


def test_tiny_sweep_writes_its_csv_and_a_rerun_skips_the_finished_cell(sweep, tmp_path, capsys):
    argv = ["--num-actors", "2", "--vtrace", "on", "--lead-chunks", "2", "--seeds", "1",
            "--total-env-steps", "256", "--num-steps", "16", "--out", str(tmp_path)]
    first = sweep.main(argv)
    assert len(first["todo"]) == 1
    rows = read_rows(tmp_path / "results.csv")
    assert len(rows) == 1
    row = rows[0]
    assert (row["num_actors"], row["envs_per_actor"], row["use_vtrace"], row["lead_chunks"]) == (
        "2", "4", "True", "2")
    assert int(row["env_steps"]) == 256 and int(row["policy_lag_max"]) <= 1
    assert (tmp_path / "return_vs_lag.png").stat().st_size > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["cells"]) == 1
    out = capsys.readouterr().out
    assert "python experiments/sweep_staleness.py --num-actors 2" in out

    again = sweep.main(argv)
    assert again["todo"] == []
    assert len(read_rows(tmp_path / "results.csv")) == 1
    dry = sweep.main([*argv, "--dry-run"])
    assert dry["todo"] == []
    assert "seeds done 1/1" in capsys.readouterr().out


def test_learning_results_on_cartpole_writes_csv_json_and_png(tmp_path):
    argv = ["--envs", "CartPole-v1", "--seeds", "2", "--budget-scale", "0.002", "--out", str(tmp_path),
            "--modes", "async", "learner", "sync"]
    run = subprocess.run(
        [sys.executable, str(EXPERIMENTS / "learning_results.py"), *argv],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = read_rows(tmp_path / "results.csv")
    assert sorted((r["mode"], r["seed"]) for r in rows) == [
        ("async", "0"), ("async", "1"), ("learner", "0"), ("learner", "1"),
        ("sync", "0"), ("sync", "1")]
    # Equal env steps: two updates of 2 actors x 4 envs x 64 steps each (the floor).
    assert {int(r["env_steps"]) for r in rows} == {2 * 512}
    summary = json.loads((tmp_path / "summary.json").read_text())["envs"]["CartPole-v1"]
    assert set(summary) >= {"config", "async", "learner", "sync"}
    assert summary["async"]["seeds"] == [0, 1]
    for name in ("curves_CartPole-v1.csv", "curves_CartPole-v1.png", "learning_curves.png"):
        assert (tmp_path / name).stat().st_size > 0
    curve_modes = {r["mode"] for r in read_rows(tmp_path / "curves_CartPole-v1.csv")}
    assert curve_modes == {"async", "learner", "sync"}
    assert "| CartPole-v1 |" in run.stdout and "sampler='learner' return" in run.stdout
    assert "python experiments/learning_results.py --envs CartPole-v1" in run.stdout
    machine = json.loads((tmp_path / "summary.json").read_text())["machine"]
    assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in machine["xla_flags"]


def test_bench_learner_measures_every_figure_it_reports(tmp_path, script, capsys):
    bench = script("bench_learner")
    # Ten updates, steady from the sixth; 20 + 10 replayed updates per learner-alone timing.
    result = bench.main(["--total-env-steps", "5120", "--warmup", "5", "--alone-updates", "10",
                         "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["learner_idle_fraction"] == result["learner_idle_fraction"]
    assert 0.0 <= saved["learner_idle_fraction"] < 1.0
    for key in ("update_alone_s", "serialize_alone_s", "load_s", "steady_seconds_per_update"):
        assert saved[key] > 0.0, key
    assert set(saved["placement"]) == {"batch", "params"}
    for times in saved["placement"].values():
        assert times["place_s"] > 0.0 and times["device_put_s"] > 0.0
    assert saved["payload_bytes"] > 1000
    assert set(saved["learner_alone_s_per_update"]) == {"pipelined", "unpipelined"}
    assert all(s > 0.0 for s in saved["learner_alone_s_per_update"].values())
    assert saved["learner_alone_pipelined_over_twin_rate"] == pytest.approx(
        saved["twin_s_per_update"] / saved["learner_alone_s_per_update"]["pipelined"])
    out = capsys.readouterr().out
    assert "target < 2%" in out and "the learner alone on replayed chunks" in out


def test_vtrace_lag_diagnostic_runs_every_variant(tmp_path):
    diagnostic = load_script("vtrace_lag_diagnostic")
    result = diagnostic.main(["--seeds", "1", "--total-env-steps", "2048", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [row["variant"] for row in saved["rows"]] == list(diagnostic.VARIANTS)
    for row in result["rows"]:
        lead = diagnostic.VARIANTS[row["variant"]]["max_lead_steps"] // diagnostic.NUM_STEPS
        assert 0.0 <= row["policy_lag_mean"] <= lead - 1
        vtrace = diagnostic.VARIANTS[row["variant"]]["use_vtrace"]
        # Only V-trace runs report clipped rhos; NaN marks the others.
        if vtrace:
            assert row["clipped_rho_mean"] > 0.0
        else:
            assert math.isnan(row["clipped_rho_mean"])


def test_offpolicy_study_writes_its_tables_and_skips_finished_cells(
        tmp_path, script, monkeypatch, capsys):
    # The study's main runs here; the sweep's worker processes inherit the flag it would set.
    study_script = script("offpolicy_study")
    import common

    monkeypatch.setenv("XLA_FLAGS", " ".join(
        [*os.environ.get("XLA_FLAGS", "").split(), common.SERIAL_SCHEDULER_FLAG]))

    def study(*args):
        study_script.main(["--envs", "cartpole", "--seeds", "2", "--total-env-steps", "2048",
                           "--out", str(tmp_path), *args])
        return capsys.readouterr()

    # Two cells, one sweep job each: the two workers of a 2-core machine train them at once.
    grid = ("--lags", "0", "2", "--variants", "vtrace+behaviour")
    study(*grid)
    rows = read_rows(tmp_path / "results.csv")
    assert sorted({(r["lag"], r["variant"]) for r in rows}) == [
        ("0", "vtrace+behaviour"), ("2", "vtrace+behaviour")]
    assert len(rows) == 4 and all(r["nonfinite"] == "0" for r in rows)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["cells"]) == 2 and summary["random_return"]["cartpole"] > 0
    for name in ("summary.md", "return_vs_lag.png", "curves_cartpole.png"):
        assert (tmp_path / name).stat().st_size > 0
    rerun = study(*grid)
    assert "machine:" in rerun.out and "cartpole lag" not in rerun.out  # nothing retrained
    assert len(read_rows(tmp_path / "results.csv")) == 4

    study("--stragglers", "--straggler-lags", "3", "--variants", "vtrace+behaviour")
    rows = read_rows(tmp_path / "stragglers.csv")
    assert sorted(r["max_policy_lag"] for r in rows) == ["", "", "1", "1"]
    # The cap drops the straggler's quarter once its lag passes 1.
    dropped = [float(r["dropped_fraction_mean"]) for r in rows if r["max_policy_lag"] == "1"]
    assert all(0.0 < d <= 0.25 for d in dropped)

    study("--validate", "--lags", "2", "--variants", "vtrace+behaviour")
    table = (tmp_path / "validate.md").read_text()
    assert "| cartpole | 2 | vtrace+behaviour |" in table and "| 2 of 2 |" in table  # byte-equal


def test_recurrent_results_runs_both_modes_and_measures_the_cost(tmp_path):
    # The LSTM alone: the MLP's rows come from the same code path, at twice the time.
    argv = ["--envs", "MemoryChain-bsuite", "--networks", "lstm", "--seeds", "1",
            "--budget-scale", "0.005", "--cost-reps", "1", "--out", str(tmp_path)]
    run = subprocess.run(
        [sys.executable, str(EXPERIMENTS / "recurrent_results.py"), *argv],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = read_rows(tmp_path / "results.csv")
    assert sorted((r["network"], r["mode"]) for r in rows) == [("lstm", "async"), ("lstm", "sync")]
    assert {int(r["env_steps"]) for r in rows} == {2 * 256}  # the two-update floor
    cost = read_rows(tmp_path / "cost.csv")
    assert [r["network"] for r in cost] == ["lstm"]
    assert all(float(r["update_ms_per_batch"]) > 0 for r in cost)
    for name in ("curves_MemoryChain-bsuite.csv", "curves_MemoryChain-bsuite.png"):
        assert (tmp_path / name).stat().st_size > 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert [e["network"] for e in result["learning"]] == ["lstm"]
    assert "| MemoryChain-bsuite | lstm |" in run.stdout
    assert "python experiments/recurrent_results.py --envs MemoryChain-bsuite" in run.stdout


def test_bench_exact_lag_measures_exact_lags_and_a_straggler(tmp_path, script):
    bench = script("bench_exact_lag")
    bench.main(["--seeds", "0", "--modes", "exact2", "exact1-straggler",
                "--total-env-steps", "8192", "--straggler-ms", "5", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    rows = {row["mode"]: row for row in saved["rows"]}
    assert set(rows) == {"exact2", "exact1-straggler"}
    assert rows["exact1-straggler"]["policy_lag_mean"] <= 1.0 and all(
        row["env_steps_per_s"] > 0 for row in rows.values())
    # Actor 0 was held back on each of its 16 chunks (or more, ahead), and only with a straggler.
    assert rows["exact1-straggler"]["straggler_chunks"] >= 16
    assert rows["exact2"]["straggler_chunks"] == 0
    # What the default config chooses at an exact lag; a straggler is a thread of its own.
    assert (rows["exact2"]["sampler"], rows["exact1-straggler"]["sampler"]) == ("learner",
                                                                               "actors")
    assert 1.0 < rows["exact2"]["policy_lag_mean"] <= 2.0  # lag 2 once two updates are done


def test_bench_throughput_measures_every_mode_in_fresh_processes(tmp_path, script, capsys):
    bench = script("bench_throughput")
    # Eight updates a mode: the quarter mark is the second, the rate runs to the eighth.
    bench.main(["--seeds", "0", "--modes", "twin", "async-1t", "async-unpipelined",
                "async-own-device", "learner", "fused-lag1", "--total-env-steps", "4096",
                "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [row["mode"] for row in saved["rows"]] == ["twin", "async-1t", "async-unpipelined",
                                                      "async-own-device", "learner",
                                                      "fused-lag1"]
    assert all(row["env_steps_per_s"] > 0 for row in saved["rows"])
    assert all(0 <= row["policy_lag_mean"] <= 1 for row in saved["rows"][1:5])
    # The bound computes what train() computes at its default exact lag of 1.
    assert saved["rows"][5]["same_params_as_train"] is True
    assert set(saved["ratio_to_twin"]) == {"async-1t", "async-unpipelined", "async-own-device",
                                           "learner", "fused-lag1"}
    # sampler="learner" passes a call's updates on together: one mark per call is kept.
    marks = [(1.0, 512, 0.1), (1.0001, 1024, 0.1), (1.2, 1536, 0.3), (1.2002, 2048, 0.3)]
    assert bench.common.last_mark_of_each_call(marks) == [marks[1], marks[3]]
    assert len(saved["machine"]["load_average_1_5_15_min"]) == 3
    assert "x the twin's run phase" in capsys.readouterr().out
    # 8 updates are not 4 calls of 16: refused before any process starts.
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "0", "--modes", "fused-lag1-16", "--total-env-steps", "4096"])
    assert "not 4 or more whole calls of 16" in capsys.readouterr().err


def test_bench_startup_measures_each_figure_in_a_fresh_process(tmp_path, script, capsys):
    bench = script("bench_startup")
    result = bench.main(["--import-repeats", "1", "--train-repeats", "1", "--num-steps", "8",
                         "--envs-per-actor", "2", "--out", str(tmp_path)])
    imports = result["imports"]
    assert imports["ratio"] == imports["ppo_async_median_s"] / imports["baseline_median_s"] > 0
    (cold,) = result["cold_runs"]
    # The next run in the cold process (another learning rate and budget) compiled nothing.
    assert cold["next_run_compiles"] == 0 and cold["next_run_first_update_s"] > 0
    (pair,) = result["warm_pairs"]
    for run in (cold, pair["first_run"], pair["second_run"]):
        assert 0 < run["first_update_s"] <= run["train_returned_s"]
        assert run["first_update_cpu_s"] > 0
    # The second run of the pair compiled nothing: it found every program.
    assert pair["cache_entries_after_first"] > 0
    assert pair["cache_entries_after_second"] == pair["cache_entries_after_first"]
    # Nor the sweep point: a new learning rate and budget are the update's arguments.
    assert 0 < pair["sweep_point_run"]["first_update_s"]
    assert pair["cache_entries_after_sweep_point"] == pair["cache_entries_after_first"]
    assert result["overrides"] == {"num_steps": 8, "envs_per_actor": 2}
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["warm_first_update_median_s"] == pair["second_run"]["first_update_s"]
    assert len(saved["load_average_before"]) == 3
    out = capsys.readouterr().out
    assert "python experiments/bench_startup.py --import-repeats 1" in out
    assert "load average before" in out


def test_startup_timeline_lists_the_programs_compiled_before_the_first_update(
        tmp_path, script, capsys):
    timeline = script("startup_timeline")
    result = timeline.main(["--updates", "1", "--sampler", "shared", "--out", str(tmp_path)])
    assert 0 < result["first_update_s"] <= result["train_total_s"]
    assert result["first_update_cpu_s"] > 0
    # JAX's compile log was parsed: the big programs are there, each with its seconds.
    by_name = {row["program"]: row for row in result["programs"]}
    assert {"update", "rollout", "reset_from", "init"} <= set(by_name)
    assert all(row["compile_s"] > 0 for row in result["programs"])
    alone = result["alone_cpu_s"]
    assert set(alone) == {"actor_program", "init_params", "reset", "rollout",
                          "learner_state", "update", "total"}
    assert alone["update"] > 0 and alone["total"] >= alone["update"]
    assert "programs compiled (or loaded) before the first update" in capsys.readouterr().out
    assert json.loads((tmp_path / "results.json").read_text())["programs"]


def test_bench_backends_compares_threads_and_ray_and_times_broadcasts(tmp_path, script, capsys):
    pytest.importorskip("ray")
    bench = script("bench_backends")
    result = bench.main(["--envs", "host:busy-python", "--total-env-steps", "3072",
                         "--warmup", "1", "--python-step-ms", "0.05", "--widths", "64",
                         "--repeats", "5", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    (run,) = saved["runs"]
    assert run["env_id"] == "host:busy-python"
    for backend in ("threads", "ray"):
        assert run[backend]["env_steps_per_s"] > 0 and run[backend]["updates"] == 6
    assert run["ray_over_threads"] == result["runs"][0]["ray_over_threads"] > 0
    assert saved["transport_costs"]["chunk_bytes"] > 1000
    (broadcast,) = saved["broadcasts"]
    # The config's own width: the broadcast's batch comes from the gymnax actor program that
    # the transport costs built (and compiled) for it.
    assert broadcast["hidden_sizes"] == [64, 64]
    for key in ("update_alone_s", "learner_hand_over_s", "publisher_serialize_s",
                "publisher_put_s", "actor_load_s"):
        assert broadcast[key] > 0.0, key
    out = capsys.readouterr().out
    assert "load average" in out and "python experiments/bench_backends.py" in out
    import ray

    assert not ray.is_initialized()


def test_bench_fixed_costs_splits_thread_actors_time_but_not_the_actors_one_thread(
        script, monkeypatch):
    costs = script("bench_fixed_costs")
    monkeypatch.setattr(costs, "EVENTS", [
        ("ppo-actor-0", "load", 1.0, 1.4), ("ppo-actor-1", "load", 2.0, 2.2),
        ("ppo-actors-0-1", "to_host", 1.0, 1.5), ("ppo-actors-0-1", "to_host", 2.0, 2.5),
        ("ppo-publisher", "serialize", 1.0, 1.1)])
    summary = costs.analyse([0.0, 1.0, 2.0, 3.0], warmup=1, exact_lag=None, num_actors=2)
    rows = {(row["role"], row["stage"]): row for row in summary["rows"]}
    assert summary["updates"] == 2 and summary["period_ms"] == pytest.approx(1000.0)
    # a thread per actor: 0.6 s of loads over 2 updates and 2 actors, each actor's own
    assert rows["actor", "load"]["ms_per_update"] == pytest.approx(150.0)
    assert rows["actor", "load"]["calls_per_update"] == pytest.approx(0.5)
    # the one thread of every actor's chunks: all of its 1.0 s over 2 updates
    assert rows["actors' thread", "to_host"]["ms_per_update"] == pytest.approx(500.0)
    assert rows["actors' thread", "to_host"]["calls_per_update"] == pytest.approx(1.0)
    assert rows["publisher", "serialize"]["ms_per_update"] == pytest.approx(50.0)


def test_cpu_device_queue_times_a_tiny_program_behind_a_long_one(tmp_path, script):
    result = script("cpu_device_queue").main(["--out", str(tmp_path)])
    one, two = result["queue"]
    assert (one["devices"], two["devices"]) == (1, 2)
    # On one device the tiny program waits for most of the long one; on two it does not.
    assert one["tiny_after_long_ms"] > 0.5 * one["long_ms"]
    assert two["tiny_after_long_ms"] < 0.5 * two["long_ms"]


def test_timing_spread_reruns_the_tested_configs_and_summarizes_them(tmp_path, script, capsys):
    spread = script("timing_spread")
    summary = spread.main(["--reruns", "1", "--seeds", "0", "1", "--cases", "memory_chain",
                           "--out", str(tmp_path)])
    assert set(summary) == {"memory_chain/MEMORY_CHAIN_LSTM", "memory_chain/MEMORY_CHAIN"}
    for figures in summary.values():
        assert figures["reruns"] == 2
        assert figures["return_min"] <= figures["return_median"] <= figures["return_max"]
        assert figures["best_running_mean_min"] >= figures["return_min"] - 1e-6
    rows = read_rows(tmp_path / "runs.csv")
    assert len(rows) == 4 and {row["config"] for row in rows} == {"MEMORY_CHAIN_LSTM",
                                                                  "MEMORY_CHAIN"}
    assert sorted(row["seed"] for row in rows) == ["0", "0", "1", "1"]
    assert (tmp_path / "spread.png").stat().st_size > 5_000
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["tests"]["memory_chain"].startswith("tests/networks/test_recurrent.py::")
    assert "python experiments/timing_spread.py --reruns 1 --seeds 0 1" in capsys.readouterr().out


def test_bench_render_times_both_ways_of_drawing_a_frame(tmp_path, script, capsys):
    bench = script("bench_render")
    results = bench.main(["--frames", "3", "--repeats", "1", "--envs", "CartPole-v1",
                          "--out", str(tmp_path)])
    figures = results["CartPole-v1"]
    assert figures["enjoy_ms_per_frame"] > 0 and figures["gymnax_ms_per_frame"] > 0
    assert figures["speed_up"] == figures["gymnax_ms_per_frame"] / figures["enjoy_ms_per_frame"]
    assert json.loads((tmp_path / "results.json").read_text())["envs"] == results
    assert "python experiments/bench_render.py --frames 3" in capsys.readouterr().out


def test_make_train_figure_parses_the_commands_summary_line(tmp_path, script, capsys):
    figure = script("make_train_figure")
    line = ("final return 500.0 (mean of the last 100 episodes) | 499712 env steps, 6.9 s of "
            "training (72110 steps/s) | policy lag mean 0.96 max 1 | learner waited 0.4 s")
    match = figure.SUMMARY.search(line)
    assert {k: float(v) for k, v in match.groupdict().items()} == {
        "final_return": 500.0, "env_steps": 499712.0, "wall_s": 6.9, "steps_per_s": 72110.0,
        "lag_mean": 0.96, "lag_max": 1.0}
    # The CLI's own line, from a real (short) run, matches too.
    from ppo_async.tools.cli import main as cli

    cli(["train", "--total-env-steps", "4096", "--no-progress", "--run-root", str(tmp_path)])
    out = capsys.readouterr().out
    assert figure.SUMMARY.search(out), out


def test_bench_scaling_rates_each_actor_count_against_its_ideal(tmp_path, script):
    bench = script("bench_scaling")
    bench.main(["--actors", "2", "--step-ms", "1", "--num-steps", "8", "--seconds", "0.5",
                "--skip", "1", "--inference", "batched", "per-actor", "--env-async",
                "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(row["num_actors"], row["batch_inference"]) for row in rows] == [(2, True), (2, False)]
    assert all(row["env_async"] for row in rows)  # the env with its own step_async / step_wait
    # 1 ms a step: two envs' ideal is 2,000 env steps/s, and no run beats its ideal by much.
    assert [row["ideal_env_steps_per_s"] for row in rows] == [2000.0, 2000.0]
    assert all(0 < row["ratio"] <= 1.1 for row in rows)
    assert all(row["ratio"] == row["env_steps_per_s"] / row["ideal_env_steps_per_s"]
               for row in rows)
    # The cores each child process used over the window: one figure per process measured.
    assert all(len(row["child_cores"]) == len(row["rss_mb"]["children"])
               and all(0 <= cores <= os.cpu_count() for cores in row["child_cores"])
               for row in rows)


def test_bench_layouts_rates_each_layout_and_mode_against_the_first(tmp_path, script):
    bench = script("bench_layouts")
    bench.main(["--env-id", "Acrobot-v1", "--layouts", "2x4", "--modes", "batched", "threads",
                "--seeds", "0", "--total-env-steps", "4096", "--rollout-calls", "2",
                "--out", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["rows"]
    assert result["env_id"] == "Acrobot-v1" and {r["env_id"] for r in rows} == {"Acrobot-v1"}
    assert [(r["num_actors"], r["envs_per_actor"], r["num_steps"], r["batch_inference"],
             r["sampler"]) for r in rows] == [(2, 4, 64, True, "shared"), (2, 4, 64, False, "actors")]
    assert all(r["env_steps_per_s"] > 0 and 0 < r["first_update_s"] < r["wall_s"] for r in rows)
    medians = result["medians"]
    assert medians["2x4 batched"]["ratio"] == 1.0  # the first layout and mode is the base
    assert medians["2x4 threads"]["ratio"] == (
        rows[1]["env_steps_per_s"] / rows[0]["env_steps_per_s"])
    (rollouts,) = result["rollouts_ms"].values()  # the one layout's three programs, timed
    assert set(rollouts) == {"own rollouts", "fused", "vmapped"} and min(rollouts.values()) > 0
    assert "load_average_after" in result


def test_bench_layouts_refuses_an_env_it_cannot_compare_before_any_run(script, capsys):
    bench = script("bench_layouts")
    for env_id, said in (("Cartpole-v1", "did you mean 'CartPole-v1'"),
                         ("gymnasium:CartPole-v1", "compared on gymnax envs")):
        with pytest.raises(SystemExit):
            bench.main(["--env-id", env_id])
        assert said in capsys.readouterr().err


def test_sampler_bounds_refuses_settings_it_cannot_measure_before_any_run(script, capsys):
    bounds = script("sampler_bounds")
    for argv in (["--cohorts", "2", "0"], ["--actors", "0"], ["--step-ms", "-1"]):
        with pytest.raises(SystemExit):
            bounds.main(argv)
        assert "must be positive" in capsys.readouterr().err


def test_compile_options_refuses_options_that_are_not_json_objects(script, capsys):
    options = script("compile_options")
    for text, message in (("{not json", "not JSON"), ("[1]", "a JSON object")):
        with pytest.raises(SystemExit):
            options.main(["--options", text])
        assert message in capsys.readouterr().err


def test_bench_ingest_replays_chunks_as_many_actors_and_times_the_fan_out(
        tmp_path, script, capsys):
    bench = script("bench_ingest")
    result = bench.main(["--actors", "8", "--chunks", "16", "--min-updates", "4", "--no-ray",
                         "--no-gymnax", "--profile", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["sizes"] == result["sizes"]
    sizes = saved["sizes"]
    assert sizes["chunk_bytes"] > 1000 and sizes["broadcast_payload_bytes"] > 10_000
    (row,) = saved["rows"]
    assert row["num_actors"] == 8 and row["batch_env_steps"] == 8 * 32
    # 8 actors of 500 env steps/s in chunks of 32: 125 chunks/s, and an update per chunk period.
    assert row["demand"]["chunks_per_s"] == pytest.approx(125.0)
    assert row["demand"]["updates_per_s"] == pytest.approx(500 / 32)
    assert set(row["ingest_alone"]) == {"queued_unpickled", "queued_objects", "waiting_unpickled"}
    for figures in (*row["ingest_alone"].values(), row["learner"]):
        # Timed from the first update's end to the third's: two batches of 8 chunks.
        assert figures["updates"] == 4 and figures["chunks_timed"] == 16
        assert figures["chunks_per_s"] == figures["chunks_timed"] / figures["seconds"] > 0
        assert figures["mb_per_s"] == pytest.approx(
            figures["chunks_per_s"] * sizes["chunk_bytes"] / 1e6)
        # Relabelled as exact_policy_lag=1 would have them: the first update lag 0, then 1.
        assert figures["policy_lag_counts"] == {"0": 8, "1": 24}
        assert figures["publishes"] == 3 and figures["fan_out_s_median"] > 0  # to 8 queues
    assert row["update_alone_s"] > 0
    assert row["learner_over_demand"] == row["learner"]["chunks_per_s"] / 125.0
    profile = saved["ingest_profile"]
    assert profile["num_actors"] == 8 and profile["chunks"] == 16 and profile["top"]
    out = capsys.readouterr().out
    assert "load average" in out and "python experiments/bench_ingest.py --actors 8" in out


def test_mujoco_results_dry_run_builds_every_config_and_its_table_names_the_reference(
        tmp_path, script):
    results = script("mujoco_results")
    planned = results.main(["--dry-run", "--total-env-steps", "8192", "--out", str(tmp_path)])
    assert list(planned) == [f"{name} {part}" for name in ("hopper", "walker2d", "ant")
                             for part in ("learning", "backends")]
    assert planned["hopper learning"] == [f"seed={seed} (fresh): 4 updates of 2048"
                                          for seed in range(3)]
    lockstep, threads, processes, ray, envpool = planned["ant backends"]
    assert "actors threads, exact policy lag 0" in lockstep
    assert "actors threads, exact policy lag 1" in threads
    assert "actors processes, exact policy lag 1" in processes  # the preset as it is
    assert "actors ray" in ray and envpool.startswith("envpool: envpool:Ant-v5, actors threads")
    assert list(tmp_path.iterdir()) == []  # nothing trained, nothing written
    rows = [dict(preset=name, env_id=f"gymnasium:{env}-v5", seed=seed, env_steps=8192,
                 training_return=100.0 + seed, greedy_return=200.0, wall_time_s=10.0)
            for name, env in (("hopper", "Hopper"), ("ant", "Ant")) for seed in (0, 1)]
    table = results.learning_table(rows)
    assert "| `hopper` | gymnasium:Hopper-v5 | 8,192 | 2 | 100.5 ± 0.5 | 200.0 ± 0.0 | " \
           "2382.86 ± 271.74 | 10 |" in table
    assert "| not given |" in table  # cleanrl's page has no Ant


def test_pbt_vs_sweep_dry_run_checks_both_specs_at_equal_env_steps(capsys):
    # Training a population costs a minute here (tests/test_pbt.py trains two); the smoke
    # run (--smoke) is for a user: the dry run checks every config it would train.
    script = load_script("pbt_vs_sweep")
    result = script.main(["--dry-run"])
    assert len(result["plans"]) == 3
    pbt, sweep = result["plans"][0]
    assert pbt["grid"] == sweep["grid"] and pbt["base"] == sweep["base"]
    assert pbt["pbt"]["population"] == len(sweep["grid"]["learning_rate"])
    assert "800000 and 800000 per repeat" in capsys.readouterr().out


def test_purejaxrls_first_solved_update_matches_a_loop_and_both_benches_refuse_no_checkout(
        tmp_path, script, capsys):
    baseline = script("purejaxrl_baseline")
    # [updates=3, steps=2, envs=2]: episodes end in time order 10, (20, 30) | 40 | (50, 60).
    returns = np.array([[[0, 10], [20, 30]], [[0, 0], [40, 0]], [[50, 60], [0, 0]]], float)
    ended = returns > 0
    # The means of the last two episodes by each update's end: 25, 35, 55.
    assert [baseline.first_solved_update(returns, ended, t, min_episodes=2)
            for t in (20, 30, 50, 56)] == [0, 1, 2, None]
    assert baseline.first_solved_update(returns, ended & False, 0) is None  # no episode, no mean

    rng = np.random.default_rng(0)
    returns = rng.uniform(0, 500, (40, 8, 4))
    ended = rng.random((40, 8, 4)) < 0.3
    for target in (150, 250, 300):
        expected, seen = None, []
        for update in range(40):  # a plain loop over the episodes as they end
            for step in range(8):
                for env in range(4):
                    if ended[update, step, env]:
                        seen.append(returns[update, step, env])
            if seen and expected is None and np.mean(seen[-5:]) >= target:
                expected = update
        assert baseline.first_solved_update(returns, ended, target, min_episodes=5) == expected

    # Both scripts with a purejaxrl mode refuse it without a checkout, before any run.
    for main in (script("bench_time_to_solve").main, script("bench_throughput").main):
        for argv in (["--modes", "purejaxrl"],
                     ["--modes", "purejaxrl", "--purejaxrl", str(tmp_path)]):
            with pytest.raises(SystemExit):
                main(argv)
        assert "no ppo.py" in capsys.readouterr().err


def test_bench_time_to_solve_times_the_runtime_and_the_twin_in_fresh_processes(
        tmp_path, script, capsys):
    bench = script("bench_time_to_solve")
    # A return of 5 is reached by the episodes of the first update (the twin: its first block).
    result = bench.main(["--seeds", "0", "--modes", "async", "sync", "--target", "5",
                         "--total-env-steps", "2048", "--sync-block", "2",
                         "--out", str(tmp_path)])
    rows = {row["mode"]: row for row in result["rows"]}
    assert rows["async"]["solved"] and rows["sync"]["solved"]
    assert rows["async"]["env_steps"] == 512 and rows["sync"]["env_steps"] == 1024  # a block of 2
    assert 0 < rows["async"]["time_s"] and 0 < rows["sync"]["time_s"]
    summary = result["summary"]
    assert summary["async"]["ratio_to_sync"] == pytest.approx(
        rows["async"]["time_s"] / rows["sync"]["time_s"])
    assert json.loads((tmp_path / "results.json").read_text())["target"] == 5.0
    assert "(1/1 solved)" in capsys.readouterr().out


def test_robustness_reads_purejaxrl_metrics_and_refuses_a_missing_checkout(
        tmp_path, script, capsys):
    robustness, baseline = script("robustness"), script("purejaxrl_baseline")
    # [updates=2, steps=2, envs=2]: episodes end in time order 10, (20, 30), 40.
    returns = np.array([[[0, 10], [20, 30]], [[0, 0], [40, 0]]], float)
    ended = returns > 0
    assert baseline.last_episodes_return_mean(returns, ended) == 25.0
    assert baseline.last_episodes_return_mean(returns, ended, min_episodes=2) == 35.0
    assert math.isnan(baseline.last_episodes_return_mean(returns, ended & False))
    with pytest.raises(ValueError, match="updates, steps, envs"):
        baseline.last_episodes_return_mean(returns[0], ended[0])
    stats = robustness.tail_stats([500.0, 480.0, 100.0, float("nan")], threshold=475.0)
    assert stats["solved_fraction"] == 0.5 and math.isnan(stats["p5"])
    assert robustness.tail_stats([0.0, 100.0], threshold=1.0)["p5"] == 5.0  # linear

    logits = np.log(np.array([[0.25, 0.75], [0.5, 0.5]]))
    pi = baseline.StandInCategorical(logits)
    np.testing.assert_allclose(pi.log_prob(np.array([1, 0])), np.log([0.75, 0.5]), rtol=1e-6)
    np.testing.assert_allclose(pi.entropy(), [-(0.25 * np.log(0.25) + 0.75 * np.log(0.75)),
                                             np.log(2)], rtol=1e-6)

    for argv in (["--modes", "purejaxrl"], ["--purejaxrl", str(tmp_path)]):
        with pytest.raises(SystemExit):
            robustness.parse_args(argv)
    assert "no ppo.py" in capsys.readouterr().err


@pytest.mark.real_layout  # the default's row runs as it would outside the suite
def test_bench_auto_layout_rates_the_default_against_the_layouts_picked_by_hand(
        tmp_path, script, capsys):
    bench = script("bench_auto_layout")
    bench.main(["--envs", "python-free", "--layouts", "threads", "--seconds", "1",
                "--warm-up-s", "2", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    threads, default = result["rows"]
    assert (threads["layout"], default["layout"]) == ("threads", "default")
    assert threads["resolved"]["collection"] == "threads"
    assert default["resolved"]["collection"] == "processes"  # what auto picks for a host env
    assert "actor processes" in default["describe"] and default["probe_s"] > 0
    (row,) = result["table"]
    assert row["best by hand"] == "threads"
    assert float(row["default / best"]) == pytest.approx(
        default["env_steps_per_s"] / threads["env_steps_per_s"], abs=0.01)
    with pytest.raises(SystemExit):
        bench.main(["--envs", "gymnax-cartpole", "--layouts", "env-workers"])
    assert "none is a layout of gymnax-cartpole" in capsys.readouterr().err


def test_overlap_probe_breaks_the_program_down_and_times_each_way_to_overlap(tmp_path, script):
    probe = script("overlap_probe")
    probe.main(["--presets", "cartpole", "--updates", "2", "--repeats", "1", "--calls", "2",
                "--out", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    [program] = result["program"]
    for part in ("whole", "rollout", "update"):
        assert program[part]["ms_per_update"] > 0
    assert program["overlap_bound"] == pytest.approx(
        program["whole"]["ms_per_update"] / program["update"]["ms_per_update"])
    assert result["xla"]["ratio"] == pytest.approx(
        result["xla"]["two"]["median_ms"] / result["xla"]["one"]["median_ms"])
    [lockstep] = result["lockstep"]
    assert lockstep["two_threads_vs_program"] == pytest.approx(
        lockstep["program"]["ms_per_update"] / lockstep["two_threads"]["ms_per_update"])
    assert [row["devices"] for row in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert row["gain"] == pytest.approx(
            (row["rollout"]["total_s"] + row["update"]["total_s"]) / row["together"]["wall_s"])


@pytest.fixture
def peers(monkeypatch):
    """experiments/peers/run_peers.py, with experiments/ and experiments/peers/ importable."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    monkeypatch.syspath_prepend(str(EXPERIMENTS / "peers"))
    spec = importlib.util.spec_from_file_location("experiments_run_peers",
                                                  EXPERIMENTS / "peers" / "run_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_peers_rates_the_runtime_in_a_fresh_process_and_a_rerun_skips_it(
        peers, tmp_path, capsys):
    # The runtime's path only: CI has no peer venvs. Two updates of the hopper preset.
    argv = ["--library", "ppo_async", "--env", "Hopper-v5", "--seeds", "1", "--torch-threads",
            "default", "--parts", "rate", "--total-env-steps", "4096", "--out", str(tmp_path)]
    summary = peers.main(argv)
    (row,) = read_rows(tmp_path / "runs.csv")
    assert (row["part"], row["library"], row["torch_threads"], row["env_steps"]) == (
        "rate", "ppo_async", "default", "4096")
    assert float(row["steady_env_steps_per_s"]) > 0 and row["steady_from_env_steps"] == "2048"
    assert math.isfinite(float(row["final_return"])) and int(row["episodes"]) > 0
    assert json.loads(row["versions"])["ppo-async"]
    raw = json.loads((tmp_path / "raw" / "rate_ppo_async_Hopper-v5_s0_tdefault_4096.json")
                     .read_text())
    assert [steps for _, steps in raw["marks"]] == [2048, 4096]
    assert raw["layout"]["collection"] == "processes"  # the preset's actor processes
    (rate,) = summary["rates"]
    assert rate["ppo_async_default_over_this"] == 1.0 and summary["returns"] == []
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["machine"]["load_average_1_5_15_min"] and len(saved["runs"]) == 1
    out = capsys.readouterr().out
    assert "| Hopper-v5 | ppo_async | default |" in out
    assert "python experiments/peers/run_peers.py --library ppo_async" in out
    assert peers.main([*argv, "--dry-run"])["todo"] == []  # done: a rerun runs nothing
    assert "0 runs to do, 1 done" in capsys.readouterr().out


def test_run_peers_steady_rates_thread_settings_and_tables_from_recorded_runs(peers):
    # cleanrl's marks from a smoke run (s, env steps): one at its start, one per update.
    marks = [[2.12, 0], [8.36, 2048], [11.83, 4096], [15.43, 6144], [18.94, 8192]]
    assert peers.steady_rate(marks, 8192) == pytest.approx(((8192 - 2048) / (18.94 - 8.36), 2048))
    assert peers.steady_rate(marks, 8192, warmup_fraction=0.6)[1] == 6144
    assert peers.steady_rate(marks[:2], 100_000) == pytest.approx((2048 / 6.24, 0))  # too short
    assert math.isnan(peers.steady_rate(marks[:1], 8192)[0])

    base = {"OMP_NUM_THREADS": "4", "XLA_FLAGS": "--xla_a --xla_cpu_multi_thread_eigen=false",
            "PYTHONPATH": "x"}
    one = peers.child_environment("ppo_async", "1", base)
    assert one["OMP_NUM_THREADS"] == "1" and one["XLA_FLAGS"].split() == [
        "--xla_a", "--xla_cpu_multi_thread_eigen=false"] and one["PYTHONPATH"] == "x"
    default = peers.child_environment("sb3", "default", base)
    assert "OMP_NUM_THREADS" not in default and "PYTHONPATH" not in default
    assert default["XLA_FLAGS"] == "--xla_a"
    assert peers.missing_venvs(["ppo_async"]) == []

    # runs.csv rows (strings) of a smoke run's rates, and made-up returns.
    rates = {("cleanrl", "1"): 580.7, ("cleanrl", "default"): 116.2, ("sb3", "1"): 677.9,
             ("sample_factory", "default"): 1055.5, ("ppo_async", "default"): 7169.3}
    rows = [dict(part="rate", library=lib, env_id="Hopper-v5", seed="0", torch_threads=threads,
                 total_env_steps="8192", steady_env_steps_per_s=str(rate),
                 load_average_1_min_before="5.0", final_return="40.0")
            for (lib, threads), rate in rates.items()]
    rows += [dict(part="return", library=lib, env_id="Hopper-v5", seed=str(seed),
                  torch_threads="1", total_env_steps="1000000",
                  final_return=str(ret + 100 * seed))
             for lib, ret in (("cleanrl", 2000), ("sb3", 1800), ("sample_factory", 1000),
                              ("ppo_async", 2300)) for seed in (0, 1)]
    summary = peers.summarize(rows)
    by_key = {(r["library"], r["torch_threads"]): r for r in summary["rates"]}
    assert list(by_key) == list(rates)  # the libraries' order, then the threads'
    assert by_key["cleanrl", "default"]["ppo_async_default_over_this"] == pytest.approx(
        7169.3 / 116.2)
    returns = {r["library"]: r for r in summary["returns"]}
    assert returns["sb3"]["final_return"] == 1850 and returns["sb3"]["runs"] == 2
    assert returns["peers' mean"]["final_return"] == pytest.approx((2050 + 1850 + 1050) / 3)
    table = peers.tables(summary)
    assert "| Hopper-v5 | cleanrl | default | 116 ± 0 | 1 | 5.00 | 61.70x |" in table
    assert "| Hopper-v5 | sb3 | 1,000,000 | 1850.0 ± 50.0 | 2 |" in table
    assert "| Hopper-v5 | peers' mean |  | 1650.0 |  |" in table


def test_cleanrl_bridge_gives_gymnasium_0_28s_same_step_reset_and_final_info(monkeypatch):
    # The bridge under the project's gymnasium 1.x, without cleanrl or torch.
    import gymnasium

    monkeypatch.syspath_prepend(str(EXPERIMENTS / "peers"))
    spec = importlib.util.spec_from_file_location("experiments_cleanrl_bridge",
                                                  EXPERIMENTS / "peers" / "cleanrl_bridge.py")
    bridge = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bridge)
    batched = {"episode": {"r": np.array([38.0, 0.0]), "_r": np.array([True, False])},
               "_episode": np.array([True, False]), "x": np.array([0.1, 0.2]),
               "_x": np.array([True, True])}
    assert bridge.unbatch(batched, 0) == {"episode": {"r": 38.0}, "x": 0.1}
    assert bridge.unbatch(batched, 1) == {"x": 0.2}

    TransformObservation, SyncVectorEnv = bridge.gymnasium_bridges()

    def make():
        env = gymnasium.wrappers.RecordEpisodeStatistics(gymnasium.make("CartPole-v1"))
        return TransformObservation(env, lambda obs: np.clip(obs, -0.1, 0.1))  # no space given

    envs = SyncVectorEnv([make, make])
    obs, _ = envs.reset(seed=0)
    assert envs.single_observation_space == gymnasium.make("CartPole-v1").observation_space
    for _ in range(200):  # pushing right: CartPole falls within tens of steps
        obs, reward, terminated, truncated, infos = envs.step(np.ones(2, dtype=np.int64))
        if "final_info" in infos:
            break
    done = terminated | truncated
    assert done.any() and list(infos["_final_info"]) == list(done)
    for index in range(2):
        info = infos["final_info"][index]
        if done[index]:  # 0.28's shape: one dict per finished env, the reset obs returned
            assert info["episode"]["r"] == info["episode"]["l"] > 0
            assert not np.array_equal(obs[index], infos["final_observation"][index])
        else:
            assert info is None
    assert np.abs(obs).max() <= 0.1
    envs.close()


def test_minatar_torso_alternates_the_torsos_per_seed_and_reads_them_at_equal_wall_time(
        tmp_path, script, capsys):
    torso = script("minatar_torso")
    # One update of 64 envs x 16 steps per run; each run is a sweep worker (a fresh process).
    argv = ["--total-env-steps", "1024", "--num-steps", "16", "--seeds", "1",
            "--out", str(tmp_path)]
    result = torso.main(argv)
    assert sorted((r["torso"], r["seed"], r["env_steps"]) for r in result["runs"]) == [
        ("minatar", 0, 1024), ("none", 0, 1024)]
    walls = {r["torso"]: r["learner_wall_time_s"] for r in result["runs"]}
    assert {r["equal_wall_time_s"] for r in result["runs"]} == {min(walls.values())}
    assert all(r["wall_time_s"] > 0 and r["env_steps_per_s"] != r["env_steps_per_s"]  # 1 update
               for r in result["runs"])
    for name in ("runs.csv", "curves.csv", "torso.png", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0
    runs = read_rows(tmp_path / "sweeps" / "seed=0" / "runs.csv")
    assert [r["torso"] for r in runs] == ["minatar", "none"]  # the order they ran in
    out = capsys.readouterr().out
    assert "| minatar | 1,024 | 1 |" in out and "python experiments/minatar_torso.py" in out
    # The torsos' curves at equal wall time: a curve read before its first point is NaN.
    assert math.isnan(torso.common.value_at([2.0, 3.0], [1.0, 5.0], 1.0))
    assert torso.common.value_at([2.0, 3.0], [1.0, 5.0], 2.5) == 1.0
    summary = {"minatar": {"return_at_equal_wall_time": 2.0}, "none": {
        "return_at_equal_wall_time": 3.0}}
    assert torso.winner(summary) == "none"


def test_minatar_results_trains_each_game_resumably_beside_the_published_return(
        tmp_path, script, capsys):
    results = script("minatar_results")
    argv = ["--games", "breakout-minatar-10m", "--total-env-steps", "1024", "--num-steps", "16",
            "--seeds", "1", "--out", str(tmp_path)]
    planned = results.main([*argv, "--dry-run"])
    assert planned == {"breakout-minatar-10m": [
        "seed=0 (fresh): Breakout-MinAtar, 1 updates of 1024, torso none"]}
    first = results.main(argv)
    (row,) = first["results"]
    assert (row["env_id"], row["torso"], row["seed"], row["env_steps"]) == (
        "Breakout-MinAtar", "none", 0, 1024)
    assert row["wall_time_s"] > 0
    for name in ("results.csv", "curves.csv", "learning_curves.png", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0
    out = capsys.readouterr().out
    assert "| Breakout-MinAtar | `breakout-minatar-10m` | none | 1,024 | 1 |" in out
    assert "| 28 |" in out and "gymnax README" in out  # the published reference column
    # A rerun skips the finished run: the same row, its wall time unchanged.
    again = results.main(argv)
    assert again["results"] == first["results"]
    assert set(results.PUBLISHED) == {"Breakout-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar",
                                      "SpaceInvaders-MinAtar"}


def test_cnn_update_times_the_projects_update_and_a_plain_jit_without_torch(
        tmp_path, script, capsys):
    cnn = script("cnn_update")
    # A minibatch of 16 frames (8 envs x 8 steps / 4 minibatches); torch is left out (CI has
    # no side venv), and asking for it without the venv is refused before any run.
    with pytest.raises(SystemExit):
        cnn.main(["--ways", "torch", "--torch-python", str(tmp_path / "none")])
    assert "needs" in capsys.readouterr().err
    result = cnn.main(["--ways", "update", "jit", "--num-steps", "8", "--repeats", "1",
                       "--out", str(tmp_path)])
    rows = {row["way"]: row for row in result["rows"]}
    assert set(rows) == {"update", "jit"}
    assert {row["minibatch"] for row in rows.values()} == {16}
    assert rows["update"]["minibatches_per_call"] == 16  # 4 epochs x 4 minibatches
    assert rows["update"]["fwd_bwd_ms"] > 0 and rows["jit"]["fwd_ms"] > 0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["machine"]["cpu_count"] >= 1 and len(read_rows(tmp_path / "results.csv")) == 2
    assert "x fastest" in capsys.readouterr().out


def test_atari_pong_smoke_runs_a_few_updates_and_reports_no_threshold_reached(
        tmp_path, script, capsys):
    pytest.importorskip("envpool")
    pong = script("atari_pong")
    result = pong.main(["--learner-device", "cpu", "--total-env-steps", "256",
                        "--num-steps", "16", "--out", str(tmp_path)])
    assert (result["env_steps"], result["updates"]) == (256, 2)  # 8 envs x 16 steps each
    assert not result["reached"] and math.isnan(result["time_to_threshold_s"])
    assert result["config"]["torso"] == "nature" and result["learner_device"] == "cpu"
    assert [row["env_steps"] for row in read_rows(tmp_path / "curve.csv")] == ["128", "256"]
    assert (tmp_path / "curve.png").stat().st_size > 0
    assert "return 18 not reached" in capsys.readouterr().out
