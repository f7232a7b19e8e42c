"""Wall time, compile included, for CartPole-v1 to reach a mean return of 475.

Three ways to train the same config, each seed in turn, each run in a FRESH
process (so every run pays its imports and compiles, as a user's would):

- ``async``: `ppo_async.train` with the defaults (actors one chunk ahead; on a
  machine without a GPU, collected in the learner's program, as ``learner``);
- ``threads``: `train` with ``sampler="shared"``: thread actors, every actor's
  chunk collected from one thread;
- ``lockstep``: ``threads`` with ``max_lead_steps = num_steps`` (lag 0, no overlap);
- ``learner``: `train` with ``sampler="learner"``: the learner's program collects
  the actors' chunks, up to 64 updates a call (`ppo_async.runtime.in_learner`);
  a call's updates are passed on together after it, so it stops at the end of
  the call that solved, and its time is that call's end;
- ``sync``: the synchronous twin (`ppo_async.sync.make_sync_twin`), jitted in
  blocks of ``--sync-block`` updates so that it can stop as soon as it solves;
- ``purejaxrl``: purejaxrl's own ``purejaxrl/ppo.py`` (``make_train``, its
  default CartPole config with ``DEBUG`` off and ``TOTAL_TIMESTEPS`` set to
  ``--total-env-steps``) from the checkout given by ``--purejaxrl``, one seed
  a process as its ``__main__`` runs it, imported with the stand-ins of
  ``purejaxrl_baseline.py`` (see its docstring). It trains its whole budget in one
  jitted call and cannot stop sooner, so its time to solve is its compile
  plus the share of its run's time up to the update that solved: every
  update of it is the same work (``purejaxrl_baseline.first_solved_update``).

"Solved" is the mean return of the last 100 finished training episodes
reaching ``--target`` (the async runs' ``episode_return_mean``, the twin's
`recent_return_mean`, purejaxrl's last 100 episodes to end by that update).
Each mode's clock starts before anything is built or compiled and stops at
the first update that is solved. No persistent
compilation cache is used, so every run pays its own compiles, as a fresh
process would. A run that does not solve within the budget counts as its full
wall time and is marked unsolved.

    python experiments/bench_time_to_solve.py [--seeds 0 1 2] [--modes async lockstep sync]
    python experiments/bench_time_to_solve.py --seeds 0 1 2 3 4 --modes async purejaxrl --purejaxrl ~/src/purejaxrl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import common


def _time_async(config, target: float) -> dict:
    from ppo_async import StopTraining, train

    solved_at = {}
    start = time.perf_counter()

    def watch(metrics):
        if metrics["episode_return"] >= target:
            solved_at["s"] = time.perf_counter() - start
            solved_at["env_steps"] = metrics["env_steps"]
            raise StopTraining

    report = train(config, progress=False, on_update=watch).report
    wall = time.perf_counter() - start
    return {
        "solved": bool(solved_at), "time_s": solved_at.get("s", wall),
        "env_steps": solved_at.get("env_steps", report.env_steps),
        "final_return": report.episode_return_mean, "policy_lag_max": report.policy_lag_max,
    }


def _time_sync(config, target: float, block: int) -> dict:
    import jax
    import numpy as np

    from ppo_async.sync import make_sync_twin, recent_return_mean

    start = time.perf_counter()
    twin = make_sync_twin(config)
    run_block = jax.jit(
        lambda carry: jax.lax.scan(lambda c, _: twin.step(c), carry, None, length=block)
    )
    carry = jax.jit(twin.init)(jax.random.key(config.seed))
    sums, counts = [], []
    updates = 0
    while updates < config.num_updates:
        carry, metrics = run_block(carry)
        metrics = jax.device_get(metrics)
        sums.append(metrics["episode_return_sum"])
        counts.append(metrics["episodes"])
        updates += block
        recent = recent_return_mean(
            {"episode_return_sum": np.concatenate(sums), "episodes": np.concatenate(counts)}
        )
        if recent >= target:
            return {"solved": True, "time_s": time.perf_counter() - start,
                    "env_steps": updates * config.batch_size, "final_return": recent,
                    "policy_lag_max": 0}
    return {"solved": False, "time_s": time.perf_counter() - start,
            "env_steps": updates * config.batch_size, "final_return": recent,
            "policy_lag_max": 0}


def _time_purejaxrl(folder: str, seed: int, total_env_steps: int, target: float) -> dict:
    import purejaxrl_baseline as baseline

    # Its clock starts at make_train (which makes the env), after the imports, as the others'.
    run = baseline.run_purejaxrl_once(baseline.purejaxrl_folder(folder), total_env_steps, seed)
    solved = baseline.first_solved_update(run["returns"], run["ended"], target)
    done = run["updates"] if solved is None else solved + 1
    return {
        "solved": solved is not None,
        "time_s": run["compile_s"] + run["run_s"] * done / run["updates"],
        "env_steps": done * run["batch"],
        "final_return": baseline.last_episodes_return_mean(run["returns"], run["ended"]),
        "policy_lag_max": 0, "compile_s": run["compile_s"], "whole_run_s": run["compile_s"] + run["run_s"],
        "run_env_steps_per_s": run["updates"] * run["batch"] / run["run_s"],
    }


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--modes", nargs="+", default=["async", "lockstep", "sync"],
                        choices=["async", "threads", "lockstep", "learner", "sync", "purejaxrl"])
    parser.add_argument("--purejaxrl", default=None, metavar="DIR",
                        help="a checkout of github.com/luchris429/purejaxrl "
                             "(for --modes purejaxrl)")
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--total-env-steps", type=int, default=500_000)
    parser.add_argument("--sync-block", type=int, default=25,
                        help="updates per jitted call of the twin between checks")
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", default=None,
                        choices=["async", "threads", "lockstep", "learner", "sync", "purejaxrl"],
                        help=argparse.SUPPRESS)  # the child process of one run
    args = parser.parse_args(argv)
    if "purejaxrl" in args.modes + [args.one]:
        import purejaxrl_baseline

        purejaxrl_baseline.purejaxrl_folder_or_exit(parser, args.purejaxrl)

    from ppo_async import AsyncActorLearnerConfig

    base = AsyncActorLearnerConfig(total_env_steps=args.total_env_steps)
    configs = {
        "async": base,
        "threads": dataclasses.replace(base, sampler="shared"),
        "lockstep": dataclasses.replace(base, max_lead_steps=base.num_steps, sampler="shared"),
        "learner": dataclasses.replace(base, sampler="learner"),
        "sync": base,
    }
    if args.one == "purejaxrl":
        result = _time_purejaxrl(args.purejaxrl, args.seeds[0], args.total_env_steps, args.target)
        print(json.dumps(result))
        return result
    if args.one is not None:
        config = dataclasses.replace(configs[args.one], seed=args.seeds[0])
        if args.one == "sync":
            result = _time_sync(config, args.target, args.sync_block)
        else:
            result = _time_async(config, args.target)
        print(json.dumps(result))
        return result

    rows = []
    for seed in args.seeds:
        for mode in args.modes:
            child = [sys.executable, __file__, "--one", mode, "--seeds", str(seed),
                     "--target", str(args.target), "--total-env-steps", str(args.total_env_steps),
                     "--sync-block", str(args.sync_block)]
            if mode == "purejaxrl":
                child += ["--purejaxrl", args.purejaxrl]
            completed = subprocess.run(child, capture_output=True, text=True, timeout=1800)
            if completed.returncode != 0:
                raise RuntimeError(f"{mode} seed {seed} failed:\n{completed.stderr[-3000:]}")
            result = json.loads(completed.stdout.strip().splitlines()[-1])
            row = {"mode": mode, "seed": seed, "load_average_1_min": os.getloadavg()[0], **result}
            rows.append(row)
            whole = (f"; compile {row['compile_s']:.1f} s, whole run {row['whole_run_s']:.1f} s, "
                     f"{row['run_env_steps_per_s']:,.0f} env steps/s after its compile"
                     if mode == "purejaxrl" else "")
            print(f"{mode:9s} seed {seed}: {'solved' if row['solved'] else 'NOT solved'} "
                  f"in {row['time_s']:.1f} s at {row['env_steps']} env steps "
                  f"(return {row['final_return']:.1f}{whole})", flush=True)

    summary = {}
    for mode in args.modes:
        times = [r["time_s"] for r in rows if r["mode"] == mode]
        summary[mode] = {
            "median_time_s": statistics.median(times),
            "solved": sum(r["solved"] for r in rows if r["mode"] == mode),
            "runs": len(times),
        }
    for baseline in ("sync", "purejaxrl"):
        for mode in ("async", "threads", "lockstep", "learner", "sync"):
            if baseline in summary and mode in summary and mode != baseline:
                summary[mode][f"ratio_to_{baseline}"] = (
                    summary[mode]["median_time_s"] / summary[baseline]["median_time_s"]
                )
    unsolved = any(figures["solved"] < figures["runs"] for figures in summary.values())
    print("\nmedian wall time to solve (compile included"
          + ("; a run that did not solve counts at its whole run's time, a lower bound"
             if unsolved else "") + "):")
    for mode, figures in summary.items():
        ratio = "".join(f"  {figures[f'ratio_to_{baseline}']:.2f}x {name}"
                        for baseline, name in (("sync", "the sync twin"), ("purejaxrl", "purejaxrl"))
                        if f"ratio_to_{baseline}" in figures)
        print(f"  {mode:9s} {figures['median_time_s']:6.1f} s  "
              f"({figures['solved']}/{figures['runs']} solved){ratio}")

    result = {"rows": rows, "summary": summary, "target": args.target}
    common.save_result("bench_time_to_solve", args.out, __file__, argv, result)
    return result


if __name__ == "__main__":
    main()
