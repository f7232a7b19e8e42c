"""PBT's best member against the best run of a sweep over the same values, at equal env steps.

Each repeat trains a population of ``--population`` members (`ppo_async.run_pbt`,
the learning rate explored over ``--learning-rates`` and perturbed every
``--interval-updates``) and a sweep of the same learning rates, one run each
(`ppo_async.run_sweep`), every run and member with ``--member-steps`` env steps,
so that both spend ``population x member_steps`` env steps when the population
is as large as the grid. The score of each is its best run's final training
return (the mean of the last 100 episodes). Over the repeats: the interquartile
mean of each score with its 95% stratified-bootstrap interval
(`ppo_async.runs.analysis`), and PBT's best minus the sweep's best per repeat.

    python experiments/pbt_vs_sweep.py                  # Pendulum-v1, 3 repeats
    python experiments/pbt_vs_sweep.py --smoke          # CartPole, tiny: checks the script
    python experiments/pbt_vs_sweep.py --dry-run        # the specs, checked; nothing trained

Writes ``results.json``, ``results.csv`` (a row per repeat and method) and
``pbt_vs_sweep.png`` under ``experiments/out/pbt_vs_sweep/`` (or ``--out``),
beside each repeat's population and sweep directories.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from common import out_dir, pyplot, save_with_load, write_csv  # noqa: E402

NAME = "pbt_vs_sweep"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="pendulum")
    parser.add_argument("--member-steps", type=int, default=200_000)
    parser.add_argument("--learning-rates", type=float, nargs="+",
                        default=[1e-4, 3e-4, 1e-3, 3e-3])
    parser.add_argument("--population", type=int, default=4)
    parser.add_argument("--interval-updates", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus-per-member", type=float, default=None)
    parser.add_argument("--smoke", action="store_true", help="CartPole, tiny budgets, 1 repeat")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.preset, args.member_steps, args.population, args.repeats = "cartpole", 256, 2, 1
        args.learning_rates, args.interval_updates = [3e-4, 1e-3], 2
    return args


def base_fields(args) -> dict:
    fields = {"total_env_steps": args.member_steps}
    if args.smoke:
        fields.update(num_actors=1, envs_per_actor=2, num_steps=16, num_epochs=1,
                      num_minibatches=1)
    return fields


def specs(args, repeat: int) -> tuple[dict, dict]:
    """The population's table and the sweep's, over the same learning rates and budget."""
    common = {"preset": args.preset, "base": base_fields(args),
              "grid": {"learning_rate": list(args.learning_rates)}}
    # Member i of population seed r trains with seed 1000 r + i; the sweep's seeds (100 + r)
    # are none of those, so no run of one method repeats a run of the other.
    pbt = {**common, "seeds": [repeat],
           "pbt": {"population": args.population, "interval_updates": args.interval_updates}}
    sweep = {**common, "seeds": [100 + repeat]}
    return pbt, sweep


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from ppo_async.pbt.spec import load_pbt
    from ppo_async.sweep.spec import load_sweep

    plans = [specs(args, repeat) for repeat in range(args.repeats)]
    for pbt, sweep in plans:  # every config checked before anything trains
        load_pbt(pbt)
        load_sweep(sweep).runs()
    runs = len(args.learning_rates)
    print(f"{args.repeats} repeats: a population of {args.population} and a sweep of {runs} "
          f"runs, {args.member_steps} env steps each ({args.population * args.member_steps} "
          f"and {runs * args.member_steps} per repeat); {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}")
    if args.dry_run:
        return {"plans": plans}
    return run(args, argv, plans)


def run(args, argv, plans) -> dict:
    import numpy as np

    from ppo_async import run_pbt, run_sweep
    from ppo_async.runs.analysis import iqm, stratified_bootstrap_ci

    out = out_dir(NAME, args.out)
    load_before = os.getloadavg()[0]
    rows = []
    for repeat, (pbt, sweep) in enumerate(plans):
        members = run_pbt(pbt, out / f"pbt_{repeat}", cpus_per_member=args.cpus_per_member,
                          progress=False)
        summary = run_sweep(sweep, out / f"sweep_{repeat}", progress=False)
        pbt_best = max(r["final_return"] for r in members if r["status"] == "done")
        sweep_best = float(np.nanmax(summary["mean"]))
        rows += [{"repeat": repeat, "method": "pbt", "best_final_return": pbt_best,
                  "env_steps": args.population * args.member_steps},
                 {"repeat": repeat, "method": "sweep", "best_final_return": sweep_best,
                  "env_steps": len(args.learning_rates) * args.member_steps}]
    write_csv(out / "results.csv", rows, ["repeat", "method", "best_final_return", "env_steps"])
    result = {"args": vars(args), "rows": rows}
    for method in ("pbt", "sweep"):
        scores = np.array([r["best_final_return"] for r in rows if r["method"] == method])
        estimate = stratified_bootstrap_ci(scores, iqm)
        result[method] = {"iqm": estimate.point, "low": estimate.low, "high": estimate.high}
        print(f"{method:5s} best final return: IQM {estimate.point:.1f} "
              f"[{estimate.low:.1f}, {estimate.high:.1f}] over {len(scores)} repeats")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    for i, method in enumerate(("pbt", "sweep")):
        est = result[method]
        ax.bar(i, est["iqm"], yerr=[[est["iqm"] - est["low"]], [est["high"] - est["iqm"]]],
               capsize=6, color=f"C{i}")
    ax.set_xticks([0, 1], ["PBT best member", "sweep best run"])
    ax.set_ylabel("final training return (IQM, 95% CI)")
    ax.set_title(f"{args.preset}: {args.member_steps} env steps a run, {args.repeats} repeats",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "pbt_vs_sweep.png", dpi=90)
    plt.close(fig)
    save_with_load(NAME, args.out, __file__, argv, result, load_before)
    return result


if __name__ == "__main__":
    main()
