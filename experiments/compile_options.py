"""XLA compile options on the learner's update: what each does to its compile and its speed.

The update is the longest compile on the way to a default run's first update
(``startup_timeline.py``). Each option set (a JSON object of XLA debug
options, passed to ``jax.jit(...).lower(...).compile(compiler_options=...)``,
so nothing else in the process changes) is timed in a fresh process: the
update of the default CartPole config lowered and compiled alone, then run
on one real batch (median of 30 calls). A second figure, ``beside``: a tiny
identity program compiled alone, then again while the update compiles in
another thread (the wait a small compile meets on an actor's way to its
first chunk).

    python experiments/compile_options.py [--options '{}' '{"xla_backend_optimization_level": 1}' ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import common

DEFAULT_OPTIONS = [
    "{}",
    '{"xla_llvm_disable_expensive_passes": true}',
    '{"xla_backend_optimization_level": 1}',
    '{"xla_cpu_use_xnnpack": false}',
    '{"xla_cpu_parallel_codegen_split_count": 1}',
    '{"xla_cpu_use_fusion_emitters": false}',
]


def _update_and_batch():
    import importlib

    import jax

    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.core.update import init_learner_state, make_update_fn
    from ppo_async.networks.actor_critic import init_params

    config = AsyncActorLearnerConfig(env_id="CartPole-v1")
    program, _, batch = common.one_real_batch(config)
    params = init_params(program.network, jax.random.key(0), program.observation_shape)
    state = jax.device_put(init_learner_state(config.update_options(), params, jax.random.key(0)))
    update = make_update_fn(config.update_options(), program.network)
    importlib.import_module("ppo_async.train")  # as a run has it
    return update, (state, batch, update.rate)


def run_options(options: dict) -> dict:
    """The update compiled with ``options``: compile seconds (wall, CPU) and ms per call."""
    import jax
    import numpy as np

    update, args = _update_and_batch()
    lowered = update.program.lower(*args)
    wall, cpu = time.perf_counter(), time.process_time()
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    jax.block_until_ready(compiled(*args))
    calls = []
    for _ in range(30):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        calls.append(time.perf_counter() - start)
    return {"options": options, "compile_wall_s": wall, "compile_cpu_s": cpu,
            "update_ms": float(np.median(calls)) * 1e3}


def run_beside() -> dict:
    """A tiny identity program's compile alone, then while the update compiles in a thread."""
    import jax
    import numpy as np

    update, args = _update_and_batch()
    lowered = update.program.lower(*args)

    def identity_compile_s(rows: int) -> float:
        tree = {f"leaf{i}": np.zeros((rows, 3), np.float32) for i in range(10)}
        small = jax.jit(lambda t: t).lower(tree)
        start = time.perf_counter()
        small.compile()
        return time.perf_counter() - start

    alone = [identity_compile_s(rows) for rows in range(1, 6)]
    done = threading.Event()
    thread = threading.Thread(target=lambda: (lowered.compile(), done.set()), daemon=True)
    thread.start()
    beside, rows = [], 100
    while not done.is_set():
        beside.append(identity_compile_s(rows))
        rows += 1
    thread.join(timeout=120)
    return {"identity_alone_s": alone, "identity_beside_update_s": beside}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--options", nargs="+", default=DEFAULT_OPTIONS,
                        help="JSON objects of XLA options, one per row")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        option_sets = [json.loads(text) for text in args.options]
    except json.JSONDecodeError as error:
        parser.error(f"--options: not JSON ({error})")
    if not all(isinstance(options, dict) for options in option_sets):
        parser.error("--options: each must be a JSON object")
    if args.one is not None:  # one row, in the fresh process main() started for it
        row = run_beside() if args.one == "beside" else run_options(json.loads(args.one))
        print(json.dumps(row))
        return row
    load_before = os.getloadavg()[0]
    rows = []
    for options in option_sets:
        row = common.run_child([__file__, "--one", json.dumps(options)], f"options {options}")
        print(f"{json.dumps(options):>48}: compile {row['compile_wall_s']:.2f} s "
              f"({row['compile_cpu_s']:.2f} CPU s), update {row['update_ms']:.2f} ms")
        rows.append(row)
    beside = common.run_child([__file__, "--one", "beside"], "identity beside the update")
    print(f"identity program's compile: alone {min(beside['identity_alone_s']):.3f}-"
          f"{max(beside['identity_alone_s']):.3f} s; while the update compiles "
          f"{min(beside['identity_beside_update_s']):.3f}-"
          f"{max(beside['identity_beside_update_s']):.3f} s "
          f"({len(beside['identity_beside_update_s'])} compiles)")
    result = {"rows": rows, "beside": beside}
    common.save_with_load("compile_options", args.out, __file__, argv, result, load_before)
    return result


if __name__ == "__main__":
    main()
