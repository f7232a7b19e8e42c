"""Threads against Ray processes: env steps/s, what the process transport costs, and broadcasts.

One script run, the same config for both backends (2 actors):

- host envs that hold the GIL: gymnasium CartPole (``gymnasium:CartPole-v1``)
  and a pure-Python env whose step costs ``--python-step-ms`` per env
  (``host:busy-python``): env steps/s the learner consumed in the steady
  state, 2 Ray actors over 2 thread actors (target >= 1.6x on a 2-core machine);
- jitted gymnax CartPole: Ray over threads (target >= 0.8x), and what the
  process transport adds: pickling one chunk, one round trip to an actor (the
  scheduling of a call), ``ray.put`` + ``ray.get`` of a chunk (the object store);
- broadcasts with Ray, per update, for each ``--widths`` MLP: the learner's
  hand-over to the publisher (its critical path), the publisher's
  serialize + ``ray.put`` (off the learner's thread), and one actor's load
  (``ray.get`` of the reference + decode + place), against one update alone.

    python experiments/bench_backends.py [--total-env-steps 60000] [--python-step-ms 0.2]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import statistics
import sys
import time

import common

BUSY_ENV = "busy-python"
# row -> (env id, config changes, budget in multiples of --total-env-steps; gymnax is ~10x
# faster). The big-chunk gymnax row shows the per-message cost of Ray amortized.
ENVS = {
    "gymnasium:CartPole-v1": ("gymnasium:CartPole-v1", {}, 1),
    f"host:{BUSY_ENV}": (f"host:{BUSY_ENV}", {}, 1),
    "CartPole-v1": ("CartPole-v1", {}, 5),
    "CartPole-v1 (32 envs x 128 steps per chunk)": (
        "CartPole-v1", {"envs_per_actor": 32, "num_steps": 128, "max_lead_steps": 4 * 128}, 15),
}


class BusyPythonEnv:
    """``E`` toy envs stepped in pure Python: each env step spins for ``step_s`` holding the GIL."""

    observation_shape = (4,)
    step_s = 0.2e-3

    def __init__(self, num_envs: int):
        import gymnasium
        import numpy as np

        self.np = np
        self.action_space = gymnasium.spaces.Discrete(2)
        self.num_envs = num_envs
        self.t = np.zeros(num_envs)

    def reset(self, seed: int):
        return self.np.zeros((self.num_envs, 4), self.np.float32)

    def step(self, actions):
        np = self.np
        for _ in range(self.num_envs):  # a Python simulator: the GIL is held throughout
            end = time.perf_counter() + self.step_s
            while time.perf_counter() < end:
                pass
        self.t += 1
        terminated = self.t >= 50
        self.t[terminated] = 0
        obs = np.stack([self.t / 50, actions, 1 - actions, self.t * 0], -1).astype(np.float32)
        return obs, np.ones(self.num_envs, np.float32), terminated, np.zeros(self.num_envs, bool), obs


# Not common.median_time: the Ray actors below take this function by value, and
# `common` is not importable in their worker processes.
def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def steady_rate(config, warmup: int) -> dict:
    """Run ``config``; env steps/s the learner consumed after ``warmup`` updates, and more."""
    from ppo_async import train

    stamps, steps, broadcast_s = [], [], []

    def record(metrics):
        stamps.append(time.perf_counter())
        steps.append(metrics["env_steps"])
        broadcast_s.append(metrics["broadcast_s"])

    start = time.perf_counter()
    report = train(config, progress=False, on_update=record).report
    total_s = time.perf_counter() - start
    first = min(warmup, len(stamps) - 2)
    rate = (steps[-1] - steps[first]) / (stamps[-1] - stamps[first])
    return {
        "env_steps_per_s": rate,
        "updates": report.updates,
        "total_s": total_s,
        "broadcast_s_median": statistics.median(broadcast_s[first:]),
        "learner_wait_s": report.learner_wait_s,
        "policy_lag_max": report.policy_lag_max,
        "actor_pause_s": [round(s.pause_s, 3) for s in report.actor_stats],
        # CPU-seconds the actors' loops got per second of the run: threads share one GIL
        # (at most 1.0 together); processes are capped by the cores the machine can spare.
        "actor_cpu_per_wall_s": sum(s.cpu_s for s in report.actor_stats) / total_s,
    }


def transport_costs(ray, config) -> dict:
    """What moving one gymnax chunk through Ray costs, timed alone."""
    import jax

    from ppo_async.envs.backends import make_actor_program
    from ppo_async.runtime.messages import Experience
    from ppo_async.runtime.process_transport import actor_env_vars
    from ppo_async.runtime.ray_transport import _ActorProcess

    program = make_actor_program(config)
    cpu = jax.devices("cpu")[0]
    params = jax.device_put(program.params_template, cpu)
    carry = program.reset(jax.random.key(0), cpu)
    carry, trajectory, bootstrap_obs, bootstrap_value = program.rollout(params, carry)
    chunk = Experience(0, 0, *jax.device_get((trajectory, bootstrap_obs, bootstrap_value)),
                       jax.device_get(carry))
    pickled = pickle.dumps(chunk)
    pickle_s = _median_time(lambda: pickle.loads(pickle.dumps(chunk)), 200)
    put_get_s = _median_time(lambda: ray.get(ray.put(chunk)), 100)
    from ppo_async.runtime.actor import ActorStart, ActorStats

    actor = ray.remote(_ActorProcess).options(
        num_cpus=0, runtime_env={"env_vars": actor_env_vars()}, max_concurrency=4,
    ).remote(0, config, None, ActorStart(), ActorStats(0))
    ray.get(actor.where.remote())
    round_trip_s = _median_time(lambda: ray.get(actor.where.remote()), 100)
    ray.kill(actor)
    return {"chunk_bytes": len(pickled), "pickle_round_trip_s": pickle_s,
            "put_get_s": put_get_s, "actor_call_round_trip_s": round_trip_s}


class _LoadTimer:
    """Runs in a Ray process with an actor's environment: times one actor's load of a broadcast."""

    def __init__(self, hidden_sizes: tuple):
        self.hidden_sizes = hidden_sizes

    def time_load(self, refs: list, repeats: int) -> float:
        import jax
        import ray

        from ppo_async.networks.actor_critic import make_network, params_template
        from ppo_async.runtime.messages import PolicyBroadcast, load_policy_from_broadcast

        network = make_network((4,), type("Discrete", (), {"n": 2})(), self.hidden_sizes)
        template = params_template(network, (4,))
        cpu = jax.devices("cpu")[0]

        def load():
            message = PolicyBroadcast(1, ray.get(refs[0]))
            jax.block_until_ready(load_policy_from_broadcast(message, template, cpu))

        load()  # compile the placement outside the timing
        return _median_time(load, repeats)


def broadcast_costs(ray, config, widths: list[int], repeats: int) -> list[dict]:
    """Per update, with Ray: publish (hand-over + serialize + put) and one actor's load."""
    import jax

    from ppo_async.core.update import init_learner_state, make_update_fn
    from ppo_async.runtime.messages import serialize_policy
    from ppo_async.runtime.process_transport import actor_env_vars
    from ppo_async.runtime.transport import Publisher

    rows = []
    for width in widths:
        sized = dataclasses.replace(config, hidden_sizes=(width, width))
        program, params, host_batch = common.one_real_batch(sized)
        update = make_update_fn(sized.update_options(), program.network)
        state = jax.device_put(init_learner_state(sized.update_options(), params,
                                                  jax.random.key(1)))
        batch = jax.device_put(host_batch)
        jax.block_until_ready(update(state, batch))
        update_s = _median_time(lambda: jax.block_until_ready(update(state, batch)), 30)
        params = state.params
        payload = serialize_policy(params)
        serialize_s = _median_time(lambda: serialize_policy(params), repeats)
        put_s = _median_time(lambda: ray.put(payload), repeats)
        # The learner's side: handing params to a running publisher.
        publisher = Publisher(lambda message: None, lambda failure: None)
        hand_over_s = _median_time(lambda: publisher.publish(params, 1), repeats)
        publisher.stop()
        publisher.thread.join(5)
        timer = ray.remote(_LoadTimer).options(
            num_cpus=0, runtime_env={"env_vars": actor_env_vars()}).remote((width, width))
        load_s = ray.get(timer.time_load.remote([ray.put(payload)], repeats))
        ray.kill(timer)
        rows.append({
            "hidden_sizes": [width, width], "payload_bytes": len(payload),
            "update_alone_s": update_s, "learner_hand_over_s": hand_over_s,
            "publisher_serialize_s": serialize_s, "publisher_put_s": put_s,
            "actor_load_s": load_s,
            "learner_critical_path_fraction": hand_over_s / update_s,
            "publish_and_load_fraction": (hand_over_s + serialize_s + put_s + load_s) / update_s,
        })
    return rows


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-env-steps", type=int, default=60_000,
                        help="per host-env run (the gymnax runs take 5x this)")
    parser.add_argument("--warmup", type=int, default=5, help="updates left out of the rate")
    parser.add_argument("--python-step-ms", type=float, default=0.2)
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS),
                        help="env ids to compare the backends on")
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    common.configure_jax()
    import ray

    if __name__ in sys.modules and __name__ != "__main__":
        # Imported by name: Ray processes cannot import it, so its code travels by value
        # (a script, or a module loaded from its file, travels by value anyway).
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.envs.registry import register_host_env
    from ppo_async.runtime.ray_transport import connect

    load_before = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load_before[0]:.2f} "
          f"{load_before[1]:.2f} {load_before[2]:.2f} before the runs")
    BusyPythonEnv.step_s = args.python_step_ms * 1e-3
    register_host_env(BUSY_ENV, BusyPythonEnv)
    base = AsyncActorLearnerConfig(
        num_actors=2, envs_per_actor=4, num_steps=64, num_epochs=2, num_minibatches=2,
        max_lead_steps=4 * 64, learner_timeout_s=120.0, total_env_steps=args.total_env_steps,
    )
    connected_here = connect(ray, base.ray_address)
    try:
        runs = []
        for name in args.envs:
            env_id, changes, scale = ENVS[name]
            config = dataclasses.replace(base, env_id=env_id, **changes,
                                         total_env_steps=args.total_env_steps * scale)
            row = {"env_id": env_id, "row": name, "changes": changes}
            for backend in ("threads", "ray"):
                row[backend] = steady_rate(dataclasses.replace(config, actor_backend=backend),
                                           args.warmup)
            row["ray_over_threads"] = (row["ray"]["env_steps_per_s"]
                                       / row["threads"]["env_steps_per_s"])
            runs.append(row)
            print(f"{name}: threads {row['threads']['env_steps_per_s']:.0f} env steps/s, "
                  f"ray {row['ray']['env_steps_per_s']:.0f} env steps/s "
                  f"= {row['ray_over_threads']:.2f}x; actor CPU-s per wall-s: threads "
                  f"{row['threads']['actor_cpu_per_wall_s']:.2f}, ray "
                  f"{row['ray']['actor_cpu_per_wall_s']:.2f}; load "
                  f"{os.getloadavg()[0]:.1f}")
        costs = transport_costs(ray, dataclasses.replace(base, env_id="CartPole-v1"))
        print(f"gymnax chunk through Ray: {costs['chunk_bytes']} bytes, pickle round trip "
              f"{costs['pickle_round_trip_s'] * 1e3:.3f} ms, ray.put+get "
              f"{costs['put_get_s'] * 1e3:.3f} ms, one actor call round trip "
              f"{costs['actor_call_round_trip_s'] * 1e3:.3f} ms")
        broadcasts = broadcast_costs(ray, base, args.widths, args.repeats)
        for row in broadcasts:
            print(f"broadcast {row['hidden_sizes']} MLP ({row['payload_bytes']} bytes): learner "
                  f"hand-over {row['learner_hand_over_s'] * 1e6:.1f} us = "
                  f"{row['learner_critical_path_fraction']:.2%} of an update "
                  f"({row['update_alone_s'] * 1e3:.2f} ms, target < 2%); publisher serialize "
                  f"{row['publisher_serialize_s'] * 1e3:.3f} ms + put "
                  f"{row['publisher_put_s'] * 1e3:.3f} ms; actor load "
                  f"{row['actor_load_s'] * 1e3:.3f} ms; all together "
                  f"{row['publish_and_load_fraction']:.1%} of an update")
    finally:
        if connected_here:
            ray.shutdown()
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    result = {"runs": runs, "transport_costs": costs, "broadcasts": broadcasts,
              "load_average_before": load_before, "load_average_after": load_after,
              "config": base.to_dict(), "python_step_ms": args.python_step_ms}
    common.save_result("bench_backends", args.out, __file__, argv, result)
    return result


if __name__ == "__main__":
    main()
