"""Env workers against thread-stepped envs and Ray actors, on a MuJoCo preset and without a learner.

Two parts, each row in a fresh process (compiles included in the process,
left out of the rate: the first ``--skip`` updates or chunks are not timed):

1. **Training** (``train``, the preset's config, ``--seconds`` of steady
   updates per row): lock-step (``exact_policy_lag=0``, envs in the actors'
   threads), thread-stepped envs at the default exact lag 1
   (``env_workers=0``, the default), env workers (one per actor, two groups), actor
   processes (``actor_backend="processes"``; ``processes-unpinned``: with
   ``pin_actor_processes=False``) and Ray actor processes (``ray-unpinned``
   likewise; all ``env_workers=0``). Ratios: each against lock-step, and env workers and
   actor processes against Ray.
2. **Collection alone** (no learner, the preset's jitted policy with its
   initial params, ``num_actors`` actor threads each running its rollout in a
   loop): env steps/s with env workers, with thread-stepped envs, with the
   shared sampler (``sampler="shared"``: one thread steps every actor's envs)
   and with a process per actor (``processes``: each with an actor process's
   JAX settings, as ``actor_backend="processes"`` runs them),
   against the env library's own loops with random actions over the same
   envs: for gymnasium ids gymnasium's ``AsyncVectorEnv`` (one process per
   env, shared memory) and ``SyncVectorEnv`` (one thread), and this package's
   ``EnvWorkers`` alone; for envpool ids envpool's synchronous loop (``step``
   on all envs) and its asynchronous one (twice the envs, ``recv`` returning
   the first half ready, ``send`` to those).

    python experiments/bench_env_workers.py [--preset hopper] [--seconds 20]
        [--part train collect]
    python experiments/bench_env_workers.py --preset busy-python   # a Python env, GIL held
    python experiments/bench_env_workers.py --preset atari-pong --part collect

Prints each row and the ratios; writes results.json under
experiments/out/bench_env_workers/ (or ``--out``) with the load average
before and after and the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time

import common

from ppo_async.runtime.layout import env_workers_and_groups

TRAIN_MODES = {  # name -> config fields over the preset (whatever actors it chooses)
    "lock-step": dict(exact_policy_lag=0, actor_backend="threads", env_workers=0),
    "threads": dict(actor_backend="threads", env_workers=0),
    "env-workers": dict(actor_backend="threads", env_workers=1),  # one per actor, two groups
    "processes": dict(actor_backend="processes", env_workers=0),
    "processes-unpinned": dict(actor_backend="processes", env_workers=0,
                               pin_actor_processes=False),
    "ray": dict(actor_backend="ray", env_workers=0),
    "ray-unpinned": dict(actor_backend="ray", env_workers=0, pin_actor_processes=False),
}
COLLECT_MODES = ("env-workers", "threads", "shared", "processes", "random:EnvWorkers",
                 "random:AsyncVectorEnv", "random:SyncVectorEnv")
ENVPOOL_COLLECT_MODES = ("threads", "shared", "processes", "random:envpool", "random:envpool-async")


def collect_modes(preset: str) -> tuple[str, ...]:
    """The collection rows for the preset's env: envpool ids have no env workers and no
    gymnasium loops, but envpool's own."""
    return ENVPOOL_COLLECT_MODES if base_config(preset).env_id.startswith("envpool:") \
        else COLLECT_MODES


def base_config(preset: str):
    """The preset's config, or for ``busy-python`` the env of ``bench_backends.py``
    (0.2 ms of pure Python per env step, the GIL held) with its config there."""
    from ppo_async import AsyncActorLearnerConfig, preset as make_preset

    if preset != "busy-python":
        return make_preset(preset)
    from bench_backends import BUSY_ENV, BusyPythonEnv

    from ppo_async.envs.registry import register_host_env

    register_host_env(BUSY_ENV, BusyPythonEnv)
    return AsyncActorLearnerConfig(
        env_id=f"host:{BUSY_ENV}", num_actors=2, envs_per_actor=4, num_steps=64, num_epochs=2,
        num_minibatches=2)


def train_row(preset: str, mode: str, seconds: float, skip: int) -> dict:
    from ppo_async import StopTraining, train

    config = dataclasses.replace(base_config(preset), total_env_steps=10**9, seed=0,
                                 learner_timeout_s=120.0, **TRAIN_MODES[mode])
    marks: list[tuple[float, int]] = []
    rss: dict = {}

    def on_update(metrics):
        marks.append((time.perf_counter(), int(metrics["env_steps"])))
        if len(marks) > skip and marks[-1][0] - marks[skip][0] >= seconds:
            rss.update(common.rss_mb())  # the learner's process and its actor or worker processes
            raise StopTraining

    started = time.perf_counter()
    train(config, progress=False, on_update=on_update)
    (t0, s0), (t1, s1) = marks[skip], marks[-1]
    return {"part": "train", "mode": mode, "env_steps_per_s": (s1 - s0) / (t1 - t0),
            "updates": len(marks), "wall_s": time.perf_counter() - started,
            "layout": list(env_workers_and_groups(config)), "num_actors": config.num_actors,
            "envs_per_actor": config.envs_per_actor, "rss_mb": rss}


def collect_row(preset: str, mode: str, seconds: float, skip: int,
                actors: list[int] | None = None, barrier=None) -> dict:
    """One collection row: ``mode`` a random loop, actor threads (``threads``,
    ``env-workers``, ``shared``) or ``processes`` (each actor's thread in a process of its
    own, as ``actor_backend="processes"`` runs it). ``actors`` and ``barrier`` serve a
    process's share of that row: its actors' ids, and the barrier every process waits on
    before its timed window starts."""
    config = base_config(preset)
    envs = config.num_actors * config.envs_per_actor
    if mode.startswith("random:"):
        return random_row(config, mode.split(":")[1], envs, seconds)
    if mode == "processes":
        return processes_row(preset, config, seconds, skip)
    import jax

    from ppo_async.envs.host_rollout import HostRollout

    from ppo_async.envs.program import AttachedCarry
    from ppo_async.runtime.transport import shared_caller

    actors = list(range(config.num_actors)) if actors is None else actors
    config = dataclasses.replace(config, env_workers=1 if mode == "env-workers" else 0,
                                 sampler="shared" if mode == "shared" else "actors")
    # The groups a run's layout gives these workers (train pins them; this builds the program).
    config = dataclasses.replace(config, env_groups=env_workers_and_groups(config)[1])
    program = HostRollout(config).program()
    device = jax.devices("cpu")[0]
    params = jax.device_put(program.params_template, device)
    counts = {i: 0 for i in actors}
    stop = threading.Event()
    sampler = (shared_caller(config, program, config.num_actors, stop.is_set).start()
               if mode == "shared" else None)
    started = threading.Event()  # every actor has collected its first ``skip`` chunks
    warm = [0]
    errors: list[BaseException] = []

    def actor(i: int) -> None:
        carry = program.reset(jax.random.key(i), device)
        if sampler is not None:
            carry = AttachedCarry(carry, sampler.client(i))
        try:
            chunks = 0
            while not stop.is_set():
                carry = program.rollout(params, carry)[0]
                chunks += 1
                counts[i] += config.num_steps * config.envs_per_actor
                if chunks == skip:
                    with lock:
                        warm[0] += 1
                        if warm[0] == len(actors):
                            started.set()
        except BaseException as error:  # noqa: BLE001 - raised in the main thread below
            if not stop.is_set():  # a sampler's actor ends its chunk with RolloutStopped
                errors.append(error)
            started.set()
        finally:
            program.close(carry)

    lock = threading.Lock()
    threads = [threading.Thread(target=actor, args=(i,)) for i in actors]
    for t in threads:
        t.start()
    try:
        if not started.wait(timeout=300) or errors:
            raise RuntimeError("the actors did not start collecting") from (
                errors[0] if errors else None)
        if barrier is not None:
            barrier.wait(timeout=300)
        steps, begun, cpu = sum(counts.values()), time.perf_counter(), time.process_time()
        time.sleep(seconds)
        steps, elapsed = sum(counts.values()) - steps, time.perf_counter() - begun
        cores = (time.process_time() - cpu) / elapsed  # this process's threads, envpool's too
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        if sampler is not None:
            sampler.thread.join(timeout=60)
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError("an actor failed or did not stop") from (errors[0] if errors else None)
    return {"part": "collect", "mode": mode, "env_steps_per_s": steps / elapsed,
            "cores_busy": cores, "layout": list(env_workers_and_groups(config)), "envs": envs,
            "rss_mb": common.rss_mb()}


def _process_share(preset, actor, seconds, skip, barrier, results) -> None:
    """An actor process's share of the ``processes`` row (its environment set by the parent)."""
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)  # as an actor process runs
    try:
        results.put(collect_row(preset, "threads", seconds, skip, [actor], barrier))
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        results.put({"error": repr(error)})
        barrier.abort()


def processes_row(preset: str, config, seconds: float, skip: int) -> dict:
    """Collection with a process per actor, each started with an actor process's JAX
    settings (`ppo_async.runtime.process_transport.actor_env_vars`): the rates of windows
    that start together, summed."""
    import multiprocessing

    from ppo_async.runtime.process_transport import actor_env_vars

    os.environ.update(actor_env_vars())  # inherited by the spawned processes
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(config.num_actors), context.Queue()
    processes = [context.Process(target=_process_share,
                                 args=(preset, i, seconds, skip, barrier, results))
                 for i in range(config.num_actors)]
    for process in processes:
        process.start()
    try:
        shares = [results.get(timeout=600) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    failed = [share["error"] for share in shares if "error" in share]
    if failed:
        raise RuntimeError(f"an actor process failed: {failed[0]}")
    return {"part": "collect", "mode": "processes",
            "env_steps_per_s": sum(share["env_steps_per_s"] for share in shares),
            "cores_busy": sum(share["cores_busy"] for share in shares),
            "layout": shares[0]["layout"], "envs": config.num_actors * config.envs_per_actor,
            "rss_mb": {"process": common.rss_mb()["process"],
                       "children": [share["rss_mb"]["process"] for share in shares]}}


def random_row(config, loop: str, envs: int, seconds: float) -> dict:
    import gymnasium
    import numpy as np

    from ppo_async.envs.host import make_host_env
    from ppo_async.envs.registry import split_env_id

    name = split_env_id(config.env_id)[1]
    if loop.startswith("envpool"):
        return envpool_row(config, loop, envs, seconds)
    if loop != "EnvWorkers" and config.env_id.startswith("host:"):
        return {"part": "collect", "mode": f"random:{loop}", "env_steps_per_s": float("nan"),
                "envs": envs, "skipped": "a host: env has no gymnasium id"}
    if loop == "EnvWorkers":
        from ppo_async.envs.workers import EnvWorkers, portable_factory

        probe = make_host_env(config.env_id, 1)
        vec = EnvWorkers(config.env_id, envs, workers=config.num_actors, groups=1,
                         observation_shape=probe.observation_shape,
                         action_space=probe.action_space,
                         payload=portable_factory(config.env_id)[0])
        space = probe.action_space
        vec.reset(0)
        step = vec.step
    else:
        cls = {"AsyncVectorEnv": gymnasium.vector.AsyncVectorEnv,
               "SyncVectorEnv": gymnasium.vector.SyncVectorEnv}[loop]
        kwargs = {"shared_memory": True} if loop == "AsyncVectorEnv" else {}
        vec = cls([lambda: gymnasium.make(name)] * envs, **kwargs)
        space = vec.single_action_space
        vec.reset(seed=0)
        step = vec.step
    rng = np.random.default_rng(0)
    if hasattr(space, "n"):
        actions = rng.integers(0, space.n, envs).astype(np.int32)
    else:
        actions = np.stack([rng.uniform(space.low, space.high).astype(np.float32)
                            for _ in range(envs)])
    return timed_loop(lambda: step(actions), vec, loop, envs, seconds)


def timed_loop(step, vec, loop: str, envs: int, seconds: float, **extra) -> dict:
    """The row of a random-action loop: ``step()`` (``envs`` env steps) 50 times untimed, then
    for ``seconds``; ``vec`` is closed after the RSS is read."""
    for _ in range(50):
        step()
    steps, started, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        step()
        steps += envs
    rate = steps / (time.perf_counter() - started)
    cores = (time.process_time() - cpu) / (time.perf_counter() - started)  # not its workers'
    rss = common.rss_mb()
    vec.close()
    return {"part": "collect", "mode": f"random:{loop}", "env_steps_per_s": rate,
            "cores_busy": cores, "envs": envs, **extra, "rss_mb": rss}


def envpool_row(config, loop: str, envs: int, seconds: float) -> dict:
    """envpool's own loop with random actions: ``step`` on all ``envs`` (``envpool``), or
    ``2 x envs`` envs with ``recv`` returning the first ``envs`` ready (``envpool-async``)."""
    import numpy as np

    from ppo_async.envs.registry import envpool_make_kwargs, import_envpool, split_env_id

    envpool = import_envpool()
    pool_size = envs * (2 if loop == "envpool-async" else 1)
    vec = envpool.make(split_env_id(config.env_id)[1], env_type="gymnasium", num_envs=pool_size,
                       batch_size=envs, seed=0,
                       **envpool_make_kwargs(config.env_id, config.envpool_kwargs))
    rng = np.random.default_rng(0)
    actions = rng.integers(0, vec.action_space.n, envs).astype(np.int32)
    if loop == "envpool-async":
        vec.async_reset()

        def step():
            *_, info = vec.recv()
            vec.send(actions, info["env_id"])
    else:
        vec.reset()

        def step():
            vec.step(actions)
    return timed_loop(step, vec, loop, envs, seconds, pool_size=pool_size)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="hopper")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--skip", type=int, default=3)
    parser.add_argument("--part", nargs="+", choices=["train", "collect"],
                        default=["train", "collect"])
    parser.add_argument("--modes", nargs="+", default=None,
                        help=f"training modes to run (default all: {', '.join(TRAIN_MODES)})")
    parser.add_argument("--one", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.one is not None:
        part, mode = args.one
        row = (train_row if part == "train" else collect_row)(args.preset, mode, args.seconds,
                                                             args.skip)
        print(json.dumps(row))
        return {}
    load_before = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load_before:.2f}")
    rows = []
    for part in args.part:
        for mode in ((args.modes or TRAIN_MODES) if part == "train"
                     else collect_modes(args.preset)):
            row = common.run_child(
                [__file__, "--one", part, mode, "--preset", args.preset,
                 "--seconds", str(args.seconds), "--skip", str(args.skip)],
                f"{part} {mode}", env={**os.environ, "RAY_AUTH_MODE": "disabled"},
                timeout_s=900)
            rows.append(row)
            rss = row.get("rss_mb") or {}
            print(f"{part:8s} {mode:24s} {row['env_steps_per_s']:>10,.0f} env steps/s"
                  + (f"  layout {row['layout']}" if "layout" in row else "")
                  + (f"  {row['cores_busy']:.2f} cores" if "cores_busy" in row else "")
                  + (f"  RSS: this process {rss['process']:.0f} MiB, its children "
                     f"{', '.join(f'{c:.0f}' for c in rss['children']) or 'none'}"
                     if rss else ""))
    rate = {(r["part"], r["mode"]): r["env_steps_per_s"] for r in rows}
    ratios = {}
    if all(("train", mode) in rate for mode in TRAIN_MODES):
        for mode in ("threads", "env-workers", "processes", "processes-unpinned", "ray",
                     "ray-unpinned"):
            ratios[f"train {mode} / lock-step"] = rate["train", mode] / rate["train", "lock-step"]
        for mode in ("env-workers", "processes"):
            ratios[f"train {mode} / ray"] = rate["train", mode] / rate["train", "ray"]
    random_rates = [r for (part, m), r in rate.items()
                    if part == "collect" and m.startswith("random:") and r == r]  # not NaN
    if random_rates:
        for (part, mode), value in rate.items():
            if part == "collect" and not mode.startswith("random:"):
                ratios[f"collect {mode} / the fastest random loop"] = value / max(random_rates)
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x")
    result = {"preset": args.preset, "rows": rows, "ratios": ratios}
    common.save_with_load("bench_env_workers", args.out, __file__, argv, result, load_before)
    return result


if __name__ == "__main__":
    main()
