"""Accelerator check: the learner on the GPU, the actors on the CPU.

When a GPU is present this

1. times one learner update of the MinAtar-sized conv network
   (Breakout-MinAtar, the default PPO batch) on the CPU and on the GPU, on the
   same batch, and prints the GPU/CPU ratio of update time;
2. runs a short `ppo_async.train` with ``learner_device='gpu:0'`` and
   ``actor_device='cpu'`` (bounded by ``--seconds``) and prints learner
   updates/s and env steps/s, and where the learner's params lived.

On a machine without a GPU it says so and exits 0. Designed to stay well
under 5 minutes of GPU time.

    python experiments/device_check.py [--seconds 120]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import common


def _gpu_devices():
    import jax

    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def _update_time(config, device, repeats: int) -> float:
    """Median seconds of one jitted learner update on ``device`` (compile excluded)."""
    import jax

    from ppo_async.core.update import init_learner_state, make_update_fn

    program, params, host_batch = common.one_real_batch(config)
    batch = jax.device_put(host_batch, device)
    state = jax.device_put(init_learner_state(config, params, jax.random.key(1)), device)
    update = make_update_fn(config, program.network)
    jax.block_until_ready(update(state, batch))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(update(state, batch))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="wall-clock bound of the training run")
    parser.add_argument("--env-id", default="Breakout-MinAtar")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import jax

    gpus = _gpu_devices()
    if not gpus:
        print(f"no GPU on this machine (JAX backend: {jax.default_backend()}); "
              "nothing to check")
        return 0

    from ppo_async import AsyncActorLearnerConfig, StopTraining, train

    config = AsyncActorLearnerConfig(
        env_id=args.env_id, num_actors=2, envs_per_actor=8, num_steps=64,
        total_env_steps=50_000_000, learner_device="gpu:0", actor_device="cpu",
    )
    cpu_s = _update_time(config, jax.devices("cpu")[0], repeats=5)
    gpu_s = _update_time(config, gpus[0], repeats=20)
    print(f"one learner update ({args.env_id}, batch {config.batch_size}): "
          f"CPU {cpu_s * 1e3:.1f} ms, GPU {gpu_s * 1e3:.1f} ms, GPU/CPU {gpu_s / cpu_s:.3f}")

    start = time.perf_counter()

    def bounded(metrics):
        if time.perf_counter() - start > args.seconds:
            raise StopTraining

    result = train(config, progress=False, on_update=bounded)
    report = result.report
    updates_per_s = report.updates / report.wall_time_s
    print(f"train with learner on {gpus[0]} and actors on cpu: {report.updates} updates in "
          f"{report.wall_time_s:.1f} s ({updates_per_s:.2f} updates/s, "
          f"{report.env_steps_per_s:,.0f} env steps/s), learner idle "
          f"{report.learner_wait_s / report.wall_time_s:.0%}, return "
          f"{report.episode_return_mean:.2f}")
    summary = {
        "env_id": args.env_id, "gpu": str(gpus[0]), "update_cpu_s": cpu_s,
        "update_gpu_s": gpu_s, "gpu_over_cpu": gpu_s / cpu_s, "updates": report.updates,
        "updates_per_s": updates_per_s, "env_steps_per_s": report.env_steps_per_s,
        "learner_idle_fraction": report.learner_wait_s / report.wall_time_s,
    }
    common.save_result("device_check", args.out, __file__, argv, summary, "summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
