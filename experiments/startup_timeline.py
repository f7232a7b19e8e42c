"""Where the first seconds of a fresh `train()` go: compiling, step by step.

With the persistent compilation cache off (as in a fresh process), one short
default CartPole run (``--updates`` updates), timed from the `train()` call:

- ``init_params``: start and end (the initializers compile here, while the
  update compiles in the "ppo-warm-up" thread);
- the learner's wait for that thread to finish (``warm_up.result``);
- the first update done;
- each actor's first chunk (``ActorStats.first_chunk_s``: its rollout compile).

Then, in the same process, the initializers compiled alone on a fresh network
(nothing beside them), for comparison.

    python experiments/startup_timeline.py [--updates 10]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

import common


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import jax

    jax.config.update("jax_enable_compilation_cache", False)

    from ppo_async import AsyncActorLearnerConfig, train
    from ppo_async.networks import init_params, make_network

    train_module = importlib.import_module("ppo_async.train")  # the name is shadowed by train()
    marks: dict[str, float] = {}
    start = [0.0]

    def timed(name, function):
        def wrapper(*a, **k):
            marks[f"{name}_start_s"] = time.perf_counter() - start[0]
            out = function(*a, **k)
            marks[f"{name}_end_s"] = time.perf_counter() - start[0]
            return out
        return wrapper

    original_init = train_module.init_params
    original_result = train_module._UpdateWarmUp.result
    train_module.init_params = timed("init_params", original_init)
    train_module._UpdateWarmUp.result = timed("warm_up_wait", original_result)
    config = AsyncActorLearnerConfig()
    config = AsyncActorLearnerConfig(total_env_steps=config.batch_size * args.updates)

    def on_update(metrics):
        marks.setdefault("first_update_s", time.perf_counter() - start[0])

    try:
        start[0] = time.perf_counter()
        report = train(config, progress=False, on_update=on_update).report
        marks["train_total_s"] = time.perf_counter() - start[0]
    finally:
        train_module.init_params = original_init
        train_module._UpdateWarmUp.result = original_result

    # The initializers alone, on a fresh network object (so nothing is cached).
    network = make_network((4,), type("Discrete", (), {"n": 2})(), config.hidden_sizes)
    alone = time.perf_counter()
    jax.block_until_ready(init_params(network, jax.random.key(1), (4,)))
    marks["init_params_alone_s"] = time.perf_counter() - alone
    marks["actor_first_chunk_s"] = [s.first_chunk_s for s in report.actor_stats]

    for name, value in marks.items():
        shown = [round(v, 2) for v in value] if isinstance(value, list) else round(value, 2)
        print(f"{name:24s} {shown}")
    common.save_result("startup_timeline", args.out, __file__, argv, dict(marks))
    return marks


if __name__ == "__main__":
    main()
