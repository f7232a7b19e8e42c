"""What bounds the shared sampler on the sleep env: one actor process's share, on one core.

The 64 x 1 row of docs/benchmarks.md runs two actor processes of 32 actors,
each pinned to a core, on an env whose step takes 2 ms (``host:sleepy`` of
``bench_scaling.py``, with its own ``step_async`` / ``step_wait``). This
script takes one such process's share and measures, each part in a fresh
process pinned to one CPU with an actor process's JAX settings (XLA's CPU
kernels single-threaded, no asynchronous dispatch), with no learner:

- ``sampler``: `LockstepSampler` as an actor process runs it: 32 actor
  threads, each handing its chunks (`HostRollout.chunk_steps`) to the sampler
  thread, which steps them in cohorts (`cohorts_for`: four for 32 actors) with one
  policy call per cohort.
- ``arrays K``: a model of a sampler without per-actor Python beyond the
  env's own calls: one thread steps the 32 envs in ``K`` cohorts, keeps the
  chunks' fields as ``[T, actors, E]`` arrays (one store per field and
  cohort), makes one policy call per cohort on the actors' observations as
  they lie (no stacking), and at each chunk's end does each actor's
  once-per-chunk work (episode statistics, the bootstrap value's call) in
  turn. It is not the runtime's code: it says how far a sampler that steps a
  cohort as arrays could go on this machine.
- ``env``: one env stepped back to back with a fixed action and no policy:
  the most one env gives (its sleep overshoots the step time).
- ``call``: the 32-row policy call alone, back to back, after the core
  slept 1.5 ms (as the sampler's core does while it waits for its envs) and
  after 1.5 ms of Python spinning, alternated, medians; with the calling
  thread's share of the process's CPU over the calls after a sleep.

    python experiments/sampler_bounds.py [--actors 32] [--step-ms 2] [--seconds 6]
        [--cohorts 2 4] [--cpu 0]

The ratio is env steps/s over ``actors / step time``; the CPU is the
process's (all threads) per env step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import common

WARM_UP_S = 3.0  # left out of each rate: the compiles and the first chunks


def _setup(args):
    """The host program and params of the sleep env, in this (pinned) process."""
    os.sched_setaffinity(0, {args.cpu})
    from ppo_async.runtime.process_transport import actor_env_vars

    os.environ.update(actor_env_vars())
    import jax
    import numpy as np

    import bench_scaling
    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.core.normalization import wrap_params
    from ppo_async.envs.host_rollout import HostRollout
    from ppo_async.envs.registry import register_host_env

    jax.config.update("jax_cpu_enable_async_dispatch", False)
    step_s = args.step_ms / 1e3
    register_host_env("sleepy", lambda n: bench_scaling.SleepyAsyncEnv(n, step_s))
    config = AsyncActorLearnerConfig(
        env_id="host:sleepy", num_actors=args.actors, envs_per_actor=1, num_steps=args.num_steps,
        num_minibatches=1, num_epochs=1, total_env_steps=10**9)
    rollout = HostRollout(config)
    shape = rollout.observation_shape
    params = wrap_params(jax.jit(rollout.network.init)(jax.random.key(0),
                                                       np.zeros((1, *shape), np.float32)),
                         shape, rollout.options)
    return rollout, params, lambda n: bench_scaling.SleepyAsyncEnv(n, step_s)


def _window(count, warm_up_s: float, seconds: float) -> tuple[float, float]:
    """(env steps/s, CPU us per env step) over ``seconds`` after ``warm_up_s``."""
    time.sleep(warm_up_s)
    steps0, t0, cpu0 = count(), time.perf_counter(), time.process_time()
    time.sleep(seconds)
    steps1, t1, cpu1 = count(), time.perf_counter(), time.process_time()
    return (steps1 - steps0) / (t1 - t0), (cpu1 - cpu0) / max(steps1 - steps0, 1) * 1e6


def run_sampler(args) -> dict:
    """The runtime's `LockstepSampler` with ``args.actors`` actor threads."""
    import jax

    from ppo_async.envs.program import AttachedCarry
    from ppo_async.runtime.inference import LockstepSampler, RolloutStopped, cohorts_for

    rollout, params, _ = _setup(args)
    program = rollout.program()
    stopped = threading.Event()
    sampler = LockstepSampler(program.inference.fn, args.actors, stopped.is_set).start()
    counts = [0] * args.actors

    def actor(index: int) -> None:
        carry = AttachedCarry(program.reset(jax.random.key(index), jax.devices()[0]),
                              sampler.client(index))
        try:
            while not stopped.is_set():
                carry, trajectory, *_ = program.rollout(params, carry)
                counts[index] += trajectory.reward.size
        except RolloutStopped:
            pass

    threads = [threading.Thread(target=actor, args=(i,), daemon=True)
               for i in range(args.actors)]
    for thread in threads:
        thread.start()
    rate, cpu_us = _window(lambda: sum(counts), WARM_UP_S, args.seconds)
    stopped.set()
    for thread in [*threads, sampler.thread]:
        thread.join(timeout=5)
    return {"part": "sampler", "cohorts": cohorts_for(args.actors), "env_steps_per_s": rate,
            "cpu_us_per_step": cpu_us}


def run_arrays(args, cohorts: int) -> dict:
    """The model: ``cohorts`` cohorts of actors stepped as arrays by one thread."""
    rollout, params, make_env = _setup(args)  # first: it pins the process before JAX starts
    import jax
    import numpy as np

    from ppo_async.envs.host_rollout import episode_statistics

    policy, steps = rollout.policy, args.num_steps
    envs = [make_env(1) for _ in range(args.actors)]
    obs = np.stack([env.reset(i) for i, env in enumerate(envs)])  # [N, 1, obs]
    keys = np.array(jax.random.key_data(jax.random.split(jax.random.key(0), args.actors)))
    n, size = args.actors, policy.num_envs * policy.columns
    chunk = {"obs": np.empty((steps + 1, *obs.shape), np.float32),
             "packed": np.empty((steps, n, 1, policy.columns), np.float32),
             "reward": np.empty((steps, n, 1), np.float32),
             "terminated": np.empty((steps, n, 1), bool),
             "truncated": np.empty((steps, n, 1), bool)}
    chunk["obs"][0] = obs
    episode_return, episode_length = np.zeros((n, 1), np.float32), np.zeros((n, 1), np.int32)
    groups = np.array_split(np.arange(n), cohorts)
    t_of = [0] * cohorts
    done_steps, marks, start = 0, [], time.perf_counter()
    while time.perf_counter() - start < WARM_UP_S + args.seconds:
        for c, idx in enumerate(groups):
            t = t_of[c]
            if t:  # the cohort's previous step: each env's own call, then one store per field
                got = [envs[i].step_wait() for i in idx]
                chunk["obs"][t, idx] = obs[idx] = np.stack([g[0] for g in got])
                for j, field in enumerate(("reward", "terminated", "truncated"), start=1):
                    chunk[field][t - 1, idx] = np.stack([g[j] for g in got])
                truncated = chunk["truncated"][t - 1, idx] & ~chunk["terminated"][t - 1, idx]
                if truncated.any():  # the final observations' value, one call for the cohort
                    final = np.stack([g[4] for g in got])
                    np.asarray(policy.value(params, None, final.reshape(-1, *final.shape[2:])))
                done_steps += len(idx)
                if t == steps:  # each actor's once-per-chunk work, in turn
                    for i in idx:
                        done = chunk["terminated"][:, i] | chunk["truncated"][:, i]
                        stats = episode_statistics(chunk["reward"][:, i], done,
                                                   episode_return[i], episode_length[i])
                        episode_return[i], episode_length[i] = stats[2], stats[3]
                        np.asarray(policy.value(params, None, obs[i]))
                    chunk["obs"][0, idx] = obs[idx]
                    t = 0
            row = np.asarray(policy.act(params, None, obs, None, keys))  # every actor's row
            packed = row[idx, :size].reshape(len(idx), 1, policy.columns)
            keys[idx] = row[idx, size:].view(np.uint32)
            chunk["packed"][t, idx] = packed
            actions = policy.actions(packed.reshape(-1, policy.columns)).reshape(len(idx), 1)
            for j, i in enumerate(idx):
                envs[i].step_async(actions[j])
            t_of[c] = t + 1
        marks.append((time.perf_counter(), done_steps, time.process_time()))
    window = [m for m in marks if m[0] - start >= WARM_UP_S]
    (t0, s0, c0), (t1, s1, c1) = window[0], window[-1]
    return {"part": "arrays", "cohorts": cohorts, "env_steps_per_s": (s1 - s0) / (t1 - t0),
            "cpu_us_per_step": (c1 - c0) / max(s1 - s0, 1) * 1e6}


def run_env(args) -> dict:
    """One env, ``step_async`` then ``step_wait``, back to back with a fixed action."""
    import numpy as np

    _, _, make_env = _setup(args)
    env, action, count = make_env(1), np.zeros(1, np.int32), [0]
    env.reset(0)
    stopped = threading.Event()

    def loop() -> None:
        while not stopped.is_set():
            env.step_async(action)
            env.step_wait()
            count[0] += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    rate, cpu_us = _window(lambda: count[0], 1.0, min(args.seconds, 3.0))
    stopped.set()
    thread.join(timeout=5)
    # One env's rate, scaled to the actors' envs: what they would give if each did as well.
    return {"part": "env", "cohorts": 0, "env_steps_per_s": rate * args.actors,
            "cpu_us_per_step": cpu_us}


def run_call(args) -> dict:
    """The ``args.actors``-row policy call, back to back, after the core slept 1.5 ms and
    after 1.5 ms of Python spinning; and the calling thread's share of the process's CPU
    over the calls after a sleep (1.0: no other thread of XLA's worked for them)."""
    import numpy as np

    rollout, params, _ = _setup(args)
    per_actor = [(None, np.zeros((1, *rollout.observation_shape), np.float32), None,
                  np.zeros(2, np.uint32)) for _ in range(args.actors)]
    call = rollout.program().inference.fn
    for _ in range(200):
        call(params, per_actor)
    times = {"back_to_back": [], "after_sleep": [], "after_spin": []}
    thread_cpu = process_cpu = 0.0
    for _ in range(10):
        for kind in times:
            for _ in range(200):
                if kind == "after_sleep":
                    time.sleep(0.0015)
                elif kind == "after_spin":
                    until = time.perf_counter() + 0.0015
                    while time.perf_counter() < until:
                        pass
                t, thread0, process0 = time.perf_counter(), time.thread_time(), time.process_time()
                call(params, per_actor)
                times[kind].append(time.perf_counter() - t)
                if kind == "after_sleep":
                    thread_cpu += time.thread_time() - thread0
                    process_cpu += time.process_time() - process0
    return {"part": "call", **{f"{kind}_us": float(np.median(v) * 1e6)
                               for kind, v in times.items()},
            "calling_thread_cpu_share": thread_cpu / process_cpu if process_cpu else None}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=32)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--num-steps", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--cohorts", type=int, nargs="+", default=[2, 4],
                        help="cohorts of the arrays model")
    parser.add_argument("--cpu", type=int, default=0, help="the CPU each part runs on")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.actors < 1 or args.step_ms <= 0 or args.seconds <= 0 or min(args.cohorts) < 1:
        parser.error("--actors, --step-ms, --seconds and --cohorts must be positive")
    if args.one is not None:  # one part, in the fresh process main() started for it
        part, _, cohorts = args.one.partition(":")
        row = {"sampler": lambda: run_sampler(args), "call": lambda: run_call(args),
               "env": lambda: run_env(args),
               "arrays": lambda: run_arrays(args, int(cohorts or 2))}[part]()
        print(json.dumps(row))
        return row
    load_before = os.getloadavg()[0]
    common_argv = ["--actors", str(args.actors), "--step-ms", str(args.step_ms),
                   "--num-steps", str(args.num_steps), "--seconds", str(args.seconds),
                   "--cpu", str(args.cpu)]
    ideal = args.actors / (args.step_ms / 1e3)
    rows = []
    for part in ["env", "sampler", *(f"arrays:{k}" for k in args.cohorts), "call"]:
        row = common.run_child([__file__, "--one", part, *common_argv], part, timeout_s=600)
        if "env_steps_per_s" in row:
            row["ratio"] = row["env_steps_per_s"] / ideal
            what = ("one env alone, x actors" if row["part"] == "env"
                    else f"{row['part']} ({row['cohorts']} cohorts)")
            print(f"{what:>24}: {row['env_steps_per_s']:>8,.0f} "
                  f"env steps/s, {row['ratio']:.2f} of ideal ({ideal:,.0f}), "
                  f"{row['cpu_us_per_step']:.1f} us of CPU per env step")
        else:
            share = row["calling_thread_cpu_share"]
            print(f"    call ({args.actors} rows): {row['back_to_back_us']:.0f} us back to back, "
                  f"{row['after_sleep_us']:.0f} us after the core slept 1.5 ms, "
                  f"{row['after_spin_us']:.0f} us after 1.5 ms of Python spinning (medians); "
                  f"the calling thread's share of the CPU after a sleep: "
                  f"{'n/a' if share is None else f'{share:.2f}'}")
        rows.append(row)
    result = {"rows": rows, "ideal_env_steps_per_s": ideal}
    common.save_with_load("sampler_bounds", args.out, __file__, argv, result, load_before)
    return result


if __name__ == "__main__":
    main()
