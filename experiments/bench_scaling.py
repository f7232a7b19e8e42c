"""Env steps/s against the number of actors, for a host env whose step takes a fixed time.

The env (``host:sleepy``, registered here) sleeps ``--step-ms`` per step of a
batch, releasing the GIL as a simulator in C would, so the ideal rate of
``N`` actors of ``E`` envs each is ``N * E / step time``: with nothing else
to pay, every actor would spend all its time inside its env's step. Each row
trains `ppo_async.train` (thread actors; actor processes with ``--backend
processes``; Ray process actors with ``--backend ray``) in a fresh process and reports the
steady rate (the updates after the first ``--skip`` ones, which include the
compile) and its ratio to the ideal.

    python experiments/bench_scaling.py [--actors 1 2 4 8 16 32 64] [--envs-per-actor 1]
        [--step-ms 2] [--seconds 8] [--backend threads|processes|ray]
        [--inference batched per-actor] [--env-groups G]

With thread actors each count runs twice by default, in alternation: with
batched inference (``batch_inference=True``, the default: one policy call
per env step for every actor waiting) and with a policy call per actor
(``per-actor``), so the script gives their ratio on the same machine and
load. Actor processes run one process per core by default (``actors_per_process``), and
their actors share batched calls within a process as thread actors do; Ray's hold one
actor each and always call their own.
The ratio falls with the number of actors when the runtime's per-actor cost
(a Python thread, its policy calls, its share of the GIL) and not the env
sets the pace.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import common

OBS_SIZE, EPISODE_STEPS = 4, 200


class SleepyEnv:
    """``E`` envs whose step sleeps a fixed time; observations are noise, episodes 200 steps."""

    observation_shape = (OBS_SIZE,)

    def __init__(self, num_envs: int, step_s: float):
        import gymnasium
        import numpy as np

        self.action_space = gymnasium.spaces.Discrete(2)
        self.num_envs, self.step_s = num_envs, step_s
        self.rng = np.random.default_rng(0)
        self.t = np.zeros(num_envs, np.int32)

    def _obs(self):
        return self.rng.standard_normal((self.num_envs, OBS_SIZE)).astype("float32")

    def reset(self, seed: int):
        import numpy as np

        self.rng = np.random.default_rng(seed)
        self.t[:] = 0
        return self._obs()

    def step(self, actions):
        time.sleep(self.step_s)
        return self._stepped(actions)

    def _stepped(self, actions):
        import numpy as np

        self.t += 1
        truncated = self.t >= EPISODE_STEPS
        self.t[truncated] = 0
        obs = self._obs()
        reward = (np.asarray(actions) == 1).astype("float32")
        return obs, reward, np.zeros(self.num_envs, bool), truncated, obs


class SleepyAsyncEnv(SleepyEnv):
    """`SleepyEnv` as a simulator that steps elsewhere (a process, a socket): ``step_async``
    starts the clock and returns, ``step_wait`` waits for what is left of the step time."""

    def step_async(self, actions):
        self.actions, self.due = actions, time.perf_counter() + self.step_s

    def step_wait(self):
        left = self.due - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return self._stepped(self.actions)


def one_run(num_actors: int, envs_per_actor: int, step_ms: float, seconds: float,
            num_steps: int, skip: int, backend: str = "threads",
            batch_inference: bool = True, env_workers: int | None = 0,
            actors_per_process: int | None = None, sampler: str | None = None,
            env_async: bool = False, pinned: bool = True, env_groups: int | None = None) -> dict:
    """Steady env steps/s of one `train` with ``num_actors`` actors (this process drives it)."""
    from ppo_async import AsyncActorLearnerConfig, StopTraining, train
    from ppo_async.envs.registry import register_host_env

    env_class = SleepyAsyncEnv if env_async else SleepyEnv
    register_host_env("sleepy", lambda n: env_class(n, step_ms / 1e3))
    config = AsyncActorLearnerConfig(
        env_id="host:sleepy", num_actors=num_actors, envs_per_actor=envs_per_actor,
        num_steps=num_steps, num_minibatches=1, num_epochs=1,
        total_env_steps=num_actors * envs_per_actor * num_steps * 100_000,
        learner_timeout_s=120.0, actor_backend=backend, batch_inference=batch_inference,
        env_workers=env_workers, env_groups=env_groups, actors_per_process=actors_per_process,
        sampler=sampler, pin_actor_processes=pinned,
        # Ray: the actors share the machine's cores (each a process), as threads do.
        ray_num_cpus_per_actor=min(1.0, (os.cpu_count() or 1) / num_actors),
    )
    marks: list[tuple[float, int]] = []
    start = time.perf_counter()

    rss: dict = {}
    child_cpu: list[dict[int, float]] = []  # at the window's first mark and at its last

    def on_update(metrics):
        marks.append((time.perf_counter(), int(metrics["env_steps"])))
        if len(marks) == skip + 1:
            child_cpu.append(common.children_cpu_s())
        if len(marks) > skip and marks[-1][0] - marks[skip][0] >= seconds:
            rss.update(common.rss_mb())  # the learner's process and its actor processes
            child_cpu.append(common.children_cpu_s())
            raise StopTraining

    report = train(config, progress=False, on_update=on_update).report
    (t0, s0), (t1, s1) = marks[skip], marks[-1]
    rate = (s1 - s0) / (t1 - t0)
    # Cores each child process (actor or env worker) used over the window.
    child_cores = [(child_cpu[1][pid] - cpu) / (t1 - t0)
                   for pid, cpu in child_cpu[0].items() if pid in child_cpu[1]]
    ideal = num_actors * envs_per_actor / (step_ms / 1e3)
    return {"backend": backend, "batch_inference": batch_inference, "num_actors": num_actors,
            "actors_per_process": (report.layout["actors_per_process"]
                                   if backend == "processes" else None),
            "envs_per_actor": envs_per_actor,
            "env_layout": [report.layout["env_workers"], report.layout["env_groups"]],
            "sampler": sampler, "env_async": env_async, "pinned": pinned,
            "step_ms": step_ms,
            "env_steps_per_s": rate, "ideal_env_steps_per_s": ideal, "ratio": rate / ideal,
            "rss_mb": rss, "child_cores": child_cores, "updates": report.updates, "wall_s": time.perf_counter() - start,
            "policy_lag_mean": report.policy_lag_mean}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--envs-per-actor", type=int, default=1)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--num-steps", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="steady seconds measured per row")
    parser.add_argument("--skip", type=int, default=3, help="first updates left out (compile)")
    parser.add_argument("--backend", choices=["threads", "processes", "ray"], default="threads",
                        help="actor_backend: thread actors, or Ray processes (a private local "
                             "instance per row)")
    parser.add_argument("--inference", nargs="+", choices=["batched", "per-actor"],
                        default=["batched", "per-actor"],
                        help="thread actors, and the actors of one actor process: "
                             "batch_inference on, off, or both (alternated)")
    parser.add_argument("--env-workers", default="0",
                        help="env_workers: 0 (the envs step in the actors' threads, the "
                             "default here), a number per actor, or auto")
    parser.add_argument("--env-groups", type=int, default=None,
                        help="env_groups: each actor's envs in this many double-buffered "
                             "groups (default: the config's)")
    parser.add_argument("--actors-per-process", type=int, default=None,
                        help="actor processes: actors in each (default: a process per core)")
    parser.add_argument("--sampler", choices=["auto", "actors", "shared"], default="auto",
                        help="sampler: each actor steps its envs, one sampler thread per "
                             "process steps them all, or the config's default (auto)")
    parser.add_argument("--env-async", action="store_true",
                        help="the env has its own step_async / step_wait (a simulator that "
                             "steps elsewhere): no thread blocks in its step")
    parser.add_argument("--unpinned", action="store_true",
                        help="actor processes: pin_actor_processes=False (the OS places them)")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.one is not None:  # a row, in the fresh process main() started for it
        print(json.dumps(one_run(args.one, args.envs_per_actor, args.step_ms, args.seconds,
                                 args.num_steps, args.skip, args.backend,
                                 args.inference == ["batched"],
                                 None if args.env_workers == "auto" else int(args.env_workers),
                                 args.actors_per_process,
                                 None if args.sampler == "auto" else args.sampler,
                                 args.env_async, not args.unpinned, args.env_groups)))
        return {}
    modes = args.inference if args.backend != "ray" else ["per-actor"]
    load_before = os.getloadavg()[0]
    rows = []
    for num_actors in args.actors:
        for mode in modes:
            row = common.run_child(
                [__file__, "--one", str(num_actors), "--envs-per-actor", str(args.envs_per_actor),
                 "--step-ms", str(args.step_ms), "--num-steps", str(args.num_steps),
                 "--seconds", str(args.seconds), "--skip", str(args.skip),
                 "--backend", args.backend, "--inference", mode,
                 "--env-workers", args.env_workers, "--sampler", args.sampler,
                 *(["--env-async"] if args.env_async else []),
                 *(["--unpinned"] if args.unpinned else []),
                 *([] if args.env_groups is None else ["--env-groups", str(args.env_groups)]),
                 *([] if args.actors_per_process is None else
                   ["--actors-per-process", str(args.actors_per_process)])],
                f"{num_actors} actors", env={**os.environ, "RAY_AUTH_MODE": "disabled"},
                timeout_s=600)
            rows.append(row)
            per_process = (f" ({row['actors_per_process']} per process)"
                           if row.get("actors_per_process") else "")
            print(f"{args.backend}{per_process} {mode:>9} sampler {args.sampler} "
                  f"{'async env ' if args.env_async else ''}"
                  f"{'unpinned ' if args.unpinned else ''}"
                  f"env workers {args.env_workers} groups {row['env_layout'][1]}: "
                  f"{num_actors:>3} actors x {args.envs_per_actor} env: "
                  f"{row['env_steps_per_s']:>9,.0f} env steps/s, "
                  f"ideal {row['ideal_env_steps_per_s']:>9,.0f} -> {row['ratio']:.2f}, "
                  f"RSS {row['rss_mb']['process'] + sum(row['rss_mb']['children']):,.0f} MiB "
                  f"({len(row['rss_mb']['children'])} child processes"
                  + (", cores each: " + ", ".join(f"{c:.2f}" for c in row["child_cores"])
                     if row["child_cores"] else "") + ")")
    result = {"rows": rows}
    common.save_with_load("bench_scaling", args.out, __file__, argv, result, load_before)
    return result


if __name__ == "__main__":
    main()
