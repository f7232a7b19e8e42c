"""Can the rollout of one iteration run beside the update on a second CPU core?

Four measurements, each in a fresh process (``--parts`` picks):

- ``program``: the learner's own program (`ppo_async.runtime.in_learner`),
  its loop of ``--updates`` updates timed whole, then with the update
  replaced by one that returns its state (the rollout alone) and with the
  rollout replaced by a fixed chunk (the update alone), on CartPole, Acrobot
  and Breakout-MinAtar (their presets). What the rollout adds to an update
  inside the program bounds what running it beside the update can gain there.
- ``xla``: two equal loops of matmuls with no data between them, in one jitted
  program, against one: 2.0x the time means XLA runs them in turn.
- ``lockstep``: the schedule an overlap would run at exact lag 1, as two
  threads of two programs: the update of chunk ``u`` in this thread while
  another collects chunk ``u + 1`` with the params of version ``u``, handing
  device arrays over (no bytes), against the learner's program.
- ``pieces``: the default config on CartPole, its two jitted pieces timed apart: the
rollout (every actor's chunk, one program, `ActorProgram.rollout_group`) and
the update (advantages, epochs x minibatches, the learner's jitted update).
Each is called ``--calls`` times back to back (medians; the calling process's
CPU time over the wall time says whether XLA spreads one call over both
cores). Then both run at once, each looping in its own Python thread, on one
CPU device and, in a fresh process with
``--xla_force_host_platform_device_count=2``, on two (the rollout on cpu:0,
the update on cpu:1). The wall time of the pair against the sum of the two
alone is what running them beside each other would gain: 1.0 is none, up to
2.0 where they overlap fully.

    python experiments/overlap_probe.py [--calls 200] [--updates 64] [--parts program xla lockstep pieces]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import common


def pieces(devices: int):
    """``(rollout(), update())``: each runs one call of its piece and waits for it."""
    import jax

    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.core import keys
    from ppo_async.core.update import default_schedule
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.runtime.learner import stack_experiences
    from ppo_async.runtime.messages import Experience
    from ppo_async.train import initial_learner_state, learner_update

    config = AsyncActorLearnerConfig()
    actor_device, learner_device = jax.devices("cpu")[0], jax.devices("cpu")[devices - 1]
    program = make_actor_program(config)
    update = learner_update(config, program, default_schedule(config.update_options()))
    state = jax.device_put(initial_learner_state(config, program), learner_device)
    params = jax.device_put(state.params, actor_device)
    carries = [program.reset(jax.random.fold_in(keys.key(0), i), actor_device)
               for i in range(config.num_actors)]
    chunks = program.rollout_group(params, carries)
    batch = jax.device_put(stack_experiences(
        [Experience(i, 0, trajectory, bootstrap_obs, bootstrap_value)
         for i, (_, trajectory, bootstrap_obs, bootstrap_value) in enumerate(chunks)]),
        learner_device)

    def rollout():
        jax.block_until_ready(program.rollout_group(params, carries))

    def learn():
        jax.block_until_ready(update(state, batch))

    rollout(), learn()  # compiled here, not timed
    return rollout, learn


def alone(fn, calls: int) -> dict:
    """Median wall time of ``fn`` and the process's CPU time over the wall time of the loop."""
    walls = []
    cpu_0, wall_0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
    cores = (time.process_time() - cpu_0) / (time.perf_counter() - wall_0)
    return {"median_ms": 1e3 * statistics.median(walls), "total_s": sum(walls), "cores": cores}


def together(first, second, calls: int) -> dict:
    """Both loops at once, each in a thread: the wall time of the pair and the cores it used."""
    errors = []

    def loop(fn):
        try:
            for _ in range(calls):
                fn()
        except BaseException as error:  # noqa: BLE001 - raised below
            errors.append(error)

    threads = [threading.Thread(target=loop, args=(fn,), name=f"overlap-{i}")
               for i, fn in enumerate((first, second))]
    cpu_0, wall_0 = time.process_time(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    if errors or any(thread.is_alive() for thread in threads):
        raise RuntimeError("a loop failed or did not end") from (errors[0] if errors else None)
    wall = time.perf_counter() - wall_0
    return {"wall_s": wall, "cores": (time.process_time() - cpu_0) / wall}


def program_breakdown(preset: str, updates: int, repeats: int) -> dict:
    """ms per update of the learner's loop program: whole, rollout alone, update alone."""
    import jax
    import jax.numpy as jnp

    from ppo_async import presets
    from ppo_async.core import keys
    from ppo_async.core.update import default_schedule
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.runtime import in_learner
    from ppo_async.train import initial_learner_state, learner_update

    config = presets.preset(preset)
    program = make_actor_program(config)
    update = learner_update(config, program, default_schedule(config.update_options()))
    state = initial_learner_state(config, program)
    device = jax.devices("cpu")[0]
    carries = tuple(program.reset(jax.random.fold_in(keys.key(0), i), device)
                    for i in range(config.num_actors))
    history = (state.params,) * config.exact_lag
    collect = in_learner._collector(config, program)
    chunks = jax.jit(collect)(state.params, carries, 0)
    _, metrics = jax.eval_shape(lambda s, b: update.program(s, b, update.rate), state,
                                chunks.batch)

    def no_update(state, batch, rate):  # the rollout alone: a finite update that changes nothing
        return state, {name: jnp.ones(m.shape, m.dtype) for name, m in metrics.items()}

    def fixed_chunk(params, carries, lag):  # the update alone, on one real chunk
        return chunks._replace(carries=carries)

    row = {"preset": preset, "updates": updates, "batch_size": config.batch_size}
    for name, collector, update_program in (("whole", collect, update.program),
                                            ("rollout", collect, no_update),
                                            ("update", fixed_chunk, update.program)):
        run = in_learner._loop_program(config, collector, update_program, updates)

        def call():
            jax.block_until_ready(run(state, carries, history, jnp.int32(updates), jnp.int32(0),
                                      jnp.int32(0), update.rate).count)

        call()  # compiled here, not timed
        timed = alone(call, repeats)
        row[name] = {"ms_per_update": timed["median_ms"] / updates, "cores": timed["cores"]}
    row["rollout_adds"] = row["whole"]["ms_per_update"] - row["update"]["ms_per_update"]
    row["overlap_bound"] = row["whole"]["ms_per_update"] / row["update"]["ms_per_update"]
    return row


def xla_two_loops(repeats: int) -> dict:
    """One loop of matmuls in a jitted program against two with no data between them."""
    import jax
    import jax.numpy as jnp

    def loop(x):
        return jax.lax.fori_loop(0, 200, lambda i, x: jnp.tanh(x @ x) * 0.5, x)

    one = jax.jit(loop)
    two = jax.jit(lambda a, b: (loop(a), loop(b)))
    a, b = jnp.full((128, 128), 0.01), jnp.full((128, 128), 0.02)
    timed = {}
    for name, fn in (("one", lambda: jax.block_until_ready(one(a))),
                     ("two", lambda: jax.block_until_ready(two(a, b)))):
        fn()
        timed[name] = alone(fn, repeats)
    return {"one": timed["one"], "two": timed["two"],
            "ratio": timed["two"]["median_ms"] / timed["one"]["median_ms"]}


def lockstep(preset: str, updates: int, repeats: int) -> dict:
    """ms per update of the overlap's schedule as two threads (exact lag 1) and of the
    learner's program, on ``preset``."""
    import queue

    import jax
    import jax.numpy as jnp

    from ppo_async import presets
    from ppo_async.core import keys
    from ppo_async.core.update import default_schedule
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.runtime import in_learner
    from ppo_async.train import initial_learner_state, learner_update

    config = presets.preset(preset)
    program = make_actor_program(config)
    update = learner_update(config, program, default_schedule(config.update_options()))
    state = initial_learner_state(config, program)
    device = jax.devices("cpu")[0]
    carries = tuple(program.reset(jax.random.fold_in(keys.key(0), i), device)
                    for i in range(config.num_actors))
    collect = jax.jit(in_learner._collector(config, program))
    learn = jax.jit(lambda state, batch: update(state, batch)[0])
    run = in_learner._loop_program(config, in_learner._collector(config, program),
                                   update.program, updates)

    def in_program():
        jax.block_until_ready(run(state, carries, (state.params,), jnp.int32(updates),
                                  jnp.int32(0), jnp.int32(0), update.rate).count)

    def two_threads():
        chunks, params = queue.Queue(), queue.Queue()

        def actor():
            carry = carries
            for _ in range(updates):
                chunk = collect(params.get(timeout=60), carry, 1)
                carry = jax.block_until_ready(chunk).carries
                chunks.put(chunk.batch)

        thread = threading.Thread(target=actor, name="overlap-actor", daemon=True)
        thread.start()
        learner_state = state
        params.put(learner_state.params)  # chunk 0, then chunk u + 1 with version u
        for _ in range(updates):
            batch = chunks.get(timeout=60)
            params.put(learner_state.params)
            learner_state = jax.block_until_ready(learn(learner_state, batch))
        thread.join(60)

    def pieces_in_turn():  # the two programs called one after the other, no thread
        learner_state, carry = state, carries
        for _ in range(updates):
            chunk = collect(learner_state.params, carry, 1)
            carry = chunk.carries
            learner_state = jax.block_until_ready(learn(learner_state, chunk.batch))

    row = {"preset": preset, "updates": updates}
    for name, fn in (("program", in_program), ("two_threads", two_threads),
                     ("in_turn", pieces_in_turn)):
        fn()
        timed = alone(fn, repeats)
        row[name] = {"ms_per_update": timed["median_ms"] / updates, "cores": timed["cores"]}
    row["two_threads_vs_program"] = (row["program"]["ms_per_update"]
                                     / row["two_threads"]["ms_per_update"])
    return row


def child(devices: int, calls: int) -> dict:
    rollout, learn = pieces(devices)
    timed_rollout, timed_update = alone(rollout, calls), alone(learn, calls)
    pair = together(rollout, learn, calls)
    return {"devices": devices, "calls": calls, "rollout": timed_rollout,
            "update": timed_update, "together": pair,
            "gain": (timed_rollout["total_s"] + timed_update["total_s"]) / pair["wall_s"]}


PRESETS = ("cartpole", "acrobot", "breakout-minatar")
# MinAtar's conv update takes about half a second on 2 cores: fewer updates a call.
MAX_UPDATES = {"breakout-minatar": 8}
PARTS = ("program", "xla", "lockstep", "pieces")


def run_part(part: str, args, extra: list[str] | None = None) -> dict:
    """One part in a fresh process (its own JAX, no other program warm)."""
    return common.run_child([__file__, "--child", part, "--calls", str(args.calls),
                             "--updates", str(args.updates), "--repeats", str(args.repeats),
                             *(extra or [])], part)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls of each piece (pieces)")
    parser.add_argument("--updates", type=int, default=64,
                        help="updates per call of a loop (program, lockstep)")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls of each loop")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--preset", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        common.configure_jax()
        if args.child == "program":
            row = program_breakdown(args.preset, args.updates, args.repeats)
        elif args.child == "xla":
            row = xla_two_loops(args.repeats)
        elif args.child == "lockstep":
            row = lockstep(args.preset, args.updates, args.repeats)
        else:
            row = child(int(args.child), args.calls)
        print(json.dumps(row))
        return
    load_before = os.getloadavg()[0]
    result = {}
    if "program" in args.parts:
        result["program"] = []
        for preset in args.presets:
            updates = min(args.updates, MAX_UPDATES.get(preset, args.updates))
            row = run_part("program", args, ["--preset", preset, "--updates", str(updates)])
            result["program"].append(row)
            print(f"{preset}: the learner's program {row['whole']['ms_per_update']:.3f} ms an "
                  f"update ({row['whole']['cores']:.2f} cores); rollout alone "
                  f"{row['rollout']['ms_per_update']:.3f} ms, update alone "
                  f"{row['update']['ms_per_update']:.3f} ms ({row['update']['cores']:.2f} cores);"
                  f" the rollout adds {row['rollout_adds']:.3f} ms, so an overlap gains at most "
                  f"{row['overlap_bound']:.2f}x", flush=True)
    if "xla" in args.parts:
        row = result["xla"] = run_part("xla", args)
        print(f"two independent loops in one program: {row['ratio']:.2f}x one loop's time "
              f"on {row['two']['cores']:.2f} cores (2.0x: in turn)", flush=True)
    if "lockstep" in args.parts:
        result["lockstep"] = []
        for preset in args.presets:
            updates = min(args.updates, MAX_UPDATES.get(preset, args.updates))
            row = run_part("lockstep", args, ["--preset", preset, "--updates", str(updates)])
            result["lockstep"].append(row)
            print(f"{preset}, exact lag 1 as two threads: "
                  f"{row['two_threads']['ms_per_update']:.3f} ms an update "
                  f"({row['two_threads']['cores']:.2f} cores), the two programs in turn "
                  f"{row['in_turn']['ms_per_update']:.3f} ms, the learner's program "
                  f"{row['program']['ms_per_update']:.3f} ms: two threads run at "
                  f"{row['two_threads_vs_program']:.2f}x the program", flush=True)
    if "pieces" in args.parts:
        result["rows"] = []
        for devices in (1, 2):
            env = dict(os.environ)
            if devices == 2:
                env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                                    + " --xla_force_host_platform_device_count=2").strip()
            row = common.run_child([__file__, "--child", str(devices), "--calls",
                                    str(args.calls)], f"{devices} device(s)", env=env)
            result["rows"].append(row)
            print(f"{devices} CPU device(s): rollout {row['rollout']['median_ms']:.2f} ms "
                  f"({row['rollout']['cores']:.2f} cores), update "
                  f"{row['update']['median_ms']:.2f} ms ({row['update']['cores']:.2f} cores); "
                  f"both at once {row['together']['wall_s']:.2f} s on "
                  f"{row['together']['cores']:.2f} cores, {row['gain']:.2f}x the two in turn",
                  flush=True)
    common.save_with_load("overlap_probe", args.out, __file__, argv, result, load_before)


if __name__ == "__main__":
    main(sys.argv[1:])
