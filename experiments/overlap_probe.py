"""Can the rollout of one iteration run beside the update on a second CPU core?

The default config on CartPole, its two jitted pieces timed apart: the
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

    python experiments/overlap_probe.py [--calls 200]
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


def child(devices: int, calls: int) -> dict:
    common.configure_jax()
    rollout, learn = pieces(devices)
    timed_rollout, timed_update = alone(rollout, calls), alone(learn, calls)
    pair = together(rollout, learn, calls)
    return {"devices": devices, "calls": calls, "rollout": timed_rollout,
            "update": timed_update, "together": pair,
            "gain": (timed_rollout["total_s"] + timed_update["total_s"]) / pair["wall_s"]}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", type=int, choices=(1, 2), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.calls)))
        return
    load_before = os.getloadavg()[0]
    rows = []
    for devices in (1, 2):
        env = dict(os.environ)
        if devices == 2:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                                + " --xla_force_host_platform_device_count=2").strip()
        row = common.run_child([__file__, "--child", str(devices), "--calls", str(args.calls)],
                               f"{devices} device(s)", env=env)
        rows.append(row)
        print(f"{devices} CPU device(s): rollout {row['rollout']['median_ms']:.2f} ms "
              f"({row['rollout']['cores']:.2f} cores), update {row['update']['median_ms']:.2f} ms "
              f"({row['update']['cores']:.2f} cores); both at once {row['together']['wall_s']:.2f} s"
              f" on {row['together']['cores']:.2f} cores, {row['gain']:.2f}x the two in turn",
              flush=True)
    common.save_with_load("overlap_probe", args.out, __file__, argv, {"rows": rows}, load_before)


if __name__ == "__main__":
    main(sys.argv[1:])
