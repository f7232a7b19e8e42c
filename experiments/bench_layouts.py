"""Env steps/s of one batch size spread over different actor layouts (a gymnax env).

Every layout trains the default config's batch of 512 env steps per update
(``num_actors x envs_per_actor x num_steps``) with the default PPO settings,
so that the envs, the steps and the update are the same and only the split
into actors differs, on one gymnax env (``--env-id``, CartPole-v1 by
default; the network is the default for its observations: the MinAtar
torso for an image). Each row is a fresh process; layouts and the two
inference modes alternate seed by seed:

- ``batched``: ``batch_inference=True, sampler='shared'``, the actors' chunks
  are one rollout program per actor device, called from one thread;
- ``per-actor``: ``batch_inference=False, sampler='shared'``, each actor runs
  its own rollout, all of them called in turn from one thread;
- ``threads``: ``batch_inference=False, sampler='actors'``, each actor runs
  its own rollout from a thread of its own;
- ``learner``: ``sampler='learner'``, the learner's program collects every
  actor's chunk (one rollout of all their envs), up to 64 updates a call
  (its rate runs from the end of a call: `common.last_mark_of_each_call`).

A row reports the steady env steps/s (from the first update at or past a
quarter of the budget to the last, start-up excluded) and the time from
``train()`` to the first completed update (compiling included; no
compilation cache). The summary is each layout's median rate as a ratio of
``1 x 8 batched`` in the same script run.

With ``--rollout-calls N`` it first times, in this process, the programs
behind the two modes for each layout: the milliseconds of one chunk of
every actor (512 env steps, waited for) as each actor's own rollout called
in turn, as the fused program ``batch_inference`` runs (the actors' carries
on an actor axis, `ppo_async.envs.gymnax_env.make_rollout(actor_axis=True)`),
and as the per-actor rollout under ``jax.vmap`` (what the fused program
replaced), in alternating rounds, medians over the rounds.

    python experiments/bench_layouts.py [--env-id CartPole-v1] [--layouts 1x8 2x4 4x2 8x1]
        [--seeds 0 1] [--modes batched per-actor threads] [--total-env-steps 400000]
        [--rollout-calls 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import common

BATCH = 512


MODES = {"batched": dict(batch_inference=True, sampler="shared"),
         "per-actor": dict(batch_inference=False, sampler="shared"),
         "threads": dict(batch_inference=False, sampler="actors"),
         "learner": dict(sampler="learner")}


def one_run(env_id: str, num_actors: int, envs_per_actor: int, mode: str, seed: int,
            total_env_steps: int) -> dict:
    """Steady env steps/s and time to the first update of one `train` (this process drives it)."""
    from ppo_async import AsyncActorLearnerConfig, train

    config = AsyncActorLearnerConfig(
        env_id=env_id, num_actors=num_actors, envs_per_actor=envs_per_actor,
        num_steps=BATCH // (num_actors * envs_per_actor), total_env_steps=total_env_steps,
        seed=seed, **MODES[mode],
    )
    marks: list[tuple[float, int]] = []
    start = time.perf_counter()
    train(config, progress=False,
          on_update=lambda m: marks.append((time.perf_counter(), int(m["env_steps"]))))
    (t0, s0), (t1, s1) = common.steady_span(config, marks, total_env_steps)
    return {"env_id": env_id, "num_actors": num_actors, "envs_per_actor": envs_per_actor,
            "num_steps": config.num_steps, "batch_inference": config.batch_inference,
            "sampler": config.sampler,
            "env_steps_per_s": (s1 - s0) / (t1 - t0),
            "first_update_s": marks[0][0] - start, "wall_s": time.perf_counter() - start}


def time_rollouts(env_id: str, layouts: list[tuple[int, int]], calls: int,
                  rounds: int = 5) -> dict:
    """Per layout, ms per chunk of every actor (512 env steps) of each way to run it (docstring)."""
    import jax
    import jax.numpy as jnp

    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.networks.actor_critic import init_params

    cpu = jax.devices("cpu")[0]
    timings: dict[str, dict[str, float]] = {}
    for actors, envs in layouts:
        config = AsyncActorLearnerConfig(env_id=env_id, num_actors=actors,
                                         envs_per_actor=envs,
                                         num_steps=BATCH // (actors * envs))
        program = make_actor_program(config)
        params = init_params(program.network, jax.random.key(0), program.observation_shape)
        carries = [program.reset(jax.random.key(i), cpu) for i in range(actors)]
        vmapped = jax.jit(lambda p, cs: jax.vmap(program.rollout, in_axes=(None, 0))(
            p, jax.tree.map(lambda *leaves: jnp.stack(leaves), *cs)))
        ways = {
            "own rollouts": lambda: [program.rollout(params, c) for c in carries],
            "fused": lambda: program.inference.fn(params, [(c,) for c in carries]),
            "vmapped": lambda: vmapped(params, tuple(carries)),
        }
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for name, fn in ways.items():
            jax.block_until_ready(fn())  # compiled before any timing
        for _ in range(rounds):
            for name, fn in ways.items():
                start = time.perf_counter()
                for _ in range(calls):
                    jax.block_until_ready(fn())
                samples[name].append((time.perf_counter() - start) / calls * 1e3)
        timings[f"{actors}x{envs}"] = {n: statistics.median(v) for n, v in samples.items()}
        print(f"{actors}x{envs}: ms per chunk of every actor: " + ", ".join(
            f"{n} {ms:.3f}" for n, ms in timings[f"{actors}x{envs}"].items()))
    return timings


def _layout(text: str) -> tuple[int, int]:
    actors, envs = (int(x) for x in text.split("x"))
    if BATCH % (actors * envs):
        raise argparse.ArgumentTypeError(f"{text}: actors x envs must divide {BATCH}")
    return actors, envs


def _check_env_id(parser: argparse.ArgumentParser, env_id: str) -> None:
    """Exit with the usage line unless ``env_id`` is a gymnax id the config accepts."""
    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.envs.registry import GYMNAX, split_env_id
    from ppo_async.errors import ConfigError

    try:
        AsyncActorLearnerConfig(env_id=env_id)
    except ConfigError as error:
        parser.error(str(error))
    if split_env_id(env_id)[0] != GYMNAX:
        parser.error(f"--env-id {env_id!r}: layouts are compared on gymnax envs (no prefix), "
                     "whose actors share one rollout program")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="CartPole-v1", help="a gymnax env id")
    parser.add_argument("--layouts", type=_layout, nargs="+",
                        default=[(1, 8), (2, 4), (4, 2), (8, 1)],
                        help="ACTORSxENVS, each dividing the batch of 512")
    parser.add_argument("--modes", nargs="+", choices=list(MODES),
                        default=["batched", "per-actor"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--total-env-steps", type=int, default=400_000)
    parser.add_argument("--rollout-calls", type=int, default=0,
                        help="first time each layout's rollout programs, this many calls a "
                             "round (0: do not)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.one is not None:  # a row, in the fresh process main() started for it
        actors, envs, mode, seed = args.one.split(",")
        print(json.dumps(one_run(args.env_id, int(actors), int(envs), mode,
                                 int(seed), args.total_env_steps)))
        return {}
    _check_env_id(parser, args.env_id)  # once, here: every row's process gets a checked id
    load_before = os.getloadavg()[0]
    env = common.env_without_compile_cache()
    rollouts = (time_rollouts(args.env_id, args.layouts, args.rollout_calls)
                if args.rollout_calls else None)
    rows = []
    for seed in args.seeds:
        for actors, envs in args.layouts:
            for mode in args.modes:
                row = common.run_child(
                    [__file__, "--one", f"{actors},{envs},{mode},{seed}", "--env-id",
                     args.env_id, "--total-env-steps", str(args.total_env_steps)],
                    f"{actors}x{envs} {mode}", env=env, timeout_s=900)
                row.update(mode=mode, seed=seed, load_average_1_min=os.getloadavg()[0])
                rows.append(row)
                print(f"seed {seed} {actors}x{envs} {mode:>9}: "
                      f"{row['env_steps_per_s']:>9,.0f} env steps/s, "
                      f"first update {row['first_update_s']:.2f} s")
    medians = {}
    for actors, envs in args.layouts:
        for mode in args.modes:
            mine = [r for r in rows if (r["num_actors"], r["envs_per_actor"], r["mode"])
                    == (actors, envs, mode)]
            medians[f"{actors}x{envs} {mode}"] = {
                "env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in mine),
                "first_update_s": statistics.median(r["first_update_s"] for r in mine)}
    base = medians.get(f"1x8 {args.modes[0]}") or next(iter(medians.values()))
    print(f"\n{args.env_id}, layout, mode: median env steps/s (ratio to the first layout), "
          "first update")
    for name, m in medians.items():
        m["ratio"] = m["env_steps_per_s"] / base["env_steps_per_s"]
        print(f"{name:>16}: {m['env_steps_per_s']:>9,.0f} ({m['ratio']:.2f}x), "
              f"{m['first_update_s']:.2f} s")
    result = {"env_id": args.env_id, "rows": rows, "medians": medians, "rollouts_ms": rollouts}
    common.save_with_load("bench_layouts", args.out, __file__, argv, result, load_before)
    return result


if __name__ == "__main__":
    main()
