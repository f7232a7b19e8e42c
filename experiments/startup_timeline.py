"""Where the first seconds of a fresh `train()` go: compiling, step by step.

With the persistent compilation cache off (as in a fresh process), one short
default CartPole run (``--updates`` updates), timed from the `train()` call:

- ``init_params``: start and end (the initializers compile here, while the
  update compiles in the "ppo-warm-up" thread);
- the learner's wait for that thread to finish (``warm_up.result``);
- the first update done;
- each actor's first chunk (``ActorStats.first_chunk_s``: its rollout compile).

Then, in the same process, the initializers compiled alone on a fresh network
(nothing beside them), for comparison, and (without a cache) ``alone_cpu_s``:
the CPU seconds of each step -- actor program, initializers, reset, rollout,
learner state, update -- retraced and recompiled one after the other.

It also takes JAX's compile log (``jax_log_compiles``) of the run up to its
first update and lists every program: the thread that built it, its tracing,
lowering and XLA compile seconds (a persistent-cache hit shows as a short
"compile": the load), so what stands between ``train()`` and its first update
can be read off program by program. ``first_update_cpu_s`` is the process's
CPU seconds over the same span: with C idle cores the wall time cannot be
below ``cpu / C``. With ``--compilation-cache-dir`` the run uses (and fills)
that cache: run twice for the warm timeline.

    python experiments/startup_timeline.py [--updates 10] [--compilation-cache-dir DIR] [--sampler learner]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import logging
import os
import re
import sys
import time

import common

# Messages JAX logs per program with jax_log_compiles on (jax 0.10).
_COMPILE_LOG = re.compile(
    r"Finished (?P<stage>tracing|jaxpr to MLIR module conversion|XLA compilation) "
    r"(?:of )?(?:jit\()?(?P<name>[^ )]+)\)?(?: for jit)? in (?P<seconds>[0-9.e-]+) sec"
)
_CACHE_HIT = re.compile(r"Persistent compilation cache hit for '(?P<name>[^']+)'")
_STAGES = {"tracing": "trace_s", "jaxpr to MLIR module conversion": "lower_s",
           "XLA compilation": "compile_s"}


class CompileLog(logging.Handler):
    """Collects JAX's per-program compile messages, by thread and program name."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.start_epoch = time.time()
        self.records: list[dict] = []
        self.hits: collections.Counter = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        hit = _CACHE_HIT.search(message)
        if hit:
            # No lock of our own: logging.Handler.handle holds the handler's around emit.
            self.hits[(record.threadName, hit.group("name"))] += 1
            return
        match = _COMPILE_LOG.search(message)
        if match:
            self.records.append({
                "at_s": record.created - self.start_epoch,
                "thread": record.threadName,
                "program": match.group("name"),
                _STAGES[match.group("stage")]: float(match.group("seconds")),
            })

    def start_clock(self) -> None:
        self.start_epoch = time.time()

    def programs(self, until_s: float) -> list[dict]:
        """One row per XLA compile (trace and lowering folded into it, and the thread they
        ran in: ``traced_in``, where a program is lowered in one thread and compiled in
        another), up to ``until_s``."""
        rows, pending = [], collections.defaultdict(dict)
        for record in self.records:
            if record["at_s"] > until_s:
                continue
            key = (record["thread"], record["program"])
            times = {k: v for k, v in record.items() if k.endswith("_s") and k != "at_s"}
            if "compile_s" not in record:
                pending[key].update(times)
                continue
            if key not in pending:  # lowered in another thread (`jax.stages.Lowered.compile`)
                key = next((k for k in pending if k[1] == record["program"]), key)
            row = {"thread": record["thread"], "traced_in": key[0], "program": record["program"],
                   "done_at_s": round(record["at_s"], 3), "trace_s": 0.0, "lower_s": 0.0,
                   **pending.pop(key, {}), **times}
            row["cache_hit"] = self.hits[(record["thread"], "jit_" + record["program"].strip("<>"))] > 0
            rows.append(row)
        return rows


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--compilation-cache-dir", default=None,
                        help="use (and fill) this persistent compilation cache; default: none")
    parser.add_argument("--sampler", default=None, choices=["actors", "shared", "learner"],
                        help="the config's sampler; default: the config's own")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import jax

    cache_was_enabled = jax.config.jax_enable_compilation_cache  # restored at the end
    jax.config.update("jax_enable_compilation_cache", args.compilation_cache_dir is not None)
    compile_log = CompileLog()
    jax_logger = logging.getLogger("jax")
    jax_logger.addHandler(compile_log)
    jax_logger.setLevel(logging.DEBUG)
    jax_logger.propagate = False  # the log is tabulated below, not printed as it comes
    jax.config.update("jax_log_compiles", True)

    from ppo_async import AsyncActorLearnerConfig, train
    from ppo_async.networks.actor_critic import init_params, make_network

    train_module = importlib.import_module("ppo_async.train")  # the name is shadowed by train()
    marks: dict[str, float] = {}
    start = [0.0]

    def timed(name, function):
        def wrapper(*a, **k):
            marks[f"{name}_start_s"] = time.perf_counter() - start[0]
            out = function(*a, **k)
            marks[f"{name}_end_s"] = time.perf_counter() - start[0]
            return out
        return wrapper

    original_init = train_module.init_params
    original_result = train_module._UpdateWarmUp.result
    train_module.init_params = timed("init_params", original_init)
    train_module._UpdateWarmUp.result = timed("warm_up_wait", original_result)
    config = AsyncActorLearnerConfig(compilation_cache_dir=args.compilation_cache_dir,
                                     sampler=args.sampler)
    config = dataclasses.replace(config, total_env_steps=config.batch_size * args.updates)
    cpu_start = [0.0]

    def on_update(metrics):
        if "first_update_s" not in marks:
            marks["first_update_s"] = time.perf_counter() - start[0]
            marks["first_update_cpu_s"] = time.process_time() - cpu_start[0]

    # The process holds the programs an earlier run compiled (a notebook, the
    # test suite): dropped, so this run compiles as a fresh process's does.
    jax.clear_caches()
    try:
        compile_log.start_clock()
        start[0], cpu_start[0] = time.perf_counter(), time.process_time()
        report = train(config, progress=False, on_update=on_update).report
        marks["train_total_s"] = time.perf_counter() - start[0]
    finally:
        train_module.init_params = original_init
        train_module._UpdateWarmUp.result = original_result
        jax.config.update("jax_log_compiles", False)
        jax_logger.removeHandler(compile_log)
        jax_logger.propagate = True
    programs = compile_log.programs(until_s=marks["first_update_s"])

    # The initializers alone, compiled again.
    network = make_network((4,), type("Discrete", (), {"n": 2})(), config.hidden_sizes)
    jax.clear_caches()
    alone = time.perf_counter()
    jax.block_until_ready(init_params(network, jax.random.key(1), (4,)))
    marks["init_params_alone_s"] = time.perf_counter() - alone
    marks["actor_first_chunk_s"] = [s.first_chunk_s for s in report.actor_stats]
    if args.compilation_cache_dir is None and config.sampler != "learner":  # steps of thread actors
        marks["alone_cpu_s"] = steps_alone(config)
    jax.config.update("jax_enable_compilation_cache", cache_was_enabled)

    for name, value in marks.items():
        if isinstance(value, dict):
            shown = {k: round(v, 2) for k, v in value.items()}
        else:
            shown = [round(v, 2) for v in value] if isinstance(value, list) else round(value, 2)
        print(f"{name:24s} {shown}")
    print_programs(programs)
    load = os.getloadavg()
    print(f"load average: {load[0]:.2f} (1 min) on {os.cpu_count()} cores")
    common.save_result("startup_timeline", args.out, __file__, argv,
                       {**marks, "programs": programs, "load_average": load,
                        "compilation_cache_dir": args.compilation_cache_dir})
    return {**marks, "programs": programs}


def steps_alone(config) -> dict[str, float]:
    """CPU seconds of each step on the way to a first update, one after the other.

    In-memory compile caches are cleared first, so each step traces, lowers
    and compiles its programs again, with nothing compiling beside it: what
    each costs, and their sum, what two cores must get through.
    """
    import jax

    from ppo_async.core.update import init_learner_state, make_update_fn
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.networks.actor_critic import init_params

    train_module = importlib.import_module("ppo_async.train")
    jax.clear_caches()
    seconds: dict[str, float] = {}

    def step(name, function):
        start = time.process_time()
        out = jax.block_until_ready(function())
        seconds[name] = round(time.process_time() - start, 3)
        return out

    program = step("actor_program", lambda: make_actor_program(config))
    params = step("init_params", lambda: init_params(
        program.network, jax.random.key(0), program.observation_shape))
    carry = step("reset", lambda: program.reset(jax.random.key(1), jax.devices("cpu")[0]))
    step("rollout", lambda: program.rollout(params, carry))
    state = step("learner_state",
                 lambda: init_learner_state(config.update_options(), params, jax.random.key(0)))
    batch = train_module._warm_up_batch(config, program)
    update = make_update_fn(config.update_options(), program.network)
    step("update", lambda: update(state, batch))
    seconds["total"] = round(sum(seconds.values()), 3)
    return seconds


def print_programs(programs: list[dict], top: int = 12) -> None:
    """The slowest programs, then totals per thread (seconds; wall time, so a
    program compiled beside another takes longer than alone)."""
    print(f"\n{len(programs)} programs compiled (or loaded) before the first update; slowest:")
    print(f"  {'done at':>7s} {'thread':14s} {'program':28s} {'trace':>6s} {'lower':>6s} {'compile':>7s}")
    for row in sorted(programs, key=lambda r: -(r["trace_s"] + r["lower_s"] + r["compile_s"]))[:top]:
        hit = " (cache hit)" if row["cache_hit"] else ""
        where = (f" (traced and lowered in {row['traced_in']})"
                 if row["traced_in"] != row["thread"] else "")
        print(f"  {row['done_at_s']:7.2f} {row['thread'][:14]:14s} {row['program'][:28]:28s} "
              f"{row['trace_s']:6.2f} {row['lower_s']:6.2f} {row['compile_s']:7.2f}{hit}{where}")
    totals = collections.defaultdict(lambda: [0, 0.0])
    for row in programs:
        totals[row["thread"]][0] += 1
        totals[row["traced_in"]][1] += row["trace_s"] + row["lower_s"]
        totals[row["thread"]][1] += row["compile_s"]
    for thread, (count, seconds) in sorted(totals.items()):
        print(f"  {thread:22s} {count:3d} programs, {seconds:6.2f} s tracing+lowering+compiling")


if __name__ == "__main__":
    main()
