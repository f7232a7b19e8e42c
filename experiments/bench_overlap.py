"""Overlap benchmark: asynchronous actors against lock-step, in the same run.

The IMPALA topology pays when collecting experience and learning can happen at
the same time. This script measures how much it pays on this machine:

1. Calibrate: a lock-step run on a host env of zero step cost measures the
   learner's update time ``U``; then the per-step cost of a host env whose
   step is a ``time.sleep`` (it releases the GIL, like a simulator in C) is
   tuned so that one actor collects one chunk in about ``U``.
2. Measure learner-consumed env steps/s on that env in lock-step mode
   (``max_lead_steps = num_steps``: actors collect, then the learner learns)
   and in async mode (the default lead of two chunks: actors collect the next
   chunk while the learner learns), 2 actors each. With collection time equal
   to update time, lock-step takes ``C + U`` per update and async
   ``max(C, U)``: the ceiling of the ratio is 2.
3. The same comparison for gymnasium's CartPole (``gymnasium:CartPole-v1``),
   untuned: its step is cheap Python that holds the GIL, so there is little
   collection time to hide.

On 2 cores every CPU-second an actor spends on its policy is taken from the
learner, so the learner is made the heavy side, as a large network would make
it: 256 x 256 MLPs and 16 epochs per update (actor inference is then ~1/48 of
the learner's arithmetic), and chunks of 64 envs x 16 steps, so the fixed cost
of a policy dispatch is paid over many envs. The learner runs on CPU device 1
and the actors on CPU device 0 (the learner-device / actor-device split of
docs/design.md, with ``--xla_force_host_platform_device_count=2``): on one shared CPU device an
actor's small policy call waited behind the learner's update work (measured
here: median 3 ms instead of 0.7 ms per call), which ate most of the overlap.

Rates are taken over the updates after ``--warmup`` (compilation), from the
learner's own clock; lock-step and async runs alternate over ``--rounds``
rounds and the medians are reported (the machine is shared with other
processes). Writes ``experiments/out/bench_overlap.json`` and a PNG next to
it, and prints the command that reproduces them::

    python experiments/bench_overlap.py
"""

from __future__ import annotations

import os

# An entry point: XLA flags must be set before JAX starts. Two host devices,
# so the learner and the actors each get their own.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    ).strip()

import argparse
import dataclasses
import functools
import json
import pathlib
import platform
import shlex
import sys
import time

import gymnasium
import jax
import numpy as np

from ppo_async import AsyncActorLearnerConfig, train
from ppo_async.envs.host_rollout import make_host_actor_program
from ppo_async.envs.registry import register_host_env

OUT_DIR = pathlib.Path(__file__).resolve().parent / "out"


class SleepEnv:
    """``E`` trivial envs stepped together; each batch step sleeps ``step_cost_s``.

    Stands in for a simulator that releases the GIL while it computes (a C
    extension, a physics engine). Observations are noise, the reward favours
    action 0, and episodes are truncated every ``episode_length`` steps so the
    bootstrap path runs too.
    """

    observation_shape = (4,)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, num_envs: int, step_cost_s: float = 0.0, episode_length: int = 200):
        self.num_envs, self.step_cost_s, self.episode_length = num_envs, step_cost_s, episode_length
        self.rng = np.random.default_rng(0)
        self.steps = np.zeros(num_envs, np.int64)

    def _obs(self) -> np.ndarray:
        return self.rng.normal(size=(self.num_envs, 4)).astype(np.float32)

    def reset(self, seed: int) -> np.ndarray:
        self.rng = np.random.default_rng(seed)
        self.steps[:] = 0
        return self._obs()

    def step(self, actions: np.ndarray):
        if self.step_cost_s > 0:
            time.sleep(self.step_cost_s)
        self.steps += 1
        truncated = self.steps >= self.episode_length
        final_obs = self._obs()
        self.steps[truncated] = 0
        reward = (actions == 0).astype(np.float32)
        return self._obs(), reward, np.zeros(self.num_envs, bool), truncated, final_obs


def use_sleep_env(step_cost_s: float) -> str:
    register_host_env("bench-sleep", functools.partial(SleepEnv, step_cost_s=step_cost_s))
    return "host:bench-sleep"


def timed_run(config: AsyncActorLearnerConfig, warmup: int) -> dict:
    """Train ``config`` and return its steady-state rates (after ``warmup`` updates)."""
    stamps: list[tuple[float, int, float]] = []  # (time, env_steps, learner_wait_s)

    def on_update(metrics):
        stamps.append((time.perf_counter(), int(metrics["env_steps"]),
                       float(metrics.get("learner_wait_s", 0.0))))

    report = train(config, progress=False, on_update=on_update).report
    (t0, steps0, wait0), (t1, steps1, wait1) = stamps[warmup - 1], stamps[-1]
    updates = len(stamps) - warmup
    window = np.array(stamps[warmup - 1:])
    # Learner time per update not spent waiting for experience: the update and
    # its bookkeeping. The median shrugs off other processes' bursts.
    busy = np.diff(window[:, 0]) - np.diff(window[:, 2])
    stats = report.actor_stats
    return {
        "env_steps_per_s": (steps1 - steps0) / (t1 - t0),
        "update_period_s": (t1 - t0) / updates,
        "learner_busy_s_per_update": float(np.median(busy)),
        "learner_wait_fraction": (wait1 - wait0) / (t1 - t0),
        "measured_updates": updates,
        "policy_lag_mean": report.policy_lag_mean,
        "policy_lag_max": report.policy_lag_max,
        # Whole run, compilation included: time per chunk an actor spent collecting.
        "actor_chunk_s_with_compile": float(np.mean([s.active_s / max(s.rollouts_sent, 1) for s in stats])),
        "actor_pause_fraction": float(np.mean([s.pause_s for s in stats])) / report.wall_time_s,
    }


def chunk_seconds(config: AsyncActorLearnerConfig, repeats: int = 5) -> float:
    """Median seconds one actor takes to collect one chunk, alone (no learner running)."""
    program = make_host_actor_program(config)
    device = jax.devices("cpu")[0]  # the actors' device
    params = jax.device_put(program.params_template, device)
    carry = program.reset(jax.random.key(0), device)
    carry = program.rollout(params, carry)[0]  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        carry, trajectory, _, _ = program.rollout(params, carry)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def compare(base: AsyncActorLearnerConfig, warmup: int, rounds: int) -> dict:
    """Lock-step and async runs of ``base``, alternated over ``rounds`` rounds.

    This machine is shared: other processes come and go. Alternating the modes
    and taking medians keeps a burst of load from deciding the ratio.
    """
    lock_step = dataclasses.replace(base, max_lead_steps=base.num_steps, broadcast_every=1)
    asynchronous = dataclasses.replace(base, max_lead_steps=None)
    assert lock_step.lock_step and not asynchronous.lock_step
    runs: dict[str, list[dict]] = {"lock_step": [], "async": []}
    for round_ in range(rounds):
        order = ["lock_step", "async"] if round_ % 2 == 0 else ["async", "lock_step"]
        for mode in order:
            config = lock_step if mode == "lock_step" else asynchronous
            runs[mode].append(timed_run(config, warmup))
    ratios = [a["env_steps_per_s"] / l["env_steps_per_s"]
              for a, l in zip(runs["async"], runs["lock_step"])]
    results = {
        mode: {"env_steps_per_s": float(np.median([r["env_steps_per_s"] for r in runs[mode]])),
               "rounds": runs[mode]}
        for mode in runs
    }
    results["async_over_lock_step"] = float(np.median(ratios))
    results["async_over_lock_step_per_round"] = ratios
    results["async_max_lead_steps"] = int(asynchronous.lead_steps)
    return results


def plot(results: dict, path: pathlib.Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = ["sleep_env", "gymnasium_cartpole"]
    labels = ["sleep env (tuned: collect = update)", "gymnasium CartPole-v1"]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for offset, mode in [(-0.2, "lock_step"), (0.2, "async")]:
        rates = [results[n][mode]["env_steps_per_s"] for n in names]
        ax.bar(x + offset, rates, 0.4, label=mode.replace("_", "-"))
    for i, n in enumerate(names):
        ax.annotate(f"{results[n]['async_over_lock_step']:.2f}x",
                    (x[i] + 0.2, results[n]["async"]["env_steps_per_s"]),
                    ha="center", va="bottom")
    ax.set_xticks(x, labels)
    ax.set_ylabel("learner-consumed env steps/s")
    ax.set_title("2 actors: async (lead 2 chunks) vs lock-step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs-per-actor", type=int, default=64)
    parser.add_argument("--num-steps", type=int, default=16)
    parser.add_argument("--num-epochs", type=int, default=16)
    parser.add_argument("--hidden-sizes", type=lambda v: tuple(int(h) for h in v.split(",")),
                        default=(256, 256), help="e.g. 256,256")
    parser.add_argument("--updates", type=int, default=20, help="measured updates per run")
    parser.add_argument("--rounds", type=int, default=3, help="lock-step/async pairs per env")
    parser.add_argument("--warmup", type=int, default=4, help="updates left out (compilation)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=OUT_DIR / "bench_overlap.json")
    args = parser.parse_args(argv)
    # Every run builds its update and policy functions afresh; the disk cache
    # spares recompiling them (compilation is left out of the rates anyway).
    jax.config.update("jax_compilation_cache_dir", str(OUT_DIR / "jax_cache"))
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])])

    base = AsyncActorLearnerConfig(
        env_id=use_sleep_env(0.0), num_actors=2, envs_per_actor=args.envs_per_actor,
        num_steps=args.num_steps, num_epochs=args.num_epochs,
        hidden_sizes=args.hidden_sizes, seed=args.seed,
        anneal_lr=False, learner_device="cpu:1", actor_device="cpu:0",
        total_env_steps=(args.warmup + args.updates) * 2 * args.envs_per_actor * args.num_steps,
    )

    # 1. Calibrate: update time U from a lock-step run with free env steps, then
    #    the sleep per step that makes one chunk take U.
    free = timed_run(dataclasses.replace(base, max_lead_steps=base.num_steps), args.warmup)
    update_s = free["learner_busy_s_per_update"]
    step_cost_s = 0.0
    for _ in range(3):  # time.sleep overshoots; correct against the measured chunk
        use_sleep_env(step_cost_s)
        chunk_s = chunk_seconds(base)
        step_cost_s = max(0.0, step_cost_s + (update_s - chunk_s) / base.num_steps)
    use_sleep_env(step_cost_s)
    chunk_s = chunk_seconds(base)
    print(f"calibration: learner update {update_s * 1e3:.1f} ms, env step cost "
          f"{step_cost_s * 1e3:.3f} ms -> one chunk {chunk_s * 1e3:.1f} ms alone", flush=True)

    # 2. and 3.
    results = {"sleep_env": compare(base, args.warmup, args.rounds)}
    results["gymnasium_cartpole"] = compare(
        dataclasses.replace(base, env_id="gymnasium:CartPole-v1"), args.warmup, args.rounds
    )

    record = {
        "command": command,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "jax": jax.__version__, "devices": [str(d) for d in jax.devices()]},
        "config": {"num_actors": base.num_actors, "envs_per_actor": base.envs_per_actor,
                   "num_steps": base.num_steps, "batch_size": base.batch_size,
                   "num_epochs": base.num_epochs, "num_minibatches": base.num_minibatches,
                   "hidden_sizes": list(base.hidden_sizes), "warmup_updates": args.warmup,
                   "learner_device": base.learner_device, "actor_device": base.actor_device,
                   "measured_updates": args.updates, "rounds": args.rounds},
        "calibration": {"learner_update_s": update_s, "env_step_cost_s": step_cost_s,
                        "chunk_s_alone": chunk_s},
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    png = args.out.with_suffix(".png")
    plot(results, png)

    for name in ("sleep_env", "gymnasium_cartpole"):
        r = results[name]
        print(f"{name:20s} lock-step {r['lock_step']['env_steps_per_s']:8.0f} steps/s | "
              f"async {r['async']['env_steps_per_s']:8.0f} steps/s | "
              f"async / lock-step = {r['async_over_lock_step']:.2f}x "
              "(median of rounds: "
              + ", ".join(f"{x:.2f}" for x in r["async_over_lock_step_per_round"]) + ")")
    print(f"wrote {args.out} and {png}")
    print(f"reproduce: {command}")


if __name__ == "__main__":
    main()
