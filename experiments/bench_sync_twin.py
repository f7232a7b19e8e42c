"""Wall time of the synchronous twin for a full CartPole-v1 budget, compile included.

Each seed builds and jits ``make_train(config)`` afresh (no persistent
compilation cache), so every figure includes its compile, as a fresh process
pays it. The reference point is the best published fully-jitted PPO on gymnax
CartPole, about 13 s for 500k steps on this 2-core machine.

    python experiments/bench_sync_twin.py [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import common


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--total-env-steps", type=int, default=500_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import jax

    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.sync import make_train, recent_return_mean

    config = AsyncActorLearnerConfig(total_env_steps=args.total_env_steps)
    rows = []
    for seed in args.seeds:
        start = time.perf_counter()
        result = jax.jit(make_train(config))(jax.random.key(seed))
        jax.block_until_ready(result)
        wall = time.perf_counter() - start
        final = recent_return_mean(jax.device_get(result.metrics))
        rows.append({"seed": seed, "wall_s": wall, "final_return": final})
        print(f"seed {seed}: {config.num_updates * config.batch_size} env steps in "
              f"{wall:.1f} s (compile included), final return {final:.1f}", flush=True)
    median = statistics.median(r["wall_s"] for r in rows)
    print(f"median {median:.1f} s for {config.num_updates * config.batch_size} env steps")
    summary = {"rows": rows, "median_wall_s": median}
    common.save_result("bench_sync_twin", args.out, __file__, argv, summary)
    return summary


if __name__ == "__main__":
    main()
