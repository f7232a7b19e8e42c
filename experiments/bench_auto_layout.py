"""The default layout (``actor_backend='auto'``, ``sampler='auto'``) against the hand-picked ones.

For each env, every layout a user could pick by hand (thread actors, actor
processes, the shared sampler with either, env workers; for gymnax the
learner's program, thread actors and processes) and the default, nothing set,
each trains in a fresh process; the row is the steady env steps/s after the
first ``--warm-up-s`` seconds (the compiles and the process starts), over
``--seconds``. The table gives each env's best hand-picked layout, the
default's choice and its ratio to that best (target >= 0.9), and what the
default's probe cost before the run (target <= 1 s).

Envs: MuJoCo Hopper without a preset; pure-Python envs whose step holds the GIL
for 0.2 ms, 10 us and no time beyond the step's own Python; an env that sleeps 2 ms (releasing the GIL, as a
simulator in C does) at 64 x 1 and 16 x 4; gymnax and gymnasium CartPole.

    python experiments/bench_auto_layout.py [--envs ...] [--layouts ...] [--seconds 6]
        [--warm-up-s 6]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import common

OBS_SIZE, EPISODE_STEPS = 4, 200

ENVS = {  # name -> (env id, num_actors, envs_per_actor)
    "hopper": ("gymnasium:Hopper-v5", 2, 4),
    "python-0.2ms": ("host:python-busy-200", 2, 4),
    "python-10us": ("host:python-busy-10", 2, 4),
    "python-free": ("host:python-free", 2, 4),
    "sleep-2ms-64x1": ("host:sleepy-2000", 64, 1),
    "sleep-2ms-16x4": ("host:sleepy-2000", 16, 4),
    "gymnax-cartpole": ("CartPole-v1", 2, 4),
    "gymnasium-cartpole": ("gymnasium:CartPole-v1", 2, 4),
}
HOST_LAYOUTS = {  # name -> the fields a user sets by hand
    "threads": dict(actor_backend="threads", sampler="actors"),
    "processes": dict(actor_backend="processes", sampler="actors"),
    "threads-shared": dict(actor_backend="threads", sampler="shared"),
    "processes-shared": dict(actor_backend="processes", sampler="shared"),
    "env-workers": dict(actor_backend="threads", sampler="actors", env_workers=1),
}
GYMNAX_LAYOUTS = {
    "learner": dict(actor_backend="threads", sampler="learner"),
    "threads": dict(actor_backend="threads", sampler="shared"),
    "processes": dict(actor_backend="processes", sampler="actors"),
}


class ToyEnv:
    """``E`` envs of noise observations and 200-step episodes; ``step`` costs ``cost_s``:
    asleep (the GIL released, as a simulator in C) or spinning in Python (the GIL held)."""

    observation_shape = (OBS_SIZE,)

    def __init__(self, num_envs: int, cost_s: float, sleeps: bool):
        import gymnasium
        import numpy as np

        self.action_space = gymnasium.spaces.Discrete(2)
        self.num_envs, self.cost_s, self.sleeps = num_envs, cost_s, sleeps
        self.rng = np.random.default_rng(0)
        self.t = np.zeros(num_envs, np.int32)

    def reset(self, seed: int):
        import numpy as np

        self.rng = np.random.default_rng(seed)
        self.t[:] = 0
        return self.rng.standard_normal((self.num_envs, OBS_SIZE)).astype("float32")

    def step(self, actions):
        import numpy as np

        if self.sleeps:  # once for the batch, as a vectorised simulator
            time.sleep(self.cost_s)
        else:  # each env's step in Python
            end = time.perf_counter() + self.cost_s * self.num_envs
            while time.perf_counter() < end:
                pass
        self.t += 1
        truncated = self.t >= EPISODE_STEPS
        self.t[truncated] = 0
        obs = self.rng.standard_normal((self.num_envs, OBS_SIZE)).astype("float32")
        reward = (np.asarray(actions) == 1).astype("float32")
        return obs, reward, np.zeros(self.num_envs, bool), truncated, obs


def register_toy_envs() -> None:
    from ppo_async.envs.registry import register_host_env

    register_host_env("python-busy-200", lambda n: ToyEnv(n, 200e-6, sleeps=False))
    register_host_env("python-busy-10", lambda n: ToyEnv(n, 10e-6, sleeps=False))
    register_host_env("python-free", lambda n: ToyEnv(n, 0.0, sleeps=False))
    register_host_env("sleepy-2000", lambda n: ToyEnv(n, 2e-3, sleeps=True))


def one_run(env: str, layout: str, seconds: float, warm_up_s: float) -> dict:
    """Steady env steps/s of one `train` of ``env`` with ``layout`` (``default``: nothing set)."""
    from ppo_async import AsyncActorLearnerConfig, StopTraining, train
    from ppo_async.runtime.layout import resolve_layout

    register_toy_envs()
    env_id, num_actors, envs_per_actor = ENVS[env]
    layouts = GYMNAX_LAYOUTS if env.startswith("gymnax") else HOST_LAYOUTS
    fields = {} if layout == "default" else layouts[layout]
    config = AsyncActorLearnerConfig(
        env_id=env_id, num_actors=num_actors, envs_per_actor=envs_per_actor,
        total_env_steps=num_actors * envs_per_actor * 64 * 100_000, learner_timeout_s=120.0,
        **fields)
    probe_start = time.perf_counter()
    decided = resolve_layout(config)  # what train resolves again (its probe timed here)
    probe_s = time.perf_counter() - probe_start
    marks: list[tuple[float, int]] = []
    start = time.perf_counter()

    def steady_marks() -> list[tuple[float, int]]:
        # The learner's program passes its updates on a call at a time: a mark per call.
        calls = (common.last_mark_of_each_call(marks) if decided.collection == "learner"
                 else marks)
        return [mark for mark in calls if mark[0] - start >= warm_up_s]

    def on_update(metrics):
        marks.append((time.perf_counter(), int(metrics["env_steps"])))
        if marks[-1][0] - start >= warm_up_s + seconds and len(steady_marks()) >= 3:
            raise StopTraining

    report = train(config, progress=False, on_update=on_update).report
    steady = steady_marks()
    (t0, s0), (t1, s1) = steady[0], steady[-1]
    return {"env": env, "layout": layout, "env_steps_per_s": (s1 - s0) / (t1 - t0),
            "resolved": report.layout, "describe": decided.describe(),
            "resolve_s": probe_s, "probe_s": decided.probe.seconds if decided.probe else 0.0,
            "updates": report.updates}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", choices=list(ENVS), default=list(ENVS))
    parser.add_argument("--layouts", nargs="+", default=None,
                        help="the hand-picked layouts to run (default: every one of each env)")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warm-up-s", type=float, default=6.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", nargs=2, metavar=("ENV", "LAYOUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_run(*args.child, args.seconds, args.warm_up_s)))
        return
    common.configure_jax()
    load_before = os.getloadavg()[0]
    rows, table = [], []
    for env in args.envs:
        layouts = [name for name in (GYMNAX_LAYOUTS if env.startswith("gymnax") else HOST_LAYOUTS)
                   if args.layouts is None or name in args.layouts]
        if not layouts:
            parser.error(f"--layouts {' '.join(args.layouts)}: none is a layout of {env}")
        by_layout = {}
        for layout in [*layouts, "default"]:
            row = common.run_child(
                [__file__, "--child", env, layout, "--seconds", str(args.seconds),
                 "--warm-up-s", str(args.warm_up_s)], f"{env} {layout}")
            rows.append(row)
            by_layout[layout] = row
            print(f"{env:20s} {layout:18s} {row['env_steps_per_s']:10.0f} env steps/s",
                  flush=True)
        best = max(layouts, key=lambda name: by_layout[name]["env_steps_per_s"])
        default = by_layout["default"]
        ratio = default["env_steps_per_s"] / by_layout[best]["env_steps_per_s"]
        table.append([env, best, f"{by_layout[best]['env_steps_per_s']:.0f}",
                      default["describe"], f"{default['env_steps_per_s']:.0f}", f"{ratio:.2f}",
                      f"{default['probe_s']:.2f}"])
    header = ["env", "best by hand", "env steps/s", "default (its line)", "env steps/s",
              "default / best", "probe s"]
    print(common.markdown_table(header, table))
    common.save_with_load("bench_auto_layout", args.out, __file__, argv,
                          {"rows": rows, "table": [dict(zip(header, r)) for r in table]},
                          load_before)


if __name__ == "__main__":
    main(sys.argv[1:])
