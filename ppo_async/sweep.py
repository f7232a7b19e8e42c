"""Sweeps: every combination of a grid of config fields, once per seed, in parallel, resumable.

    from ppo_async.sweep import run_sweep
    summary = run_sweep("sweep.toml", "runs/lr_vtrace", workers=2)  # a DataFrame, a row per point

``ppo-async sweep sweep.toml --out runs/lr_vtrace`` does the same on the
command line. A sweep file is TOML (or YAML, with pyyaml installed)::

    preset = "acrobot"           # optional: the starting config (ppo_async.presets)
    seeds = [0, 1, 2]            # every grid point runs once per seed (default [0])
    [base]                       # config fields over the preset, for every run
    total_env_steps = 300000
    [grid]                       # every combination of these lists
    learning_rate = [3e-4, 1e-3]
    use_vtrace = [false, true]

and, for fields that change together rather than crossed, a list of
``[[points]]`` tables, each crossed with the grid (``num_actors = 2`` with
``envs_per_actor = 4``, ``num_actors = 4`` with ``envs_per_actor = 2``).
Every run's config is built and validated before anything runs
(`SweepSpec.runs`): a bad value is one `ConfigError` naming the file, the
grid point and the field.

The sweep directory ``DIR`` holds

================== ==========================================================
``sweep.toml``     the sweep as run (`SweepSpec.to_toml`); a rerun into DIR
                   must start from the same preset and ``[base]``
``<run>/``         one run directory per (grid point, seed), named by
                   `run_name`: ``learning_rate=0.001,use_vtrace=true,seed=0``
``runs.csv``       one row per run: its grid values, seed, status (pending,
                   running, done, failed, interrupted), final return (the
                   mean of the last 100 training episodes), policy lag, env
                   steps, wall time (seconds of the process that trained it,
                   summed over attempts), and a failed run's error
``summary.csv``,   one row per grid point: the interquartile mean of the
``summary.md``     final return over its finished seeds with a 95%
                   stratified-bootstrap interval (`ppo_async.runs.analysis`),
                   mean and std, mean wall time and policy lag
``logs/<job>.log`` each worker's output
================== ==========================================================

Backends. ``local`` trains each run in a process of its own (at most
``workers`` at once; by default as many as the cores hold, counting each run's
actor threads and its learner). ``ray`` makes each run a Ray task that asks
for as many CPUs (a local private instance, or the cluster at
``ray_address``, whose nodes must all see DIR). ``twin=True`` (gymnax envs)
trains all pending seeds of a grid point in one ``jax.vmap`` of the
synchronous twin (`ppo_async.sync.make_train`, acting at the config's exact
policy lag, as one actor at ``exact_policy_lag=K`` does), and writes the same
run directories, tables and summary.

Resuming: the same sweep again skips the runs whose directory holds a
``summary.json`` (finished), resumes those with a checkpoint from it, and
starts the rest (a failed run is tried again). Ctrl-C stops every worker (each
asynchronous run checkpoints first), records who finished, and raises
`SweepInterrupted` with the command that continues. A run that fails is
recorded with its error and the others go on.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import hashlib
import io
import itertools
import json
import math
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.presets import apply_overrides, preset_overrides, read_table_file, toml_value
from ppo_async.runs.run_dir import (
    ERROR_FILE,
    SUMMARY_FILE,
    checkpoint_dir,
    write_atomically,
)

SWEEP_FILE = "sweep.toml"
RUNS_FILE = "runs.csv"
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
LOGS_SUBDIR = "logs"
SWEEP_KEYS = ("preset", "seeds", "base", "grid", "points")
BACKENDS = ("local", "ray")
# A stopped asynchronous run writes a checkpoint before it exits; a twin job
# cannot be interrupted inside its one XLA call and has nothing to save.
STOP_TIMEOUT_S = 120.0
TWIN_STOP_TIMEOUT_S = 5.0
POLL_S = 0.2
# The last line a worker writes to its log when it fails: the error the table records.
ERROR_PREFIX = "ppo-async sweep worker: "
RUN_COLUMNS = ("status", "final_return", "policy_lag_mean", "env_steps", "wall_time_s", "error")
SUMMARY_COLUMNS = ("seeds", "done", "failed", "iqm", "iqm_low", "iqm_high", "mean", "std",
                   "wall_time_s", "policy_lag_mean")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._+-]")
_MAX_LABEL = 100  # characters of a run name before the seed; longer ones end in a hash


class SweepWarning(UserWarning):
    """More workers than the cores hold, and similar advice that does not stop the sweep."""


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the sweep: ``finished`` of ``total`` runs done; ``command`` continues it."""

    def __init__(self, finished: int, total: int, command: str):
        super().__init__(f"sweep stopped: {finished} of {total} runs finished; "
                         f"continue with: {command}")
        self.finished, self.total, self.command = finished, total, command


class SweepRun(NamedTuple):
    """One run of a sweep: a grid point and a seed."""

    name: str  # its directory's name under the sweep directory
    point: dict[str, Any]  # the fields the grid (and points) set, in file order
    seed: int
    config: AsyncActorLearnerConfig


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A sweep: a starting config (``preset``, ``base``), a grid crossed with ``points``, seeds.

    Build one with `load_sweep` (a file or a table) so that it is checked;
    `runs` builds and validates every run's config.
    """

    seeds: tuple[int, ...] = (0,)
    base: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    grid: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    points: tuple[Mapping[str, Any], ...] = ({},)
    preset: str | None = None
    source: str = "sweep"  # names the sweep in errors: "sweep file 'lr.toml'"

    @classmethod
    def from_table(cls, table: Mapping[str, Any], source: str = "sweep") -> SweepSpec:
        """The sweep a file's table (or a dict) describes; `ConfigError` naming key and fix."""
        _check_keys(table, source)
        preset = table.get("preset")
        if preset is not None and not isinstance(preset, str):
            raise ConfigError(f"{source}: preset = {preset!r}: must be a preset name (a string)")
        seeds = _checked_seeds(table.get("seeds", [0]), source)
        base = _checked_table(table.get("base", {}), source, "[base]")
        grid_table = _checked_table(table.get("grid", {}), source, "[grid]")
        grid = {field: _checked_values(field, values, source)
                for field, values in grid_table.items()}
        points = _checked_points(table.get("points", [{}]), source)
        _check_overlaps(base, grid, points, source)
        spec = cls(tuple(seeds), base, grid, points, preset, source)
        spec.base_config()  # the preset and [base] alone, so their errors name them
        return spec

    def base_config(self) -> AsyncActorLearnerConfig:
        """The dataclass defaults, the preset's fields, then ``[base]``; validated."""
        config = AsyncActorLearnerConfig()
        if self.preset is not None:
            try:
                overrides = preset_overrides(self.preset)
            except ConfigError as error:
                raise ConfigError(f"{self.source}: {error}") from None
            config = apply_overrides(config, overrides, f"preset {self.preset!r}")
        return apply_overrides(config, self.base, f"{self.source}, [base]")

    def grid_points(self) -> list[dict[str, Any]]:
        """Each ``[[points]]`` table crossed with every combination of the ``[grid]`` lists."""
        combinations = itertools.product(*self.grid.values())
        crossed = [dict(zip(self.grid, values)) for values in combinations]
        return [{**point, **combination} for point in self.points for combination in crossed]

    def fields(self) -> list[str]:
        """The fields the grid points set, in file order: the columns of the tables."""
        return list(dict.fromkeys(f for point in self.grid_points() for f in point))

    def runs(self) -> list[SweepRun]:
        """Every (grid point, seed) with its validated config; `ConfigError` names a bad point."""
        base = self.base_config()
        runs, problems = [], []
        points = self.grid_points()
        for point in points:
            label = point_label(point)
            try:
                configs = [apply_overrides(base, {**point, "seed": seed},
                                           f"{self.source}, grid point {label or '(base)'}")
                           for seed in self.seeds]
            except ConfigError as error:
                problems.append(str(error))
                continue
            runs += [SweepRun(run_name(point, seed), point, seed, config)
                     for seed, config in zip(self.seeds, configs)]
        if problems:
            more = f" ({len(problems)} of {len(points)} grid points are invalid)" if len(
                problems) > 1 else ""
            raise ConfigError(problems[0] + more)
        return _unique_names(runs)

    def to_table(self) -> dict[str, Any]:
        """The sweep as the table a file holds (`from_table` reads it back)."""
        table: dict[str, Any] = {} if self.preset is None else {"preset": self.preset}
        table["seeds"] = list(self.seeds)
        table["base"] = dict(self.base)
        table["grid"] = {field: list(values) for field, values in self.grid.items()}
        if self.points != ({},):
            table["points"] = [dict(point) for point in self.points]
        return table

    def to_toml(self) -> str:
        """The sweep as a TOML sweep file (`load_sweep` reads it back to an equal sweep)."""
        lines = [f"# The sweep as run (from {self.source}); `ppo-async sweep` reads it back."]
        if self.preset is not None:
            lines.append(f"preset = {toml_value(self.preset)}")
        lines.append(f"seeds = {toml_value(list(self.seeds))}")
        for header, table in (("[base]", self.base), ("[grid]", self.grid)):
            lines += ["", header] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
        for point in self.points if self.points != ({},) else ():
            lines += ["", "[[points]]"] + [f"{k} = {toml_value(v)}" for k, v in point.items()]
        return "\n".join(lines) + "\n"


def _check_keys(table: Mapping[str, Any], source: str) -> None:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: expected a table with seeds, [base] and [grid]")
    for key in table:
        if key not in SWEEP_KEYS:
            fields = {f.name for f in dataclasses.fields(AsyncActorLearnerConfig)}
            hint = (" (a config field: put it under [base], or under [grid] as a list)"
                    if key in fields else "")
            close = difflib.get_close_matches(str(key), SWEEP_KEYS, n=1)
            hint = hint or (f" (did you mean {close[0]!r}?)" if close else "")
            raise ConfigError(f"{source}: {key!r} is not a sweep key{hint}; a sweep file holds "
                              "preset, seeds, [base], [grid] and [[points]]")


def _checked_seeds(seeds: Any, source: str) -> list[int]:
    good = isinstance(seeds, list) and seeds and all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    if not good:
        raise ConfigError(f"{source}: seeds = {seeds!r}: must be a non-empty list of integers "
                          ">= 0, e.g. seeds = [0, 1, 2]")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{source}: seeds = {seeds!r}: lists a seed twice")
    return list(seeds)


def _checked_table(table: Any, source: str, where: str) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: {where} must be a table of config field = value, "
                          f"found {table!r}")
    for field, value in table.items():
        if field == "seed":
            raise ConfigError(f"{source}: seed in {where}: list the seeds at the top instead, "
                              "seeds = [0, 1, 2]")
        _check_toml_value(value, source, f"{where} {field}")
    return dict(table)


def _check_toml_value(value: Any, source: str, where: str) -> None:
    """Every value must have a TOML form: ``sweep.toml`` records the sweep as run."""
    try:
        toml_value(value)
    except ValueError:
        raise ConfigError(
            f"{source}: {where} = {value!r}: has no TOML form (TOML has no null: leave the "
            "field out to keep its default)") from None


def _checked_values(field: str, values: Any, source: str) -> tuple[Any, ...]:
    if not isinstance(values, (list, tuple)) or not values:
        example = toml_value(values) if _has_toml(values) else "..."
        raise ConfigError(f"{source}: [grid] {field} = {values!r}: must be a non-empty list of "
                          f"values, e.g. {field} = [{example}]")
    seen = set()
    for value in values:
        key = json.dumps(value, sort_keys=True)
        if key in seen:
            raise ConfigError(f"{source}: [grid] {field} lists {value!r} twice")
        seen.add(key)
    return tuple(values)


def _has_toml(value: Any) -> bool:
    try:
        toml_value(value)
    except ValueError:
        return False
    return True


def _checked_points(points: Any, source: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(points, list) or not points or not all(
            isinstance(p, Mapping) for p in points):
        raise ConfigError(f"{source}: points must be a non-empty list of tables "
                          "([[points]] in TOML), each of config field = value")
    checked = [_checked_table(point, source, f"[[points]] #{i + 1}") for i, point in
               enumerate(points)]
    labels = [json.dumps(p, sort_keys=True) for p in checked]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{source}: [[points]] lists the same point twice")
    return tuple(checked)


def _check_overlaps(base: Mapping[str, Any], grid: Mapping[str, Any],
                    points: Sequence[Mapping[str, Any]], source: str) -> None:
    """A field is set in one place only: [base], [grid] or [[points]]."""
    point_fields = {f for point in points for f in point}
    for field, (here, there) in {
        **{f: ("[base]", "[grid]") for f in set(base) & set(grid)},
        **{f: ("[base]", "[[points]]") for f in set(base) & point_fields},
        **{f: ("[grid]", "[[points]]") for f in set(grid) & point_fields},
    }.items():
        raise ConfigError(f"{source}: {field} is in {here} and in {there}; set it in one of them")


def load_sweep(sweep: str | os.PathLike | Mapping[str, Any] | SweepSpec) -> SweepSpec:
    """A checked `SweepSpec` from a sweep file (TOML or YAML), a table (dict), or a spec."""
    if isinstance(sweep, SweepSpec):
        return SweepSpec.from_table(sweep.to_table(), sweep.source)
    if isinstance(sweep, Mapping):
        return SweepSpec.from_table(sweep, "sweep")
    path = pathlib.Path(sweep)
    return SweepSpec.from_table(read_table_file(path, "sweep file"), f"sweep file {str(path)!r}")


# --- names --------------------------------------------------------------------------------


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "-".join(_value_text(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def point_label(point: Mapping[str, Any]) -> str:
    """``field=value,field=value`` of a grid point, as its runs' names and the tables show it."""
    return ",".join(f"{field}={_value_text(value)}" for field, value in point.items())


def _short_hash(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:8]


def run_name(point: Mapping[str, Any], seed: int) -> str:
    """The directory name of a run: its grid values and seed, ``lr=0.001,use_vtrace=true,seed=0``.

    Characters other than letters, digits and ``._+-`` in a value become
    ``_`` (``gymnasium:CartPole-v1`` -> ``gymnasium_CartPole-v1``); a label
    longer than 100 characters is cut and ends in a hash of the point.
    """
    parts = [f"{field}={_NAME_CHARS.sub('_', _value_text(value))}"
             for field, value in point.items()]
    label = ",".join(parts)
    if len(label) > _MAX_LABEL:
        label = f"{label[:_MAX_LABEL - 9]}-{_short_hash(point)}"
    return f"{label},seed={seed}" if label else f"seed={seed}"


def _unique_names(runs: list[SweepRun]) -> list[SweepRun]:
    """Runs whose names collide (values that differ only in replaced characters) get a hash."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.name] = counts.get(run.name, 0) + 1
    return [run._replace(name=f"{run.name}-{_short_hash(run.point)}")
            if counts[run.name] > 1 else run for run in runs]


# --- the state of a sweep directory ---------------------------------------------------------


def run_state(run_dir: pathlib.Path) -> str:
    """``done`` (a ``summary.json``), ``resume`` (a checkpoint), ``fresh`` (nothing), or
    ``restart`` (files of a run that stopped before its first checkpoint)."""
    if (run_dir / SUMMARY_FILE).is_file():
        return "done"
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return "fresh"
    checkpoints = checkpoint_dir(run_dir)
    if checkpoints.is_dir() and any(p.suffix == ".msgpack" for p in checkpoints.iterdir()):
        return "resume"
    return "restart"


def _check_sweep_dir(spec: SweepSpec, out: pathlib.Path) -> None:
    """Refuse a directory that holds another sweep (another preset or [base])."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r}: exists and is not a directory")
    recorded = out / SWEEP_FILE
    if not recorded.is_file():
        return
    old = load_sweep(recorded)
    if old.base_config().to_dict() != spec.base_config().to_dict():
        raise ConfigError(
            f"--out {str(out)!r} holds another sweep ({recorded} starts from another preset or "
            "[base]): its run names would not say what differs. Sweep into another directory, "
            "or keep the preset and [base] and change only [grid], [[points]] and seeds")


class _Table:
    """``runs.csv``: a row per run, rewritten atomically at every change of status."""

    def __init__(self, out: pathlib.Path, runs: Sequence[SweepRun], fields: Sequence[str]):
        self.path, self.fields = out / RUNS_FILE, list(fields)
        old = {row["run"]: row for row in _read_csv(self.path)}
        self.rows: dict[str, dict[str, Any]] = {}
        for run in runs:
            row = {"run": run.name, **{f: run.point.get(f, "") for f in self.fields},
                   "seed": run.seed, **{c: "" for c in RUN_COLUMNS}}
            previous = old.get(run.name, {})
            row["status"] = previous.get("status") or "pending"
            row["wall_time_s"] = previous.get("wall_time_s", "")
            row["error"] = previous.get("error", "")
            if run_state(out / run.name) == "done":
                row.update(_finished(out / run.name), status="done", error="")
            self.rows[run.name] = row

    def set(self, name: str, **values: Any) -> None:
        self.rows[name].update(values)

    def add_wall_time(self, name: str, seconds: float) -> None:
        before = _number(self.rows[name]["wall_time_s"])
        before = 0.0 if math.isnan(before) else before
        self.rows[name]["wall_time_s"] = round(before + seconds, 2)

    def count(self, status: str) -> int:
        return sum(row["status"] == status for row in self.rows.values())

    def write(self) -> None:
        columns = ["run", *self.fields, "seed", *RUN_COLUMNS]
        write_atomically(self.path, _csv_text(self.rows.values(), columns).encode())


def _cell(value: Any) -> Any:
    """A value as a table cell: a grid value as in JSON (``true``, ``[64, 64]``), a NaN empty."""
    if isinstance(value, float) and math.isnan(value):
        return ""
    if isinstance(value, (bool, list, tuple)):
        return json.dumps(value)
    return value


def _finished(run_dir: pathlib.Path) -> dict[str, Any]:
    """The figures of a finished run's ``summary.json`` that ``runs.csv`` keeps."""
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    ret = summary.get("episode_return_mean")
    return dict(final_return=ret if ret is not None else math.nan,
                policy_lag_mean=summary.get("policy_lag_mean"),
                env_steps=summary.get("env_steps"))


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _read_csv(path: pathlib.Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _csv_text(rows: Sequence[Mapping[str, Any]] | Any, columns: Sequence[str]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return text.getvalue()


# --- the summary ----------------------------------------------------------------------------


def summarize(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> list[dict[str, Any]]:
    """A row per grid point (in the order of ``rows``): IQM [95% CI], mean, std of its done seeds.

    ``rows`` are `runs.csv` rows; the interval is the stratified bootstrap of
    `ppo_async.runs.analysis` (2000 resamples), NaN with no finished seed.
    """
    import numpy as np

    from ppo_async.runs.analysis import iqm, stratified_bootstrap_ci

    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(json.dumps(row.get(f, "")) for f in fields), []).append(row)
    summary = []
    for group in groups.values():
        done = [r for r in group if r["status"] == "done"]
        finals = np.array([_number(r["final_return"]) for r in done])
        estimate = stratified_bootstrap_ci(finals, iqm) if len(finals) else None

        def mean(column: str) -> float:
            return float(np.mean([_number(r[column]) for r in done])) if done else math.nan

        summary.append({
            **{f: group[0].get(f, "") for f in fields},
            "seeds": len(group), "done": len(done),
            "failed": sum(r["status"] == "failed" for r in group),
            "iqm": estimate.point if estimate else math.nan,
            "iqm_low": estimate.low if estimate else math.nan,
            "iqm_high": estimate.high if estimate else math.nan,
            "mean": float(np.mean(finals)) if done else math.nan,
            "std": float(np.std(finals)) if done else math.nan,
            "wall_time_s": mean("wall_time_s"), "policy_lag_mean": mean("policy_lag_mean"),
        })
    return summary


def summary_markdown(summary: Sequence[Mapping[str, Any]],
                     fields: Sequence[str] | None = None) -> str:
    """The summary as a markdown table: IQM [95% CI], mean ± std, seeds done, time, lag.

    ``fields``: the grid's columns (default: every column of the rows not in `SUMMARY_COLUMNS`).
    """
    if fields is None:
        fields = [k for k in summary[0] if k not in SUMMARY_COLUMNS] if summary else []

    def number(value: Any, digits: int = 1) -> str:
        return "n/a" if math.isnan(_number(value)) else f"{_number(value):.{digits}f}"

    header = [*fields, "seeds done", "IQM [95% CI]", "mean ± std", "wall s", "lag"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in summary:
        failed = f", {row['failed']} failed" if row["failed"] else ""
        cells = [*(str(_cell(row[f])) for f in fields), f"{row['done']}/{row['seeds']}{failed}",
                 f"{number(row['iqm'])} [{number(row['iqm_low'])}, {number(row['iqm_high'])}]",
                 f"{number(row['mean'])} ± {number(row['std'])}", number(row["wall_time_s"], 0),
                 number(row["policy_lag_mean"], 2)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_summary(out: pathlib.Path, table: _Table) -> list[dict[str, Any]]:
    summary = summarize(list(table.rows.values()), table.fields)
    columns = [*table.fields, *SUMMARY_COLUMNS]
    write_atomically(out / SUMMARY_CSV, _csv_text(summary, columns).encode())
    write_atomically(out / SUMMARY_MD, (summary_markdown(summary, table.fields) + "\n").encode())
    return summary


# --- jobs and workers -----------------------------------------------------------------------


class _Job(NamedTuple):
    """What one worker trains: one run, or (twin) the pending seeds of one grid point."""

    name: str  # the log's name: the run's, or the grid point's
    runs: list[SweepRun]
    twin: bool

    def threads(self) -> int:
        """Threads one run keeps busy: the learner, each actor, the evaluator; a twin job: one."""
        if self.twin:
            return 1
        config = self.runs[0].config
        return 1 + config.num_actors + (1 if config.eval_every_updates else 0)


def _jobs(pending: Sequence[SweepRun], twin: bool) -> list[_Job]:
    if not twin:
        return [_Job(run.name, [run], False) for run in pending]
    by_point: dict[str, list[SweepRun]] = {}
    for run in pending:
        by_point.setdefault(point_label(run.point) or "base", []).append(run)
    return [_Job(_NAME_CHARS.sub("_", label)[:_MAX_LABEL] + "-twin", runs, True)
            for label, runs in by_point.items()]


def _job_message(spec: SweepSpec, out: pathlib.Path, job: _Job) -> dict[str, Any]:
    """A job as JSON: the sweep's table and the runs' names (the worker rebuilds the configs)."""
    return dict(sweep=spec.to_table(), source=spec.source, out=str(out), twin=job.twin,
                runs=[run.name for run in job.runs])


def run_job(message: Mapping[str, Any]) -> None:
    """Train one job's runs (`_job_message`), in this process: a worker's whole work."""
    spec = SweepSpec.from_table(message["sweep"], message["source"])
    out = pathlib.Path(message["out"])
    by_name = {run.name: run for run in spec.runs()}
    runs = [by_name[name] for name in message["runs"]]
    if message["twin"]:
        from ppo_async.sync import train_twin_runs

        train_twin_runs([(out / run.name, run.config) for run in runs])
        return
    from ppo_async.train import train

    for run in runs:
        run_dir = out / run.name
        resume = run_dir if run_state(run_dir) == "resume" else None
        try:
            train(run.config, run_dir=run_dir, resume_from=resume, progress=False)
        except Exception:
            if run_dir.is_dir():
                write_atomically(run_dir / ERROR_FILE, traceback.format_exc().encode())
            raise


def _worker_main() -> None:
    """A local worker: ``python -c '...' JOB_JSON``; exit 130 when stopped, 1 when it failed."""
    try:
        run_job(json.loads(sys.argv[1]))
    except KeyboardInterrupt as interrupt:
        print(f"{ERROR_PREFIX}interrupted: {interrupt}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except BaseException as error:  # noqa: BLE001 - the log keeps the traceback, the table a line
        traceback.print_exc()
        print(f"{ERROR_PREFIX}{_one_line(error)}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# The serial XLA scheduler: a vmapped twin can deadlock on a 2-core CPU without it
# (experiments/common.py says why); set before JAX starts in the worker.
TWIN_XLA_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def _worker_env(twin: bool) -> dict[str, str]:
    """A worker's environment: this one's, this process's compilation cache, the twin's flag."""
    from ppo_async.runtime.ray_transport import inherited_cache_env

    env = {**os.environ, **inherited_cache_env()}
    if twin and TWIN_XLA_FLAG not in env.get("XLA_FLAGS", "").split():
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {TWIN_XLA_FLAG}".strip()
    return env


class _Finished(NamedTuple):
    job: _Job
    seconds: float
    error: str | None  # None when the worker returned
    interrupted: bool


class _LocalPool:
    """Workers as processes of their own session (Ctrl-C at the terminal reaches only the sweep,
    which passes one SIGINT to each worker, so that no run is interrupted while checkpointing)."""

    def __init__(self, out: pathlib.Path):
        self.logs = out / LOGS_SUBDIR
        self.running: dict[int, tuple[_Job, subprocess.Popen, float, pathlib.Path]] = {}

    def start(self, job: _Job, message: dict[str, Any]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{job.name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-c", "from ppo_async.sweep import _worker_main; _worker_main()",
                 json.dumps(message)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=_worker_env(job.twin), start_new_session=True)
        self.running[process.pid] = (job, process, time.monotonic(), log_path)

    def finished(self, timeout_s: float) -> list[_Finished]:
        deadline = time.monotonic() + timeout_s
        while True:
            done = [pid for pid, (_, process, _, _) in self.running.items()
                    if process.poll() is not None]
            if done or time.monotonic() >= deadline:
                return [self._outcome(pid) for pid in done]
            time.sleep(min(0.05, timeout_s))

    def _outcome(self, pid: int) -> _Finished:
        job, process, started, log_path = self.running.pop(pid)
        seconds = time.monotonic() - started
        if process.returncode == 0:
            return _Finished(job, seconds, None, False)
        return _Finished(job, seconds, _log_error(log_path, process.returncode),
                         process.returncode in (130, -signal.SIGINT))

    def stop(self) -> list[_Finished]:
        """SIGINT to every worker, a wait for their checkpoints, then SIGKILL; their outcomes."""
        for _, process, _, _ in self.running.values():
            _signal(process, signal.SIGINT)
        timeout = max((TWIN_STOP_TIMEOUT_S if job.twin else STOP_TIMEOUT_S)
                      for job, _, _, _ in self.running.values()) if self.running else 0.0
        deadline = time.monotonic() + timeout
        for _, process, _, _ in self.running.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(process, signal.SIGKILL)
                process.wait(timeout=10)
        outcomes = [self._outcome(pid) for pid in list(self.running)]
        return [o._replace(interrupted=True) for o in outcomes]

    def close(self) -> None:
        self.stop()


def _signal(process: subprocess.Popen, signum: int) -> None:
    try:
        process.send_signal(signum)
    except ProcessLookupError:  # it ended meanwhile
        pass


def _log_error(log_path: pathlib.Path, returncode: int) -> str:
    """The error line a worker wrote last, or its exit status."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX):]
    return f"worker exited with status {returncode} (its output: {log_path})"


class _RayPool:
    """Workers as Ray tasks, each asking for the CPUs of its run's threads."""

    def __init__(self, address: str | None):
        try:
            import ray
        except ImportError:
            raise ConfigError("--backend ray: Ray is not installed; pip install "
                              "'ppo-async[ray]'") from None
        from ppo_async.runtime.ray_transport import connect

        self.ray = ray
        self.connected_here = connect(ray, address)
        self.task = ray.remote(max_retries=0)(run_job)
        self.running: dict[Any, tuple[_Job, float]] = {}

    def check_fits(self, jobs: Sequence[_Job]) -> None:
        """A job that asks for more CPUs than the cluster has would wait forever: refused."""
        cpus = self.ray.cluster_resources().get("CPU", 0)
        for job in jobs:
            if job.threads() > cpus:
                raise ConfigError(f"--backend ray: run {job.name} needs {job.threads()} CPUs "
                                  f"(learner and actors), the Ray cluster has {cpus:g}")

    def start(self, job: _Job, message: dict[str, Any]) -> None:
        from ppo_async.runtime.ray_transport import inherited_cache_env

        env_vars = inherited_cache_env()
        if job.twin:
            env_vars["XLA_FLAGS"] = _worker_env(True)["XLA_FLAGS"]
        options: dict[str, Any] = dict(num_cpus=job.threads())
        if env_vars:
            options["runtime_env"] = {"env_vars": env_vars}
        ref = self.task.options(**options).remote(message)
        self.running[ref] = (job, time.monotonic())

    def finished(self, timeout_s: float) -> list[_Finished]:
        if not self.running:
            return []
        ready, _ = self.ray.wait(list(self.running), num_returns=len(self.running),
                                 timeout=timeout_s)
        return [self._outcome(ref) for ref in ready]

    def _outcome(self, ref: Any) -> _Finished:
        job, started = self.running.pop(ref)
        seconds = time.monotonic() - started
        try:
            self.ray.get(ref, timeout=60)
        except self.ray.exceptions.TaskCancelledError:
            return _Finished(job, seconds, "interrupted", True)
        except self.ray.exceptions.RayTaskError as error:
            cause = error.as_instanceof_cause()
            interrupted = isinstance(cause, KeyboardInterrupt)
            return _Finished(job, seconds, _one_line_cause(error), interrupted)
        except Exception as error:  # noqa: BLE001 - a lost worker, a timeout: recorded
            return _Finished(job, seconds, _one_line(error), False)
        return _Finished(job, seconds, None, False)

    def stop(self) -> list[_Finished]:
        """Cancel every task (a KeyboardInterrupt inside: the run checkpoints), then force."""
        refs = list(self.running)
        for ref in refs:
            self.ray.cancel(ref)
        ready, left = self.ray.wait(refs, num_returns=len(refs), timeout=STOP_TIMEOUT_S) if refs \
            else ([], [])
        for ref in left:
            self.ray.cancel(ref, force=True)
        outcomes = [self._outcome(ref) for ref in refs]
        return [o._replace(interrupted=True) for o in outcomes]

    def close(self) -> None:
        self.stop()
        if self.connected_here:
            self.ray.shutdown()


def _one_line_cause(error: Any) -> str:
    """A Ray task's error as the exception the task raised, on one line."""
    cause = getattr(error, "cause", None)
    return _one_line(cause) if isinstance(cause, BaseException) else _one_line(error)


# --- running a sweep --------------------------------------------------------------------------


def default_workers(jobs: Sequence[_Job], cpus: int | None = None) -> int:
    """As many workers as the cores hold: ``cpu_count // threads of the largest job``, >= 1."""
    cpus = cpus or os.cpu_count() or 1
    return max(1, cpus // max((job.threads() for job in jobs), default=1))


def _checked_workers(workers: int | None, jobs: Sequence[_Job], backend: str) -> int | None:
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ConfigError(f"--workers {workers!r}: must be an integer >= 1")
    if backend == "ray":
        return workers  # Ray places the tasks by their CPUs; workers only caps those in flight
    if workers is None:
        return default_workers(jobs)
    cpus = os.cpu_count() or 1
    at_once = min(workers, len(jobs))
    threads = at_once * max((job.threads() for job in jobs), default=1)
    if at_once > default_workers(jobs, cpus):
        warnings.warn(
            f"--workers {workers}: {at_once} runs at once, up to {threads} threads of actors "
            f"and learners on "
            f"{cpus} cores; runs will slow each other down (the default is "
            f"{default_workers(jobs)})", SweepWarning, stacklevel=3)
    return workers


def _check_twin(runs: Sequence[SweepRun], spec: SweepSpec) -> None:
    from ppo_async.envs.registry import GYMNAX, split_env_id

    for run in runs:
        label = point_label(run.point) or "(base)"
        if split_env_id(run.config.env_id)[0] != GYMNAX:
            raise ConfigError(f"{spec.source}, grid point {label}: --twin runs gymnax envs only, "
                              f"not env_id={run.config.env_id!r}; run it without --twin")
        if run.config.exact_lag is None:
            raise ConfigError(
                f"{spec.source}, grid point {label}: --twin simulates an exact policy lag; "
                "free-running actors (max_lead_steps without exact_policy_lag) have none. "
                "Run it without --twin, or set exact_policy_lag")


class SweepPlan(NamedTuple):
    """What a sweep would do: every run and its state in the directory (`run_state`)."""

    spec: SweepSpec
    runs: list[SweepRun]
    states: dict[str, str]  # run name -> done | resume | fresh | restart


def plan_sweep(sweep: str | os.PathLike | Mapping[str, Any] | SweepSpec,
               out: str | os.PathLike, *, twin: bool = False) -> SweepPlan:
    """Load and validate the sweep, check the directory, and find each run's state; writes nothing."""
    spec = load_sweep(sweep)
    out = pathlib.Path(out)
    runs = spec.runs()
    if twin:
        _check_twin(runs, spec)
    _check_sweep_dir(spec, out)
    return SweepPlan(spec, runs, {run.name: run_state(out / run.name) for run in runs})


def continue_command(sweep: Any, out: pathlib.Path, *, workers: int | None, backend: str,
                     ray_address: str | None, twin: bool) -> str:
    """The ``ppo-async sweep`` command that continues this sweep."""
    path = sweep if isinstance(sweep, (str, os.PathLike)) else out / SWEEP_FILE
    argv = ["ppo-async", "sweep", str(path), "--out", str(out)]
    argv += ["--workers", str(workers)] if workers is not None else []
    argv += ["--backend", backend] if backend != "local" else []
    argv += ["--ray-address", ray_address] if ray_address else []
    argv += ["--twin"] if twin else []
    return shlex.join(argv)


def execute_sweep(sweep: str | os.PathLike | Mapping[str, Any] | SweepSpec,
                  out: str | os.PathLike, *, workers: int | None = None, backend: str = "local", ray_address: str | None = None,
                  twin: bool = False, progress: bool = True) -> list[dict[str, Any]]:
    """`run_sweep` without pandas: the summary as a list of row dicts (what the CLI prints)."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}: must be one of {', '.join(BACKENDS)}")
    if ray_address is not None and backend != "ray":
        raise ConfigError("--ray-address needs --backend ray")
    out = pathlib.Path(out)
    plan = plan_sweep(sweep, out, twin=twin)
    pending = [run for run in plan.runs if plan.states[run.name] != "done"]
    jobs = _jobs(pending, twin)
    workers = _checked_workers(workers, jobs, backend)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / SWEEP_FILE, plan.spec.to_toml().encode())
    table = _Table(out, plan.runs, plan.spec.fields())
    for run in pending:
        if plan.states[run.name] == "restart":  # no checkpoint to resume from: start again
            shutil.rmtree(out / run.name)
        table.set(run.name, status="pending")
    table.write()
    command = continue_command(sweep, out, workers=workers if backend == "local" else None,
                               backend=backend, ray_address=ray_address, twin=twin)
    if not jobs:  # every run is done: no worker, no Ray instance
        return _write_summary(out, table)
    pool = _RayPool(ray_address) if backend == "ray" else _LocalPool(out)
    try:
        if isinstance(pool, _RayPool):
            pool.check_fits(jobs)
        _execute(plan.spec, out, jobs, pool, table, workers, progress, command)
    finally:
        pool.close()
        table.write()
        summary = _write_summary(out, table)
    return summary


def _execute(spec: SweepSpec, out: pathlib.Path, jobs: Sequence[_Job], pool: Any, table: _Table,
             workers: int | None, progress: bool, command: str) -> None:
    """Start jobs as workers free up; record each as it ends; on Ctrl-C stop every worker."""
    from ppo_async.runs.run_log import progress_bar

    total = len(table.rows)
    bar = progress_bar(total, table.count("done"), "sweep", unit="run") if progress else None
    waiting = list(jobs)

    def record(outcomes: Sequence[_Finished]) -> None:
        for outcome in outcomes:
            _record(out, table, outcome)
        if outcomes:
            table.write()
            if bar is not None:
                bar.update(sum(len(o.job.runs) for o in outcomes))
                bar.set_postfix(running=sum(len(j.runs) for j in _running_jobs(pool)),
                                failed=table.count("failed"))

    try:
        while waiting or pool.running:
            while waiting and (workers is None or len(pool.running) < workers):
                job = waiting.pop(0)
                for run in job.runs:
                    table.set(run.name, status="running")
                pool.start(job, _job_message(spec, out, job))
                table.write()
            record(pool.finished(POLL_S))
    except KeyboardInterrupt:
        record(pool.stop())
        table.write()
        raise SweepInterrupted(table.count("done"), total, command) from None
    finally:
        if bar is not None:
            bar.close()


def _running_jobs(pool: Any) -> list[_Job]:
    return [entry[0] for entry in pool.running.values()]


def _record(out: pathlib.Path, table: _Table, outcome: _Finished) -> None:
    """A finished job's runs in the table: done (their ``summary.json``), interrupted or failed."""
    for run in outcome.job.runs:
        table.add_wall_time(run.name, outcome.seconds)
        if run_state(out / run.name) == "done":
            table.set(run.name, status="done", error="", **_finished(out / run.name))
        elif outcome.interrupted:
            table.set(run.name, status="interrupted", error="")
        else:
            table.set(run.name, status="failed",
                      error=outcome.error or "the worker ended without finishing the run")


def run_sweep(sweep: str | os.PathLike | Mapping[str, Any] | SweepSpec, out: str | os.PathLike,
              *, workers: int | None = None, backend: str = "local",
              ray_address: str | None = None, twin: bool = False, dry_run: bool = False,
              progress: bool = True):
    """Run a sweep into ``out``; its summary as a pandas DataFrame, one row per grid point.

    Args:
      sweep: a sweep file (TOML, or YAML with pyyaml), a dict of the same
        table (``{"seeds": [0, 1], "base": {...}, "grid": {...}}``), or a `SweepSpec`.
      out: the sweep directory (made if missing); the same call again continues it.
      workers: runs at once (``local``: default `default_workers`; ``ray``: default
        every run, placed by its CPUs).
      backend: ``"local"`` (a process per run) or ``"ray"`` (a Ray task per run).
      ray_address: a Ray cluster to run on (default: a private local instance).
      twin: train all seeds of a grid point in one vmapped synchronous twin (gymnax envs).
      dry_run: check everything and return the runs (name, grid values, seed,
        state) without writing or training anything.
      progress: show a progress bar of the sweep (runs done, running, failed, time left).

    Raises `ConfigError` for a bad sweep (before anything runs), and
    `SweepInterrupted` on Ctrl-C. A run that fails does not raise: the
    summary's ``failed`` column counts it and ``runs.csv`` holds its error.
    Needs pandas for the DataFrame (``ppo-async sweep`` needs none).
    """
    import pandas as pd

    if dry_run:
        plan = plan_sweep(sweep, out, twin=twin)
        return pd.DataFrame([{"run": run.name, **run.point, "seed": run.seed,
                              "state": plan.states[run.name]} for run in plan.runs])
    summary = execute_sweep(sweep, out, workers=workers, backend=backend,
                            ray_address=ray_address, twin=twin, progress=progress)
    return pd.DataFrame(summary)
