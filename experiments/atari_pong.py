"""Pong to a return of 18: the ``atari-pong`` preset trained to 10M env steps, the learner on a GPU.

The ``atari-pong`` preset (envpool's ``Pong-v5`` with the standard Atari
settings, the Nature CNN, cleanrl's ``ppo_atari.py`` settings) with the
learner on ``--learner-device`` (default ``gpu``; the actors act on the CPU,
as the preset's). The clock starts before ``train`` is called (so JAX's start,
the envs' and the compiles count) and the time to ``--threshold`` (default 18)
is the wall time at the first update whose training return (the mean of the
last 100 episodes of the training envs: clipped rewards, no sticky actions;
Pong's rewards are +-1 and it has no lives, so this is the game's score) is
at least the threshold. The run goes on to ``--total-env-steps`` unless
``--stop-at-threshold``. Needs envpool (``pip install 'ppo-async[atari]'``).

Writes, under ``experiments/out/atari_pong/`` (or ``--out``): ``curve.csv``
(every update: env steps, wall time, return), ``curve.png``, ``results.json``
(time and env steps to the threshold, final return, env steps/s, the
machine), and the run directory ``run/`` (metrics.jsonl, checkpoints).

    python experiments/atari_pong.py                                  # on a GPU machine: 10M steps
    python experiments/atari_pong.py --learner-device cpu --total-env-steps 2048 --num-steps 16  # CPU smoke
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

CURVE_FIELDS = ("update", "env_steps", "wall_time_s", "episode_return")


def make_config(args):
    from ppo_async.presets import preset

    overrides: dict[str, Any] = dict(total_env_steps=args.total_env_steps, seed=args.seed,
                                     learner_device=args.learner_device,
                                     learner_timeout_s=args.learner_timeout_s)
    if args.num_steps:
        overrides["num_steps"] = args.num_steps
    return preset("atari-pong", **overrides)


class ThresholdClock:
    """``on_update``: every update's env steps, wall time and return, and the first time
    the return reached ``threshold`` (`ppo_async.StopTraining` then, if ``stop``)."""

    def __init__(self, threshold: float, stop: bool, start: float):
        self.threshold, self.stop, self.start = threshold, stop, start
        self.curve: list[dict[str, Any]] = []
        self.reached: dict[str, float] = {}

    def __call__(self, metrics) -> None:
        from ppo_async import StopTraining

        now = time.perf_counter() - self.start
        point = dict(update=int(metrics["update"]), env_steps=int(metrics["env_steps"]),
                     wall_time_s=round(now, 3), episode_return=float(metrics["episode_return"]))
        self.curve.append(point)
        if not self.reached and point["episode_return"] >= self.threshold:  # NaN: False
            self.reached = dict(time_to_threshold_s=now, env_steps_at_threshold=point["env_steps"])
            print(f"   return {point['episode_return']:.1f} >= {self.threshold:g} after "
                  f"{now:.0f} s, {point['env_steps']:,} env steps", flush=True)
            if self.stop:
                raise StopTraining


def plot(curve: list[dict[str, Any]], threshold: float, path) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, x, label in zip(axes, ("env_steps", "wall_time_s"),
                            ("env steps", "wall time (s), start-up and compiles included")):
        ax.plot([p[x] for p in curve], [p["episode_return"] for p in curve], linewidth=1.5)
        ax.axhline(threshold, color="k", linestyle="--", linewidth=1, label=f"return {threshold:g}")
        ax.set_xlabel(label)
        ax.set_ylabel("return (last 100 episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Pong-v5, atari-pong preset")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total-env-steps", type=int, default=10_000_000)
    parser.add_argument("--threshold", type=float, default=18.0,
                        help="the training return whose first update stops the clock")
    parser.add_argument("--stop-at-threshold", action="store_true",
                        help="end the run at the threshold instead of the budget")
    parser.add_argument("--learner-device", default="gpu", help="e.g. gpu, gpu:0, cpu")
    parser.add_argument("--learner-timeout-s", type=float, default=600.0,
                        help="a CPU update of the CNN can keep the actors' threads waiting long")
    parser.add_argument("--num-steps", type=int, default=0,
                        help="steps per env and update (0: the preset's 128; fewer: a smoke run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.total_env_steps < 1 or args.num_steps < 0 or not math.isfinite(args.threshold):
        parser.error("--total-env-steps must be >= 1 and --threshold finite")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    start = time.perf_counter()
    common.configure_jax()
    from ppo_async import train

    config = make_config(args)
    out = common.out_dir("atari_pong", args.out)
    run_dir = out / "run"
    if run_dir.exists():  # a fresh run each time: the clock is for a run from scratch
        shutil.rmtree(run_dir)
    print(f"== {config.env_id}: {config.num_updates} updates of {config.batch_size} env steps, "
          f"learner on {config.learner_device}, clock stops at a return of {args.threshold:g}",
          flush=True)
    clock = ThresholdClock(args.threshold, args.stop_at_threshold, start)
    report = train(config, run_dir=run_dir, progress=False, on_update=clock).report
    wall = time.perf_counter() - start
    common.write_csv(out / "curve.csv", clock.curve, CURVE_FIELDS)
    if clock.curve:
        plot(clock.curve, args.threshold, out / "curve.png")
    result = dict(
        env_id=config.env_id, learner_device=config.learner_device, threshold=args.threshold,
        reached=bool(clock.reached),
        time_to_threshold_s=clock.reached.get("time_to_threshold_s", math.nan),
        env_steps_at_threshold=clock.reached.get("env_steps_at_threshold"),
        env_steps=report.env_steps, updates=report.updates, wall_time_s=round(wall, 1),
        final_return=report.episode_return_mean, env_steps_per_s=report.env_steps_per_s,
        learner_wait_s=report.learner_wait_s, config=config.to_dict())
    print(f"{report.env_steps:,} env steps in {wall:.0f} s ({report.env_steps_per_s:.0f} env "
          f"steps/s); final return {report.episode_return_mean:.1f}; "
          + (f"return {args.threshold:g} after {result['time_to_threshold_s']:.0f} s"
             if clock.reached else f"return {args.threshold:g} not reached"))
    common.save_result("atari_pong", args.out, __file__, argv, result)
    return result


if __name__ == "__main__":
    main()
