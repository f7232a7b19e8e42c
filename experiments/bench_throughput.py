"""Steady-state throughput: `train()` against the synchronous twin's run phase.

Both train the default config (CartPole-v1, 2 actors x 4 envs x 64 steps, a
batch of 512, 4 epochs x 4 minibatches), each run in a FRESH process, modes
alternating seed by seed:

- ``twin``: ``jax.jit(make_train(config))`` is compiled first (timed apart),
  then run over the whole budget; its env steps/s is the budget over the run
  alone, compile excluded.
- ``async``: `ppo_async.train`, its default config; its env steps/s is
  measured from the first update at or past a quarter of the budget to the
  last update (start-up and the first compiles excluded), from the
  ``on_update`` timestamps. On a machine without a GPU the default collects
  in the learner's program (``sampler="auto"`` is ``"learner"`` there: see
  ``learner`` below, whose rule for the marks it follows).
- ``threads``: the same `train()` with ``sampler="shared"``: thread actors,
  every actor's chunk collected from one thread, each actor's program called
  in turn (the default before the learner's program was).

- ``async-1t``: the same `train()` with XLA's CPU ops single-threaded
  (``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false``): every actor and the
  learner is already a thread of its own, and on a small machine XLA's
  intra-op pool only adds hand-offs between them.
- ``async-unpipelined``: ``threads`` with the learner's pipelined
  readback off (``learner_loop(pipeline=False)``: every update read back
  before the next is dispatched), to measure what pipelining gives.
- ``async-processes``: the same `train()` with ``actor_backend="processes"``:
  each actor in a process of its own (one XLA thread, a GIL of its own),
  the learner alone in this one. CPU counts the actor processes too.
- ``async-own-device``: the same `train()` with the learner on a CPU device
  of its own (two CPU devices, ``jax_num_cpu_devices=2``;
  ``learner_device="cpu:1"``, the actors on ``cpu:0``). A CPU device runs its
  programs one at a time (``experiments/cpu_device_queue.py``); on two, the
  update and the rollouts may run at the same time.

- ``learner``: the same `train()` with ``sampler="learner"``: the learner's
  program collects the actors' chunks, up to 64 updates a call
  (`ppo_async.runtime.in_learner`), with the bits of thread actors that share
  their calls (``batch_inference=True``). A call's
  updates are read back together, so the rate runs from the end of the call
  that holds the quarter's update (the last of that call's marks) to the end.
- ``learner-in-turn``: the same with ``batch_inference=False``: each actor's
  rollout in turn inside the program, where ``learner`` rolls every actor's
  envs out as one (the bits of thread actors calling alone, ``threads``').
- ``learner-unpipelined``: ``learner`` with each call launched only once the
  last one's updates are passed on (``in_learner_loop(pipeline=False)``), to
  measure what launching it before them gives.

- ``fused-lag1``: not the runtime, a bound on what it could reach with its
  actors inside the learner's program: what `train()` builds (the actors'
  program, each actor's first carry, the update) as one jitted call per
  update that collects every actor's next chunk with the current params
  and updates on the batch collected one update earlier, launched from
  Python with its metrics read back every update, as a learner loop would.
  The rollouts and the update of a call do not depend on each other. Its
  bits are those of `train()`'s thread actors (``threads``) at the default
  exact lag of 1 (checked after the timing by running `train()`:
  ``same_params_as_train``). Measured as ``async``.
- ``fused-lag1-16``: the same, 16 updates per call (a ``lax.scan``; the
  metrics read back every 16 updates): what the launches cost.
- ``purejaxrl``: purejaxrl's own ``purejaxrl/ppo.py`` from the checkout
  given by ``--purejaxrl`` (its default CartPole config: 4 envs x 128 steps,
  the same batch of 512 and 4 epochs x 4 minibatches), one seed jitted as
  its ``__main__`` runs it (`purejaxrl_baseline.run_purejaxrl_once`); like the twin,
  compiled first and timed over its run alone.

Targets: async (and learner) / twin >= 1.0, async (and learner) / purejaxrl >= 1.2.
The machine's load average is printed with the figures: run it with nothing
else on the machine.

    python experiments/bench_throughput.py [--seeds 0 1 2] [--total-env-steps 500000]
    python experiments/bench_throughput.py --seeds 0 1 2 3 --modes twin async purejaxrl --purejaxrl ~/src/purejaxrl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import common


def _twin(total_env_steps: int, seed: int) -> dict:
    import jax

    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.sync import make_train, recent_return_mean

    config = AsyncActorLearnerConfig(total_env_steps=total_env_steps, seed=seed)
    start = time.perf_counter()
    compiled = jax.jit(make_train(config)).lower(jax.random.key(seed)).compile()
    compile_s = time.perf_counter() - start
    start, cpu_start = time.perf_counter(), common.cpu_seconds(children=True)
    result = jax.block_until_ready(compiled(jax.random.key(seed)))
    run_s, cpu_s = time.perf_counter() - start, common.cpu_seconds(children=True) - cpu_start
    steps = config.num_updates * config.batch_size
    return {"env_steps_per_s": steps / run_s, "compile_s": compile_s, "run_s": run_s,
            "cpu_s_per_100k_steps": cpu_s / steps * 1e5, "cores_busy": cpu_s / run_s,
            "final_return": recent_return_mean(jax.device_get(result.metrics))}


def _purejaxrl(folder: str, total_env_steps: int, seed: int) -> dict:
    import purejaxrl_baseline as baseline

    run = baseline.run_purejaxrl_once(baseline.purejaxrl_folder(folder), total_env_steps, seed)
    steps = run["updates"] * run["batch"]
    return {"env_steps_per_s": steps / run["run_s"], "compile_s": run["compile_s"],
            "run_s": run["run_s"], "cpu_s_per_100k_steps": run["run_cpu_s"] / steps * 1e5,
            "cores_busy": run["run_cpu_s"] / run["run_s"],
            "final_return": baseline.last_episodes_return_mean(run["returns"], run["ended"])}


def _async(total_env_steps: int, seed: int, pipeline: bool = True,
           actor_backend: str = "threads", own_device: bool = False,
           sampler: str | None = None, batch_inference: bool | None = None) -> dict:
    import functools
    import importlib

    import jax

    if own_device:  # before JAX starts its CPU backend
        jax.config.update("jax_num_cpu_devices", 2)
    from ppo_async import AsyncActorLearnerConfig, train

    train_module = importlib.import_module("ppo_async.train")  # the name is shadowed by train()

    if not pipeline:  # every update (call) read back before the next is dispatched (launched)
        train_module.learner_loop = functools.partial(train_module.learner_loop, pipeline=False)
        train_module.in_learner_loop = functools.partial(train_module.in_learner_loop,
                                                         pipeline=False)
    config = AsyncActorLearnerConfig(total_env_steps=total_env_steps, seed=seed,
                                     actor_backend=actor_backend, sampler=sampler,
                                     batch_inference=batch_inference)
    if own_device:
        config = dataclasses.replace(config, learner_device="cpu:1", actor_device="cpu:0")
    marks = []
    # Child processes' CPU is read only where there are some (actor processes): that
    # reading scans them, about 0.5 ms a call on 2 cores, on the learner's thread.
    children = actor_backend == "processes"
    start = time.perf_counter()
    report = train(config, progress=False, on_update=lambda m: marks.append(
        (time.perf_counter(), m["env_steps"], common.cpu_seconds(children=children)))).report
    return {**_steady_rate(config, marks, total_env_steps, start),
            "final_return": report.episode_return_mean,
            "learner_wait_s": report.learner_wait_s, "policy_lag_mean": report.policy_lag_mean}


def _steady_rate(config, marks: list[tuple[float, int, float]], total_env_steps: int,
                 start: float) -> dict:
    """The rate of a run of ``config`` over `common.steady_span` of its marks.

    ``marks``: (time, env steps, CPU seconds) after each update (``config`` None: call);
    ``start``: when the run began.
    """
    wall_s = time.perf_counter() - start
    (t0, s0, c0), (t1, s1, c1) = common.steady_span(config, marks, total_env_steps)
    return {"env_steps_per_s": (s1 - s0) / (t1 - t0), "wall_s": wall_s,
            "cpu_s_per_100k_steps": (c1 - c0) / (s1 - s0) * 1e5, "cores_busy": (c1 - c0) / (t1 - t0),
            "first_update_s": marks[0][0] - start}


FUSED_UPDATES_PER_CALL = {"fused-lag1": 1, "fused-lag1-16": 16}


def _fused_lag1(total_env_steps: int, seed: int, per_call: int) -> dict:
    import flax.serialization
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ppo_async import AsyncActorLearnerConfig, train
    from ppo_async.core.devices import to_host
    from ppo_async.core.update import default_schedule
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.runtime.actor import ActorStart, _first_carry
    from ppo_async.runtime.in_learner import _collector
    from ppo_async.sync import recent_return_mean
    from ppo_async.train import initial_learner_state, learner_update

    # What train() builds: the actors' program, each actor's first carry, the update.
    config = AsyncActorLearnerConfig(total_env_steps=total_env_steps, seed=seed)
    program, cpu = make_actor_program(config), jax.devices("cpu")[0]
    update = learner_update(config, program, default_schedule(config.update_options()))
    carries = tuple(_first_carry(actor, config, program, cpu, ActorStart())
                    for actor in range(config.num_actors))
    # Every actor's own chunk in turn, stacked as the learner does: the bits of thread
    # actors (sampler="shared"), as sampler="learner" collects them with
    # batch_inference=False.
    chunks_of = _collector(dataclasses.replace(config, batch_inference=False), program)

    def collect(params, carries, lag):
        chunks = chunks_of(params, carries, lag)
        episodes = {"episode_return_sum": sum(jnp.sum(ret) for ret, _ in chunks.episodes),
                    "episodes": sum(jnp.sum(length > 0) for _, length in chunks.episodes)}
        return chunks.carries, chunks.batch, episodes

    def step(state, _):
        learner, carries, batch, episodes = state
        carries, next_batch, next_episodes = collect(learner.params, carries, 1)
        learner, metrics = update(learner, batch)
        return (learner, carries, next_batch, next_episodes), metrics | episodes

    steps = jax.jit(lambda state: jax.lax.scan(step, state, None, length=per_call))
    start = time.perf_counter()
    learner = jax.device_put(initial_learner_state(config, program), cpu)
    state = (learner, *jax.jit(collect, static_argnums=2)(learner.params, carries, 0))
    marks, metrics = [], []
    for call in range(config.num_updates // per_call):
        state, call_metrics = steps(state)
        metrics.append(to_host(call_metrics))
        marks.append((time.perf_counter(), (call + 1) * per_call * config.batch_size,
                      common.cpu_seconds()))
    rate = _steady_rate(None, marks, total_env_steps, start)  # a mark per call
    ran = train(dataclasses.replace(config, sampler="shared"), progress=False).params
    same = (flax.serialization.to_bytes(to_host(state[0].params))
            == flax.serialization.to_bytes(to_host(ran)))
    return {**rate,
            "final_return": recent_return_mean({k: np.concatenate([m[k] for m in metrics])
                                                for k in ("episode_return_sum", "episodes")}),
            "same_params_as_train": same}


SINGLE_THREADED_XLA = "--xla_cpu_multi_thread_eigen=false"
# The sampler each mode names; None (the modes not here): the default config's.
_SAMPLERS = {"threads": "shared", "async-unpipelined": "shared", "learner": "learner",
             "learner-in-turn": "learner", "learner-unpipelined": "learner"}
MODES = ("twin", "async", "threads", "async-1t", "async-unpipelined", "async-processes",
         "async-own-device", "learner", "learner-in-turn", "learner-unpipelined",
         *FUSED_UPDATES_PER_CALL, "purejaxrl")
BASELINES = {"twin": ("the twin's run phase", 1.0), "purejaxrl": ("purejaxrl's run phase", 1.2)}


def _one_in_a_fresh_process(mode: str, seed: int, total_env_steps: int,
                            purejaxrl: str | None) -> dict:
    env = dict(os.environ)
    if mode == "async-1t":
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {SINGLE_THREADED_XLA}".strip()
    return common.run_child(
        [__file__, "--one", "async" if mode == "async-1t" else mode, "--seeds", str(seed),
         "--total-env-steps", str(total_env_steps),
         *(["--purejaxrl", purejaxrl] if mode == "purejaxrl" else [])],
        f"{mode} seed {seed}", env=env)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--total-env-steps", type=int, default=500_000)
    # async-1t's child runs --one async with XLA_FLAGS set (_one_in_a_fresh_process).
    parser.add_argument("--one", choices=[m for m in MODES if m != "async-1t"],
                        default=None,
                        help=argparse.SUPPRESS)  # the child process of one measurement
    parser.add_argument("--modes", nargs="+", choices=MODES,
                        default=[m for m in MODES if m not in (*FUSED_UPDATES_PER_CALL, "purejaxrl")])
    parser.add_argument("--purejaxrl", default=None, metavar="DIR",
                        help="a checkout of github.com/luchris429/purejaxrl "
                             "(for --modes purejaxrl)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if "purejaxrl" in args.modes + [args.one]:
        import purejaxrl_baseline

        purejaxrl_baseline.purejaxrl_folder_or_exit(parser, args.purejaxrl)
    for mode in set(args.modes) & set(FUSED_UPDATES_PER_CALL):
        from ppo_async import AsyncActorLearnerConfig

        updates = AsyncActorLearnerConfig(total_env_steps=args.total_env_steps).num_updates
        per_call = FUSED_UPDATES_PER_CALL[mode]
        if updates % per_call or updates < 4 * per_call:  # the rate runs from a quarter on
            parser.error(f"--modes {mode}: the budget's {updates} updates are not 4 or more "
                         f"whole calls of {per_call}; choose another --total-env-steps")

    if args.one is not None:
        if args.one == "purejaxrl":
            result = _purejaxrl(args.purejaxrl, args.total_env_steps, args.seeds[0])
        elif args.one == "twin":
            result = _twin(args.total_env_steps, args.seeds[0])
        elif args.one in FUSED_UPDATES_PER_CALL:
            result = _fused_lag1(args.total_env_steps, args.seeds[0],
                                 FUSED_UPDATES_PER_CALL[args.one])
        else:
            result = _async(args.total_env_steps, args.seeds[0],
                            not args.one.endswith("-unpipelined"),
                            "processes" if args.one == "async-processes" else "threads",
                            own_device=args.one == "async-own-device",
                            sampler=_SAMPLERS.get(args.one),
                            batch_inference=False if args.one == "learner-in-turn" else None)
        print(json.dumps(result))
        return {}

    def line(row):
        lag = f", policy lag {row['policy_lag_mean']:.2f}" if "policy_lag_mean" in row else ""
        if "same_params_as_train" in row:
            lag = f", train()'s params: {row['same_params_as_train']}"
        return (f"{row['mode']:15s} seed {row['seed']}: {row['env_steps_per_s']:8.0f} env steps/s, "
                f"{row['cpu_s_per_100k_steps']:.2f} CPU s per 100k steps on "
                f"{row['cores_busy']:.2f} cores (final return {row['final_return']:.1f}{lag}, "
                f"load {row['load_average_1_min']:.1f})")

    rows = common.rows_per_seed_and_mode(
        args.seeds, args.modes,
        lambda mode, seed: _one_in_a_fresh_process(mode, seed, args.total_env_steps,
                                                   args.purejaxrl), line)
    medians = common.median_rate_by_mode(rows, args.modes)
    print("\nmedian steady-state env steps/s:")
    ratios = {baseline: {} for baseline in BASELINES if baseline in medians}
    for mode in args.modes:
        text = ""
        for baseline, (name, target) in BASELINES.items():
            if mode != baseline and baseline in medians:
                ratios[baseline][mode] = medians[mode] / medians[baseline]
                aim = f" (target >= {target})" if mode in ("async", "learner") else ""
                text += f"  {ratios[baseline][mode]:.2f}x {name}{aim}"
        print(f"  {mode:15s} {medians[mode]:8.0f}{text}")
    summary = {"rows": rows, "median_env_steps_per_s": medians,
               **{f"ratio_to_{baseline}": r for baseline, r in ratios.items()}}
    common.save_result("bench_throughput", args.out, __file__, argv, summary)
    return summary


if __name__ == "__main__":
    main()
