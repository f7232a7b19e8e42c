"""What an exact policy lag costs: steady env steps/s of ``exact_policy_lag=1`` against free-running actors.

Both train the default config (CartPole-v1, 2 actors x 4 envs x 64 steps, 4
epochs x 4 minibatches), each run in a FRESH process, modes alternating seed
by seed:

- ``free``: ``exact_policy_lag=None``, actors act with the newest params they
  have, at most two chunks ahead (the valve);
- ``exact1``: ``exact_policy_lag=1`` (the default), every chunk collected with the params of
  exactly one update before the one it feeds (the lead is then two chunks too);
- ``exact0`` / ``exact2``: lock-step, and a lag of exactly two updates (a lead of three
  chunks): what lag 1 costs against each;
- ``free-straggler`` / ``exact1-straggler``: the same, with actor 0 sleeping
  ``--straggler-ms`` after every chunk (an actor much slower than the other).

The plain modes run what a user's config gets (``--sampler default``): at an
exact lag on a machine without a GPU the learner's own program collects the
chunks (``sampler="learner"``), while free-running actors are threads, the
only actors that run free; ``--sampler shared`` runs every plain mode on
thread actors sharing one rollout program, the price of exactness among
threads alone. A straggler is one actor's: a thread per actor
(``sampler="actors"``), so that it does not hold the others up as it would
from their one thread. Each row says which sampler ran.

Env steps/s are taken from the first update at or past a quarter of the
budget to the last one (start-up and compiles excluded; with the learner's
program, whose updates are passed on a call at a time, from the end of a call:
`common.steady_span`). Target: exact1 /
free >= 0.97. By default the four plain modes run (``--modes`` adds the
stragglers). The load average is printed with every row: run it with nothing
else on the machine.

    python experiments/bench_exact_lag.py [--seeds 0 1 2] [--total-env-steps 500000] [--sampler shared]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import common

MODES = ("free", "exact0", "exact1", "exact2", "free-straggler", "exact1-straggler")


def _one(mode: str, seed: int, total_env_steps: int, straggler_ms: float,
         sampler: str) -> dict:
    import importlib

    from ppo_async import AsyncActorLearnerConfig, train
    from ppo_async.runtime.actor import current_actor

    slowed = []  # the straggler's chunks, each held back straggler_ms
    if mode.endswith("straggler"):
        train_module = importlib.import_module("ppo_async.train")  # shadowed by train()
        make = train_module.make_actor_program

        def slow_actor_0(config):
            program = make(config)

            def rollout(params, carry):
                out = program.rollout(params, carry)
                if current_actor() == 0:
                    time.sleep(straggler_ms / 1000)
                    slowed.append(1)
                return out
            return program._replace(rollout=rollout)

        train_module.make_actor_program = slow_actor_0
    lag = int(mode[len("exact")]) if mode.startswith("exact") else None
    chosen = ("actors" if mode.endswith("straggler") else
              None if sampler == "default" else sampler)
    config = AsyncActorLearnerConfig(total_env_steps=total_env_steps, seed=seed,
                                     exact_policy_lag=lag, sampler=chosen)
    in_learner = common.collects_in_learner(config)
    marks = []
    report = train(config, progress=False, on_update=lambda m: marks.append(
        (time.perf_counter(), m["env_steps"]))).report
    (t0, s0), (t1, s1) = common.steady_span(config, marks, total_env_steps)
    return {"env_steps_per_s": (s1 - s0) / (t1 - t0), "final_return": report.episode_return_mean,
            "policy_lag_mean": report.policy_lag_mean,
            "learner_wait_s": report.learner_wait_s, "straggler_chunks": len(slowed),
            "sampler": "learner" if in_learner else (chosen or "threads")}


def _in_a_fresh_process(mode: str, seed: int, total_env_steps: int, straggler_ms: float,
                        sampler: str) -> dict:
    return common.run_child(
        [__file__, "--one", mode, "--seeds", str(seed), "--total-env-steps",
         str(total_env_steps), "--straggler-ms", str(straggler_ms), "--sampler", sampler],
        f"{mode} seed {seed}")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--total-env-steps", type=int, default=500_000)
    parser.add_argument("--straggler-ms", type=float, default=40.0)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES[:4]))
    parser.add_argument("--sampler", choices=("default", "shared"), default="default",
                        help="the plain modes' sampler: what the config chooses (default), "
                             "or thread actors sharing one rollout program")
    parser.add_argument("--one", choices=MODES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.one is not None:  # the child process of one measurement
        print(json.dumps(_one(args.one, args.seeds[0], args.total_env_steps, args.straggler_ms,
                              args.sampler)))
        return {}

    rows = common.rows_per_seed_and_mode(
        args.seeds, args.modes,
        lambda mode, seed: _in_a_fresh_process(mode, seed, args.total_env_steps,
                                               args.straggler_ms, args.sampler),
        lambda row: (f"{row['mode']:17s} seed {row['seed']} ({row['sampler']}): "
                     f"{row['env_steps_per_s']:8.0f} env "
                     f"steps/s, policy lag {row['policy_lag_mean']:.2f}, final return "
                     f"{row['final_return']:.1f} (load {row['load_average_1_min']:.1f})"))
    medians = common.median_rate_by_mode(rows, args.modes)
    ratios = {}
    for exact, free in (("exact0", "free"), ("exact1", "free"), ("exact2", "free"),
                        ("exact1-straggler", "free-straggler")):
        if exact in medians and free in medians:
            ratios[exact] = medians[exact] / medians[free]
    print("\nmedian steady-state env steps/s:")
    for mode in args.modes:
        ratio = f"  {ratios[mode]:.3f}x free-running" if mode in ratios else ""
        print(f"  {mode:17s} {medians[mode]:8.0f}{ratio}")
    summary = {"rows": rows, "median_env_steps_per_s": medians, "ratio_to_free_running": ratios,
               "straggler_ms": args.straggler_ms, "sampler": args.sampler}
    common.save_result("bench_exact_lag", args.out, __file__, argv, summary)
    return summary


if __name__ == "__main__":
    main()
