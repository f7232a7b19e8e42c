"""Past one machine: what the learner ingests at N actors, and what the broadcast fan-out costs.

The learner side alone, fed by a transport (`ReplayTransport`) that replays
recorded chunks as fast as the learner asks for them, relabelled as the
chunks of ``N`` actors (ids ``0 .. N - 1``, the policy version each chunk
would carry under ``exact_policy_lag``), so that ``N = 64, 640, 6400``
stands for 1, 10 and 100 machines of 64 actors. In one process:

- chunk and broadcast sizes: one recorded chunk pickled as it travels between
  processes (the Ray path pickles the same `Experience`; a host env's carry
  stays with its actor, a gymnax carry travels as host arrays), for the
  replayed layout and for the default gymnax CartPole layout; the broadcast
  payload (`serialize_policy`, flax msgpack bytes of the params).
- ingest alone: `learner_loop` with an update that does nothing, so what is
  timed is the learner taking chunks, filling its buffer, stacking and placing
  the batch: chunks/s, env steps/s and MB/s, with each chunk unpickled from
  its bytes in ``receive`` (what a learner fed over the wire pays) and, apart,
  handed over as ready objects; on the path the learner takes when chunks are
  already queued (pipelined: the next batch is taken while an update runs)
  and on its waiting path (``pipeline=False``: every chunk is received after
  the check for actors that went silent, as when the learner keeps up with
  its actors and waits for each chunk).
- the update alone on a batch of ``N`` columns (one chunk per actor: the
  batch grows with ``N``), and `learner_loop` with the real update (pipelined,
  chunks unpickled): what the learner sustains.
- the broadcast fan-out per publish: the transport's publisher (`Publisher`)
  serializes once and puts the message in ``N`` actor queues, timed on its
  thread while the learner runs; and the cost model of Ray's path, one
  ``ray.put`` of the payload plus one small actor call per actor, from a
  private local Ray instance (calls to one actor, per call).

The demand is ``N`` actors each producing ``--actor-env-steps-per-s`` (500:
one env whose step takes 2 ms, the ideal of the "Many actors" benchmark,
``experiments/bench_scaling.py``) in chunks of ``num_steps x envs_per_actor``.

    python experiments/bench_ingest.py [--actors 64 640 6400] [--chunks 25600]
        [--actor-env-steps-per-s 500] [--ray-sends 2000] [--no-ray] [--profile]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import pickle
import queue
import statistics
import sys
import time

import common

MB = 1e6
MACHINE_ACTORS = 64  # actors per machine in the arithmetic


def replay_config(num_actors: int, args):
    """The "Many actors" layout (bench_scaling's config) with ``num_actors`` columns."""
    from ppo_async import AsyncActorLearnerConfig

    return AsyncActorLearnerConfig(
        env_id=args.env_id, num_actors=num_actors, envs_per_actor=args.envs_per_actor,
        num_steps=args.num_steps, num_minibatches=1, num_epochs=1,
        total_env_steps=num_actors * args.envs_per_actor * args.num_steps * 100_000,
        learner_timeout_s=60.0,
    )


def as_sent(experience):
    """``experience`` as a process transport sends it: a gymnax carry as host arrays, a
    host env's carry (live simulators) left behind (`ppo_async.runtime.ray_transport`)."""
    import jax

    from ppo_async.envs.gymnax_env import EnvCarry

    carry = experience.env_carry
    return experience._replace(
        env_carry=jax.device_get(carry) if isinstance(carry, EnvCarry) else None)


def record_chunks(config):
    """``(program, host params, [Experience])``: ``num_actors`` chunks of ``config``, collected
    by its actor program as a run collects them (one actor's chunks in a row), as sent."""
    import jax

    from ppo_async.envs.backends import make_actor_program

    program = make_actor_program(config)
    params = jax.device_put(program.params_template, jax.devices("cpu")[0])
    recorded = common.real_chunks(config, program, params)
    chunks = [as_sent(e) for e in recorded]
    if program.close is not None:
        program.close(recorded[-1].env_carry)
    return program, jax.device_get(params), chunks


class ReplayTransport:
    """A `LearnerTransport` that hands the learner recorded chunks at once, as ``N`` actors'.

    Chunk ``k`` goes out as actor ``k % N``'s ``k // N``-th chunk, collected
    (as ``exact_policy_lag=K`` would have it) under version ``max(0, c - K)``,
    so the buffer fills one batch per ``N`` chunks and each lag is what a real
    run's is. ``unpickle``: each chunk is unpickled from its bytes in
    ``receive`` (the learner's cost of a chunk off the wire); otherwise it is
    handed over as a ready object. ``publish`` goes to a real `Publisher`
    thread that serializes once and puts the message in ``N`` actor queues;
    `fan_out_s` holds the seconds of each delivery.
    """

    def __init__(self, chunks, num_actors: int, lag: int, unpickle: bool):
        from ppo_async.runtime.transport import Publisher

        self.blobs = [pickle.dumps(c, protocol=pickle.HIGHEST_PROTOCOL) for c in chunks]
        self.chunks, self.num_actors, self.lag, self.unpickle = chunks, num_actors, lag, unpickle
        self.sent = 0
        self.actor_queues = [queue.Queue() for _ in range(num_actors)]
        self.fan_out_s: list[float] = []  # seconds of each delivery to every actor queue
        self.failures: queue.Queue = queue.Queue()
        self.publisher = Publisher(self._deliver, self.failures.put, every_version=True)

    def _deliver(self, message) -> None:
        start = time.perf_counter()
        for actor_queue in self.actor_queues:
            actor_queue.put(message)  # nobody reads them: a few hundred messages at most
        self.fan_out_s.append(time.perf_counter() - start)

    def receive(self, timeout_s: float):
        if not self.failures.empty():
            return self.failures.get_nowait()
        k, self.sent = self.sent, self.sent + 1
        actor_id, chunk_index = k % self.num_actors, k // self.num_actors
        which = k % len(self.blobs)
        chunk = pickle.loads(self.blobs[which]) if self.unpickle else self.chunks[which]
        return chunk._replace(actor_id=actor_id,
                              policy_version=max(0, chunk_index - self.lag))

    def publish(self, params, learner_updates: int) -> None:
        self.publisher.publish(params, learner_updates)

    def start_actor(self, actor_id, start) -> None:
        pass

    def restart_actor(self, actor_id, start) -> None:
        pass

    def wait_started(self) -> None:
        pass

    def kill_actor(self, actor_id: int) -> bool:
        return False

    def report_failure(self, failure) -> None:
        self.failures.put(failure)

    def queue_depth(self) -> int:
        return 0  # everything has arrived

    def actor_stats(self) -> list:
        return []

    def stop(self, timeout_s: float, known_stuck=()) -> list[str]:
        from ppo_async.runtime.transport import stop_threads

        self.publisher.stop()
        return stop_threads([self.publisher.thread], timeout_s)

    def late_failures(self) -> list:
        return []


def no_update(state, batch):
    """An update that computes nothing: `learner_loop` then times only its ingest."""
    return state, {"params_finite": 1.0}


def time_learner(config, program, params, chunks, update, updates: int, unpickle: bool,
                 pipeline: bool = True, profiler=None) -> dict:
    """Steady rate of `learner_loop` on replayed chunks over ``updates`` updates, and the
    fan-out the transport's publisher measured meanwhile.

    Timed from the first update's end to the last but one's: each of those
    intervals takes exactly one batch and finishes one update, pipelined or
    not. ``pipeline``: the learner takes the next batch without waiting while
    an update runs (its path when chunks are already queued); without it,
    every chunk goes through the learner's waiting path (its path whenever it
    keeps up with its actors). ``profiler`` (a ``cProfile.Profile``) profiles
    that span.
    """
    import jax

    from ppo_async.core.devices import LearnerPlacement
    from ppo_async.core.update import init_learner_state
    from ppo_async.runtime.learner import LearnerConnections, LearnerHooks, learner_loop

    if updates < 3:
        raise ValueError("the steady rate needs at least 3 updates")
    cpu = LearnerPlacement(jax.devices("cpu")[:1])
    state = cpu.put_state(init_learner_state(config.update_options(), params, jax.random.key(1)))
    lag = config.exact_lag if config.exact_lag is not None else 0
    transport = ReplayTransport(chunks, config.num_actors, lag, unpickle)
    stamps: list[float] = []

    def on_update(metrics) -> None:
        stamps.append(time.perf_counter())
        if profiler is not None and len(stamps) in (1, updates - 1):
            (profiler.enable if len(stamps) == 1 else profiler.disable)()

    try:
        end_state, report = learner_loop(config, program.network, state,
                                         LearnerConnections(transport), cpu,
                                         LearnerHooks(on_update), update=update,
                                         end_update=updates, pipeline=pipeline)
        jax.block_until_ready(end_state)
        deadline = time.monotonic() + 10.0  # the publisher may still deliver the last ones
        while transport.publisher.published < updates - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stuck = transport.stop(5.0)
    if stuck:
        raise RuntimeError(f"the replay's publisher did not stop: {stuck}")
    if not transport.failures.empty():
        raise transport.failures.get_nowait().error
    seconds = stamps[updates - 2] - stamps[0]
    chunks_timed = (updates - 2) * config.num_actors
    return {"seconds": seconds, "updates": report.updates, "chunks_timed": chunks_timed,
            "chunks_per_s": chunks_timed / seconds,
            "env_steps_per_s": (updates - 2) * config.batch_size / seconds,
            "policy_lag_counts": {str(k): v for k, v in report.policy_lag_counts.items()},
            "publishes": transport.publisher.published,
            "fan_out_s_median": (statistics.median(transport.fan_out_s)
                                 if transport.fan_out_s else None),
            "serialize_s_mean": (transport.publisher.serialize_s
                                 / max(1, transport.publisher.published))}


def update_alone_s(config, program, params, chunks, repeats: int) -> tuple[float, object]:
    """Median seconds of the jitted update on a batch of ``num_actors`` columns; the update."""
    import jax

    from ppo_async.core.devices import LearnerPlacement
    from ppo_async.core.update import init_learner_state, make_update_fn
    from ppo_async.runtime.learner import stack_experiences

    # Placed as `learner_loop` places them, so that its calls hit this compile.
    placement = LearnerPlacement(jax.devices("cpu")[:1])
    batch = placement.put_batch(stack_experiences(
        [chunks[i % len(chunks)]._replace(actor_id=i) for i in range(config.num_actors)]))
    update = make_update_fn(config.update_options(), program.network)
    state = placement.put_state(
        init_learner_state(config.update_options(), params, jax.random.key(1)))
    jax.block_until_ready(update(state, batch))  # compile
    return common.median_time(lambda: jax.block_until_ready(update(state, batch)), repeats), update


def measure_actors(num_actors: int, chunk_bytes: int, args, program, params, chunks) -> dict:
    """Every learner-side figure at ``num_actors`` columns."""
    config = replay_config(num_actors, args)
    updates = max(args.min_updates, args.chunks // num_actors)
    update_s, update = update_alone_s(config, program, params, chunks,
                                      repeats=max(3, min(50, updates)))
    # name: (unpickle, pipeline)
    modes = {"queued_unpickled": (True, True), "queued_objects": (False, True),
             "waiting_unpickled": (True, False)}
    ingest = {mode: time_learner(config, program, params, chunks, no_update, updates,
                                 unpickle=unpickle, pipeline=pipeline)
              for mode, (unpickle, pipeline) in modes.items()}
    learner = time_learner(config, program, params, chunks, update, updates, unpickle=True)
    for figures in (*ingest.values(), learner):
        figures["mb_per_s"] = figures["chunks_per_s"] * chunk_bytes / MB
    return {"num_actors": num_actors, "machines": num_actors / MACHINE_ACTORS,
            "batch_env_steps": config.batch_size, "update_alone_s": update_s,
            "ingest_alone": ingest, "learner": learner}


class _Sink:
    """A Ray actor that takes a broadcast's reference and drops it, as an actor's deliver does."""

    def deliver(self, version, refs):
        return version


def ray_fan_out(payload: bytes, sends: int, repeats: int) -> dict:
    """Ray's broadcast path on a private local instance: one ``ray.put`` of ``payload``, then
    one small actor call per actor (``sends`` calls to one actor, per call)."""
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a private instance, on this machine only
    import ray

    from ppo_async.runtime.ray_transport import ray_processes_start

    with ray_processes_start():
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, object_store_memory=80 * 1024**2)
    try:
        sink = ray.remote(_Sink).remote()
        ref = ray.put(payload)
        ray.get([sink.deliver.remote(0, [ref]) for _ in range(50)])  # started and warm
        put_s = common.median_time(lambda: ray.put(payload), repeats)
        rounds = []
        for _ in range(3):
            start = time.perf_counter()
            calls = [sink.deliver.remote(i, [ref]) for i in range(sends)]
            submitted = time.perf_counter()
            ray.get(calls)
            rounds.append((submitted - start, time.perf_counter() - start))
        submit_s, done_s = min(rounds, key=lambda r: r[1])
    finally:
        ray.shutdown()
    return {"put_s": put_s, "sends": sends, "submit_s_per_send": submit_s / sends,
            "done_s_per_send": done_s / sends}


def demand(num_actors: int, args, chunk_bytes: int, payload_bytes: int) -> dict:
    """On paper: what ``num_actors`` actors send the learner and what it sends back."""
    chunk_steps = args.num_steps * args.envs_per_actor
    chunks_per_s = num_actors * args.actor_env_steps_per_s / chunk_steps
    # One chunk per actor per update: the learner must update as often as one actor
    # sends a chunk, whatever N, on a batch that grows with N.
    updates_per_s = args.actor_env_steps_per_s / chunk_steps
    machines = max(1, num_actors // MACHINE_ACTORS)
    return {"chunks_per_s": chunks_per_s, "env_steps_per_s": chunks_per_s * chunk_steps,
            "in_mb_per_s": chunks_per_s * chunk_bytes / MB, "updates_per_s": updates_per_s,
            "seconds_per_update": 1.0 / updates_per_s,
            "broadcast_out_mb_per_s_per_actor": payload_bytes * num_actors * updates_per_s / MB,
            "broadcast_out_mb_per_s_per_machine": payload_bytes * machines * updates_per_s / MB,
            "sends_per_s": num_actors * updates_per_s}


def profile_ingest(num_actors: int, args, program, params, chunks, top: int = 6) -> dict:
    """Where ingest alone spends its time at ``num_actors`` on the waiting path (chunks as
    objects): the timed span's seconds under cProfile, and its functions of most own time."""
    import cProfile
    import pstats

    config = replay_config(num_actors, args)
    updates = max(args.min_updates, args.chunks // num_actors)
    profiler = cProfile.Profile()
    figures = time_learner(config, program, params, chunks, no_update, updates,
                           unpickle=False, pipeline=False, profiler=profiler)
    ranked = sorted(pstats.Stats(profiler).stats.items(), key=lambda item: item[1][2],
                    reverse=True)[:top]
    return {"num_actors": num_actors, "seconds": figures["seconds"],
            "chunks": figures["chunks_timed"],
            "top": [{"function": f"{pathlib.Path(file).name}:{line}({name})", "own_s": own,
                     "calls": calls}
                    for (file, line, name), (_, calls, own, _, _) in ranked]}


def table(rows: list[dict]) -> str:
    """The figures of every row as one markdown table."""
    header = ["actors (machines)", "batch env steps", "demand: chunks/s, MB/s in",
              "ingest alone, chunks/s: queued, unpickled (MB/s) / queued, as objects / "
              "waiting, unpickled",
              "update alone ms (demand: one per ms)", "learner: chunks/s, env steps/s",
              "learner / demand",
              "fan-out ms per publish: queues / Ray per actor / Ray per machine",
              "broadcast MB/s out: a copy per actor / per machine"]
    lines = []
    for row in rows:
        paper, learner, ingest = row["demand"], row["learner"], row["ingest_alone"]
        ray = (f"{row['ray_fan_out_s'] * 1e3:,.1f} / {row['ray_fan_out_per_machine_s'] * 1e3:,.1f}"
               if "ray_fan_out_s" in row else "- / -")
        lines.append([
            f"{row['num_actors']:,} ({row['machines']:g})", f"{row['batch_env_steps']:,}",
            f"{paper['chunks_per_s']:,.0f}, {paper['in_mb_per_s']:,.1f}",
            f"{ingest['queued_unpickled']['chunks_per_s']:,.0f} "
            f"({ingest['queued_unpickled']['mb_per_s']:,.1f}) / "
            f"{ingest['queued_objects']['chunks_per_s']:,.0f} / "
            f"{ingest['waiting_unpickled']['chunks_per_s']:,.0f}",
            f"{row['update_alone_s'] * 1e3:,.1f} ({paper['seconds_per_update'] * 1e3:,.0f})",
            f"{learner['chunks_per_s']:,.0f}, {learner['env_steps_per_s']:,.0f}",
            f"{row['learner_over_demand']:.3f}",
            f"{learner['fan_out_s_median'] * 1e3:,.2f} / {ray}",
            f"{paper['broadcast_out_mb_per_s_per_actor']:,.0f} / "
            f"{paper['broadcast_out_mb_per_s_per_machine']:,.1f}",
        ])
    return common.markdown_table(header, lines)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[64, 640, 6400])
    parser.add_argument("--env-id", default="gymnasium:CartPole-v1",
                        help="env of the replayed chunks (the 2 ms host env's shapes: obs 4, "
                             "two actions)")
    parser.add_argument("--envs-per-actor", type=int, default=1)
    parser.add_argument("--num-steps", type=int, default=32)
    parser.add_argument("--actor-env-steps-per-s", type=float, default=500.0,
                        help="one actor's rate in the demand (500: one env of a 2 ms step)")
    parser.add_argument("--chunks", type=int, default=25_600,
                        help="chunks per timing of the learner (at least --min-updates batches)")
    parser.add_argument("--min-updates", type=int, default=5,
                        help="updates per timing at least (the steady span leaves out two)")
    parser.add_argument("--ray-sends", type=int, default=2000,
                        help="small actor calls timed for Ray's fan-out model")
    parser.add_argument("--no-ray", action="store_true", help="leave out Ray's fan-out model")
    parser.add_argument("--no-gymnax", action="store_true",
                        help="leave out the default gymnax chunk's size")
    parser.add_argument("--profile", action="store_true",
                        help="profile ingest alone on the waiting path at the largest --actors")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f}", flush=True)

    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.runtime.messages import serialize_policy

    program, params, chunks = record_chunks(replay_config(4, args))
    chunk_bytes = int(statistics.median(len(pickle.dumps(c, protocol=pickle.HIGHEST_PROTOCOL))
                                        for c in chunks))
    payload_bytes = len(serialize_policy(params))
    sizes = {"env_id": args.env_id, "chunk_env_steps": args.num_steps * args.envs_per_actor,
             "chunk_bytes": chunk_bytes, "broadcast_payload_bytes": payload_bytes}
    if not args.no_gymnax:
        default = AsyncActorLearnerConfig()
        _, _, gymnax_chunks = record_chunks(dataclasses.replace(default, num_actors=1))
        sizes["gymnax_default_chunk_env_steps"] = default.num_steps * default.envs_per_actor
        sizes["gymnax_default_chunk_bytes"] = len(pickle.dumps(gymnax_chunks[0],
                                                               protocol=pickle.HIGHEST_PROTOCOL))
    print(f"chunk of {sizes['chunk_env_steps']} env steps ({args.env_id}): {chunk_bytes:,} bytes"
          + (f"; default gymnax chunk of {sizes['gymnax_default_chunk_env_steps']} env steps: "
             f"{sizes['gymnax_default_chunk_bytes']:,} bytes" if not args.no_gymnax else "")
          + f"; broadcast payload {payload_bytes:,} bytes", flush=True)

    ray_model = None if args.no_ray else ray_fan_out(serialize_policy(params), args.ray_sends, 50)
    if ray_model is not None:
        print(f"Ray: ray.put of the payload {ray_model['put_s'] * 1e3:.3f} ms; one small actor "
              f"call {ray_model['submit_s_per_send'] * 1e6:.0f} us to submit, "
              f"{ray_model['done_s_per_send'] * 1e6:.0f} us to complete", flush=True)
    rows = []
    for num_actors in args.actors:
        row = measure_actors(num_actors, chunk_bytes, args, program, params, chunks)
        row["demand"] = demand(num_actors, args, chunk_bytes, payload_bytes)
        row["learner_over_demand"] = (row["learner"]["chunks_per_s"]
                                      / row["demand"]["chunks_per_s"])
        if ray_model is not None:
            row["ray_fan_out_s"] = ray_model["put_s"] + num_actors * ray_model["done_s_per_send"]
            # One call per machine instead (a relay there hands the bytes to its actors):
            row["ray_fan_out_per_machine_s"] = (
                ray_model["put_s"] + max(1, num_actors // MACHINE_ACTORS)
                * ray_model["done_s_per_send"])
        rows.append(row)
        print(f"{num_actors:,} actors: learner {row['learner']['chunks_per_s']:,.0f} chunks/s "
              f"against a demand of {row['demand']['chunks_per_s']:,.0f}", flush=True)
    print(table(rows))
    profile = None
    if args.profile:
        profile = profile_ingest(max(args.actors), args, program, params, chunks)
        print(f"ingest alone at {max(args.actors):,} actors, waiting path, under cProfile: "
              f"{profile['chunks']:,} chunks in {profile['seconds']:.2f} s; most own time:")
        for entry in profile["top"]:
            print(f"  {entry['own_s']:7.3f} s  {entry['calls']:>7} calls  {entry['function']}")
    load_after = os.getloadavg()
    print(f"load average: {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    result = {"sizes": sizes, "ray_fan_out": ray_model, "rows": rows, "ingest_profile": profile,
              "actors_per_machine": MACHINE_ACTORS,
              "actor_env_steps_per_s": args.actor_env_steps_per_s,
              "load_average_before": load_before[0], "load_average_after": load_after[0]}
    common.save_result("bench_ingest", args.out, __file__, argv, result)
    return result


if __name__ == "__main__":
    main()
