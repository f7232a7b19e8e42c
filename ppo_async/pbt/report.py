"""What a population leaves for its user: ``summary.csv`` / ``summary.md`` (a row per member,
the best marked), ``schedules.csv`` (every member's explored fields over time) and ``pbt.png``
(the population's curves and the schedules of the explored fields)."""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from ppo_async.pbt.member import member_name, read_schedule
from ppo_async.pbt.spec import PBTSpec
from ppo_async.runs.run_dir import SUMMARY_FILE, write_atomically
from ppo_async.sweep.table import SUMMARY_CSV, SUMMARY_MD, cell, csv_text

SCHEDULES_CSV = "schedules.csv"
PLOT_FILE = "pbt.png"
MEMBER_COLUMNS = ("member", "status", "final_return", "env_steps", "updates", "exploits",
                  "resumes")


def member_row(pbt: PBTSpec, out: pathlib.Path, index: int, failed: str | None) -> dict[str, Any]:
    """One member: its status, final return (last 100 training episodes), and explored fields now."""
    name = member_name(index)
    run_dir = out / name
    schedule = read_schedule(run_dir)
    fields = schedule[-1]["fields"] if schedule else {}
    row: dict[str, Any] = {"member": name, "final_return": math.nan, "env_steps": "",
                           "updates": "", "exploits": sum(s["source"] == "exploit" for s in schedule),
                           "resumes": sum(s["source"] == "resume" for s in schedule),
                           **{f: fields.get(f, "") for f in pbt.explored()}}
    if (run_dir / SUMMARY_FILE).is_file():
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
        ret = summary.get("episode_return_mean")
        row.update(status="done", final_return=math.nan if ret is None else ret,
                   env_steps=summary.get("env_steps"), updates=summary.get("updates"))
    else:
        row["status"] = "failed" if failed else ("stopped" if schedule else "pending")
    row["error"] = failed or ""
    return row


def best_member(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    done = [r for r in rows if r["status"] == "done" and not math.isnan(r["final_return"])]
    return max(done, key=lambda r: r["final_return"]) if done else None


def schedule_rows(pbt: PBTSpec, out: pathlib.Path) -> list[dict[str, Any]]:
    """Every segment of every member: where it started and the explored fields it trained with."""
    rows = []
    for index in range(pbt.population):
        name = member_name(index)
        for line in read_schedule(out / name):
            rows.append({"member": name, "update": line["update"], "env_steps": line["env_steps"],
                         "source": line["source"], "donor": line.get("donor") or "",
                         **{f: line["fields"].get(f, "") for f in pbt.explored()}})
    return rows


def summary_markdown(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> str:
    header = ["member", "status", "final return", "env steps", "exploits", *fields]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        ret = row["final_return"]
        lines.append("| " + " | ".join(
            [row["member"], row["status"], "n/a" if math.isnan(ret) else f"{ret:.1f}",
             str(row["env_steps"]), str(row["exploits"]),
             *(f"{v:.4g}" if isinstance(v, float) else str(cell(v))
               for v in (row[f] for f in fields))]) + " |")
    best = best_member(rows)
    if best is not None:
        lines += ["", f"best member: {best['member']} (final return "
                      f"{best['final_return']:.1f}; {SCHEDULES_CSV} holds its schedule)"]
    return "\n".join(lines)


def write_population_summary(pbt: PBTSpec, out: pathlib.Path,
                             failed: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Write ``summary.csv``, ``summary.md``, ``schedules.csv`` and (with matplotlib) ``pbt.png``."""
    failed = failed or {}
    rows = [member_row(pbt, out, i, failed.get(member_name(i))) for i in range(pbt.population)]
    best = best_member(rows)
    for row in rows:
        row["best"] = best is not None and row["member"] == best["member"]
    fields = pbt.explored()
    write_atomically(out / SUMMARY_CSV, csv_text(
        rows, [*MEMBER_COLUMNS, *fields, "best", "error"]).encode())
    write_atomically(out / SUMMARY_MD, (summary_markdown(rows, fields) + "\n").encode())
    schedules = schedule_rows(pbt, out)
    write_atomically(out / SCHEDULES_CSV, csv_text(
        schedules, ["member", "update", "env_steps", "source", "donor", *fields]).encode())
    try:
        plot_population(pbt, out, schedules)
    except ImportError:  # matplotlib is optional: the tables say everything the plot shows
        pass
    return rows


def plot_population(pbt: PBTSpec, out: pathlib.Path,
                    schedules: Sequence[Mapping[str, Any]]) -> pathlib.Path | None:
    """``pbt.png``: each member's training return, then each explored field, over env steps."""
    import io

    from ppo_async.runs.analysis import load_run
    from ppo_async.runs.plotting import _figure, _steps_formatter

    fields = pbt.explored()
    fig = _figure(figsize=(6 * (1 + len(fields)), 4.2))
    axes = fig.subplots(1, 1 + len(fields), squeeze=False)[0]
    drawn = False
    for index in range(pbt.population):
        name = member_name(index)
        try:
            run = load_run(out / name)
        except FileNotFoundError:
            continue
        color = f"C{index % 10}"
        axes[0].plot(run.metrics["env_steps"], run.metrics["episode_return"], color=color,
                     linewidth=1.2, label=name)
        drawn = True
        mine = [s for s in schedules if s["member"] == name]
        ends = [s["env_steps"] for s in mine[1:]] + [float(run.metrics["env_steps"][-1])]
        for ax, field in zip(axes[1:], fields):
            for segment, end in zip(mine, ends):
                ax.plot([segment["env_steps"], end], [segment[field]] * 2, color=color,
                        linewidth=1.5)
                if segment["source"] == "exploit":
                    ax.plot([segment["env_steps"]], [segment[field]], "o", color=color,
                            markersize=4)
    if not drawn:
        return None
    axes[0].set_title("training return (last 100 episodes)", fontsize=10)
    axes[0].legend(fontsize=8)
    for ax, field in zip(axes[1:], fields):
        ax.set_title(f"{field} (dots: copied a better member, then explored)", fontsize=10)
        if field in pbt.ranges and pbt.ranges[field][0] > 0 or (
                field in pbt.sweep.grid and all(isinstance(v, (int, float)) and v > 0
                                                for v in pbt.sweep.grid[field])):
            ax.set_yscale("log")
    for ax in axes:
        ax.set_xlabel("env steps")
        ax.xaxis.set_major_formatter(_steps_formatter())
        ax.grid(alpha=0.3)
    fig.suptitle(f"PBT: population {pbt.population}, perturbed every "
                 f"{pbt.interval_updates} updates")
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=90)
    return write_atomically(out / PLOT_FILE, image.getvalue())
