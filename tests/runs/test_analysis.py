"""Run directories as arrays, seeds grouped, IQM and stratified bootstrap, and `ppo-async plot`.

The runs here are hand-written ``metrics.jsonl`` + ``config.json`` files with
the names and shapes a real run writes, so the tests take milliseconds
(tests/runtime/test_runtime.py and tests/runs/test_wandb_log.py plot trained runs).
"""

import json
import math
import os

import numpy as np
import pytest

from ppo_async import AsyncActorLearnerConfig
from ppo_async.runs.analysis import (
    aligned,
    bootstrap_mean_band,
    group_runs,
    iqm,
    load_run,
    load_runs,
    runs_dataframe,
    stratified_bootstrap_ci,
)
from ppo_async.runs.plotting import PANELS, plot_runs

from run_helpers import drawn_figures

UPDATES = 12
BATCH = 64


def write_run(run_dir, *, seed=0, num_actors=2, updates=UPDATES, rate=1000.0, lags=(0, 1),
              summary=True, segments=None, compile_s=2.0, evaluations=()):
    """A run directory as train() leaves it: config.json, segments.json, metrics.jsonl, summary.json.

    ``compile_s``: seconds before the first update; ``evaluations``: the updates a periodic
    evaluation evaluated, each a line of its own after the updates' (it finished later).
    """
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True)
    config = AsyncActorLearnerConfig(num_actors=num_actors, envs_per_actor=2, num_steps=64 // (2 * num_actors),
                                     seed=seed, total_env_steps=BATCH * updates)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    (run_dir / "segments.json").write_text(json.dumps(
        segments or [{"segment": 0, "start_update": 0, "start_env_steps": 0}]))
    lines = []
    for u in range(1, updates + 1):
        env_steps = u * BATCH
        lines.append(json.dumps({
            "policy_loss": float(rng.normal()), "value_loss": float(rng.uniform(1, 2)),
            "entropy": 0.69 - 0.01 * u, "approx_kl": 1e-3, "clip_fraction": 0.1,
            "update": u, "env_steps": env_steps,
            # The segment's average since the learner started (2 s of compile at the start).
            "env_steps_per_s": env_steps / (compile_s + env_steps / rate),
            "episode_return": None if u == 1 else 10.0 * u + seed,
            "policy_lag_mean": float(np.mean(lags)), "policy_lag_max": max(lags),
        }))
    for u in evaluations:
        lines.append(json.dumps({"update": u, "env_steps": u * BATCH, "eval_return_mean": 100.0 + u,
                                 "eval_return_std": 1.0, "eval_policy_version": u}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if summary:
        counts = {str(lag): 1 + lag for lag in lags}
        (run_dir / "summary.json").write_text(json.dumps({"policy_lag_counts": counts}))
    return run_dir


@pytest.fixture
def three_runs(tmp_path):
    """Two seeds of one config and one run of another."""
    return [write_run(tmp_path / "a0", seed=0), write_run(tmp_path / "a1", seed=1),
            write_run(tmp_path / "b0", seed=0, num_actors=4, rate=2000.0)]


def test_load_run_gives_arrays_of_every_metric_and_wall_time(three_runs):
    run = load_run(three_runs[0])
    assert run.num_updates == UPDATES and run.config["seed"] == 0 and run.summary
    for name in ("update", "env_steps", "episode_return", "policy_loss", "wall_time_s",
                 "env_steps_per_s_window"):
        assert run.metrics[name].shape == (UPDATES,) and run.metrics[name].dtype == np.float64
    assert math.isnan(run.metrics["episode_return"][0])  # null in the file
    assert run.final("episode_return") == 10.0 * UPDATES
    # Wall time: 2 s before the first update, then 1000 env steps/s.
    np.testing.assert_allclose(run.metrics["wall_time_s"], 2.0 + run.metrics["env_steps"] / 1000.0)
    np.testing.assert_allclose(run.metrics["env_steps_per_s_window"][1:], 1000.0)


def test_wall_time_adds_up_the_segments_of_a_resumed_run(tmp_path):
    # Resumed at update 6 (384 env steps): the second segment's clock starts again at 0.
    run_dir = write_run(tmp_path / "r", segments=[
        {"segment": 0, "start_update": 0, "start_env_steps": 0},
        {"segment": 1, "start_update": 6, "start_env_steps": 6 * BATCH}])
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in lines[6:]:
        segment_steps = record["env_steps"] - 6 * BATCH
        record["env_steps_per_s"] = segment_steps / (2.0 + segment_steps / 1000.0)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    run = load_run(run_dir)
    wall = run.metrics["wall_time_s"]
    first = 2.0 + 6 * BATCH / 1000.0
    np.testing.assert_allclose(wall[:6], 2.0 + np.arange(1, 7) * BATCH / 1000.0)
    np.testing.assert_allclose(wall[6:], first + 2.0 + np.arange(1, 7) * BATCH / 1000.0)
    assert np.all(np.diff(wall) > 0)
    # The plot's throughput: no window spans the resume's 2 s start-up (it read 3.5x
    # slower for the ten updates after it); the resumed segment's first update has
    # none, as the run's first.
    rate = run.metrics["env_steps_per_s_window"]
    assert np.isnan(rate[0]) and np.isnan(rate[6])
    np.testing.assert_allclose(np.delete(rate, [0, 6]), 1000.0)


def test_runs_differing_only_by_seed_form_a_group(three_runs):
    runs = load_runs(three_runs)
    groups = group_runs(runs)
    assert [len(g) for g in groups.values()] == [2, 1]
    # Labelled by the fields given that differ between the groups (an unset lead stays
    # unset in config.json, so the lead the sizes imply does not label them).
    assert list(groups) == ["num_actors=2, num_steps=16", "num_actors=4, num_steps=8"]
    assert list(group_runs(runs[:2])) == ["CartPole-v1"]  # one group: named by its env


def test_aligned_curves_and_band_shapes(three_runs):
    runs = load_runs(three_runs)
    grid, values = aligned(runs[:2], "episode_return")  # same env steps: kept as they are
    assert grid.shape == (UPDATES,) and values.shape == (2, UPDATES)
    np.testing.assert_array_equal(grid, runs[0].metrics["env_steps"])
    grid, values = aligned(runs, "episode_return", x="wall_time_s", num_points=50)
    assert grid.shape == (50,) and values.shape == (3, 50)
    assert grid[0] >= max(r.metrics["wall_time_s"][0] for r in runs)  # the range all runs cover
    mean, low, high = bootstrap_mean_band(values)
    assert mean.shape == low.shape == high.shape == (50,)
    ok = np.isfinite(mean)
    assert ok.any() and np.all(low[ok] <= mean[ok] + 1e-9) and np.all(mean[ok] <= high[ok] + 1e-9)


def test_dataframe_has_a_row_per_update(three_runs):
    pytest.importorskip("pandas")
    frame = runs_dataframe(load_runs(three_runs))
    assert len(frame) == 3 * UPDATES
    assert {"run", "group", "seed", "episode_return", "wall_time_s"} <= set(frame.columns)
    assert frame.groupby("group", sort=False)["run"].nunique().tolist() == [2, 1]


# --- IQM and the stratified bootstrap ----------------------------------------------------


def test_iqm_by_hand():
    # 8 scores: cut the 2 lowest and the 2 highest; the middle half is 3, 4, 5, 6.
    assert iqm([100.0, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)
    # The mean would be pulled by the outlier; the IQM is not.
    assert iqm([1.0, 2, 3, 4]) == pytest.approx(2.5)
    assert iqm([5.0]) == 5.0


def test_iqm_agrees_with_scipy_trim_mean():
    from scipy.stats import trim_mean

    rng = np.random.default_rng(0)
    for n in (4, 8, 20, 100, 7, 10):  # divisible by 4, and not (scipy cuts floor(n/4) too)
        scores = rng.standard_cauchy(n)
        assert iqm(scores) == pytest.approx(trim_mean(scores, 0.25))
    runs_by_tasks = rng.normal(size=(12, 5))
    np.testing.assert_allclose(iqm(runs_by_tasks, axis=0), trim_mean(runs_by_tasks, 0.25, axis=0))
    assert iqm(runs_by_tasks) == pytest.approx(trim_mean(runs_by_tasks.ravel(), 0.25))


def test_bootstrap_ci_contains_the_estimate_and_narrows_with_more_seeds():
    rng = np.random.default_rng(0)
    population = rng.normal(10.0, 2.0, size=(400, 3))  # runs x tasks
    widths = []
    for seeds in (5, 20, 80):
        estimate = stratified_bootstrap_ci(population[:seeds], iqm, reps=500)
        assert estimate.low <= estimate.point <= estimate.high
        assert estimate.point == pytest.approx(iqm(population[:seeds]))
        widths.append(estimate.high - estimate.low)
    assert widths[0] > widths[1] > widths[2] > 0
    # The 95% interval of the mean of 80 draws covers the true mean 10.
    mean = stratified_bootstrap_ci(population[:80], np.mean, reps=500)
    assert mean.low < 10.0 < mean.high


def test_the_bootstrap_is_stratified_by_task():
    # Task 0 scores 0, task 1 scores 100: a resample that mixed tasks could give other means.
    scores = np.column_stack([np.zeros(6), np.full(6, 100.0)])
    estimate = stratified_bootstrap_ci(scores, np.mean, reps=200)
    assert estimate == (50.0, 50.0, 50.0)


# --- figures -------------------------------------------------------------------------------


def test_plot_of_three_runs_writes_a_figure(three_runs, tmp_path, capsys):
    from ppo_async.tools.cli import main

    out = tmp_path / "overview.png"
    main(["plot", *map(str, three_runs), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert str(out) in capsys.readouterr().out
    main(["plot", *map(str, three_runs), "--x", "wall_time", "--out", str(tmp_path / "wall.png")])
    assert (tmp_path / "wall.png").stat().st_size > 20_000
    main(["plot", str(three_runs[0])])  # one run: its curves.png
    assert (three_runs[0] / "curves.png").stat().st_size > 20_000


def test_every_panel_is_drawn_and_the_lag_ticks_do_not_collide(tmp_path, monkeypatch):
    # Lags 0..59: a tick per lag would put 60 labels on one small axis.
    run = write_run(tmp_path / "lagged", lags=tuple(range(60)))
    figures = drawn_figures(monkeypatch)
    plot_runs([run], tmp_path / "lagged.png")
    (figure,) = figures
    axes = figure.axes
    assert len(axes) == len(PANELS) + 1
    for (metric, _), ax in zip(PANELS, axes):
        assert ax.lines, metric  # drawn, not "not recorded"
    histogram = axes[-1]
    heights = [bar.get_height() for bar in histogram.patches]
    np.testing.assert_allclose(heights, np.arange(1, 61) / np.arange(1, 61).sum())  # shares
    ticks = [t for t in histogram.get_xticks() if histogram.get_xlim()[0] <= t <= histogram.get_xlim()[1]]
    assert 2 <= len(ticks) <= 12
    assert all(float(t).is_integer() for t in ticks)


def test_plot_errors_are_one_line(tmp_path, capsys):
    from ppo_async.tools.cli import main

    (tmp_path / "empty").mkdir()
    for args in (["plot", str(tmp_path / "empty")], ["plot"]):
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err


def test_evaluation_lines_merge_into_their_update_and_plot_beside_runs_without(
    tmp_path, monkeypatch
):
    # Two seeds of one config: one evaluated every 4 updates, the other never.
    evaluated = load_run(write_run(tmp_path / "e0", seed=0, evaluations=(4, 8, 12)))
    assert evaluated.num_updates == UPDATES  # merged, not rows of their own
    evals = evaluated.metrics["eval_return_mean"]
    np.testing.assert_array_equal(evaluated.metrics["update"][np.isfinite(evals)], [4, 8, 12])
    np.testing.assert_array_equal(evals[np.isfinite(evals)], [104.0, 108.0, 112.0])
    assert np.isfinite(evaluated.metrics["policy_loss"]).all()
    plain = write_run(tmp_path / "p1", seed=1)
    figures = drawn_figures(monkeypatch)
    plot_runs([evaluated.path, plain], tmp_path / "mixed.png")
    (figure,) = figures
    dots = [line for line in figure.axes[0].lines if line.get_marker() == "o"]
    assert [list(d.get_ydata()[np.isfinite(d.get_ydata())]) for d in dots] == [[104, 108, 112]]
    assert "greedy evaluation" in figure.axes[0].get_title()


def test_wall_clock_groups_line_seeds_up_from_their_first_update(tmp_path, monkeypatch):
    # Seeds of one config whose clocks do not overlap at all (the second compiled for 30 s).
    dirs = [write_run(tmp_path / "w0", seed=0, compile_s=2.0),
            write_run(tmp_path / "w1", seed=1, compile_s=30.0, rate=1100.0)]
    runs = load_runs(dirs)
    assert runs[0].metrics["wall_time_s"][-1] < runs[1].metrics["wall_time_s"][0]
    grid, values = aligned(runs, "entropy", x="wall_time_s", from_start=True)
    span = (UPDATES - 1) * BATCH / 1100.0  # the shorter seed: from its first update to its last
    assert grid[0] == 0.0 and grid[-1] == pytest.approx(span)
    assert np.isfinite(values).all()
    mean, _, _ = bootstrap_mean_band(values)
    # Entropy falls 0.01 per update in both seeds: the mean falls at one rate, without a jump.
    assert np.diff(mean)[0] < 0
    np.testing.assert_allclose(np.diff(mean), np.diff(mean)[0])
    figures = drawn_figures(monkeypatch)
    plot_runs(dirs, tmp_path / "wall.png", x="wall_time")
    entropy_ax = figures[0].axes[[m for m, _ in PANELS].index("entropy")]
    mean_line = max(entropy_ax.lines, key=lambda line: line.get_linewidth())
    np.testing.assert_allclose(mean_line.get_xdata()[[0, -1]], [0.0, span])
    assert np.isfinite(mean_line.get_ydata()).all()
    assert "first update" in entropy_ax.get_xlabel()


def test_a_damaged_metrics_line_is_skipped_with_a_warning(tmp_path, capsys):
    from ppo_async.runs.analysis import MetricsWarning
    from ppo_async.tools.cli import main

    run_dir = write_run(tmp_path / "damaged")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2][:17]  # line 3 cut
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(MetricsWarning, match=r"metrics\.jsonl, line 3: not a JSON object"):
        run = load_run(run_dir)
    assert run.num_updates == UPDATES - 1 and 3 not in run.metrics["update"]
    main(["plot", str(run_dir)])
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"ppo-async: warning: {run_dir / 'metrics.jsonl'}, line 3: "
                                "not a JSON object (cut by a crash?); skipped"]


def test_plot_skips_a_run_without_updates_and_fails_when_none_has_any(three_runs, tmp_path, capsys):
    from ppo_async.tools.cli import main

    refused = tmp_path / "refused"  # what a run refused before its first update leaves
    refused.mkdir()
    (refused / "config.json").write_text((three_runs[0] / "config.json").read_text())
    (refused / "metrics.jsonl").write_text("")
    out = tmp_path / "overview.png"
    main(["plot", *map(str, three_runs), str(refused), "--out", str(out)])
    assert out.stat().st_size > 20_000
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ppo-async: plot: skipping {refused}: ")
    stray = tmp_path / "stray"  # a directory that is no run at all
    stray.mkdir()
    with pytest.raises(SystemExit) as info:
        main(["plot", str(refused), str(stray), "--out", str(out)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "none of the 2 run directories has an update recorded" in err[-1]
    with pytest.raises(SystemExit):  # a directory not there is a typo: said before any plot
        main(["plot", *map(str, three_runs), str(tmp_path / "missing"), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing': no such directory" in err[0]


@pytest.mark.parametrize("content, expected", [
    ('{"env_id": "CartPole-v1", "se', "not valid JSON"),
    ("[1, 2, 3]", "expected a JSON object of config fields, found list"),
])
def test_plot_of_a_damaged_config_is_one_line(three_runs, capsys, content, expected):
    from ppo_async.tools.cli import main

    (three_runs[0] / "config.json").write_text(content)
    with pytest.raises(SystemExit) as info:
        main(["plot", str(three_runs[0])])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err and "config.json" in err, err
    assert "Traceback" not in err


def test_a_sweeps_long_labels_go_under_the_panels_without_overlapping_them(tmp_path,
                                                                          monkeypatch):
    # Five groups that differ in eight fields: each label is ~150 characters. In the
    # return panel they covered its curves and ran off the figure's left edge, and
    # matplotlib gave up its layout ("Tight layout not applied").
    import warnings

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    dirs = []
    for i in range(5):
        run_dir = write_run(tmp_path / f"g{i}", seed=0)
        config = json.loads((run_dir / "config.json").read_text())
        config.update(learning_rate=1e-4 * (i + 1), ent_coef=0.01 * i, vf_coef=0.5 + i,
                      clip_eps=0.1 + 0.01 * i, gamma=0.9 + 0.01 * i, gae_lambda=0.9 + 0.01 * i,
                      max_grad_norm=0.5 + i, num_epochs=1 + i)
        (run_dir / "config.json").write_text(json.dumps(config))
        dirs.append(run_dir)
    figures = drawn_figures(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_runs(dirs, tmp_path / "sweep.png")
    assert not [w for w in caught if "layout" in str(w.message)]
    (figure,) = figures
    (legend,) = figure.legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert len(labels) == 5 and all("learning_rate=" in label for label in labels)
    assert min(len(label) for label in labels) > 120
    renderer = FigureCanvasAgg(figure).get_renderer()
    box, page = legend.get_window_extent(renderer), figure.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0
    assert all(box.y1 < ax.get_tightbbox(renderer).y0 for ax in figure.axes)


def test_an_over_long_metrics_line_is_skipped_in_bounded_memory(tmp_path):
    import tracemalloc

    from ppo_async.runs.analysis import MetricsWarning
    from ppo_async.runs.run_dir import MAX_METRICS_LINE_BYTES, cut_metrics_after

    run_dir = write_run(tmp_path / "run")
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    with path.open("w") as file:
        file.write("\n".join(lines[:2]) + "\n")
    os.truncate(path, path.stat().st_size + (64 << 20))  # line 3: 64 MiB of zeros (sparse)
    with path.open("a") as file:
        file.write("\n" + "\n".join(lines[2:]) + "\n")
    tracemalloc.start()
    try:
        with pytest.warns(MetricsWarning, match=rf"line 3: longer than {MAX_METRICS_LINE_BYTES} "
                                                 "bytes, not a metrics line; skipped"):
            run = load_run(run_dir)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MAX_METRICS_LINE_BYTES, peak
    assert run.num_updates == UPDATES and run.metrics["update"].tolist() == list(range(1, 13))
    # A resume cuts the log back: the over-long line goes with it.
    assert cut_metrics_after(run_dir, 5) == 5
    assert [json.loads(line)["update"] for line in path.read_text().splitlines()] == [1, 2, 3,
                                                                                      4, 5]


@pytest.mark.parametrize("name", ["config.json", "segments.json", "summary.json"])
def test_a_huge_run_file_is_refused_giving_both_sizes_without_being_read(three_runs, capsys,
                                                                          name):
    from ppo_async.tools.cli import main

    os.truncate(three_runs[0] / name, 2 << 30)  # 2 GiB, sparse: nothing on disk
    with pytest.raises(SystemExit) as info:
        main(["plot", str(three_runs[0])])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and line.startswith("ppo-async: invalid configuration: ")
    assert f"{three_runs[0] / name} is {2 << 30} bytes, more than the " in line, line
