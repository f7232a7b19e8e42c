"""One CPU device runs its programs one at a time: what that costs the default run.

The fixed-cost table of docs/benchmarks.md found the update and the actors'
rollouts adding up to about one update period, "as if they ran one at a
time". They do: XLA's CPU client runs the programs dispatched to one device
in order, each after the one before has ended, however many cores are free.
This script measures that, and whether giving the learner a device of its own
(``learner_device="cpu:1"`` with two CPU devices, ``jax_num_cpu_devices=2``)
lets the default run go faster. Each part runs in a fresh process:

- ``queue``: a long program (a loop of matrix products, about 0.1 s) is
  dispatched, then a tiny one (``x + 1``); the time until the tiny one's
  result is ready, with both on one device, and with the tiny one on a
  second CPU device. Also two long programs, on one device and on two.
- ``train``: the default config (CartPole, 2 actors x 4 envs), steady env
  steps/s (from a quarter of the run to its end), on one device (the
  default) and with the learner on a second CPU device, ``--pairs`` pairs
  alternated; with ``--single-thread`` also XLA's CPU ops single-threaded in
  the two-device runs (``--xla_cpu_multi_thread_eigen=false``), so that each
  program keeps to one core.

    python experiments/cpu_device_queue.py [--pairs 5] [--single-thread]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import common


def run_queue(devices: int) -> dict:
    import jax

    jax.config.update("jax_num_cpu_devices", devices)
    import jax.numpy as jnp

    @jax.jit
    def long(x):
        return jax.lax.fori_loop(0, 2000, lambda i, y: jnp.tanh(y @ y * 0.01), x)

    @jax.jit
    def tiny(x):
        return x + 1

    first, last = jax.devices()[0], jax.devices()[-1]
    x = jax.device_put(jnp.ones((128, 128)), first)
    x_other = jax.device_put(jnp.ones((128, 128)), last)
    y = jax.device_put(jnp.ones(4), last)
    long(x).block_until_ready(), long(x_other).block_until_ready(), tiny(y).block_until_ready()
    alone, tiny_after, both = [], [], []
    for _ in range(5):
        start = time.perf_counter()
        long(x).block_until_ready()
        alone.append(time.perf_counter() - start)
        start = time.perf_counter()
        pending = long(x)
        tiny(y).block_until_ready()
        tiny_after.append(time.perf_counter() - start)
        pending.block_until_ready()
        start = time.perf_counter()
        a, b = long(x), long(x_other)
        a.block_until_ready(), b.block_until_ready()
        both.append(time.perf_counter() - start)
    return {"devices": devices, "long_ms": 1e3 * statistics.median(alone),
            "tiny_after_long_ms": 1e3 * statistics.median(tiny_after),
            "two_long_ms": 1e3 * statistics.median(both)}


def run_train(devices: int) -> dict:
    import dataclasses

    import jax

    jax.config.update("jax_num_cpu_devices", devices)
    from ppo_async import AsyncActorLearnerConfig, train

    config = AsyncActorLearnerConfig()
    if devices > 1:
        config = dataclasses.replace(config, learner_device="cpu:1", actor_device="cpu:0")
    marks: list[tuple[float, float]] = []
    cpu0 = time.process_time()
    result = train(config, progress=False,
                   on_update=lambda m: marks.append((time.perf_counter(), m["env_steps"])))
    (t0, s0), (t1, s1) = marks[len(marks) // 4], marks[-1]
    return {"devices": devices, "env_steps_per_s": (s1 - s0) / (t1 - t0),
            "cpu_s": time.process_time() - cpu0,
            "final_return": result.report.episode_return_mean}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="alternated train() pairs")
    parser.add_argument("--single-thread", action="store_true",
                        help="XLA's CPU ops single-threaded in the two-device train() runs")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.pairs < 0:
        parser.error("--pairs must be >= 0")
    if args.one is not None:  # one part, in the fresh process main() started for it
        part, devices = args.one.split(":")
        row = (run_queue if part == "queue" else run_train)(int(devices))
        print(json.dumps(row))
        return row
    load_before = os.getloadavg()[0]
    queue = [common.run_child([__file__, "--one", f"queue:{n}"], f"queue on {n} device(s)")
             for n in (1, 2)]
    for row in queue:
        where = "the same device" if row["devices"] == 1 else "a second device"
        print(f"a long program alone {row['long_ms']:.1f} ms; a tiny one dispatched after it, on "
              f"{where}: ready after {row['tiny_after_long_ms']:.2f} ms; two long ones "
              f"{'on one device' if row['devices'] == 1 else 'on two'}: {row['two_long_ms']:.1f} ms")
    env = dict(os.environ)
    two_env = dict(env)
    if args.single_thread:
        two_env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                                " --xla_cpu_multi_thread_eigen=false").strip()
    runs = []
    for pair in range(args.pairs):
        for devices, child_env in ((1, env), (2, two_env)):
            row = common.run_child([__file__, "--one", f"train:{devices}"],
                                   f"train on {devices} device(s)", env=child_env)
            row["pair"], row["load_average_1_min"] = pair, os.getloadavg()[0]
            runs.append(row)
            print(f"pair {pair}, {'learner on its own device' if devices == 2 else 'one device'}: "
                  f"{row['env_steps_per_s']:,.0f} env steps/s, {row['cpu_s']:.1f} CPU s, "
                  f"return {row['final_return']:.1f}", flush=True)
    result = {"queue": queue, "train": runs}
    if runs:
        rates = {n: [r["env_steps_per_s"] for r in runs if r["devices"] == n] for n in (1, 2)}
        ratios = [b / a for a, b in zip(rates[1], rates[2])]
        result["summary"] = {"one_device_median": statistics.median(rates[1]),
                             "two_devices_median": statistics.median(rates[2]),
                             "pair_ratios": ratios}
        print(f"steady env steps/s, medians: one device {statistics.median(rates[1]):,.0f}, the "
              f"learner on its own {statistics.median(rates[2]):,.0f}; two / one pair by pair: "
              + ", ".join(f"{r:.2f}" for r in ratios))
    common.save_with_load("cpu_device_queue", args.out, __file__, argv, result, load_before)
    return result


if __name__ == "__main__":
    main()
