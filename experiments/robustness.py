"""Robustness over seeds: how often a run solves the env, and how bad the worst runs end.

For each env and mode, N seeds (0..N-1, default 32) at the env's preset in
``ppo_async.presets`` (the config of the learning-results table), and per
mode: the fraction of seeds whose final return reaches the env's threshold,
the 5th-percentile final return (``numpy.percentile``, its default linear
interpolation between order statistics), the min, median and mean ± std
(ddof 0), and the wall time. The tail is what a mean ± std over 3 seeds hides.

Modes:

* ``async``: the runtime, ``ppo_async.train(config, progress=False)``, one seed
  after another in this process (``learning_results.run_async``).
* ``sync``: its synchronous twin, ``ppo_async.sync.make_train``, seeds
  vmapped in one ``jax.jit`` (``learning_results.run_sync``), ``--chunk``
  seeds per jit (default all: XLA's memory analysis of 32 seeds at full
  budget gives about 11 MB for the twin on either env and 0.9 GB for
  purejaxrl, most of it its per-step metrics).
* ``purejaxrl``: CartPole only. purejaxrl's own ``purejaxrl/ppo.py``
  ``make_train`` (``purejaxrl_baseline.run_purejaxrl``) from the checkout
  given by ``--purejaxrl`` (github.com/luchris429/purejaxrl; nothing of it
  is copied here), with the config dict of
  its ``__main__`` read from that file (LR 2.5e-4, 4 envs x 128 steps, 5e5
  steps, 4 epochs x 4 minibatches, ...) except ``DEBUG`` set False (True
  prints every episode from inside the jit), seeds vmapped as its README does:
  ``jax.jit(jax.vmap(make_train(config)))(jax.vmap(jax.random.PRNGKey)(seeds))``.

Final return, the same definition in every mode: the mean return of the last
100 training episodes (``LearnerReport.episode_return_mean`` for async;
``ppo_async.sync.recent_return_mean`` for the twin, which counts whole
updates, so slightly more than 100 episodes; for purejaxrl the last 100
episodes to end in ``out["metrics"]``, see
``purejaxrl_baseline.last_episodes_return_mean``). A seed with no finished episode has a NaN final return: it counts as below the
threshold, and makes the percentiles NaN.

Thresholds (``THRESHOLDS``): gymnasium's registered ``reward_threshold`` of
each env, CartPole-v1 475 and Acrobot-v1 -100.

Wall time, compile included: async per seed (the sum over seeds in the
summary); sync and purejaxrl per jit call of ``--chunk`` seeds (the sum over
calls in the summary), compile time also given apart.

Stand-ins for purejaxrl (``ppo.py``'s imports that are not dependencies
here, and gymnax 1.0's six-value ``step``): ``experiments/purejaxrl_baseline.py``,
whose docstring lists them; they are recorded in ``summary.json``.

Writes, under ``experiments/out/robustness/`` (or ``--out``): ``results.csv``
(one row per env, mode and seed; rows of envs and modes not run now are kept,
so the table can be built up in pieces), ``summary.json`` (the statistics,
configs, the purejaxrl files' sha256, the machine, the command), and prints a
markdown table for docs/results.md and each mode's final returns sorted.
The script sets an XLA flag before JAX starts: without it a vmapped twin can
hang on a 2-core CPU (``avoid_vmapped_qr_deadlock`` in ``common.py``).

    python experiments/robustness.py --purejaxrl ~/src/purejaxrl            # 32 seeds, all of it
    python experiments/robustness.py --envs Acrobot-v1 --modes async sync
    python experiments/robustness.py --seeds 2 --budget-scale 0.02 --purejaxrl ~/src/purejaxrl  # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402
    avoid_vmapped_qr_deadlock,
    check_seeds_and_budget,
    configure_jax,
    format_mean_std,
    machine_info,
    markdown_table,
    mean_std,
    out_dir,
    print_reproduce,
    read_csv,
    reproduce_command,
    write_csv,
    write_json,
)

# Before anything starts JAX's CPU backend (importing ppo_async does).
avoid_vmapped_qr_deadlock()

import numpy as np  # noqa: E402
from learning_results import make_config, run_async, run_sync  # noqa: E402
from purejaxrl_baseline import (  # noqa: E402
    import_purejaxrl_ppo,
    purejaxrl_config,
    purejaxrl_folder_or_exit,
    run_purejaxrl,
)

# gymnasium's registered reward_threshold of each env.
THRESHOLDS: dict[str, float] = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0}
MODES = ("async", "sync", "purejaxrl")
PUREJAXRL_ENVS = ("CartPole-v1",)  # purejaxrl's default config is CartPole's
PERCENTILE = 5
RESULT_FIELDS = (
    "env_id", "mode", "seed", "env_steps", "budget_scale", "final_return", "threshold",
    "solved", "wall_time_s", "wall_time_scope", "compile_s", "call", "command",
)


# --- the runs, the statistics ---------------------------------------------------------


def chunks(seeds: list[int], size: int) -> list[list[int]]:
    return [seeds[i:i + size] for i in range(0, len(seeds), size)]


def run_mode(env_id: str, mode: str, seeds: list[int], args, ppo) -> list[dict[str, Any]]:
    """One row per seed of ``mode`` on ``env_id``, printing as each run or jit call ends."""
    config = make_config(env_id, 0, args.budget_scale)
    rows = []
    if mode == "async":
        for seed in seeds:
            row, _ = run_async(dataclasses.replace(config, seed=seed))
            rows.append(dict(seed=seed, call=len(rows), compile_s="", final_return=row["final_return"],
                             env_steps=row["env_steps"], wall_time_s=row["wall_time_s"],
                             wall_time_scope=row["wall_time_scope"]))
            print(f"   async seed {seed}: {row['final_return']:.1f} in {row['wall_time_s']:.0f} s",
                  flush=True)
        return rows
    for call, chunk in enumerate(chunks(seeds, args.chunk)):
        if mode == "sync":
            chunk_rows = [{k: r[k] for k in ("final_return", "env_steps", "wall_time_s", "compile_s")}
                          for r in run_sync(config, chunk)[0]]
        else:
            chunk_rows = run_purejaxrl(ppo, args.purejaxrl_config, chunk)
        for seed, row in zip(chunk, chunk_rows):
            rows.append(dict(seed=seed, call=call, wall_time_scope=(
                f"one jit call of {len(chunk)} seeds vmapped, compile included"), **row))
        print(f"   {mode} seeds {chunk}: {[round(r['final_return'], 1) for r in chunk_rows]} "
              f"in {chunk_rows[0]['wall_time_s']:.0f} s (vmapped; compile "
              f"{chunk_rows[0]['compile_s']:.0f} s)", flush=True)
    return rows


def tail_stats(finals: Sequence[float], threshold: float) -> dict[str, float]:
    """Fraction >= ``threshold`` (NaN counts as below), 5th percentile (linear), min, median, mean, std."""
    finals = np.asarray(finals, float)
    mean, std = mean_std(finals)
    return dict(
        seeds=int(finals.size), solved_fraction=float(np.mean(finals >= threshold)),
        p5=float(np.percentile(finals, PERCENTILE)), min=float(np.min(finals)),
        median=float(np.median(finals)), mean=mean, std=std,
    )


def summarize(rows: list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Per env and mode: `tail_stats`, seeds, env steps, wall times (summed over runs or calls)."""
    summary: dict[str, dict[str, Any]] = {}
    for env_id in dict.fromkeys(r["env_id"] for r in rows):
        summary[env_id] = {"threshold": THRESHOLDS[env_id]}
        for mode in MODES:
            runs = [r for r in rows if r["env_id"] == env_id and r["mode"] == mode]
            if not runs:
                continue
            per_call = {r["call"]: float(r["wall_time_s"]) for r in runs}
            compiles = {r["call"]: float(r["compile_s"]) for r in runs if r["compile_s"]}
            summary[env_id][mode] = dict(
                **tail_stats([float(r["final_return"]) for r in runs], THRESHOLDS[env_id]),
                seed_list=[int(r["seed"]) for r in runs],
                finals_sorted=sorted(float(r["final_return"]) for r in runs),
                env_steps=int(runs[0]["env_steps"]), budget_scale=float(runs[0]["budget_scale"]),
                wall_time_s=round(sum(per_call.values()), 2),
                compile_s=round(sum(compiles.values()), 2) if compiles else None,
                wall_time_scope=("sum over seeds run one after another" if mode == "async" else
                                 f"sum over {len(per_call)} jit call(s) of vmapped seeds")
                + ", compile included",
                command=runs[0].get("command", ""),
            )
    return summary


def results_table(summary: dict[str, dict[str, Any]]) -> str:
    rows = []
    for env_id, entry in summary.items():
        for mode in MODES:
            if mode not in entry:
                continue
            s = entry[mode]
            scale = s["budget_scale"]
            rows.append([
                env_id, mode, f"{s['env_steps']:,}" + ("" if scale == 1 else f" (x{scale:g})"),
                s["seeds"],
                f"{round(s['solved_fraction'] * s['seeds'])}/{s['seeds']} "
                f"(>= {entry['threshold']:g})",
                f"{s['p5']:.1f}", f"{s['min']:.1f}", f"{s['median']:.1f}",
                format_mean_std(s["mean"], s["std"]), f"{s['wall_time_s']:.0f}",
            ])
    return markdown_table(
        ["env", "mode", "env steps per seed", "seeds", "solved", "5th pct", "min", "median",
         "mean ± std", "wall s (all seeds)"],
        rows,
    )


def file_sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(THRESHOLDS), choices=list(THRESHOLDS),
                        metavar="ENV", help=f"envs to run (default: {list(THRESHOLDS)})")
    parser.add_argument("--seeds", type=int, default=32, help="seeds 0..N-1 (default 32)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="any of async, sync, purejaxrl (default all; purejaxrl runs "
                             "CartPole only)")
    parser.add_argument("--purejaxrl", metavar="DIR", default=None,
                        help="a checkout of github.com/luchris429/purejaxrl (its root or its "
                             "purejaxrl/ folder); needed for --modes purejaxrl")
    parser.add_argument("--chunk", type=int, default=32,
                        help="seeds per jit call of the vmapped modes (default 32)")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiplies every run's env steps (e.g. 0.02 for a smoke run)")
    parser.add_argument("--out", default=None, help="output dir (default experiments/out/robustness)")
    args = parser.parse_args(argv)
    check_seeds_and_budget(parser, args)
    if args.chunk < 1:
        parser.error("--chunk must be >= 1")
    args.purejaxrl_folder = None
    if "purejaxrl" in args.modes and any(env in PUREJAXRL_ENVS for env in args.envs):
        args.purejaxrl_folder = purejaxrl_folder_or_exit(parser, args.purejaxrl)
        try:
            args.purejaxrl_config = purejaxrl_config(args.purejaxrl_folder / "ppo.py",
                                                     args.budget_scale)
        except (ValueError, SyntaxError) as error:
            parser.error(f"--purejaxrl: cannot read the default config: {error}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    configure_jax()
    out = out_dir("robustness", args.out)
    seeds = list(range(args.seeds))
    command = reproduce_command(__file__, argv)
    results_path = out / "results.csv"
    ppo, purejaxrl_info = None, None
    if args.purejaxrl_folder is not None:
        ppo, stood_in = import_purejaxrl_ppo(args.purejaxrl_folder)
        purejaxrl_info = dict(
            folder=str(args.purejaxrl_folder), config=args.purejaxrl_config,
            stood_in_modules=stood_in,
            sha256={name: file_sha256(args.purejaxrl_folder / name)
                    for name in ("ppo.py", "wrappers.py")},
        )
        print(f"purejaxrl from {args.purejaxrl_folder} (stand-ins: {', '.join(stood_in) or 'none'})")
    planned = [(env_id, mode) for env_id in args.envs for mode in args.modes
               if mode != "purejaxrl" or env_id in PUREJAXRL_ENVS]
    # Rows of the envs and modes not run now stay, so the table can be built up in pieces.
    rows = [r for r in read_csv(results_path) if (r["env_id"], r["mode"]) not in planned]
    for env_id in args.envs:
        config = make_config(env_id, 0, args.budget_scale)
        print(f"== {env_id}: preset {config.num_updates} updates x {config.batch_size} env steps, "
              f"seeds 0..{args.seeds - 1}, threshold {THRESHOLDS[env_id]:g}", flush=True)
        for mode in args.modes:
            if (env_id, mode) not in planned:
                print(f"   {mode}: skipped (purejaxrl's default config is for {PUREJAXRL_ENVS})")
                continue
            for row in run_mode(env_id, mode, seeds, args, ppo):
                rows.append({k: str(v) for k, v in dict(
                    env_id=env_id, mode=mode, budget_scale=args.budget_scale,
                    threshold=THRESHOLDS[env_id], command=command,
                    solved=int(row["final_return"] >= THRESHOLDS[env_id]), **row).items()})
            # After every mode, so a long run that dies keeps what it finished.
            rows.sort(key=lambda r: (list(THRESHOLDS).index(r["env_id"]), MODES.index(r["mode"]),
                                     int(r["seed"])))
            write_csv(results_path, rows, RESULT_FIELDS)

    summary = summarize(rows)
    summary_path = write_json(out / "summary.json", dict(
        envs=summary, percentile=f"{PERCENTILE}th, numpy.percentile (linear)",
        final_return="mean return of the last 100 training episodes (sync: whole updates, >= 100)",
        purejaxrl=purejaxrl_info, machine=machine_info(), command=command))
    for env_id, entry in summary.items():
        for mode in MODES:
            if mode in entry:
                finals = ", ".join(f"{v:.1f}" for v in entry[mode]["finals_sorted"])
                print(f"{env_id} {mode} finals, sorted: {finals}")
    table = results_table(summary)
    print("\n" + table)
    print(f"\nwrote {results_path} and {summary_path}")
    print_reproduce(__file__, argv)
    return dict(summary=summary, table=table, out=out)


if __name__ == "__main__":
    main()
