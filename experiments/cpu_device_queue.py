"""One CPU device runs its programs one at a time.

The fixed-cost table of docs/benchmarks.md found the update and the actors'
rollouts adding up to about one update period, "as if they ran one at a
time". They do: XLA's CPU client runs the programs dispatched to one device
in order, each after the one before has ended, however many cores are free.
In a fresh process for one CPU device and one for two
(``jax_num_cpu_devices=2``), a long program (a loop of matrix products,
about 0.1 s) is dispatched, then a tiny one (``x + 1``): the time until the
tiny one's result is ready, with both on one device and with the tiny one on
the second; and two long programs, on one device and on two. What a learner
device of its own does to the default run is `bench_throughput.py`'s
``async-own-device`` mode.

    python experiments/cpu_device_queue.py
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


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.one is not None:  # one device count, in the fresh process main() started for it
        row = run_queue(args.one)
        print(json.dumps(row))
        return row
    load_before = os.getloadavg()[0]
    queue = [common.run_child([__file__, "--one", str(n)], f"queue on {n} device(s)")
             for n in (1, 2)]
    for row in queue:
        where = "the same device" if row["devices"] == 1 else "a second device"
        print(f"a long program alone {row['long_ms']:.1f} ms; a tiny one dispatched after it, on "
              f"{where}: ready after {row['tiny_after_long_ms']:.2f} ms; two long ones "
              f"{'on one device' if row['devices'] == 1 else 'on two'}: {row['two_long_ms']:.1f} ms")
    result = {"queue": queue}
    common.save_with_load("cpu_device_queue", args.out, __file__, argv, result, load_before)
    return result


if __name__ == "__main__":
    main()
