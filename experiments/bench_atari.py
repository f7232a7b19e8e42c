"""Env steps per second of a short ``train()`` on envpool's Pong with the Nature CNN.

The ``atari-pong`` preset (2 actors x 4 envs x 128 steps, 4 epochs x 4
minibatches, the Nature-CNN torso, envpool's standard Atari training
settings) with a short budget. The figure is the learner's: env steps it
consumed per second of its wall time (`LearnerReport.env_steps_per_s`,
first update's compile included), and how long it waited for experience
(``learner_wait_s``: near 0 means the learner's update, not the actors, sets
the pace). Written to ``experiments/out/bench_atari/results.json`` with the
machine it ran on.

    python experiments/bench_atari.py [--total-env-steps 20480] [--torso nature]
"""

from __future__ import annotations

import argparse
import sys
import time

import common


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-env-steps", type=int, default=20_480)
    parser.add_argument("--torso", default="nature", help="config torso: nature, minatar or auto")
    parser.add_argument("--learner-device", default=None, help="e.g. gpu (default: JAX's default)")
    parser.add_argument("--learner-timeout-s", type=float, default=600.0,
                        help="a CPU update of the CNN can starve the actors' threads for a minute")
    parser.add_argument("--out", default=None, help="output directory")
    args = parser.parse_args(argv)
    argv = list(argv) if argv is not None else sys.argv[1:]

    common.configure_jax()
    from ppo_async import train
    from ppo_async.presets import preset

    config = preset("atari-pong", total_env_steps=args.total_env_steps, torso=args.torso,
                    learner_device=args.learner_device,
                    learner_timeout_s=args.learner_timeout_s)
    start = time.perf_counter()
    report = train(config, progress=False).report
    total_s = time.perf_counter() - start
    result = {
        "env_id": config.env_id,
        "torso": config.network_torso,
        "env_steps": report.env_steps,
        "updates": report.updates,
        "env_steps_per_s": round(report.env_steps_per_s, 1),
        "learner_wall_time_s": round(report.wall_time_s, 1),
        "learner_wait_s": round(report.learner_wait_s, 1),
        "train_call_s": round(total_s, 1),
        "config": config.to_dict(),
    }
    print(f"{config.env_id}, torso {result['torso']}: {result['env_steps_per_s']} env steps/s "
          f"({report.env_steps} steps, {report.updates} updates in {report.wall_time_s:.1f} s; "
          f"learner waited {report.learner_wait_s:.1f} s)")
    common.save_result("bench_atari", args.out, __file__, argv, result)
    return result


if __name__ == "__main__":
    main()
