"""MinAtar at 10M env steps: Breakout, Asterix, Freeway and SpaceInvaders, beside published PPO.

Each game's preset (``breakout-minatar-10m``, ``asterix-minatar``,
``freeway-minatar``, ``space-invaders-minatar``: gymnax-blines' PPO settings,
``ppo_async/presets.py`` says which and what differs) with ``--torso`` (default
the presets' ``none``, the MLP on the flattened grid; ``minatar`` is the conv
torso; ``experiments/minatar_torso.py`` measures which learns more per second
here), ``--seeds`` seeds, each run a run directory of one sweep per game
(`ppo_async.sweep`, one worker: each run in a fresh process, one after the
other, so each run's wall time is its own). Resumable: a rerun skips the runs
that finished and resumes an interrupted one from its last checkpoint (written
every 5 minutes), and a rerun with more ``--seeds`` adds only the new ones.

The return is the training return, the mean over the last 100 episodes of the
sampled policy (`LearnerReport.episode_return_mean`). The reference is the
return gymnax's README lists for gymnax-blines' PPO checkpoints
(``PUBLISHED``): trained 10M env steps with the settings the presets copy,
evaluated on 164 episodes of the sampled policy (gymnax-blines
``utils/ppo.py``), one run each, no spread given.

Writes, under ``experiments/out/minatar_results/`` (or ``--out``):
``sweeps/<preset>,torso=<torso>/`` (the run directories), ``results.csv`` (a
row per run: return, env steps, wall time), ``curves.csv`` (every update's
return, env steps and learner wall time), ``learning_curves.png`` (return
against env steps, mean ± std over seeds, the reference dashed), and
``summary.json``; prints the markdown table.

    python experiments/minatar_results.py                                   # 4 games x 3 seeds x 10M
    python experiments/minatar_results.py --seeds 1 --games freeway-minatar # one game, one seed
    python experiments/minatar_results.py --total-env-steps 4096 --num-steps 16 --seeds 1   # smoke
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

GAMES = ("breakout-minatar-10m", "asterix-minatar", "freeway-minatar", "space-invaders-minatar")
TORSOS = ("none", "minatar")
# gymnax v1.0.1 README ("Implemented Accelerated Environments", column "Ckpt (Return)"), the
# returns of gymnax-blines' PPO checkpoints (github.com/RobertTLange/gymnax-blines,
# agents/<Game>-MinAtar/ppo.yaml: num_train_steps 10M). The installed gymnax's METADATA holds
# the same README.
PUBLISHED: dict[str, float] = {
    "Breakout-MinAtar": 28.0, "Asterix-MinAtar": 15.0, "Freeway-MinAtar": 58.0,
    "SpaceInvaders-MinAtar": 131.0,
}
PUBLISHED_ENV_STEPS = 10_000_000
PUBLISHED_SOURCE = ("gymnax README (v1.0.1), gymnax-blines PPO checkpoints, 10M env steps, "
                    "164 episodes of the sampled policy")
RESULT_FIELDS = ("preset", "env_id", "torso", "seed", "env_steps", "final_return",
                 "wall_time_s", "learner_wall_time_s", "env_steps_per_s", "run")
CURVE_FIELDS = ("preset", "env_id", "torso", "seed", "update", "env_steps", "wall_time_s",
                "episode_return")


def sweep_table(name: str, args) -> dict[str, Any]:
    """One game's sweep: its preset, the budget and torso in ``[base]``, seeds 0..N-1."""
    base: dict[str, Any] = {"total_env_steps": args.total_env_steps, "torso": args.torso}
    if args.num_steps:
        base["num_steps"] = args.num_steps
    return {"preset": name, "seeds": list(range(args.seeds)), "base": base}


def sweep_dir(out: pathlib.Path, name: str, torso: str) -> pathlib.Path:
    return out / "sweeps" / f"{name},torso={torso}"


def run_games(args, out: pathlib.Path) -> None:
    from ppo_async.sweep.execute import SweepWarning, execute_sweep

    for name in args.games:
        directory = sweep_dir(out, name, args.torso)
        print(f"== {name}, torso {args.torso}: seeds 0..{args.seeds - 1}, "
              f"{args.total_env_steps:,} env steps each, into {directory}", flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SweepWarning)  # "all done already": a resumed rerun
            execute_sweep(sweep_table(name, args), directory, workers=args.workers,
                          progress=False)
        for row in common.read_csv(directory / "runs.csv"):
            print(f"   seed {row['seed']}: {row['status']} {row['error']}".rstrip()
                  + (f", return {_number(row['final_return']):.1f} in "
                     f"{_number(row['wall_time_s']):.0f} s" if row["status"] == "done" else ""),
                  flush=True)


def _number(cell: str) -> float:
    """A runs.csv cell as a float: NaN where empty (no episode ended yet)."""
    return float(cell) if cell not in ("", None) else float("nan")


def collect(args, out: pathlib.Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A row per finished run and its curve, of every game and torso swept into ``out``."""
    from ppo_async.presets import PRESETS

    results, curves = [], []
    for name in GAMES:
        for torso in TORSOS:
            directory = sweep_dir(out, name, torso)
            if not (directory / "runs.csv").is_file():
                continue
            for run in common.finished_sweep_runs(directory):
                m = run["run_data"].metrics
                key = dict(preset=name, env_id=PRESETS[name]["env_id"], torso=torso,
                           seed=int(run["seed"]))
                results.append(dict(
                    **key, env_steps=int(m["env_steps"][-1]),
                    final_return=_number(run["final_return"]),
                    wall_time_s=_number(run["wall_time_s"]),
                    learner_wall_time_s=float(m["wall_time_s"][-1]),
                    env_steps_per_s=common.steady_rate(m["env_steps"], m["wall_time_s"]),
                    run=str(directory / run["run"])))
                curves += [dict(**key, update=int(u), env_steps=int(s), wall_time_s=float(t),
                                episode_return=float(r))
                           for u, s, t, r in zip(m["update"], m["env_steps"], m["wall_time_s"],
                                                 m["episode_return"])]
    return results, curves


def results_table(results: list[dict[str, Any]]) -> str:
    lines = []
    for name in GAMES:
        for torso in TORSOS:
            runs = [r for r in results if r["preset"] == name and r["torso"] == torso]
            if not runs:
                continue
            env_id = runs[0]["env_id"]
            lines.append([
                env_id, f"`{name}`", torso, f"{runs[0]['env_steps']:,}", len(runs),
                common.format_mean_std(*common.mean_std(r["final_return"] for r in runs)),
                f"{PUBLISHED[env_id]:g}",
                f"{common.mean_std(r['env_steps_per_s'] for r in runs)[0]:,.0f}",
                " / ".join(f"{r['wall_time_s']:.0f}" for r in runs),
            ])
    return common.markdown_table(
        ["game", "preset", "torso", "env steps", "seeds", "return (last 100 episodes)",
         f"published PPO ({PUBLISHED_ENV_STEPS // 1_000_000}M env steps)", "env steps/s",
         "wall time per run (s)"], lines)


def plot(curves: list[dict[str, Any]], path: pathlib.Path) -> None:
    """Return against env steps per game: seeds thin, mean ± std thick, the reference dashed."""
    import numpy as np

    plt = common.pyplot()
    from matplotlib.ticker import FuncFormatter

    games = [g for g in GAMES if any(c["preset"] == g for c in curves)]
    fig, axes = plt.subplots(1, max(1, len(games)), figsize=(4.4 * max(1, len(games)), 3.6),
                             squeeze=False)
    for ax, name in zip(axes[0], games):
        env_id = next(c["env_id"] for c in curves if c["preset"] == name)
        for index, torso in enumerate(TORSOS):
            seeds = sorted({c["seed"] for c in curves if c["preset"] == name
                            and c["torso"] == torso})
            if not seeds:
                continue
            per_seed = [[c for c in curves if c["preset"] == name and c["torso"] == torso
                         and c["seed"] == seed] for seed in seeds]
            length = min(len(s) for s in per_seed)
            steps = np.array([c["env_steps"] for c in per_seed[0][:length]])
            returns = np.array([[c["episode_return"] for c in s[:length]] for s in per_seed])
            color = f"C{index}"
            for row in returns:
                ax.plot(steps, row, color=color, alpha=0.3, linewidth=0.8)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # before any episode ended
                mean, std = np.nanmean(returns, 0), np.nanstd(returns, 0)
            ax.plot(steps, mean, color=color, linewidth=2, marker="." if length < 50 else None,
                    label=f"torso {torso} ({len(seeds)} seed{'s' * (len(seeds) > 1)})")
            ax.fill_between(steps, mean - std, mean + std, color=color, alpha=0.2)
        ax.axhline(PUBLISHED[env_id], color="k", linestyle="--", linewidth=1,
                   label="gymnax-blines PPO, 10M")
        ax.set_title(env_id)
        # Freeway's first episodes end after 2,500 steps: the curve starts late, the axis at 0.
        ax.set_xlim(0, max(c["env_steps"] for c in curves if c["preset"] == name))
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda x, _: f"{x / 1e6:g}M" if x >= 1e6 else f"{x / 1e3:g}k" if x else "0"))
        ax.set_xlabel("env steps")
        ax.set_ylabel("return (last 100 episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", nargs="+", default=list(GAMES), choices=GAMES,
                        help="presets to train (default: all four)")
    parser.add_argument("--total-env-steps", type=int, default=10_000_000)
    parser.add_argument("--torso", default="none", choices=TORSOS,
                        help="none: MLPs on the flattened grid (the presets'); minatar: one conv")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per game")
    parser.add_argument("--num-steps", type=int, default=0,
                        help="steps per env and update (0: the presets' 128; fewer: a smoke run)")
    parser.add_argument("--workers", type=int, default=1,
                        help="runs at once (1: each run's wall time is its own)")
    parser.add_argument("--dry-run", action="store_true",
                        help="build and print every run's config, train nothing")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if min(args.seeds, args.workers, args.total_env_steps) < 1 or args.num_steps < 0:
        parser.error("--seeds, --workers and --total-env-steps must be >= 1")
    return args


def dry_run(args, out: pathlib.Path) -> dict[str, list[str]]:
    from ppo_async.sweep.execute import plan_sweep

    planned = {}
    for name in args.games:
        plan = plan_sweep(sweep_table(name, args), sweep_dir(out, name, args.torso))
        planned[name] = [f"{run.name} ({plan.states[run.name]}): {run.config.env_id}, "
                         f"{run.config.num_updates} updates of {run.config.batch_size}, torso "
                         f"{run.config.network_torso}" for run in plan.runs]
        print(f"{name}:\n  " + "\n  ".join(planned[name]))
    return planned


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = common.out_dir("minatar_results", args.out)
    if args.dry_run:
        return dry_run(args, out)
    common.configure_jax()  # the sweep's workers inherit the compilation cache
    run_games(args, out)
    results, curves = collect(args, out)
    common.write_csv(out / "results.csv", results, RESULT_FIELDS)
    common.write_csv(out / "curves.csv", curves, CURVE_FIELDS)
    if curves:
        plot(curves, out / "learning_curves.png")
    table = results_table(results)
    print("\n" + table + f"\n\npublished: {PUBLISHED_SOURCE}")
    result = dict(results=results, table=table, published=PUBLISHED,
                  published_source=PUBLISHED_SOURCE, published_env_steps=PUBLISHED_ENV_STEPS)
    common.save_result("minatar_results", args.out, __file__, argv, result, "summary.json")
    return result


if __name__ == "__main__":
    main()
