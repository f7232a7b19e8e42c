"""Run directories as arrays, grouped by config, and statistics over seeds.

    from ppo_async.runs.analysis import load_runs, group_runs, iqm, stratified_bootstrap_ci
    runs = load_runs(sorted(glob.glob("runs/CartPole-v1-*")))
    for label, group in group_runs(runs).items():           # runs whose configs differ only by seed
        finals = np.array([[r.final("episode_return")] for r in group])   # [runs, tasks]
        print(label, stratified_bootstrap_ci(finals, iqm))
    frame = runs_dataframe(runs)                            # one row per update (needs pandas)

Statistics follow Agarwal et al. (2021), "Deep RL at the edge of the
statistical precipice": the interquartile mean (IQM, the mean of the middle
50% of scores, pooled over runs and tasks) and percentile confidence
intervals from a stratified bootstrap (runs resampled with replacement within
each task). They are written here with numpy rather than taken from rliable:
rliable 1.2.0 computes its intervals with ``arch``, whose releases break with
pandas 3, and the off-policy study will reuse these same functions, so the
project keeps one small implementation that its tests check against
``scipy.stats.trim_mean``.

Wall-clock time: each update's ``wall_time_s`` (seconds of training since the
run started, summed over its segments) is derived from ``metrics.jsonl``'s
``env_steps_per_s`` (env steps of the segment per second of the segment's
learner time) and ``segments.json``'s segment starts; compile time before the
first update is counted, as the learner waits for it.
"""

from __future__ import annotations

import json
import math
import pathlib
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ppo_async.runs.run_dir import (
    MAX_METRICS_LINE_BYTES,
    MAX_RECORD_BYTES,
    METRICS_FILE,
    SEGMENTS_FILE,
    SUMMARY_FILE,
    metrics_lines,
    read_bounded,
    read_config_fields,
)

# The config field that tells the seeds of one experiment apart.
SEED_FIELD = "seed"
# Updates over which ``env_steps_per_s_window`` measures the throughput.
RATE_WINDOW = 10


class MetricsWarning(UserWarning):
    """A line of ``metrics.jsonl`` that is not a JSON object, skipped when the run was read."""


# The keys of an evaluation's own line (`ppo_async.runtime.learner.drain_evaluations`).
EVALUATION_KEYS = frozenset({"update", "env_steps", "eval_return_mean", "eval_return_std",
                             "eval_policy_version"})


def read_metrics(run_dir: str | pathlib.Path) -> list[dict[str, Any]]:
    """The per-update metrics of a run (``metrics.jsonl``), in order; ``null`` becomes NaN.

    A periodic evaluation has a line of its own, written when it finished
    (updates later); its values are merged into the record of the update it
    evaluated. A line that is not a JSON object (the last one, cut by a
    crash, or a damaged one) is skipped with a `MetricsWarning` naming the
    file and the line. Raises FileNotFoundError if there is no
    ``metrics.jsonl`` or it holds no update yet.
    """
    path = pathlib.Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics; is {run_dir} a run directory?")
    updates: list[dict[str, Any]] = []
    evaluations: list[dict[str, Any]] = []
    for number, line, record in metrics_lines(path):
        if record is None:
            why = ("not a JSON object (cut by a crash?)" if line is not None else
                   f"longer than {MAX_METRICS_LINE_BYTES} bytes, not a metrics line")
            warnings.warn(f"{path}, line {number}: {why}; skipped", MetricsWarning, stacklevel=2)
            continue
        record = {k: math.nan if v is None else v for k, v in record.items()}
        is_evaluation = "update" in record and record.keys() <= EVALUATION_KEYS
        (evaluations if is_evaluation else updates).append(record)
    if not updates:
        raise FileNotFoundError(f"{path}: no update recorded yet; plot again once the run has made one")
    return _merge_evaluations(updates, evaluations)


def _merge_evaluations(updates: list[dict[str, Any]],
                       evaluations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each evaluation's values in the record of the update it evaluated (its own, if none)."""
    by_update = {record.get("update"): record for record in updates}
    orphans = []
    for evaluation in evaluations:
        if evaluation["update"] in by_update:
            by_update[evaluation["update"]].update(
                (k, v) for k, v in evaluation.items() if k not in ("update", "env_steps"))
        else:
            orphans.append(evaluation)
    if not orphans:
        return updates
    return sorted(updates + orphans, key=lambda record: _as_float(record.get("update")))


def _as_float(value: Any) -> float:
    """A metric's value as a float: NaN for a missing or non-numeric one."""
    return float(value) if isinstance(value, (int, float)) else math.nan


class Run(NamedTuple):
    """One run directory, loaded."""

    path: pathlib.Path
    config: dict[str, Any]  # config.json (the newest segment's config); {} if missing
    metrics: dict[str, np.ndarray]  # metric name -> [updates] float64 (NaN where an update lacks it)
    summary: dict[str, Any] | None  # summary.json, written when the run finished; None before

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def num_updates(self) -> int:
        return len(self.metrics["update"])

    def final(self, metric: str = "episode_return") -> float:
        """The metric's last finite value (NaN if it has none)."""
        values = self.metrics.get(metric, np.array([]))
        finite = values[np.isfinite(values)]
        return float(finite[-1]) if finite.size else math.nan


def _wall_time(metrics: dict[str, np.ndarray], segments: list[dict[str, Any]]) -> np.ndarray:
    """Seconds of training at each update, summed over segments (see the module doc)."""
    update, env_steps, rate = metrics["update"], metrics["env_steps"], metrics["env_steps_per_s"]
    starts = sorted((int(s.get("start_update", 0)), int(s.get("start_env_steps", 0)))
                    for s in segments) or [(0, 0)]
    wall = np.full(update.shape, math.nan)
    offset = 0.0
    for i, (start_update, start_env_steps) in enumerate(starts):
        end_update = starts[i + 1][0] if i + 1 < len(starts) else math.inf
        rows = (update > start_update) & (update <= end_update)
        with np.errstate(divide="ignore", invalid="ignore"):
            wall[rows] = offset + (env_steps[rows] - start_env_steps) / rate[rows]
        if rows.any():
            offset = float(wall[rows][-1])
    return wall


def _segment_of(update: np.ndarray, segments: list[dict[str, Any]]) -> np.ndarray:
    """The ``start_update`` of the segment each update belongs to (0 for a run never resumed)."""
    starts = np.array(sorted(int(s.get("start_update", 0)) for s in segments) or [0])
    return starts[np.maximum(np.searchsorted(starts, update, side="left") - 1, 0)]


def _windowed_rate(env_steps: np.ndarray, wall_time_s: np.ndarray, segment: np.ndarray,
                   window: int = RATE_WINDOW) -> np.ndarray:
    """Env steps per second over the last ``window`` updates of the same segment (`_segment_of`:
    a window never spans a resume's start-up); fewer at a segment's start, NaN at the run's
    first update and at a resumed segment's."""
    rate = np.full(env_steps.shape, math.nan)
    for i in range(1, len(env_steps)):
        j = max(0, i - window)
        while segment[j] != segment[i]:
            j += 1
        seconds = wall_time_s[i] - wall_time_s[j]
        if seconds > 0:
            rate[i] = (env_steps[i] - env_steps[j]) / seconds
    return rate


def load_run(run_dir: str | pathlib.Path) -> Run:
    """A run directory as arrays: every scalar of ``metrics.jsonl``, plus ``wall_time_s`` and
    ``env_steps_per_s_window`` (the throughput over the last `RATE_WINDOW` updates of a
    segment; the file's ``env_steps_per_s`` averages over the whole segment, the first
    update's compile included).

    Raises FileNotFoundError if the run has no metrics yet, and `ConfigError` if its
    ``config.json`` is not a JSON object (`ppo_async.runs.run_dir.read_config_fields`).
    """
    path = pathlib.Path(run_dir)
    config = read_config_fields(path)
    records = read_metrics(path)
    # Only metrics: a field no record holds a number in (a label, say) is left out.
    names = list(dict.fromkeys(name for record in records for name, value in record.items()
                               if isinstance(value, (int, float))))
    metrics = {name: np.array([_as_float(r.get(name)) for r in records], dtype=np.float64)
               for name in names}
    summary_path, segments_path = path / SUMMARY_FILE, path / SEGMENTS_FILE
    summary = (json.loads(read_bounded(summary_path, MAX_RECORD_BYTES))
               if summary_path.is_file() else None)
    segments = (json.loads(read_bounded(segments_path, MAX_RECORD_BYTES))
                if segments_path.is_file() else [])
    if "wall_time_s" not in metrics and {"env_steps", "env_steps_per_s"} <= metrics.keys():
        metrics["wall_time_s"] = _wall_time(metrics, segments)
    if "wall_time_s" in metrics:
        segment = (_segment_of(metrics["update"], segments) if "update" in metrics
                   else np.zeros(len(metrics["wall_time_s"]), int))
        metrics["env_steps_per_s_window"] = _windowed_rate(
            metrics["env_steps"], metrics["wall_time_s"], segment)
    return Run(path, config or {}, metrics, summary)


def expand_sweep_dirs(paths: Iterable[str | pathlib.Path]) -> list[pathlib.Path]:
    """``paths`` with each sweep directory replaced by its run directories, in name order.

    A sweep directory (`ppo_async.sweep`) has no ``metrics.jsonl`` of its
    own but subdirectories that do; any other path is kept as it is.
    """
    expanded = []
    for path in map(pathlib.Path, paths):
        runs = sorted(p for p in path.iterdir() if (p / METRICS_FILE).is_file()) if (
            path.is_dir() and not (path / METRICS_FILE).is_file()) else []
        expanded += runs or [path]
    return expanded


def load_runs(run_dirs: Iterable[str | pathlib.Path]) -> list[Run]:
    """`load_run` of each directory, in the order given."""
    return [load_run(run_dir) for run_dir in run_dirs]


def config_key(config: dict[str, Any], ignore: Sequence[str] = (SEED_FIELD,)) -> str:
    """The config minus ``ignore`` (the seed) as a canonical string: equal for seeds of one experiment."""
    return json.dumps({k: v for k, v in config.items() if k not in ignore}, sort_keys=True)


def group_runs(runs: Sequence[Run], ignore: Sequence[str] = (SEED_FIELD,)) -> dict[str, list[Run]]:
    """Runs whose configs differ only in ``ignore`` (the seed), keyed by a label.

    The label names the config fields that differ between groups (e.g.
    ``num_actors=4, use_vtrace=True``); with one group it is the env id. Runs
    without a ``config.json`` form a group each, labelled by directory name.
    Groups keep the order in which their first run appears.
    """
    keyed: dict[str, list[Run]] = {}
    for run in runs:
        key = config_key(run.config, ignore) if run.config else f"dir:{run.path}"
        keyed.setdefault(key, []).append(run)
    configs = [group[0].config for group in keyed.values()]
    fields = sorted({k for c in configs for k in c} - set(ignore))
    differing = [f for f in fields if len({json.dumps(c.get(f)) for c in configs}) > 1]
    labelled: dict[str, list[Run]] = {}
    for key, group in keyed.items():
        config = group[0].config
        if not config:
            label = group[0].name
        elif differing:
            label = ", ".join(f"{f}={config.get(f)}" for f in differing)
        else:
            label = str(config.get("env_id", group[0].name))
        labelled[label if label not in labelled else f"{label} ({group[0].name})"] = group
    return labelled


def run_x(run: Run, x: str = "env_steps", from_start: bool = False) -> np.ndarray:
    """``run``'s ``x`` at each update; with ``from_start``, counted from its first update's."""
    xs = run.metrics[x]
    if from_start and np.isfinite(xs).any():
        xs = xs - np.nanmin(xs)
    return xs


def aligned(runs: Sequence[Run], metric: str, x: str = "env_steps",
            num_points: int = 200, from_start: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(grid [points], values [runs, points])``: ``metric`` of each run against ``x``.

    Runs that share their ``x`` values (seeds of one config against
    ``env_steps``) keep them; otherwise each run is linearly interpolated onto
    ``num_points`` points spanning the range all runs cover, so that a mean
    over runs averages the same runs at every point. NaN where a run has no
    value there (e.g. the return before the first finished episode).

    ``from_start`` counts each run's ``x`` from its own first update
    (`run_x`): seeds whose wall-clock times are offset (a slower compile
    before the first update, runs started one after another) line up at 0,
    and their common range is as long as the shortest of them.
    """
    xs = [run_x(run, x, from_start) for run in runs]
    ys = [run.metrics.get(metric, np.full_like(run.metrics[x], math.nan)) for run in runs]
    if all(len(v) == len(xs[0]) and np.array_equal(v, xs[0]) for v in xs):
        return xs[0].copy(), np.stack(ys)
    low = max(float(np.nanmin(v)) for v in xs)
    high = min(float(np.nanmax(v)) for v in xs)
    if not high > low:  # no common range: fall back to the union of the runs' ranges
        low, high = min(float(np.nanmin(v)) for v in xs), max(float(np.nanmax(v)) for v in xs)
    grid = np.linspace(low, high, num_points)
    values = np.empty((len(runs), num_points))
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        ok = np.isfinite(xi) & np.isfinite(yi)
        if ok.sum() < 2:
            values[i] = math.nan
            continue
        values[i] = np.interp(grid, xi[ok], yi[ok], left=math.nan, right=math.nan)
    return grid, values


# --- statistics over seeds -----------------------------------------------------------


def iqm(scores: np.ndarray | Sequence[float], axis: int | None = None) -> np.ndarray | float:
    """Interquartile mean: the mean of the scores left after cutting the lowest and highest 25%.

    ``floor(n / 4)`` scores are cut from each end (with ``axis=None`` all
    scores are pooled, as rliable pools runs and tasks), which is
    ``scipy.stats.trim_mean(scores, 0.25, axis)``; for ``n`` divisible by 4
    it is exactly the mean of the middle half.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if axis is None:
        scores, axis = scores.reshape(-1), 0
    n = scores.shape[axis]
    if n == 0:
        raise ValueError("iqm of no scores")
    cut = int(n * 0.25)
    middle = np.sort(scores, axis=axis)
    middle = np.take(middle, np.arange(cut, n - cut), axis=axis)
    result = np.mean(middle, axis=axis)
    return float(result) if np.ndim(result) == 0 else result


class Estimate(NamedTuple):
    """A point estimate with a percentile bootstrap confidence interval."""

    point: float
    low: float
    high: float


def stratified_bootstrap_ci(
    scores: np.ndarray | Sequence[Sequence[float]],
    statistic: Callable[[np.ndarray], float] = iqm,
    *,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """``statistic`` of ``scores`` ``[runs, tasks]`` with a stratified-bootstrap percentile interval.

    Each of ``reps`` resamples draws ``runs`` runs with replacement within
    every task (column) independently, as in Agarwal et al. (2021); the
    interval is the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2``
    quantiles of the statistic over resamples. A 1-D ``scores`` is one task.
    ``statistic`` maps a ``[runs, tasks]`` array to a number (default `iqm`,
    pooled over runs and tasks); it is called once per resample.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim == 1:
        scores = scores[:, None]
    if scores.ndim != 2 or scores.shape[0] < 1:
        raise ValueError(f"scores must be [runs, tasks] with at least one run, got {scores.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    runs, tasks = scores.shape
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, runs, size=(reps, runs, tasks))  # a run index per (resample, draw, task)
    resampled = np.take_along_axis(scores[None], rows, axis=1)  # [reps, runs, tasks]
    stats = np.array([statistic(sample) for sample in resampled])
    alpha = (1 - confidence) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return Estimate(float(statistic(scores)), float(low), float(high))


def bootstrap_mean_band(values: np.ndarray, *, reps: int = 1000, confidence: float = 0.95,
                        seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, low, high)`` over runs of ``values [runs, points]``, a bootstrap interval per point.

    Runs are resampled with replacement (the same draw at every point, so a
    band follows whole curves); NaNs are ignored. With one run the band is
    the curve itself.
    """
    values = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN points, e.g. before any episode ends
        mean = np.nanmean(values, axis=0)
        if values.shape[0] < 2:
            return mean, mean.copy(), mean.copy()
        rows = rng.integers(0, values.shape[0], size=(reps, values.shape[0]))
        means = np.nanmean(values[rows], axis=1)  # [reps, points]
        alpha = (1 - confidence) / 2
        low, high = np.nanquantile(means, [alpha, 1 - alpha], axis=0)
    return mean, low, high


# --- tables --------------------------------------------------------------------------


def runs_dataframe(runs: Sequence[Run]):
    """One row per (run, update): ``run``, ``group`` (see `group_runs`), ``seed`` and every metric.

    Needs pandas (``pip install pandas``); raises ImportError naming it otherwise.
    """
    try:
        import pandas as pd
    except ImportError as error:
        raise ImportError("runs_dataframe needs pandas: pip install pandas") from error
    group_of = {id(run): label for label, group in group_runs(runs).items() for run in group}
    frames = []
    for run in runs:
        frame = pd.DataFrame(run.metrics)
        frame.insert(0, "seed", run.config.get(SEED_FIELD))
        frame.insert(0, "group", group_of[id(run)])
        frame.insert(0, "run", run.name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)
