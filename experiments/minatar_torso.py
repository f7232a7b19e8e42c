"""Which MinAtar torso learns most per second of wall time here: one conv, or the MLP on the grid.

One game (``--env-id``, default Breakout-MinAtar) with the settings of the
``breakout-minatar-10m`` preset (gymnax-blines' PPO), each torso at equal env
steps (``--total-env-steps``) and ``--seeds`` seeds; only the torso differs:

- ``minatar``: one 3x3 conv of 16 filters (the MinAtar paper's body), flattened
  into the 2 x 256 MLPs;
- ``none``: the 2 x 256 MLPs on the flattened 10x10xC grid (gymnax-blines'
  PPO baselines; the presets' choice).

Every run is a run directory of a sweep (`ppo_async.sweep`, one worker: each
run in a fresh process, one after the other); one sweep per seed, so the
torsos alternate and a change in the machine's load hits both. Resumable: a
rerun skips finished runs (and adds seeds). Reported per torso: the steady
env steps/s (the learner's, from a quarter of the budget on), the wall time
per run (the worker process's: JAX's start and compiles included), the
return (last 100 episodes) at equal env steps (the end) and at equal wall
time (each seed's pair read at the shorter run's learner time), and the
curves against learner wall time and env steps. The winner is the torso
with the higher mean return at equal wall time.

The default budget is 2M env steps, not 10M: at 10M the four runs would
take hours on a 2-core CPU, most of them the conv torso's (the slower per
step); ``--total-env-steps 10000000`` runs the full budget.

Writes, under ``experiments/out/minatar_torso/`` (or ``--out``): ``sweeps/``,
``runs.csv`` (a row per run), ``curves.csv`` (every update), ``torso.png``
(return against wall time and against env steps), ``summary.json``; prints
the markdown table.

    python experiments/minatar_torso.py                          # Breakout, 2 seeds x 2 torsos, 2M each
    python experiments/minatar_torso.py --env-id Asterix-MinAtar --total-env-steps 1000000
    python experiments/minatar_torso.py --total-env-steps 2048 --num-steps 16 --seeds 1   # smoke
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

TORSOS = ("minatar", "none")
PRESET = "breakout-minatar-10m"
GAMES = ("Breakout-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar", "SpaceInvaders-MinAtar")
RUN_FIELDS = ("env_id", "torso", "seed", "env_steps", "wall_time_s", "learner_wall_time_s",
              "env_steps_per_s", "final_return", "equal_wall_time_s", "return_at_equal_wall_time")
CURVE_FIELDS = ("torso", "seed", "update", "env_steps", "wall_time_s", "episode_return")


def sweep_table(args, seed: int) -> dict[str, Any]:
    base: dict[str, Any] = {"env_id": args.env_id, "total_env_steps": args.total_env_steps}
    if args.num_steps:
        base["num_steps"] = args.num_steps
    return {"preset": PRESET, "seeds": [seed], "base": base, "grid": {"torso": list(args.torsos)}}


def run_sweeps(args, out: pathlib.Path) -> None:
    from ppo_async.sweep.execute import SweepWarning, execute_sweep

    for seed in range(args.seeds):
        directory = out / "sweeps" / f"seed={seed}"
        print(f"== seed {seed}: torsos {list(args.torsos)} on {args.env_id}, "
              f"{args.total_env_steps:,} env steps each, into {directory}", flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SweepWarning)  # "all done already": a rerun
            execute_sweep(sweep_table(args, seed), directory, workers=1, progress=False)
        for row in common.read_csv(directory / "runs.csv"):
            print(f"   torso {row['torso']}: {row['status']} in {row['wall_time_s']} s "
                  f"{row['error']}".rstrip(), flush=True)


def collect(args, out: pathlib.Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A row per finished run (with its pair's equal-wall-time return) and every update."""
    import numpy as np

    rows, curves = [], []
    for seed in range(args.seeds):
        runs = {r["torso"]: r for r in common.finished_sweep_runs(out / "sweeps" / f"seed={seed}")}
        if not runs:
            continue
        equal_wall = min(float(r["run_data"].metrics["wall_time_s"][-1]) for r in runs.values())
        for torso, run in runs.items():
            m = run["run_data"].metrics
            rows.append(dict(
                env_id=args.env_id, torso=torso, seed=seed, env_steps=int(m["env_steps"][-1]),
                wall_time_s=float(run["wall_time_s"]),
                learner_wall_time_s=float(m["wall_time_s"][-1]),
                env_steps_per_s=common.steady_rate(m["env_steps"], m["wall_time_s"]),
                final_return=float(np.asarray(m["episode_return"])[-1]),
                equal_wall_time_s=equal_wall if len(runs) > 1 else float("nan"),
                return_at_equal_wall_time=(common.value_at(m["wall_time_s"], m["episode_return"],
                                                           equal_wall)
                                           if len(runs) > 1 else float("nan"))))
            curves += [dict(torso=torso, seed=seed, update=int(u), env_steps=int(s),
                            wall_time_s=float(t), episode_return=float(r))
                       for u, s, t, r in zip(m["update"], m["env_steps"], m["wall_time_s"],
                                             m["episode_return"])]
    return rows, curves


def summarize(rows: list[dict[str, Any]], torsos) -> dict[str, dict[str, float]]:
    summary = {}
    for torso in torsos:
        runs = [r for r in rows if r["torso"] == torso]
        if runs:
            summary[torso] = {key: common.mean_std(r[key] for r in runs)[0] for key in (
                "env_steps_per_s", "wall_time_s", "learner_wall_time_s", "final_return",
                "return_at_equal_wall_time", "equal_wall_time_s")}
            summary[torso].update(
                seeds=len(runs), env_steps=runs[0]["env_steps"],
                final_return_std=common.mean_std(r["final_return"] for r in runs)[1],
                return_at_equal_wall_time_std=common.mean_std(
                    r["return_at_equal_wall_time"] for r in runs)[1])
    return summary


def winner(summary: dict[str, dict[str, float]]) -> str | None:
    """The torso with the higher mean return at equal wall time (None without both)."""
    scored = {t: s["return_at_equal_wall_time"] for t, s in summary.items()
              if s["return_at_equal_wall_time"] == s["return_at_equal_wall_time"]}
    return max(scored, key=scored.get) if len(scored) > 1 else None


def table(summary: dict[str, dict[str, float]]) -> str:
    return common.markdown_table(
        ["torso", "env steps", "seeds", "env steps/s", "wall time per run (s)",
         "return at equal env steps", "return at equal wall time", "at (learner s)"],
        [[torso, f"{s['env_steps']:,}", s["seeds"], f"{s['env_steps_per_s']:,.0f}",
          f"{s['wall_time_s']:.0f}",
          common.format_mean_std(s["final_return"], s["final_return_std"]),
          common.format_mean_std(s["return_at_equal_wall_time"],
                                 s["return_at_equal_wall_time_std"]),
          f"{s['equal_wall_time_s']:.0f}" if s["equal_wall_time_s"] == s["equal_wall_time_s"]
          else "n/a"] for torso, s in summary.items()])


def plot(curves: list[dict[str, Any]], title: str, path: pathlib.Path) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for index, torso in enumerate(dict.fromkeys(c["torso"] for c in curves)):
        for seed in sorted({c["seed"] for c in curves if c["torso"] == torso}):
            points = [c for c in curves if c["torso"] == torso and c["seed"] == seed]
            label = f"torso {torso}" if seed == min(c["seed"] for c in curves
                                                    if c["torso"] == torso) else None
            for ax, x in zip(axes, ("wall_time_s", "env_steps")):
                ax.plot([p[x] for p in points], [p["episode_return"] for p in points],
                        color=f"C{index}", linewidth=1.2, alpha=0.8, label=label)
    for ax, xlabel in zip(axes, ("learner wall time (s), compile included", "env steps")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("return (last 100 episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="Breakout-MinAtar", choices=GAMES)
    parser.add_argument("--torsos", nargs="+", default=list(TORSOS), choices=TORSOS)
    parser.add_argument("--total-env-steps", type=int, default=2_000_000,
                        help="every run's budget (default 2M; the docstring says why not 10M)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 (default 2)")
    parser.add_argument("--num-steps", type=int, default=0,
                        help="steps per env and update (0: the preset's 128; fewer: a smoke run)")
    parser.add_argument("--dry-run", action="store_true",
                        help="build and print every run's config, train nothing")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if min(args.seeds, args.total_env_steps) < 1 or args.num_steps < 0:
        parser.error("--seeds and --total-env-steps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = common.out_dir("minatar_torso", args.out)
    if args.dry_run:
        from ppo_async.sweep.execute import plan_sweep

        planned = [f"{run.name} ({plan.states[run.name]}): {run.config.num_updates} updates "
                   f"of {run.config.batch_size}, torso {run.config.network_torso}"
                   for seed in range(args.seeds)
                   for plan in [plan_sweep(sweep_table(args, seed),
                                           out / "sweeps" / f"seed={seed}")]
                   for run in plan.runs]
        print("\n".join(planned))
        return dict(planned=planned)
    common.configure_jax()  # the sweep's workers inherit the compilation cache
    run_sweeps(args, out)
    rows, curves = collect(args, out)
    common.write_csv(out / "runs.csv", rows, RUN_FIELDS)
    common.write_csv(out / "curves.csv", curves, CURVE_FIELDS)
    if curves:
        plot(curves, f"{args.env_id}: torsos at {args.total_env_steps:,} env steps",
             out / "torso.png")
    summary = summarize(rows, args.torsos)
    markdown = table(summary)
    best = winner(summary)
    print("\n" + markdown)
    if best is not None:
        print(f"\nmost return at equal wall time: torso {best}")
    result = dict(env_id=args.env_id, runs=rows, summary=summary, table=markdown, winner=best)
    common.save_result("minatar_torso", args.out, __file__, argv, result, "summary.json")
    return result


if __name__ == "__main__":
    main()
