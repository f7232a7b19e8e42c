"""A sweep directory's tables: ``runs.csv`` (a row per run) and the summary (a row per grid point).

``summary.csv`` and ``summary.md`` hold the interquartile mean of each grid
point's final returns with a 95% stratified-bootstrap interval
(`ppo_async.runs.analysis`), mean and std, mean wall time and policy lag.
"""

from __future__ import annotations

import csv
import io
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from ppo_async.runs.run_dir import SUMMARY_FILE, checkpoint_dir, write_atomically
from ppo_async.sweep.spec import SweepRun

RUNS_FILE = "runs.csv"
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
RUN_COLUMNS = ("status", "final_return", "policy_lag_mean", "env_steps", "wall_time_s", "error")
SUMMARY_COLUMNS = ("seeds", "done", "failed", "iqm", "iqm_low", "iqm_high", "mean", "std",
                   "wall_time_s", "policy_lag_mean")


# --- the state of a run directory -----------------------------------------------------------


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


class RunsTable:
    """``runs.csv``: a row per run, rewritten atomically at every change of status."""

    def __init__(self, out: pathlib.Path, runs: Sequence[SweepRun], fields: Sequence[str]):
        self.path, self.fields = out / RUNS_FILE, list(fields)
        old = {row["run"]: row for row in read_csv(self.path)}
        self.rows: dict[str, dict[str, Any]] = {}
        for run in runs:
            row = {"run": run.name, **{f: run.point.get(f, "") for f in self.fields},
                   "seed": run.seed, **{c: "" for c in RUN_COLUMNS}}
            previous = old.get(run.name, {})
            row["status"] = previous.get("status") or "pending"
            row["wall_time_s"] = previous.get("wall_time_s", "")
            row["error"] = previous.get("error", "")
            if run_state(out / run.name) == "done":
                row.update(finished_figures(out / run.name), status="done", error="")
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
        write_atomically(self.path, csv_text(self.rows.values(), columns).encode())


def cell(value: Any) -> Any:
    """A value as a table cell: a grid value as in JSON (``true``, ``[64, 64]``), a NaN empty."""
    if isinstance(value, float) and math.isnan(value):
        return ""
    if isinstance(value, (bool, list, tuple)):
        return json.dumps(value)
    return value


def finished_figures(run_dir: pathlib.Path) -> dict[str, Any]:
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


def read_csv(path: pathlib.Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def csv_text(rows: Sequence[Mapping[str, Any]] | Any, columns: Sequence[str]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: cell(v) for k, v in row.items()})
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
        cells = [*(str(cell(row[f])) for f in fields), f"{row['done']}/{row['seeds']}{failed}",
                 f"{number(row['iqm'])} [{number(row['iqm_low'])}, {number(row['iqm_high'])}]",
                 f"{number(row['mean'])} ± {number(row['std'])}", number(row["wall_time_s"], 0),
                 number(row["policy_lag_mean"], 2)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_summary(out: pathlib.Path, table: RunsTable) -> list[dict[str, Any]]:
    summary = summarize(list(table.rows.values()), table.fields)
    columns = [*table.fields, *SUMMARY_COLUMNS]
    write_atomically(out / SUMMARY_CSV, csv_text(summary, columns).encode())
    write_atomically(out / SUMMARY_MD, (summary_markdown(summary, table.fields) + "\n").encode())
    return summary
