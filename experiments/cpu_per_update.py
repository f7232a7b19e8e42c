"""CPU time per update: the pieces of the default run alone, against the running system and the twin.

The running system on jitted envs spends several times the twin's CPU per
env step (``bench_throughput.py``: CPU s per 100k steps). This script says
where: in one process, on the default config (CartPole-v1, 2 actors x 4
envs x 64 steps, a batch of 512), it measures wall and CPU milliseconds
(all threads of the process, ``getrusage``) per call of

- ``train``: the running system, per update, from the first update at or
  past a quarter of ``--total-env-steps`` to the last one;
- ``update alone``: the jitted update on one real batch, waited for;
- ``update alone, E epoch(s) of M minibatch(es)``: the same update on the
  same batch with other ``num_epochs`` / ``num_minibatches`` (1 x 1, one
  epoch of the default's minibatches, the default's epochs of one
  minibatch): whether its time goes to passes over the batch or to steps;
- ``the update's launch alone``: a program with the update's arguments and
  results (the learner state's leaves and the metrics) that computes next to
  nothing, and the same arguments with one result: what a call costs before
  the update's work;
- ``update, 10 in one program``: the same update ten times in one
  ``lax.scan`` (as the twin runs its updates), per update: what a program
  launched from Python costs beyond its computation;
- ``rollout alone``: one actor's jitted rollout (4 envs x 64 steps) and its
  copy to the host, as the actor loop does it; an update needs two;
- ``learner alone``: `learner_loop` on replayed real chunks, no actors
  (stacking, placing, the update, readback, publishing);
- ``twin``: the synchronous twin's run phase (``jax.jit(make_train)``,
  compile excluded), per update.

The pieces alone add up to what the running system's computations cost; the
rest of its CPU is the runtime between them (threads waking each other,
queues, the publisher, loading params, XLA's thread pool). Run it on a
quiet machine; the load average is printed.

    python experiments/cpu_per_update.py [--total-env-steps 300000]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import common


def _per_call(fn, calls: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per call of ``fn`` over ``calls`` calls, after 10 unmeasured."""
    for _ in range(10):
        fn()
    wall, cpu = time.perf_counter(), common.cpu_seconds()
    for _ in range(calls):
        fn()
    return ((time.perf_counter() - wall) / calls * 1e3, (common.cpu_seconds() - cpu) / calls * 1e3)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-env-steps", type=int, default=300_000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]

    import jax
    import jax.numpy as jnp

    from bench_learner import _learner_alone
    from ppo_async import AsyncActorLearnerConfig, train
    from ppo_async.core.update import init_learner_state, make_update_fn
    from ppo_async.sync import make_train

    config = AsyncActorLearnerConfig(total_env_steps=args.total_env_steps)
    rows: dict[str, tuple[float, float]] = {}

    marks = []
    train(config, progress=False,
          on_update=lambda m: marks.append(
              (time.perf_counter(), m["env_steps"], common.cpu_seconds())))
    (t0, s0, c0), (t1, s1, c1) = common.steady_span(config, marks, args.total_env_steps)
    updates = (s1 - s0) / config.batch_size
    rows["train (the running system)"] = ((t1 - t0) / updates * 1e3, (c1 - c0) / updates * 1e3)

    program, params, host_batch = common.one_real_batch(config)
    cpu = jax.devices("cpu")[0]
    batch = jax.device_put(host_batch)
    update = make_update_fn(config.update_options(), program.network)
    state = jax.device_put(init_learner_state(config.update_options(), params, jax.random.key(1)))
    rows["update alone"] = _per_call(lambda: jax.block_until_ready(update(state, batch)),
                                     args.calls)

    # The same batch with fewer passes or minibatches: what an epoch and a minibatch cost.
    for epochs, minibatches in ((1, 1), (1, config.num_minibatches), (config.num_epochs, 1)):
        options = dataclasses.replace(config.update_options(), num_epochs=epochs,
                                      num_minibatches=minibatches)
        variant = make_update_fn(options, program.network)
        variant_state = jax.device_put(init_learner_state(options, params, jax.random.key(1)))
        rows[f"update alone, {epochs} epoch(s) of {minibatches} minibatch(es)"] = _per_call(
            lambda: jax.block_until_ready(variant(variant_state, batch)), args.calls)

    # A launch with the update's arguments and results that computes next to nothing:
    # what calling the update costs before any of its work (every result is an array
    # JAX makes for the caller), and the same arguments with one result.
    metric_names = list(update(state, batch)[1])

    @jax.jit
    def launch_only(state, batch, rate):
        leaves, tree = jax.tree.flatten(state)
        touched = [x + 0 if jnp.issubdtype(x.dtype, jnp.number) else x for x in leaves]
        return (jax.tree.unflatten(tree, touched),
                {name: batch.reward[0, 0] + i for i, name in enumerate(metric_names)})

    one_result = jax.jit(lambda state, batch, rate: batch.reward[0, 0] + 1)
    for name, fn in (("the update's launch alone (its arguments and results)", launch_only),
                     ("the same arguments, one result", one_result)):
        rows[name] = _per_call(lambda: jax.block_until_ready(fn(state, batch, update.rate)),
                               args.calls)

    def ten_updates(state, batch):  # the same update, ten times in one program (as the twin runs)
        return jax.lax.scan(lambda s, _: (update(s, batch)[0], None), state, None, length=10)[0]

    ten = jax.jit(ten_updates)
    wall_ms, cpu_ms = _per_call(lambda: jax.block_until_ready(ten(state, batch)),
                                max(1, args.calls // 10))
    rows["update, 10 in one program (per update)"] = (wall_ms / 10, cpu_ms / 10)

    carry = [program.reset(jax.random.key(0), cpu)]

    def rollout():
        carry[0], *chunk = program.rollout(params, carry[0])
        jax.device_get(chunk)

    rows["rollout alone (one actor's chunk)"] = _per_call(rollout, args.calls)

    experiences = common.real_chunks(config, program, params)
    _learner_alone(config, program, params, experiences, update, True, 20)  # compiles its calls
    cpu_start = common.cpu_seconds()
    learner_s = _learner_alone(config, program, params, experiences, update, True, args.calls)
    # Its 20 warm-up updates count too.
    learner_cpu = (common.cpu_seconds() - cpu_start) / (args.calls + 20)
    rows["learner alone (replayed chunks)"] = (learner_s * 1e3, learner_cpu * 1e3)

    compiled = jax.jit(make_train(config)).lower(jax.random.key(0)).compile()
    wall, cpu_start = time.perf_counter(), common.cpu_seconds()
    jax.block_until_ready(compiled(jax.random.key(0)))
    rows["twin (rollout and update in one program)"] = (
        (time.perf_counter() - wall) / config.num_updates * 1e3,
        (common.cpu_seconds() - cpu_start) / config.num_updates * 1e3)

    parts = rows["update alone"][1] + config.num_actors * rows["rollout alone (one actor's chunk)"][1]
    running = rows["train (the running system)"][1]
    print(f"CartPole-v1 default config ({config.num_actors} actors x {config.envs_per_actor} envs "
          f"x {config.num_steps} steps), load average {load_before:.2f} before")
    print("| per update | wall ms | CPU ms |\n| --- | --- | --- |")
    for name, (wall_ms, cpu_ms) in rows.items():
        print(f"| {name} | {wall_ms:.2f} | {cpu_ms:.2f} |")
    print(f"the update and {config.num_actors} rollouts alone: {parts:.2f} CPU ms; the running "
          f"system: {running:.2f} CPU ms per update ({running / parts:.2f}x); the rest, "
          f"{running - parts:.2f} CPU ms, is the runtime between the computations")
    result = {"rows": {k: {"wall_ms": w, "cpu_ms": c} for k, (w, c) in rows.items()},
              "parts_cpu_ms": parts, "running_cpu_ms": running}
    common.save_with_load("cpu_per_update", args.out, __file__, argv, result, load_before)
    return result


if __name__ == "__main__":
    main()
