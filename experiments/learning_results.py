"""Learning results: the asynchronous runtime against its synchronous twin, at equal env steps.

For each env in ``ENV_PRESETS`` and each seed, one asynchronous run
(``ppo_async.train``, the env's preset in ``ppo_async.presets`` (``ppo-async
train --preset NAME``) with thread actors (``sampler='shared'``, mode
``async``) or collected in the learner's program (``sampler='learner'``, mode
``learner``: the default on a machine without a GPU), at the default exact
lag of one update) and one synchronous run
(``ppo_async.sync.make_train``, all seeds at once with
``jax.jit(jax.vmap(...))``). Both consume the same env steps in batches of the
same shape (``num_actors * envs_per_actor`` envs x ``num_steps``), with the
same hyperparameters; only the asynchrony differs.

Final return: the mean return of the last 100 training episodes
(``LearnerReport.episode_return_mean`` for async; for sync,
``ppo_async.sync.recent_return_mean``, which covers whole updates, so slightly
more than 100 episodes). Reported as mean ± std over seeds (std with ddof 0).

Learning curves: async from each update's ``on_update`` metrics (``env_steps``,
``episode_return`` = mean of the last 100 episodes); sync from each update's
``episode_return_sum / episodes``, smoothed the same way (the mean over the
latest updates that hold at least 100 episodes).

Writes, under ``experiments/out/learning_results/`` (or ``--out``):
``results.csv`` (one row per env, mode and seed), ``summary.json`` (mean ± std,
configs, wall times, the command), ``curves_<env>.csv`` and
``curves_<env>.png`` per env, ``learning_curves.png`` (all envs), and prints a
markdown table for docs/results.md. Running a subset of envs (or ``--modes``)
replaces only those rows, so the full table can be built up one env at a time.

The script sets an XLA flag before JAX starts: without it the vmapped twin can
hang on a 2-core CPU (see ``avoid_vmapped_qr_deadlock`` in ``common.py``).

    python experiments/learning_results.py                       # everything: 3 seeds, ~45 min on 2 cores, most of it MinAtar
    python experiments/learning_results.py --envs CartPole-v1 --seeds 2
    python experiments/learning_results.py --envs CartPole-v1 --budget-scale 0.01   # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402
    MIN_EPISODES,
    avoid_vmapped_qr_deadlock,
    check_seeds_and_budget,
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

# Before anything starts JAX's CPU backend (importing ppo_async does).
avoid_vmapped_qr_deadlock()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ppo_async import train  # noqa: E402
from ppo_async.presets import LEARNING_RESULTS_PRESETS, PRESETS, preset  # noqa: E402
from ppo_async.sync import make_train, recent_return_mean  # noqa: E402

# Each env's config is its preset in `ppo_async.presets` (budget, sizes and
# hyperparameters, with why), so `ppo-async train --preset NAME` trains exactly
# the config of the table's row.
ENV_PRESETS: dict[str, str] = {PRESETS[name]["env_id"]: name for name in LEARNING_RESULTS_PRESETS}
MODES = ("async", "learner", "sync")
SAMPLERS = {"async": "shared", "learner": "learner"}  # each train() mode's sampler
RESULT_FIELDS = (
    "env_id", "mode", "seed", "env_steps", "budget_scale", "final_return",
    "wall_time_s", "wall_time_scope", "compile_s", "policy_lag_mean", "policy_lag_max", "command",
)
CURVE_FIELDS = ("mode", "seed", "update", "env_steps", "episode_return")


def make_config(env_id: str, seed: int, budget_scale: float):
    """The env's preset, its budget scaled (at least two updates, so a curve has two points)."""
    base = preset(ENV_PRESETS[env_id], seed=seed)
    total = max(2 * base.batch_size, int(base.total_env_steps * budget_scale))
    return dataclasses.replace(base, total_env_steps=total)


def run_async(config) -> tuple[dict[str, Any], list[tuple[int, float]]]:
    """One asynchronous run: (result row fields, curve as (env_steps, return) per update)."""
    curve: list[tuple[int, float]] = []
    start = time.perf_counter()
    report = train(
        config, progress=False,
        on_update=lambda m: curve.append((int(m["env_steps"]), float(m["episode_return"]))),
    ).report
    wall = time.perf_counter() - start
    row = dict(
        final_return=report.episode_return_mean, env_steps=report.env_steps,
        wall_time_s=round(wall, 2), wall_time_scope="this seed, compile included",
        policy_lag_mean=round(report.policy_lag_mean, 4), policy_lag_max=report.policy_lag_max,
    )
    return row, curve


def sync_recent_curve(returns_sum, episodes, min_episodes: int = MIN_EPISODES) -> list[float]:
    """For each update, the mean return over the latest updates holding >= ``min_episodes`` episodes."""
    returns_sum, episodes = np.asarray(returns_sum), np.asarray(episodes)
    return [
        recent_return_mean({"episode_return_sum": returns_sum[: u + 1],
                            "episodes": episodes[: u + 1]}, min_episodes)
        for u in range(len(episodes))
    ]


def run_sync(config, seeds: list[int]) -> tuple[list[dict[str, Any]], list[list[tuple[int, float]]]]:
    """All seeds of the synchronous twin in one ``jit(vmap(...))``: rows and curves per seed."""
    # jax.random.key(seed) per seed: the key train() derives from config.seed.
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds))
    start = time.perf_counter()
    # Compiled apart so that compile time (which depends on the persistent
    # cache's state) can be told from training time.
    train_fn = jax.jit(jax.vmap(make_train(config))).lower(keys).compile()
    compile_s = time.perf_counter() - start
    metrics = jax.device_get(train_fn(keys).metrics)
    wall = time.perf_counter() - start
    env_steps = config.num_updates * config.batch_size
    steps = [(u + 1) * config.batch_size for u in range(config.num_updates)]
    rows, curves = [], []
    for i in range(len(seeds)):
        seed_metrics = {k: np.asarray(v[i]) for k, v in metrics.items()}
        rows.append(dict(
            final_return=recent_return_mean(seed_metrics, MIN_EPISODES), env_steps=env_steps,
            wall_time_s=round(wall, 2), compile_s=round(compile_s, 2),
            wall_time_scope=f"all {len(seeds)} seeds vmapped, compile included",
            policy_lag_mean=0.0, policy_lag_max=0,
        ))
        returns = sync_recent_curve(seed_metrics["episode_return_sum"], seed_metrics["episodes"])
        curves.append(list(zip(steps, returns)))
    return rows, curves


def steps_formatter():
    """Tick labels like 250k and 1M."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _: f"{x / 1e6:g}M" if x >= 1e6 else f"{x / 1e3:g}k" if x else "0")


def load_curves(path) -> dict[str, dict[int, list[tuple[int, float]]]]:
    """``{mode: {seed: [(env_steps, return), ...]}}`` from a ``curves_<env>.csv``."""
    curves: dict[str, dict[int, list[tuple[int, float]]]] = {}
    for r in read_csv(path):
        curves.setdefault(r["mode"], {}).setdefault(int(r["seed"]), []).append(
            (int(r["env_steps"]), float(r["episode_return"])))
    return curves


def plot_env(ax, title: str, curves: dict[str, dict[int, list[tuple[int, float]]]]) -> None:
    """Mean ± std over seeds of each mode's curve, seeds as thin lines."""
    colors = {"async": "tab:blue", "learner": "tab:green", "sync": "tab:orange"}
    labels = {"async": "train, sampler='shared'", "learner": "train, sampler='learner'",
              "sync": "synchronous twin"}
    for mode, per_seed in curves.items():
        if not per_seed:
            continue
        length = min(len(c) for c in per_seed.values())
        steps = np.array([s for s, _ in next(iter(per_seed.values()))[:length]])
        returns = np.array([[r for _, r in c[:length]] for c in per_seed.values()], float)
        for seed_returns in returns:
            ax.plot(steps, seed_returns, color=colors[mode], alpha=0.25, linewidth=0.8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # updates before any episode ends
            mean, std = np.nanmean(returns, 0), np.nanstd(returns, 0)
        ax.plot(steps, mean, color=colors[mode], linewidth=2,
                label=f"{labels[mode]} ({len(per_seed)} seeds)")
        ax.fill_between(steps, mean - std, mean + std, color=colors[mode], alpha=0.2)
    ax.set_title(title)
    ax.xaxis.set_major_formatter(steps_formatter())
    ax.set_xlabel("env steps")
    ax.set_ylabel("return (last 100 episodes)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)


def summarize(rows: list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Per env: its config, and per mode the mean ± std of the final return over seeds, wall times and the command."""
    summary: dict[str, dict[str, Any]] = {}
    for env_id in dict.fromkeys(r["env_id"] for r in rows):
        scale = float(next(r for r in rows if r["env_id"] == env_id)["budget_scale"])
        config = make_config(env_id, 0, scale).to_dict()
        del config["seed"]
        summary[env_id] = {"config": config}
        for mode in MODES:
            runs = [r for r in rows if r["env_id"] == env_id and r["mode"] == mode]
            if not runs:
                continue
            mean, std = mean_std(float(r["final_return"]) for r in runs)
            walls = [float(r["wall_time_s"]) for r in runs]
            summary[env_id][mode] = dict(
                final_return_mean=mean, final_return_std=std, seeds=[int(r["seed"]) for r in runs],
                env_steps=int(runs[0]["env_steps"]), budget_scale=float(runs[0]["budget_scale"]),
                # async, learner: each seed is its own run; sync: one vmapped run for all seeds.
                wall_time_s=walls[0] if mode == "sync" else sum(walls),
                compile_s=float(runs[0].get("compile_s") or "nan"),
                policy_lag_mean=mean_std(float(r["policy_lag_mean"]) for r in runs)[0],
                policy_lag_max=max(int(r["policy_lag_max"]) for r in runs),
                command=runs[0].get("command", ""),
            )
    return summary


def results_table(summary: dict[str, dict[str, Any]]) -> str:
    learner = any("learner" in entry for entry in summary.values())
    rows = []
    for env_id, entry in summary.items():
        if "async" not in entry or "sync" not in entry:
            continue
        a, s = entry["async"], entry["sync"]
        scale = a["budget_scale"]
        rows.append([
            env_id, f"{a['env_steps']:,}" + ("" if scale == 1 else f" (x{scale:g})"),
            len(a["seeds"]),
            format_mean_std(a["final_return_mean"], a["final_return_std"]),
            *([format_mean_std(entry["learner"]["final_return_mean"],
                               entry["learner"]["final_return_std"])
               if "learner" in entry else ""] if learner else []),
            format_mean_std(s["final_return_mean"], s["final_return_std"]),
            f"{a['policy_lag_mean']:.2f} / {a['policy_lag_max']}",
            f"{a['wall_time_s'] / len(a['seeds']):.0f}", f"{s['wall_time_s']:.0f}",
        ])
    return markdown_table(
        ["env", "env steps", "seeds", "async return",
         *(["sampler='learner' return"] if learner else []), "sync twin return",
         "async lag mean / max", "async s per seed", "sync s (all seeds, vmapped)"],
        rows,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(ENV_PRESETS), choices=list(ENV_PRESETS),
                        metavar="ENV", help=f"envs to run (default: all of {list(ENV_PRESETS)})")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiplies every env's total_env_steps (e.g. 0.01 for a smoke run)")
    parser.add_argument("--modes", nargs="+", default=["async", "sync"], choices=MODES,
                        help="async (train() with sampler='shared'), learner "
                             "(sampler='learner') and sync (default: async and sync)")
    parser.add_argument("--out", default=None, help="output dir (default experiments/out/learning_results)")
    args = parser.parse_args(argv)
    check_seeds_and_budget(parser, args)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    configure_jax()
    out = out_dir("learning_results", args.out)
    seeds = list(range(args.seeds))
    command = reproduce_command(__file__, argv)
    results_path = out / "results.csv"
    # Rows of the envs and modes not run now stay, so the table can be built up in pieces.
    rows = [r for r in read_csv(results_path)
            if r["env_id"] not in args.envs or r["mode"] not in args.modes]
    for env_id in args.envs:
        config = make_config(env_id, 0, args.budget_scale)
        print(f"== {env_id}: {config.num_updates} updates x {config.batch_size} env steps, "
              f"seeds {seeds}", flush=True)
        curves: dict[str, dict[int, list]] = {mode: {} for mode in args.modes}
        new_rows: list[dict[str, Any]] = []
        for mode in [m for m in ("async", "learner") if m in args.modes]:
            for seed in seeds:
                row, curve = run_async(dataclasses.replace(config, seed=seed,
                                                           sampler=SAMPLERS[mode]))
                new_rows.append(dict(env_id=env_id, mode=mode, seed=seed,
                                     budget_scale=args.budget_scale, **row))
                curves[mode][seed] = curve
                print(f"   {mode} seed {seed}: return {row['final_return']:.1f} "
                      f"in {row['wall_time_s']:.0f} s (lag mean {row['policy_lag_mean']:.2f})",
                      flush=True)
        if "sync" in args.modes:
            sync_rows, sync_curves = run_sync(config, seeds)
            for seed, row, curve in zip(seeds, sync_rows, sync_curves):
                new_rows.append(dict(env_id=env_id, mode="sync", seed=seed,
                                     budget_scale=args.budget_scale, **row))
                curves["sync"][seed] = curve
            print(f"   sync  seeds {seeds}: returns "
                  f"{[round(r['final_return'], 1) for r in sync_rows]} "
                  f"in {sync_rows[0]['wall_time_s']:.0f} s (vmapped; compile "
                  f"{sync_rows[0]['compile_s']:.0f} s)", flush=True)
        rows.extend({**{k: str(v) for k, v in r.items()}, "command": command} for r in new_rows)
        curves_path = out / f"curves_{env_id}.csv"
        # Keep the other modes' curves of an earlier run (e.g. --modes sync after async).
        kept = [r for r in read_csv(curves_path) if r["mode"] not in args.modes]
        write_csv(curves_path, kept + [
            dict(mode=mode, seed=seed, update=u + 1, env_steps=steps, episode_return=ret)
            for mode, per_seed in curves.items() for seed, curve in per_seed.items()
            for u, (steps, ret) in enumerate(curve)
        ], CURVE_FIELDS)
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        title = env_id if args.budget_scale == 1 else f"{env_id} (budget x{args.budget_scale:g})"
        plot_env(ax, title, load_curves(curves_path))
        fig.tight_layout()
        fig.savefig(out / f"curves_{env_id}.png", dpi=110)
        plt.close(fig)
        # After every env, so a long run that dies keeps the envs it finished.
        order = list(ENV_PRESETS)
        rows.sort(key=lambda r: (order.index(r["env_id"]), MODES.index(r["mode"]), int(r["seed"])))
        write_csv(results_path, rows, RESULT_FIELDS)

    plot_all(out, [env_id for env_id in ENV_PRESETS
                   if (out / f"curves_{env_id}.csv").is_file()])
    summary = summarize(rows)
    summary_path = write_json(out / "summary.json", dict(envs=summary, machine=machine_info()))
    table = results_table(summary)
    print("\n" + table)
    print(f"\nwrote {results_path}, {summary_path}, curves_*.csv/png and learning_curves.png in {out}")
    print_reproduce(__file__, argv)
    return dict(summary=summary, table=table, out=out)


def plot_all(out, env_ids: list[str]) -> None:
    """One figure with every env's curves, read back from their CSVs."""
    if not env_ids:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1, len(env_ids), figsize=(5 * len(env_ids), 3.8), squeeze=False)
    for ax, env_id in zip(axes[0], env_ids):
        plot_env(ax, env_id, load_curves(out / f"curves_{env_id}.csv"))
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
