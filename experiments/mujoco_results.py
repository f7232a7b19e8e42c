"""MuJoCo presets (hopper, walker2d, ant) against published PPO, and which actors pay.

Two parts, one script run (``--parts`` picks):

- ``learning``: each preset (``ppo_async.presets``: cleanrl's
  ppo_continuous_action settings on gymnasium's ``*-v5`` envs) trained for
  its budget once per seed through `ppo_async.sweep` (one sweep directory per
  preset, a process per run, resumable: a rerun skips finished runs). Then
  each run's final params play ``--eval-episodes`` greedy episodes
  (`ppo_async.runtime.evaluate`: the env's own, unnormalized return). Table:
  mean ± std over seeds of the training return (mean of the last 100
  training episodes, the figure cleanrl reports) and of the greedy return,
  cleanrl's published figure beside them, and wall time per run (the sweep
  worker's process, compile included).
- ``backends``: each preset trained once per mode in a fresh process
  (imports and compiles included, as a user's run pays them) until its
  training return reaches the preset's threshold or the budget ends:
  ``lockstep`` (``exact_policy_lag=0``, thread actors: actors wait for every
  update, the runtime's synchronous baseline), ``threads`` (thread actors
  one update ahead), ``processes`` (the preset as it is: actor processes
  one update ahead), ``ray`` (``actor_backend='ray'``: Ray actor processes)
  and ``envpool`` (thread actors stepping envpool's C++ twin of the env,
  ``envpool:NAME-v5``). Env steps/s the learner consumed after
  ``--warmup`` updates, and wall time to the threshold.

Writes, under ``experiments/out/mujoco_results/`` (or ``--out``): ``sweeps/<preset>/``
(the runs), ``learning.csv``, ``backends.csv``, ``summary.json`` (both
tables, the machine, the command), ``backends.png``, and prints both
markdown tables for docs/results.md.

    python experiments/mujoco_results.py                      # everything: 3 presets x 3 seeds x 1M steps, then 4 modes x 3 presets
    python experiments/mujoco_results.py --presets hopper --parts backends
    python experiments/mujoco_results.py --total-env-steps 8192 --seeds 1 --eval-episodes 2   # smoke run
    python experiments/mujoco_results.py --dry-run            # build and print every config, train nothing
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import platform
import sys
import time
from typing import Any

import common

# cleanrl's ppo_continuous_action.py at 1M env steps on gymnasium's v4 envs
# (docs.cleanrl.dev/rl-algorithms/ppo/, "MuJoCo v4", runs tagged pr-424): mean ±
# std over seeds of the average training episodic return. The page gives no Ant.
PUBLISHED = {"hopper": (2382.86, 271.74), "walker2d": (2287.95, 571.78), "ant": None}
# Training return at which the backend comparison stops a run's clock: well
# inside what cleanrl's curves reach by 1M steps.
THRESHOLDS = {"hopper": 1000.0, "walker2d": 1000.0, "ant": 1000.0}
MODES = ("lockstep", "threads", "processes", "ray", "envpool")
PARTS = ("learning", "backends")
LEARNING_FIELDS = ("preset", "env_id", "seed", "env_steps", "training_return", "greedy_return",
                   "greedy_return_std", "eval_episodes", "wall_time_s", "policy_lag_mean")
BACKEND_FIELDS = ("preset", "mode", "env_id", "seed", "env_steps_per_s", "threshold", "reached",
                  "time_to_threshold_s", "env_steps_at_threshold", "env_steps", "wall_time_s",
                  "final_return", "policy_lag_max", "load_average_1_min")


def mode_config(name: str, mode: str, seed: int, total_env_steps: int | None):
    """The preset ``name`` as backend ``mode`` trains it."""
    from ppo_async.presets import preset

    config = preset(name, seed=seed)
    if total_env_steps is not None:
        config = dataclasses.replace(config, total_env_steps=total_env_steps)
    if mode == "lockstep":
        return dataclasses.replace(config, exact_policy_lag=0, actor_backend="threads")
    if mode == "threads":
        return dataclasses.replace(config, actor_backend="threads")
    if mode == "ray":
        return dataclasses.replace(config, actor_backend="ray")
    if mode == "envpool":
        # envpool's name for gymnasium's include_cfrc_ext_in_observation (the ant preset's)
        kwargs = dict(config.gymnasium_kwargs)
        envpool_kwargs = (() if kwargs.pop("include_cfrc_ext_in_observation", True) else
                          (("use_contact_force", False),))
        if kwargs:
            raise SystemExit(f"{name}: no envpool twin of gymnasium_kwargs {kwargs}")
        return dataclasses.replace(config, env_id="envpool:" + config.env_id.partition(":")[2],
                                   gymnasium_kwargs=(), envpool_kwargs=envpool_kwargs,
                                   actor_backend="threads")  # envpool steps in C++ threads
    return config


def sweep_table(name: str, seeds: int, total_env_steps: int | None,
                eval_every: int = 0, eval_episodes: int = 10) -> dict[str, Any]:
    """The sweep of one preset: its config once per seed (``[base]`` only for another budget,
    or periodic greedy evaluations every ``eval_every`` updates)."""
    base: dict[str, Any] = {} if total_env_steps is None else {"total_env_steps": total_env_steps}
    if eval_every:
        base.update(eval_every_updates=eval_every, eval_episodes=eval_episodes)
    return {"preset": name, "seeds": list(range(seeds)), "base": base}


def measure(config, threshold: float, warmup: int) -> dict[str, Any]:
    """Train ``config`` until its training return reaches ``threshold``; rate and times."""
    from ppo_async import StopTraining, train

    stamps, steps, reached = [], [], {}
    start = time.perf_counter()

    def watch(metrics):
        stamps.append(time.perf_counter())
        steps.append(int(metrics["env_steps"]))
        if metrics["episode_return"] >= threshold:  # NaN before any episode ended: False
            reached.update(time_to_threshold_s=stamps[-1] - start,
                           env_steps_at_threshold=steps[-1])
            raise StopTraining

    report = train(config, progress=False, on_update=watch).report
    wall = time.perf_counter() - start
    first = max(0, min(warmup, len(stamps) - 2))
    rate = ((steps[-1] - steps[first]) / (stamps[-1] - stamps[first])
            if len(stamps) - first >= 2 else math.nan)
    return {"env_steps_per_s": rate, "reached": bool(reached),
            "time_to_threshold_s": reached.get("time_to_threshold_s", math.nan),
            "env_steps_at_threshold": reached.get("env_steps_at_threshold", ""),
            "env_steps": report.env_steps, "wall_time_s": wall,
            "final_return": report.episode_return_mean, "policy_lag_max": report.policy_lag_max}


def run_learning(args, out: pathlib.Path) -> list[dict[str, Any]]:
    """Every preset's sweep, then a greedy evaluation of each finished run."""
    from ppo_async.runtime.evaluate import evaluate
    from ppo_async.sweep.execute import execute_sweep
    from ppo_async.resume import load_run_config, load_run_params

    rows = []
    for name in args.presets:
        sweep_dir = out / "sweeps" / name
        print(f"== learning: {name}, seeds 0..{args.seeds - 1}, into {sweep_dir}", flush=True)
        execute_sweep(sweep_table(name, args.seeds, args.total_env_steps, args.eval_every,
                                  args.eval_episodes), sweep_dir,
                      workers=args.workers, progress=False)
        for run in common.read_csv(sweep_dir / "runs.csv"):
            if run["status"] != "done":
                print(f"   {run['run']}: {run['status']} {run['error']}", flush=True)
                continue
            config = load_run_config(sweep_dir / run["run"])
            params = load_run_params(sweep_dir / run["run"], config)
            greedy = evaluate(config, params, num_episodes=args.eval_episodes, seed=0)
            rows.append(dict(
                preset=name, env_id=config.env_id, seed=int(run["seed"]),
                env_steps=int(run["env_steps"]), training_return=float(run["final_return"]),
                greedy_return=greedy.mean_return, greedy_return_std=greedy.std_return,
                eval_episodes=args.eval_episodes, wall_time_s=float(run["wall_time_s"]),
                policy_lag_mean=float(run["policy_lag_mean"]),
            ))
            print(f"   seed {run['seed']}: training return {float(run['final_return']):.1f}, "
                  f"greedy {greedy.mean_return:.1f} in {float(run['wall_time_s']):.0f} s",
                  flush=True)
    return rows


def run_backends(args, argv_base: list[str]) -> list[dict[str, Any]]:
    """Every (preset, mode, seed) in a fresh process, the modes alternating."""
    rows = []
    for name in args.presets:
        threshold = args.threshold if args.threshold is not None else THRESHOLDS[name]
        print(f"== backends: {name}, clock stops at a training return of {threshold:g}",
              flush=True)

        def one(mode: str, seed: int) -> dict[str, Any]:
            child = [__file__, "--one", name, mode, str(seed), "--threshold", str(threshold),
                     *argv_base]
            config = mode_config(name, mode, seed, args.total_env_steps)
            return {"preset": name, "env_id": config.env_id, "threshold": threshold,
                    **common.run_child(child, f"{name} {mode} seed {seed}", timeout_s=6 * 3600)}

        rows += common.rows_per_seed_and_mode(
            range(args.backend_seeds), args.modes, one,
            lambda r: (f"   {r['mode']:8s} seed {r['seed']}: {r['env_steps_per_s']:.0f} env "
                       f"steps/s; " + (f"return {r['threshold']:g} after "
                                       f"{r['time_to_threshold_s']:.0f} s" if r["reached"] else
                                       f"{r['threshold']:g} not reached in "
                                       f"{r['wall_time_s']:.0f} s") +
                       f" (final return {r['final_return']:.1f})"))
    return rows


def learning_table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for name in dict.fromkeys(r["preset"] for r in rows):
        runs = [r for r in rows if r["preset"] == name]
        published = PUBLISHED.get(name)
        lines.append([
            f"`{name}`", runs[0]["env_id"], f"{runs[0]['env_steps']:,}", len(runs),
            common.format_mean_std(*common.mean_std(r["training_return"] for r in runs)),
            common.format_mean_std(*common.mean_std(r["greedy_return"] for r in runs)),
            common.format_mean_std(*published, digits=2) if published else "not given",
            f"{common.mean_std(r['wall_time_s'] for r in runs)[0]:.0f}",
        ])
    return common.markdown_table(
        ["preset", "env", "env steps", "seeds", "training return (last 100 episodes)",
         "greedy return", "cleanrl ppo_continuous_action, v4 (training return)",
         "wall time per run (s)"], lines)


def backends_table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for name in dict.fromkeys(r["preset"] for r in rows):
        for mode in MODES:
            runs = [r for r in rows if r["preset"] == name and r["mode"] == mode]
            if not runs:
                continue
            reached = [r for r in runs if r["reached"]]
            to_threshold = (f"{common.mean_std(r['time_to_threshold_s'] for r in reached)[0]:.0f}"
                            f" ({len(reached)}/{len(runs)} reached)" if reached else
                            f"not reached in {max(r['wall_time_s'] for r in runs):.0f}")
            lines.append([f"`{name}`", mode, runs[0]["env_id"],
                          f"{common.mean_std(r['env_steps_per_s'] for r in runs)[0]:.0f}",
                          f"{runs[0]['threshold']:g}", to_threshold])
    return common.markdown_table(
        ["preset", "actors", "env", "env steps/s", "return threshold",
         "wall time to threshold (s), compile included"], lines)


CURVE_FIELDS = ("preset", "seed", "update", "env_steps", "greedy_return", "training_return")


def greedy_curves(presets: list[str], out: pathlib.Path) -> list[dict[str, Any]]:
    """Every periodic greedy evaluation of each preset's runs, and ``greedy_<preset>.png``:
    the greedy return (dots) against the training return (lines) over env steps."""
    import numpy as np

    from ppo_async.runs.analysis import load_runs

    rows, plt = [], common.pyplot()
    for name in presets:
        sweep_dir = out / "sweeps" / name
        runs = load_runs(sorted(p.parent for p in sweep_dir.glob("*/config.json")))
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for index, run in enumerate(runs):
            color = f"C{index}"
            m = run.metrics
            ax.plot(m["env_steps"], m["episode_return"], color=color, linewidth=1,
                    label=f"seed {run.config['seed']}: training return")
            evaluated = np.isfinite(m["eval_return_mean"])
            ax.plot(m["env_steps"][evaluated], m["eval_return_mean"][evaluated], "o-",
                    color=color, markersize=3, linewidth=0.8, alpha=0.8,
                    label=f"seed {run.config['seed']}: greedy return")
            rows += [dict(preset=name, seed=run.config["seed"], update=int(u), env_steps=int(s),
                          greedy_return=float(g), training_return=float(t))
                     for u, s, g, t in zip(m["update"][evaluated], m["env_steps"][evaluated],
                                           m["eval_return_mean"][evaluated],
                                           m["episode_return"][evaluated])]
        ax.set_xlabel("env steps")
        ax.set_ylabel("return")
        ax.set_title(f"{name}: greedy evaluations during training")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / f"greedy_{name}.png", dpi=110)
        plt.close(fig)
    return rows


def hardware_line() -> str:
    """The CPU model, cores and platform the figures were measured on."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def plot_backends(rows: list[dict[str, Any]], path: pathlib.Path) -> None:
    """Env steps/s of each mode, grouped by preset."""
    plt = common.pyplot()
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.8 + 2.2 * len(presets), 3.6))
    width = 0.8 / len(MODES)
    for i, mode in enumerate(MODES):
        rates = [common.mean_std(r["env_steps_per_s"] for r in rows
                                 if r["preset"] == name and r["mode"] == mode)[0]
                 for name in presets]
        ax.bar([p + (i - (len(MODES) - 1) / 2) * width for p in range(len(presets))], rates,
               width, label=mode)
    ax.set_xticks(range(len(presets)), presets)
    ax.set_ylabel("env steps/s (learner)")
    ax.set_title("env steps/s by kind of actor")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str]) -> argparse.Namespace:
    from ppo_async.presets import MUJOCO_PRESETS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(MUJOCO_PRESETS),
                        choices=list(MUJOCO_PRESETS))
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--seeds", type=int, default=3, help="learning: seeds 0..N-1 (default 3)")
    parser.add_argument("--total-env-steps", type=int, default=None,
                        help="every run's budget (default: the preset's, 1M)")
    parser.add_argument("--eval-episodes", type=int, default=10,
                        help="learning: greedy episodes per finished run")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="learning: also evaluate greedily every this many updates during "
                             "training (eval_every_updates), drawn per preset in greedy_<preset>.png")
    parser.add_argument("--workers", type=int, default=1,
                        help="learning: runs at once (1: each run's wall time is its own)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--backend-seeds", type=int, default=1,
                        help="backends: seeds 0..N-1 per mode (default 1)")
    parser.add_argument("--threshold", type=float, default=None,
                        help=f"backends: one return threshold for every preset "
                        f"(default {THRESHOLDS})")
    parser.add_argument("--warmup", type=int, default=3,
                        help="backends: updates left out of the rate")
    parser.add_argument("--dry-run", action="store_true",
                        help="build and print every run's config, train nothing")
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", nargs=3, metavar=("PRESET", "MODE", "SEED"), default=None,
                        help=argparse.SUPPRESS)  # the child process of one backend run
    args = parser.parse_args(argv)
    if min(args.seeds, args.backend_seeds, args.eval_episodes, args.workers) < 1:
        parser.error("--seeds, --backend-seeds, --eval-episodes and --workers must be >= 1")
    return args


def dry_run(args, out: pathlib.Path) -> dict[str, Any]:
    """Every config both parts would train, validated; nothing is trained or written."""
    from ppo_async.sweep.execute import plan_sweep

    planned = {}
    for name in args.presets:
        if "learning" in args.parts:
            plan = plan_sweep(sweep_table(name, args.seeds, args.total_env_steps, args.eval_every,
                                          args.eval_episodes),
                              out / "sweeps" / name)
            planned[f"{name} learning"] = [f"{run.name} ({plan.states[run.name]}): "
                                           f"{run.config.num_updates} updates of "
                                           f"{run.config.batch_size}" for run in plan.runs]
        if "backends" in args.parts:
            planned[f"{name} backends"] = [
                f"{mode}: {config.env_id}, actors {config.actor_backend}, exact policy lag "
                f"{config.exact_lag}, {config.num_updates} updates"
                for mode in args.modes
                for config in [mode_config(name, mode, 0, args.total_env_steps)]]
    for what, lines in planned.items():
        print(f"{what}:\n  " + "\n  ".join(lines))
    return planned


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.one is not None:
        name, mode, seed = args.one
        common.configure_jax()
        config = mode_config(name, mode, int(seed), args.total_env_steps)
        result = measure(config, args.threshold, args.warmup)
        print(json.dumps(result))
        return result
    out = common.out_dir("mujoco_results", args.out)
    if args.dry_run:
        return dry_run(args, out)
    common.configure_jax()
    budget = ([] if args.total_env_steps is None
              else ["--total-env-steps", str(args.total_env_steps)])
    result: dict[str, Any] = {"hardware": hardware_line()}
    print(f"hardware: {result['hardware']}", flush=True)
    if "learning" in args.parts:
        rows = run_learning(args, out)
        common.write_csv(out / "learning.csv", rows, LEARNING_FIELDS)
        if args.eval_every:
            curves = greedy_curves(args.presets, out)
            common.write_csv(out / "greedy_curves.csv", curves, CURVE_FIELDS)
            result.update(greedy_curves=curves)
        result.update(learning=rows, learning_table=learning_table(rows))
    if "backends" in args.parts:
        rows = run_backends(args, budget + ["--warmup", str(args.warmup)])
        common.write_csv(out / "backends.csv", rows, BACKEND_FIELDS)
        plot_backends(rows, out / "backends.png")
        result.update(backends=rows, backends_table=backends_table(rows))
    for key in ("learning_table", "backends_table"):
        if key in result:
            print("\n" + result[key])
    print(f"\nhardware: {result['hardware']}")
    common.save_result("mujoco_results", args.out, __file__, argv, result, "summary.json")
    return result


if __name__ == "__main__":
    main()
