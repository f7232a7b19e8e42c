"""Staleness sweep: what does asynchrony cost on CartPole-v1, and does V-trace buy it back?

A grid over ``num_actors`` (1, 2, 4, 8) x ``use_vtrace`` (off, on) x
``max_lead_steps`` (1, 2, 4, 8 chunks): 32 cells, each run for every seed.
Per run: the final return (``LearnerReport.episode_return_mean``, the last 100
training episodes), the observed policy lag (``policy_lag_mean``,
``policy_lag_max``, in learner updates), throughput and wall time.

The batch per update is the same in every cell: ``envs_per_actor = 8 //
num_actors``, so 8 envs in all, x ``num_steps`` (64) = 512 env steps per
update, as in the default config (2 actors x 4 envs). Only how the 8 envs are
split among actor threads and how far each may run ahead changes; lead 1
chunk (``max_lead_steps = num_steps``) is lock-step, lag 0. Everything else
is `AsyncActorLearnerConfig`'s defaults.

The runs are a sweep of `ppo_async.sweep` (``ppo-async sweep``'s machinery):
one run directory per cell and seed under ``runs_<env>_<steps>_<num_steps>/``
(one sweep directory per env, budget and chunk size), trained one at a time
by default (``--workers``; parallel runs would share the cores and skew the
throughput), resumable (a finished run is skipped, an interrupted one resumes
from its checkpoint). ``results.csv`` is rebuilt from every finished run
directory of those sweep directories. ``--dry-run`` lists the grid and what is done. The plot,
``return_vs_lag.png``, shows each cell's final return (mean ± std over seeds)
against its observed mean lag, without and with V-trace, and the observed lag
against the valve's lead.

    python experiments/sweep_staleness.py --dry-run
    python experiments/sweep_staleness.py                      # 96 runs of 200k steps: ~30 min on 2 cores
    python experiments/sweep_staleness.py --num-actors 1 2 4 --lead-chunks 1 4 --seeds 1 \\
        --total-env-steps 200000                               # a sub-grid
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from typing import Any, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402
    configure_jax,
    format_mean_std,
    machine_info,
    markdown_table,
    mean_std,
    out_dir,
    print_reproduce,
    pyplot,
    read_csv,
    reproduce_command,
    write_csv,
    write_json,
)

NUM_ACTORS = (1, 2, 4, 8)
VTRACE = ("off", "on")
LEAD_CHUNKS = (1, 2, 4, 8)
TOTAL_ENVS = 8  # envs over all actors in every cell: the batch stays the same
FIELDS = (
    "env_id", "num_actors", "envs_per_actor", "use_vtrace", "lead_chunks", "max_lead_steps",
    "num_steps", "total_env_steps", "seed", "final_return", "policy_lag_mean",
    "policy_lag_max", "env_steps", "env_steps_per_s", "learner_wait_s", "wall_time_s",
    "train_wall_time_s", "finished_at",
)


class Cell(NamedTuple):
    num_actors: int
    vtrace: str  # "off" | "on"
    lead_chunks: int  # max_lead_steps in chunks of num_steps


def grid(args: argparse.Namespace) -> list[Cell]:
    return [Cell(*c) for c in itertools.product(args.num_actors, args.vtrace, args.lead_chunks)]


def row_key(row: dict[str, str]) -> tuple:
    return (row["env_id"], int(row["num_actors"]), row["use_vtrace"] == "True",
            int(row["lead_chunks"]), int(row["seed"]), int(row["total_env_steps"]),
            int(row["num_steps"]))


def make_config(args: argparse.Namespace, cell: Cell, seed: int):
    """The config of one run, as the sweep builds it from `sweep_table`."""
    from ppo_async.sweep.spec import load_sweep

    table = sweep_table(args, [cell])
    table["seeds"] = [seed]
    (run,) = [r for r in load_sweep(table).runs() if r.config.use_vtrace == (cell.vtrace == "on")]
    return run.config


def sweep_table(args: argparse.Namespace, cells: list[Cell]) -> dict[str, Any]:
    """The cells as a sweep (`ppo_async.sweep`): a point per actor count and lead, V-trace crossed."""
    points = [dict(num_actors=n, envs_per_actor=TOTAL_ENVS // n,
                   max_lead_steps=lead * args.num_steps)
              for n, lead in dict.fromkeys((c.num_actors, c.lead_chunks) for c in cells)]
    vtrace = [v == "on" for v in VTRACE if any(c.vtrace == v for c in cells)]
    return dict(seeds=list(range(args.seeds)), points=points, grid=dict(use_vtrace=vtrace),
                base=dict(env_id=args.env_id, num_steps=args.num_steps, broadcast_every=1,
                          total_env_steps=args.total_env_steps))


def sweep_dir(out, args: argparse.Namespace):
    """The sweep directory of this env, budget and chunk size."""
    return out / f"runs_{args.env_id.replace(':', '_')}_{args.total_env_steps}_{args.num_steps}"


def result_rows(out, wall_times: dict[str, str]) -> list[dict[str, Any]]:
    """A `FIELDS` row per finished run directory of every sweep directory under ``out``."""
    from ppo_async.runs.analysis import expand_sweep_dirs

    rows = []
    for run_dir in expand_sweep_dirs(sorted(out.glob("runs_*"))):
        if not (run_dir / "summary.json").is_file():
            continue
        config = json.loads((run_dir / "config.json").read_text())
        report = json.loads((run_dir / "summary.json").read_text())
        rows.append(dict(
            env_id=config["env_id"], num_actors=config["num_actors"],
            envs_per_actor=config["envs_per_actor"], use_vtrace=config["use_vtrace"],
            lead_chunks=config["max_lead_steps"] // config["num_steps"],
            max_lead_steps=config["max_lead_steps"], num_steps=config["num_steps"],
            total_env_steps=config["total_env_steps"], seed=config["seed"],
            final_return=round(report["episode_return_mean"], 3),
            policy_lag_mean=round(report["policy_lag_mean"], 4),
            policy_lag_max=report["policy_lag_max"], env_steps=report["env_steps"],
            env_steps_per_s=round(report["env_steps_per_s"], 1),
            learner_wait_s=round(report["learner_wait_s"], 2),
            wall_time_s=wall_times.get(str(run_dir), round(report["wall_time_s"], 2)),
            train_wall_time_s=round(report["wall_time_s"], 2),
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(
                (run_dir / "summary.json").stat().st_mtime)),
        ))
    return rows


def finished_cells(rows: list[dict[str, str]], args: argparse.Namespace) -> dict[Cell, list]:
    """Finished runs per cell at this sweep's env, budget and chunk size, in grid order.

    Every cell in the CSV counts, not only those of a restricted ``--num-actors``
    etc., so a sweep built up in pieces is summarized and plotted whole.
    """
    cells: dict[Cell, list] = {}
    for r in rows:
        env_id, num_actors, vtrace, lead_chunks, _, total, num_steps = row_key(r)
        if (env_id, total, num_steps) == (args.env_id, args.total_env_steps, args.num_steps):
            cell = Cell(num_actors, "on" if vtrace else "off", lead_chunks)
            cells.setdefault(cell, []).append(r)
    return dict(sorted(cells.items(), key=lambda item: (item[0].num_actors,
                                                        VTRACE.index(item[0].vtrace),
                                                        item[0].lead_chunks)))


def summarize(rows: list[dict[str, str]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per cell with at least one finished run: mean ± std over its seeds."""
    summary = []
    for cell, runs in finished_cells(rows, args).items():
        ret_mean, ret_std = mean_std(float(r["final_return"]) for r in runs)
        summary.append(dict(
            num_actors=cell.num_actors, use_vtrace=cell.vtrace == "on",
            lead_chunks=cell.lead_chunks, seeds=sorted(int(r["seed"]) for r in runs),
            final_return_mean=ret_mean, final_return_std=ret_std,
            policy_lag_mean=mean_std(float(r["policy_lag_mean"]) for r in runs)[0],
            policy_lag_max=max(int(r["policy_lag_max"]) for r in runs),
            env_steps_per_s=mean_std(float(r["env_steps_per_s"]) for r in runs)[0],
            wall_time_s=mean_std(float(r["wall_time_s"]) for r in runs)[0],
        ))
    return summary


def summary_table(summary: list[dict[str, Any]]) -> str:
    return markdown_table(
        ["actors x envs", "V-trace", "lead (chunks)", "seeds", "final return",
         "lag mean", "lag max", "env steps/s", "wall s"],
        ([f"{s['num_actors']} x {TOTAL_ENVS // s['num_actors']}",
          "on" if s["use_vtrace"] else "off", s["lead_chunks"], len(s["seeds"]),
          format_mean_std(s["final_return_mean"], s["final_return_std"]),
          f"{s['policy_lag_mean']:.2f}", s["policy_lag_max"], f"{s['env_steps_per_s']:.0f}",
          f"{s['wall_time_s']:.0f}"] for s in summary),
    )


def plot(summary: list[dict[str, Any]], args: argparse.Namespace, path) -> None:
    """Left: final return vs observed mean lag, V-trace off/on. Right: observed lag vs the valve's lead."""
    plt = pyplot()
    colors = {False: "tab:red", True: "tab:blue"}
    markers = {1: "o", 2: "s", 4: "^", 8: "D"}
    fig, (ax_ret, ax_lag) = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in summary:
        ax_ret.errorbar(s["policy_lag_mean"], s["final_return_mean"], yerr=s["final_return_std"],
                        color=colors[s["use_vtrace"]], marker=markers.get(s["num_actors"], "x"),
                        markersize=7, capsize=3, linestyle="none", alpha=0.85)
    # One trend line per V-trace setting: the mean over cells of about the same lag.
    for vtrace in (False, True):
        by_lag: dict[float, list[float]] = {}
        for s in summary:
            if s["use_vtrace"] == vtrace:
                by_lag.setdefault(round(s["policy_lag_mean"], 1), []).append(s["final_return_mean"])
        if len(by_lag) > 1:
            lags = sorted(by_lag)
            ax_ret.plot(lags, [mean_std(by_lag[lag])[0] for lag in lags], color=colors[vtrace],
                        alpha=0.4, linewidth=1.5)
    handles = [plt.Line2D([], [], color=colors[v], marker="o", linestyle="-", alpha=0.7,
                          label=f"V-trace {'on' if v else 'off'} (line: mean at each lag)")
               for v in (False, True)]
    handles += [plt.Line2D([], [], color="gray", marker=m, linestyle="none",
                           label=f"{n} actor{'s' if n > 1 else ''}")
                for n, m in markers.items() if any(s["num_actors"] == n for s in summary)]
    ax_ret.legend(handles=handles, fontsize=8, loc="best")
    ax_ret.set_xlabel("observed policy lag, mean (learner updates)")
    ax_ret.set_ylabel("final return (last 100 episodes)")
    ax_ret.set_title(f"{args.env_id}, {args.total_env_steps:,} env steps: return vs lag")
    ax_ret.grid(alpha=0.3)

    for n, m in markers.items():
        for vtrace in (False, True):
            points = sorted((s["lead_chunks"], s["policy_lag_mean"]) for s in summary
                            if s["num_actors"] == n and s["use_vtrace"] == vtrace)
            if points:
                ax_lag.plot(*zip(*points), marker=m, color=colors[vtrace],
                            linestyle="-" if vtrace else "--", alpha=0.8)
    leads = sorted({s["lead_chunks"] for s in summary})
    if leads:
        ax_lag.plot(leads, [lead - 1 for lead in leads], color="black", linestyle=":",
                    label="valve bound: lead - 1")
        ax_lag.set_xticks(leads)
    ax_lag.plot([], [], color="gray", linestyle="--", label="V-trace off")
    ax_lag.plot([], [], color="gray", linestyle="-", label="V-trace on")
    ax_lag.legend(fontsize=8, loc="upper left")
    ax_lag.set_ylim(bottom=-0.2)
    ax_lag.set_xlabel("valve lead, max_lead_steps (chunks of num_steps)")
    ax_lag.set_ylabel("observed policy lag, mean (learner updates)")
    ax_lag.set_title("observed lag vs the valve's lead (marker: actors)")
    ax_lag.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-actors", nargs="+", type=int, default=list(NUM_ACTORS),
                        choices=NUM_ACTORS, help="actor counts (envs_per_actor = 8 // num_actors)")
    parser.add_argument("--vtrace", nargs="+", default=list(VTRACE), choices=VTRACE)
    parser.add_argument("--lead-chunks", nargs="+", type=int, default=list(LEAD_CHUNKS),
                        help="max_lead_steps in chunks of num_steps (1 = lock-step)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per cell (default 3)")
    parser.add_argument("--total-env-steps", type=int, default=200_000,
                        help="per run (default 200k: CartPole is still being learned, so staleness shows)")
    parser.add_argument("--num-steps", type=int, default=64, help="rows per actor chunk")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--workers", type=int, default=1,
                        help="runs at once (default 1: parallel runs would skew the throughput)")
    parser.add_argument("--dry-run", action="store_true", help="list the grid and what is done")
    parser.add_argument("--out", default=None, help="output dir (default experiments/out/sweep_staleness)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or any(k < 1 for k in args.lead_chunks):
        parser.error("--seeds and --lead-chunks must be >= 1")
    batch = TOTAL_ENVS * args.num_steps
    if args.total_env_steps < batch:
        parser.error(f"--total-env-steps must be at least one batch ({TOTAL_ENVS} envs x "
                     f"--num-steps = {batch})")
    args.num_actors = sorted(set(args.num_actors))
    args.vtrace = [v for v in VTRACE if v in args.vtrace]
    args.lead_chunks = sorted(set(args.lead_chunks))
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from ppo_async.sweep.execute import execute_sweep, plan_sweep

    out = out_dir("sweep_staleness", args.out)
    csv_path = out / "results.csv"
    cells = grid(args)
    seeds = list(range(args.seeds))
    runs_dir = sweep_dir(out, args)
    plan = plan_sweep(sweep_table(args, cells), runs_dir)
    by_cell = {(r.config.num_actors, r.config.use_vtrace, r.config.max_lead_chunks, r.seed): r
               for r in plan.runs}

    def is_done(cell: Cell, seed: int) -> bool:
        run = by_cell[(cell.num_actors, cell.vtrace == "on", cell.lead_chunks, seed)]
        return plan.states[run.name] == "done"

    todo = [(cell, seed) for cell in cells for seed in seeds if not is_done(cell, seed)]
    print(f"{args.env_id}: {len(cells)} cells x {len(seeds)} seeds, "
          f"{args.total_env_steps:,} env steps each, {TOTAL_ENVS} envs x {args.num_steps} "
          f"steps per update; {len(cells) * len(seeds) - len(todo)} runs done, "
          f"{len(todo)} to run ({runs_dir})")
    if args.dry_run:
        for i, cell in enumerate(cells, 1):
            finished = [s for s in seeds if is_done(cell, s)]
            print(f"  cell {i:2d}: num_actors={cell.num_actors} "
                  f"envs_per_actor={TOTAL_ENVS // cell.num_actors} vtrace={cell.vtrace:3s} "
                  f"lead={cell.lead_chunks} chunks  seeds done {len(finished)}/{len(seeds)}")
        return dict(cells=cells, todo=todo, out=out)

    configure_jax()  # the workers share this process's compilation cache
    if todo:
        execute_sweep(plan.spec, runs_dir, workers=args.workers)
    wall_times = {str(runs_dir / r["run"]): r["wall_time_s"]
                  for r in read_csv(runs_dir / "runs.csv")}
    write_csv(csv_path, result_rows(out, wall_times), FIELDS)
    rows = read_csv(csv_path)
    summary = summarize(rows, args)
    command = reproduce_command(__file__, argv)
    png_path = out / "return_vs_lag.png"
    plot(summary, args, png_path)
    json_path = write_json(out / "summary.json", dict(
        env_id=args.env_id, total_env_steps=args.total_env_steps, num_steps=args.num_steps,
        total_envs=TOTAL_ENVS, cells=summary, command=command, machine=machine_info(),
    ))
    table = summary_table(summary)
    print("\n" + table)
    print(f"\nwrote {csv_path}, {json_path}, {png_path}")
    print_reproduce(__file__, argv)
    return dict(cells=cells, todo=todo, summary=summary, table=table, out=out)


if __name__ == "__main__":
    main()
