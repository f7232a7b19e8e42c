"""Actor collection rate inside the running system against the raw jitted rollout.

Both sides use the same program (`ppo_async.envs.backends.make_actor_program`: env,
policy network, batch of ``envs_per_actor`` envs, ``num_steps`` rows) and the
same number of threads (``num_actors``), in this process:

- raw: each thread loops ``rollout`` + ``device_get`` for ``--raw-seconds``
  with fixed params, nothing else running; rate = env steps / elapsed.
- in the system: `ppo_async.train` with the same config; rate = env steps /
  ``active_s`` of each actor (time collecting and sending, with pauses of the
  staleness valve and the first, compiling chunk excluded), summed over actors.

The ratio says how much slower an actor collects while the learner and the
other actors share the machine (target >= 0.9).

    python experiments/bench_collection.py [--total-env-steps 300000]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import common


def raw_rollout_rate(config, seconds: float) -> float:
    """Env steps/s of ``num_actors`` threads looping the rollout, nothing else running."""
    import jax

    from ppo_async.envs.backends import make_actor_program

    program = make_actor_program(config)
    cpu = jax.devices("cpu")[0]
    params = jax.device_put(program.params_template, cpu)
    carries = [program.reset(jax.random.key(i), cpu) for i in range(config.num_actors)]
    program.rollout(params, carries[0])  # compile outside the timed window
    steps = [0] * config.num_actors
    stop = threading.Event()

    def loop(i: int) -> None:
        carry = carries[i]
        while not stop.is_set():
            carry, trajectory, bootstrap_obs, bootstrap_value = program.rollout(params, carry)
            jax.device_get((trajectory, bootstrap_obs, bootstrap_value))
            steps[i] += trajectory.reward.size

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(config.num_actors)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    return sum(steps) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-env-steps", type=int, default=300_000)
    parser.add_argument("--num-actors", type=int, default=2)
    parser.add_argument("--envs-per-actor", type=int, default=4)
    parser.add_argument("--raw-seconds", type=float, default=10.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from ppo_async import AsyncActorLearnerConfig, train

    config = AsyncActorLearnerConfig(
        total_env_steps=args.total_env_steps, num_actors=args.num_actors,
        envs_per_actor=args.envs_per_actor,
    )
    raw = raw_rollout_rate(config, args.raw_seconds)
    report = train(config, progress=False).report
    # The first chunk is timed apart (it compiles); take its steps out as well.
    per_actor = [
        (s.env_steps - s.env_steps // s.rollouts_sent) / s.active_s for s in report.actor_stats
    ]
    in_system = sum(per_actor)
    paused = sum(s.pause_s for s in report.actor_stats) / (
        report.wall_time_s * len(report.actor_stats))
    result = {
        "config": config.to_dict(),
        "raw_env_steps_per_s": raw,
        "in_system_active_env_steps_per_s": in_system,
        "ratio": in_system / raw,
        "actor_pause_fraction": paused,
        "learner_env_steps_per_s": report.env_steps_per_s,
    }
    print(f"raw jitted rollout ({config.num_actors} threads): {raw:,.0f} env steps/s")
    print(f"actors inside train(), per second of active time: {in_system:,.0f} env steps/s")
    print(f"ratio: {result['ratio']:.2f} (target >= 0.9); actors paused by the valve "
          f"{paused:.0%} of the run; learner consumed {report.env_steps_per_s:,.0f} env steps/s")
    common.save_result("bench_collection", args.out, __file__, argv, result)
    return result


if __name__ == "__main__":
    main()
