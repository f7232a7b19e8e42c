"""Where the learner's time goes: idle fraction and broadcast cost.

At the default config, in this process:

- learner idle fraction: time the learner blocked on the experience queue
  over wall time, in the steady state (updates after ``--warmup`` updates, so
  that compiling is not counted as waiting); target < 10%.
- broadcast cost on the learner's critical path: the learner hands its params
  to the publisher thread (the learner's ``broadcast_s`` per update), as a
  fraction of one learner update (the jitted update timed alone on a real
  batch); target < 2%. Off the learner's thread, and reported beside it: the
  publisher's serialize (timed alone) and one actor's load
  (`load_policy_from_broadcast`, timed here on the same bytes).
- placement: `ppo_async.core.devices.place` (one jitted identity) against plain
  ``jax.device_put`` for the batch and the params, timed alone.
- the learner alone: `learner_loop` on the same real chunks replayed as fast
  as it takes them (no actor threads, no waiting), milliseconds per update
  with its pipelined readback (the default) and without it (``pipeline=False``),
  against the update alone and against the synchronous twin's run phase
  (``jax.jit(make_train(config))``, compile excluded) per update: the
  learner's own overhead per update, how much of it pipelining hides when
  the learner has a core to itself, and whether the learner side alone
  could keep up with the twin.

    python experiments/bench_learner.py [--total-env-steps 300000] [--hidden-sizes 256 256]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import common


def _checkpoint_cost(config, program, state, device) -> tuple[float, int]:
    """Median seconds to write one checkpoint of ``config``'s run, and its size in bytes."""
    import tempfile

    import jax

    from ppo_async.core.update import default_schedule
    from ppo_async.runs.checkpoint import list_checkpoints, save_checkpoint
    from ppo_async.resume import checkpoint_contents
    from ppo_async.runtime.learner import LearnerReport

    carries = [program.reset(jax.random.key(i), device) for i in range(config.num_actors)]
    report = LearnerReport(updates=1, env_steps=config.batch_size, policy_lag_counts={0: 1})
    tree, counters = checkpoint_contents(state, report, carries,
                                         default_schedule(config.update_options()))
    with tempfile.TemporaryDirectory() as directory:
        def write() -> None:
            save_checkpoint(directory, step=1, state=tree, counters=counters,
                            config_dict=config.to_dict(), keep=1)

        seconds = common.median_time(write, 20)
        size = list_checkpoints(directory)[-1].stat().st_size
    return seconds, size


class _Replay:
    """A learner transport that hands out the same chunks again and again, at once."""

    def __init__(self, experiences):
        self.experiences, self.sent, self.version = experiences, 0, 0

    def receive(self, timeout_s):
        experience = self.experiences[self.sent % len(self.experiences)]
        self.sent += 1
        return experience._replace(policy_version=self.version)

    def publish(self, params, learner_updates):
        self.version = learner_updates

    def queue_depth(self):
        return 0


def _learner_alone(config, program, params, experiences, update, pipeline: bool,
                   updates: int = 1000) -> float:
    """Seconds per update of `learner_loop` on replayed chunks (after 20 unmeasured)."""
    import jax

    from ppo_async.core.devices import place
    from ppo_async.core.update import init_learner_state
    from ppo_async.runtime.learner import LearnerConnections, learner_loop

    cpu = jax.devices("cpu")[0]
    state = place(init_learner_state(config.update_options(), params, jax.random.key(1)), cpu)

    def run(n):
        learner_loop(config, program.network, state, LearnerConnections(_Replay(experiences)), cpu,
                     update=update, end_update=n, pipeline=pipeline)

    run(20)
    start = time.perf_counter()
    run(updates)
    return (time.perf_counter() - start) / updates


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-env-steps", type=int, default=300_000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--hidden-sizes", type=int, nargs="+", default=None,
                        help="network widths (default: the config's, 64 64)")
    parser.add_argument("--alone-updates", type=int, default=1000,
                        help="updates per timing of the learner alone on replayed chunks")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import jax

    from ppo_async import AsyncActorLearnerConfig, train
    from ppo_async.core.devices import place
    from ppo_async.core.update import init_learner_state, make_update_fn
    from ppo_async.runtime.messages import (
        PolicyBroadcast,
        load_policy_from_broadcast,
        serialize_policy,
    )

    config = AsyncActorLearnerConfig(total_env_steps=args.total_env_steps)
    if args.hidden_sizes:
        config = dataclasses.replace(config, hidden_sizes=tuple(args.hidden_sizes))
    metrics, stamps = [], []

    def record(m):
        metrics.append(m)
        stamps.append(time.perf_counter())

    report = train(config, progress=False, on_update=record).report
    first, last = args.warmup, len(metrics) - 1
    window_s = stamps[last] - stamps[first]
    idle = (metrics[last]["learner_wait_s"] - metrics[first]["learner_wait_s"]) / window_s
    broadcast_s = statistics.median(m["broadcast_s"] for m in metrics[first:])
    steady_update_s = window_s / (last - first)

    # The pieces alone, on one real batch.
    program, params, host_batch = common.one_real_batch(config)
    cpu = jax.devices("cpu")[0]
    batch = jax.device_put(host_batch)
    update = make_update_fn(config.update_options(), program.network)
    state = jax.device_put(init_learner_state(config.update_options(), params, jax.random.key(1)))
    jax.block_until_ready(update(state, batch))
    update_s = common.median_time(lambda: jax.block_until_ready(update(state, batch)), 100)
    # When the call hands control back: reading one update's metrics while the
    # next one runs can only overlap anything if the dispatch returns early.
    outputs = []
    dispatch_s = common.median_time(lambda: outputs.append(update(state, batch)), 100)
    jax.block_until_ready(outputs)
    message = PolicyBroadcast(1, serialize_policy(params))
    load_s = common.median_time(
        lambda: jax.block_until_ready(
            load_policy_from_broadcast(message, program.params_template, cpu)), 200)
    serialize_s = common.median_time(lambda: serialize_policy(params), 200)
    # Placing host pytrees on the device: the jitted identity `place` uses on
    # the hot paths against plain per-leaf jax.device_put (baseline).
    host_params = jax.device_get(params)
    placement = {}
    for name, tree in (("batch", host_batch), ("params", host_params)):
        jax.block_until_ready(place(tree, cpu))  # compile outside the timing
        placement[name] = {
            "place_s": common.median_time(lambda t=tree: jax.block_until_ready(place(t, cpu)), 300),
            "device_put_s": common.median_time(
                lambda t=tree: jax.block_until_ready(jax.device_put(t, cpu)), 300),
        }

    checkpoint_s, checkpoint_bytes = _checkpoint_cost(config, program, state, cpu)

    from ppo_async.sync import make_train

    compiled_twin = jax.jit(make_train(config)).lower(jax.random.key(0)).compile()
    twin_start = time.perf_counter()
    jax.block_until_ready(compiled_twin(jax.random.key(0)))
    twin_s = (time.perf_counter() - twin_start) / config.num_updates

    experiences = common.real_chunks(config, program, params)
    alone = {}
    for pipeline in (False, True, False, True):  # alternating; the median of two each
        alone.setdefault(pipeline, []).append(
            _learner_alone(config, program, params, experiences, update, pipeline,
                           args.alone_updates))
    alone_s = {"pipelined": statistics.median(alone[True]),
               "unpipelined": statistics.median(alone[False])}

    broadcast_fraction = broadcast_s / update_s  # the learner thread's share
    off_thread_fraction = (serialize_s + load_s) / update_s
    result = {
        "config": config.to_dict(),
        "learner_idle_fraction": idle,
        "steady_seconds_per_update": steady_update_s,
        "update_alone_s": update_s,
        "update_dispatch_returns_after_s": dispatch_s,
        "broadcast_s_median": broadcast_s,
        "serialize_alone_s": serialize_s,
        "load_s": load_s,
        "broadcast_fraction_of_update": broadcast_fraction,
        "publisher_and_load_fraction_of_update": off_thread_fraction,
        "payload_bytes": len(message.payload),
        "placement": placement,
        "env_steps_per_s": report.env_steps_per_s,
        "checkpoint_write_s": checkpoint_s,
        "checkpoint_bytes": checkpoint_bytes,
        "learner_alone_s_per_update": alone_s,
        "twin_s_per_update": twin_s,
        "learner_alone_pipelined_over_twin_rate": twin_s / alone_s["pipelined"],
    }
    print(f"learner idle (waiting for experience) in the steady state: {idle:.1%} (target < 10%)")
    print(f"the update's call returns after {dispatch_s * 1e3:.2f} ms (dispatch), "
          f"{update_s * 1e3:.2f} ms with the wait for its result")
    print(f"one update alone: {update_s * 1e3:.2f} ms; in the running system one update "
          f"every {steady_update_s * 1e3:.2f} ms")
    print(f"serialize alone: {serialize_s * 1e3:.3f} ms")
    print(f"broadcast on the learner's thread (hand-over to the publisher): "
          f"{broadcast_s * 1e3:.3f} ms = {broadcast_fraction:.2%} of an update (target < 2%)")
    print(f"off the learner's thread: serialize {serialize_s * 1e3:.3f} ms + one actor's load "
          f"{load_s * 1e3:.3f} ms ({len(message.payload)} bytes) = {off_thread_fraction:.1%} "
          "of an update")
    for name, times in placement.items():
        print(f"placing the {name} on the device: place {times['place_s'] * 1e3:.3f} ms, "
              f"jax.device_put {times['device_put_s'] * 1e3:.3f} ms "
              f"({times['device_put_s'] / times['place_s']:.1f}x)")
    print(f"one checkpoint (state, every actor's env carry, counters): {checkpoint_bytes} bytes, "
          f"written atomically in {checkpoint_s * 1e3:.1f} ms (median of 20)")
    print(f"the learner alone on replayed chunks (no actors): pipelined "
          f"{alone_s['pipelined'] * 1e3:.2f} ms per update "
          f"({config.batch_size / alone_s['pipelined']:.0f} env steps/s), unpipelined "
          f"{alone_s['unpipelined'] * 1e3:.2f} ms "
          f"({config.batch_size / alone_s['unpipelined']:.0f} env steps/s); the update alone "
          f"{update_s * 1e3:.2f} ms; the synchronous twin's run phase {twin_s * 1e3:.2f} ms "
          f"({config.batch_size / twin_s:.0f} env steps/s): the learner alone, pipelined, runs "
          f"{twin_s / alone_s['pipelined']:.2f}x the twin's rate")
    common.save_result("bench_learner", args.out, __file__, argv, result)
    return result


if __name__ == "__main__":
    main()
