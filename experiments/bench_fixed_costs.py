"""Where an update's time goes: the learner's and actors' fixed costs, stage by stage.

One `train()` of a config (default: the default CartPole config, 2 actors x 4
envs x 64 steps, exact lag 1), in this process, with each stage of the
update's loop wrapped in a timer that records its thread, start and end
(`time.perf_counter`). Nothing of the runtime is changed; the wrappers cost
about a microsecond a call. After ``--warmup`` updates (compiles and start-up
excluded), per update, the median over updates of:

- learner thread: waiting for chunks (`take_experience` blocked on the
  queue), stacking the chunks (`stack_experiences`), placing the batch on the
  learner's device (`put_batch`), dispatching the update (the jitted call
  returns before the update ends), reading the metrics back (``to_host``,
  `ppo_async.core.devices.to_host`, in `finish`: it waits for the update to end), handing the params to the
  publisher, and the rest of `finish` (counting, `on_update`);
- publisher thread: serializing the params (`serialize_policy`:
  ``to_host`` and `flax.serialization.to_bytes`);
- actors: loading a version (`SharedParams`: `from_bytes`, the check, placing
  it on the actor's device; once per version for all actors), dispatching a
  chunk's rollout, waiting for it to end (``to_host`` of the chunk),
  sending it; with a thread per actor each actor's own share, and where one
  thread collects every actor's chunk (gymnax actors, from 2) all of that
  thread's time ("actors' thread");
- the critical chain at an exact lag ``k``: the chunks that feed update
  ``u + k + 1`` need the params of update ``u``, so the time from update
  ``u``'s metrics readback to update ``u + k + 1``'s dispatch bounds the
  rate from below; it is printed beside the update period.

Prints the table (milliseconds per update, and each stage's share of the
update period) and writes ``fixed_costs.json`` under
``experiments/out/bench_fixed_costs/`` (or ``--out``). Run it on a quiet
machine; the load average is printed with the figures.

    python experiments/bench_fixed_costs.py                           # the default config, 200k env steps
    python experiments/bench_fixed_costs.py --total-env-steps 100000 --set num_actors=4 envs_per_actor=2
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import threading
import time
from typing import Any

import common

EVENTS: list[tuple[str, str, float, float]] = []  # (thread, stage, start, end)


def _timed(stage: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((threading.current_thread().name, stage, start, time.perf_counter()))
    return wrapper


def install_timers() -> None:
    """Wrap each stage of the learner, publisher and actor loops in `_timed`."""
    from ppo_async.core.devices import LearnerPlacement
    from ppo_async.runtime import actor, inference, learner, messages, transport

    learner_cls = learner.Learner
    learner.stack_experiences = _timed("stack", learner.stack_experiences)
    LearnerPlacement.put_batch = _timed("put_batch", LearnerPlacement.put_batch)
    learner_cls.dispatch = _timed("dispatch (all)", learner_cls.dispatch)
    learner_cls.finish = _timed("finish (all)", learner_cls.finish)
    learner_cls._publish = _timed("hand to publisher", learner_cls._publish)
    transport.serialize_policy = _timed("serialize", transport.serialize_policy)
    inference.SharedParams.__call__ = _timed("load version", inference.SharedParams.__call__)
    receive = transport.ThreadTransport.receive
    transport.ThreadTransport.receive = _timed("receive", receive)
    # The reads of device arrays (each module holds its own name for to_host).
    for module in (learner, actor, messages):
        module.to_host = _timed("to_host", module.to_host)
    train_module = sys.modules["ppo_async.train"]
    make_program = train_module.make_actor_program

    def make_actor_program(config):
        program = make_program(config)
        return program._replace(rollout=_timed("rollout dispatch", program.rollout))

    train_module.make_actor_program = make_actor_program


def _median(values: list[float]) -> float:
    import numpy as np

    return float(np.median(values)) if values else float("nan")


def analyse(update_ends: list[float], warmup: int, exact_lag: int | None,
            num_actors: int) -> dict[str, Any]:
    """Per-update medians of each stage after ``warmup`` updates."""
    start = update_ends[warmup]
    end = update_ends[-1]
    updates = len(update_ends) - 1 - warmup
    period = (end - start) / updates
    events = [e for e in EVENTS if start <= e[2] < end]
    by = collections.defaultdict(list)
    for thread, stage, t0, t1 in events:
        role = ("learner" if thread == "MainThread" or thread.startswith("ppo-learner") else
                "publisher" if thread == "ppo-publisher" else
                # one thread collecting every actor's chunk (`ActorGroup`): all of its time
                "actors' thread" if thread.startswith("ppo-actors-") else
                "actor" if thread.startswith("ppo-actor") else thread)
        by[(role, stage)].append((t0, t1))
    rows = []
    for (role, stage), spans in sorted(by.items()):
        total = sum(t1 - t0 for t0, t1 in spans)
        share = num_actors if role == "actor" else 1  # a thread per actor: each one's own
        per_update = total / updates / share
        rows.append(dict(role=role, stage=stage, calls_per_update=len(spans) / updates / share,
                         ms_per_update=1e3 * per_update, median_call_ms=1e3 * _median(
                             [t1 - t0 for t0, t1 in spans]), share_of_period=per_update / period))
    chain = []
    if exact_lag is not None:
        readbacks = sorted(t1 for (role, stage), spans in by.items()
                           if role == "learner" and stage == "to_host" for _, t1 in spans)
        dispatches = sorted(t0 for (role, stage), spans in by.items()
                            if role == "learner" and stage == "dispatch (all)" for t0, _ in spans)
        # update u read back -> update u + lag + 1 dispatched (the chunks it needs came back)
        for u, t_read in enumerate(readbacks):
            later = [t for t in dispatches if t > t_read]
            if len(later) > exact_lag:
                chain.append(later[exact_lag] - t_read)
    return dict(updates=updates, period_ms=1e3 * period, rows=rows,
                chain_median_ms=1e3 * _median(chain), chain_samples=len(chain))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-env-steps", type=int, default=200_000)
    parser.add_argument("--warmup", type=int, default=20, help="updates left out at the start")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="config overrides (JSON values), e.g. num_actors=4")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import json

    common.configure_jax()
    from ppo_async import AsyncActorLearnerConfig, train
    from ppo_async.presets import apply_overrides

    overrides = {k: json.loads(v) if v[:1] in "[{0123456789-tfn" else v
                 for k, v in (item.split("=", 1) for item in args.set)}
    config = apply_overrides(AsyncActorLearnerConfig(total_env_steps=args.total_env_steps),
                             overrides, "--set")
    install_timers()
    update_ends: list[float] = []
    result = train(config, progress=False,
                   on_update=lambda m: update_ends.append(time.perf_counter()))
    if len(update_ends) < args.warmup + 5:
        raise SystemExit(f"only {len(update_ends)} updates: raise --total-env-steps")
    summary = analyse(update_ends, args.warmup, config.exact_lag, config.num_actors)
    load = os.getloadavg()[0]
    print(f"\n{config.env_id}, {config.num_actors} actors x {config.envs_per_actor} envs x "
          f"{config.num_steps} steps (a batch of {config.batch_size}), exact lag "
          f"{config.exact_lag}; {summary['updates']} updates after {args.warmup}; "
          f"{result.report.env_steps_per_s:,.0f} env steps/s over the run; load average "
          f"{load:.2f}")
    print(f"update period {summary['period_ms']:.2f} ms; critical chain (update u read back "
          f"-> update u + {config.exact_lag} + 1 dispatched) {summary['chain_median_ms']:.2f} ms")
    print(common.markdown_table(
        ["thread", "stage", "calls per update", "ms per update (an actor thread: each one's own)",
         "median call (ms)", "share of the period"],
        [[r["role"], r["stage"], f"{r['calls_per_update']:.2f}", f"{r['ms_per_update']:.2f}",
          f"{r['median_call_ms']:.3f}", f"{r['share_of_period']:.0%}"]
         for r in summary["rows"]]))
    out = common.out_dir("bench_fixed_costs", args.out)
    summary.update(config=config.to_dict(), load_average_1_min=load,
                   env_steps_per_s=result.report.env_steps_per_s,
                   machine=common.machine_info(),
                   command=common.print_reproduce(__file__, sys.argv[1:]))
    common.write_json(out / "fixed_costs.json", summary)


if __name__ == "__main__":
    main()
