"""Why the ``ant`` preset did not walk: what Ant's observation and initial std change.

Two parts, one script run (``--parts`` picks):

- ``actions``: what a policy that has learnt nothing earns on Ant-v5 (27
  observations): 20 episodes of actions drawn from ``N(0, std^2)`` per joint,
  clipped to the action box, for each ``--stds``: the control cost per step
  (``info["reward_ctrl"]``), the return per step and the episode length;
  and how many of Ant-v5's 78 contact-force observations never move in 10
  episodes of uniformly random actions. No JAX, seconds.
- ``training``: the ``ant`` preset trained once per variant and seed for its
  budget (1M env steps), each variant changing what the preset observes
  (Ant-v5's default 105 numbers, or Ant-v4's 27: ``gymnasium_kwargs``
  ``include_cfrc_ext_in_observation=False``) and the policy's initial log-std
  (``init_log_std``); then 10 greedy episodes of the final params
  (`ppo_async.runtime.evaluate`, the env's own return). Each run in a fresh
  process; a run takes 4-6 minutes on 2 cores.

Writes ``actions.csv``, ``training.csv`` and ``summary.json`` under
``experiments/out/ant_diagnosis/`` (or ``--out``), and prints both tables for
docs/results.md.

    python experiments/ant_diagnosis.py                                # both parts, the 5 variants, seed 0
    python experiments/ant_diagnosis.py --parts actions
    python experiments/ant_diagnosis.py --parts training --variants obs27-std0.37 --seeds 0 1 2
    python experiments/ant_diagnosis.py --parts training --total-env-steps 8192   # smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import common

# name -> (observes the contact forces, init_log_std)
VARIANTS: dict[str, tuple[bool, float]] = {
    "obs105-std1": (True, 0.0),
    "obs27-std1": (False, 0.0),
    "obs27-std0.61": (False, -0.5),
    "obs27-std0.37": (False, -1.0),
    "obs105-std0.37": (True, -1.0),
}
PARTS = ("actions", "training")
TRAINING_FIELDS = ("variant", "observations", "init_log_std", "seed", "env_steps",
                   "training_return", "greedy_return", "greedy_return_std", "wall_time_s")


def variant_config(name: str, seed: int, total_env_steps: int | None):
    """The ``ant`` preset with variant ``name``'s observation and initial log-std."""
    from ppo_async.presets import preset

    contact_forces, log_std = VARIANTS[name]
    overrides: dict[str, Any] = dict(
        seed=seed, init_log_std=log_std,
        gymnasium_kwargs=(() if contact_forces else
                          (("include_cfrc_ext_in_observation", False),)))
    if total_env_steps is not None:
        overrides["total_env_steps"] = total_env_steps
    return preset("ant", **overrides)


def run_one(name: str, seed: int, total_env_steps: int | None) -> dict[str, Any]:
    """One training run and its greedy evaluation (in a child process)."""
    from ppo_async import train
    from ppo_async.runtime.evaluate import evaluate

    config = variant_config(name, seed, total_env_steps)
    start = time.perf_counter()
    result = train(config, progress=False)
    greedy = evaluate(config, result.params, num_episodes=10, seed=0)
    return dict(variant=name, observations=27 if config.gymnasium_kwargs else 105,
                init_log_std=config.init_log_std, seed=seed,
                env_steps=result.report.env_steps,
                training_return=result.report.episode_return_mean,
                greedy_return=greedy.mean_return, greedy_return_std=greedy.std_return,
                wall_time_s=time.perf_counter() - start)


def random_actions(stds: list[float], episodes: int = 20) -> list[dict[str, Any]]:
    import gymnasium
    import numpy as np

    env = gymnasium.make("Ant-v5", include_cfrc_ext_in_observation=False)
    low, high = env.action_space.low, env.action_space.high
    rows = []
    for std in stds:
        rng = np.random.default_rng(0)
        lengths, returns, costs = [], [], []
        for episode in range(episodes):
            env.reset(seed=episode)
            done, total, steps = False, 0.0, 0
            while not done:
                action = np.clip(rng.normal(0.0, std, low.shape), low, high)
                _, reward, terminated, truncated, info = env.step(action)
                total, steps = total + float(reward), steps + 1
                costs.append(-float(info["reward_ctrl"]))
                done = terminated or truncated
            lengths.append(steps)
            returns.append(total)
        rows.append(dict(std=std, log_std=math.log(std), episodes=episodes,
                         control_cost_per_step=float(np.mean(costs)),
                         return_per_step=float(np.sum(returns) / np.sum(lengths)),
                         episode_length_median=float(np.median(lengths)),
                         episode_length_mean=float(np.mean(lengths))))
        print(f"   std {std:.2f}: control cost {rows[-1]['control_cost_per_step']:.2f} a step, "
              f"return {rows[-1]['return_per_step']:+.2f} a step, median episode "
              f"{rows[-1]['episode_length_median']:.0f} steps", flush=True)
    env.close()
    return rows


def still_contact_forces(episodes: int = 10) -> tuple[int, int]:
    """(contact-force observations that never moved, all of them) in Ant-v5's default 105."""
    import gymnasium
    import numpy as np

    env = gymnasium.make("Ant-v5")
    env.action_space.seed(0)
    observations = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        done = False
        while not done:
            observations.append(obs)
            obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    env.close()
    forces = np.asarray(observations)[:, 27:]  # after Ant-v4's 27 numbers
    return int(np.sum(forces.std(axis=0) == 0.0)), forces.shape[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--stds", nargs="+", type=float,
                        default=[1.0, math.exp(-0.5), math.exp(-1.0)])
    parser.add_argument("--total-env-steps", type=int, default=None,
                        help="training budget (default: the preset's 1M)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "SEED"), default=None,
                        help=argparse.SUPPRESS)  # a child process: one run, JSON on stdout
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args.total_env_steps)))
        return
    out = common.out_dir("ant_diagnosis", args.out)
    summary: dict[str, Any] = {"machine": common.machine_info()}
    if "actions" in args.parts:
        print("== actions of a policy that has learnt nothing (Ant-v5, 27 observations)")
        rows = random_actions(args.stds)
        common.write_csv(out / "actions.csv", rows, list(rows[0]))
        summary["actions"] = rows
        still, forces = still_contact_forces()
        summary["contact_forces_never_moving"] = [still, forces]
        print(f"   Ant-v5's contact forces that never moved in 10 random episodes: {still} of "
              f"{forces}", flush=True)
        print(common.markdown_table(
            ["std", "control cost per step", "return per step", "episode length (median)"],
            [[f"{r['std']:.2f}", f"{r['control_cost_per_step']:.2f}",
              f"{r['return_per_step']:+.2f}", f"{r['episode_length_median']:.0f}"]
             for r in rows]))
    if "training" in args.parts:
        extra = ([] if args.total_env_steps is None else
                 ["--total-env-steps", str(args.total_env_steps)])
        rows = []
        for seed in args.seeds:
            for name in args.variants:
                row = common.run_child([__file__, "--one", name, str(seed), *extra],
                                       f"{name} seed {seed}", timeout_s=3 * 3600)
                rows.append(row)
                print(f"   {name} seed {seed}: training return {row['training_return']:.1f}, "
                      f"greedy {row['greedy_return']:.1f} +- {row['greedy_return_std']:.1f} "
                      f"in {row['wall_time_s']:.0f} s", flush=True)
        common.write_csv(out / "training.csv", rows, TRAINING_FIELDS)
        summary["training"] = rows
        print(common.markdown_table(
            ["variant", "observations", "initial std", "seed", "training return",
             "greedy return"],
            [[r["variant"], r["observations"], f"{math.exp(r['init_log_std']):.2f}", r["seed"],
              f"{r['training_return']:.1f}",
              f"{r['greedy_return']:.1f} +- {r['greedy_return_std']:.1f}"] for r in rows]))
    summary["command"] = common.print_reproduce(__file__, sys.argv[1:])
    common.write_json(out / "summary.json", summary)


if __name__ == "__main__":
    main()
