"""`train(config)`: wire queues, actor threads and the learner; always shut down.

The learner runs in the calling thread (so Ctrl-C reaches it directly); the
actors run in daemon threads. Whatever ends the run -- its last update, an
actor's exception, a starved learner, KeyboardInterrupt -- the stop signal is
set and every actor thread is joined before `train` returns or raises.
"""

from __future__ import annotations

import json
import logging
import pathlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.serialization
import jax

from ppo_async.actor import (
    ActorChannels,
    ActorFailure,
    ActorHandle,
    ActorStart,
    make_actor_program,
    spawn_actor,
)
from ppo_async.config import AsyncActorLearnerConfig, resolve_device
from ppo_async.learner import (
    LearnerChannels,
    LearnerReport,
    broadcast,
    init_learner_state,
    learner_loop,
)
from ppo_async.networks import init_params
from ppo_async.policy_io import PolicyBroadcast

logger = logging.getLogger(__name__)

# Actors notice the stop signal within one chunk; a chunk is milliseconds, but
# the first one also compiles the rollout.
_JOIN_TIMEOUT_S = 60.0


class TrainResult(NamedTuple):
    params: Any  # host (numpy) flax params pytree of the final policy
    report: LearnerReport


def _join_actors(handles: list[ActorHandle], timeout_s: float) -> list[int]:
    """Join every actor within ``timeout_s`` overall; the ids still alive."""
    deadline = time.monotonic() + timeout_s
    for handle in handles:
        handle.join(max(0.0, deadline - time.monotonic()))
    return [h.actor_id for h in handles if h.thread.is_alive()]


class _RunLog:
    """metrics.jsonl writer and progress bar; both optional."""

    def __init__(self, config: AsyncActorLearnerConfig, run_dir: pathlib.Path | None,
                 progress: bool):
        self.file = None
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
            self.file = open(run_dir / "metrics.jsonl", "w", buffering=1)
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=config.num_updates, unit="upd", desc=config.env_id)

    def __call__(self, metrics: dict[str, float]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(metrics) + "\n")
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(
                sps=f"{metrics['env_steps_per_s']:.0f}",
                ret=f"{metrics['episode_return']:.1f}",
                lag=f"{metrics['policy_lag_max']:.0f}",
                refresh=False,
            )

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.bar is not None:
            self.bar.close()


def train(
    config: AsyncActorLearnerConfig,
    *,
    run_dir: str | pathlib.Path | None = None,
    progress: bool = True,
    on_update: Callable[[dict[str, float]], None] | None = None,
) -> TrainResult:
    """Run asynchronous actor-learner PPO as ``config`` says.

    Args:
      config: the run's configuration (validated on construction).
      run_dir: if given, write ``config.json``, ``metrics.jsonl`` (one JSON
        object per update) and the final ``params.msgpack`` (flax bytes) there.
      progress: show a progress bar with env steps/s, return and lag.
      on_update: also called with each update's metrics dict.

    Raises:
      ConfigError: a device the config names does not exist.
      ActorError: an actor raised (chained to its exception).
      LearnerTimeoutError: no experience for ``config.learner_timeout_s``.
    """
    learner_device = resolve_device(config.learner_device)
    actor_device = resolve_device(config.actor_device)
    run_dir = pathlib.Path(run_dir) if run_dir is not None else None

    program = make_actor_program(config)
    params_key, learner_key = jax.random.split(jax.random.key(config.seed))
    params = init_params(program.network, params_key, program.observation_shape)
    state = jax.device_put(init_learner_state(config, params, learner_key), learner_device)

    experience_queue: queue.Queue = queue.Queue()
    broadcast_queues = [queue.Queue() for _ in range(config.num_actors)]
    stop = threading.Event()
    learner_channels = LearnerChannels(experience_queue, broadcast_queues)
    first_broadcast = broadcast(learner_channels, state.params, 0)

    run_log = _RunLog(config, run_dir, progress)

    def record(metrics: dict[str, float]) -> None:
        run_log(metrics)
        if on_update is not None:
            on_update(metrics)

    handles: list[ActorHandle] = []

    def channels_of(actor_id: int) -> ActorChannels:
        return ActorChannels(experience_queue, broadcast_queues[actor_id], stop)

    def restart_actor(failure: ActorFailure, produced_steps: int,
                      latest: PolicyBroadcast) -> bool:
        """The supervisor: replace a failed actor while its restart budget lasts."""
        old = handles[failure.actor_id]
        if old.stats.restarts >= config.max_actor_restarts:
            return False
        logger.warning(
            "actor %d failed; restarting it (restart %d of %d):\n%s", failure.actor_id,
            old.stats.restarts + 1, config.max_actor_restarts, failure.formatted_traceback,
        )
        old.join(_JOIN_TIMEOUT_S)  # it ended right after sending its failure
        old.stats.restarts += 1
        # The dead actor may have drained every broadcast; give its successor the newest.
        broadcast_queues[failure.actor_id].put(latest)
        start = ActorStart(restart=old.stats.restarts, produced_steps=produced_steps)
        handles[failure.actor_id] = spawn_actor(
            failure.actor_id, config, program, channels_of(failure.actor_id),
            actor_device, old.stats, start,
        )
        return True

    try:
        for actor_id in range(config.num_actors):
            handles.append(
                spawn_actor(actor_id, config, program, channels_of(actor_id), actor_device)
            )
        state, report = learner_loop(
            config, program.network, state, learner_channels, learner_device, record,
            on_actor_failure=restart_actor, latest_broadcast=first_broadcast,
        )
    finally:
        stop.set()
        alive = _join_actors(handles, _JOIN_TIMEOUT_S)
        run_log.close()
        if alive:
            # Only reached if an actor is stuck inside a single rollout; the
            # threads are daemons, so the process can still exit.
            logger.error("actor threads %s did not stop within %.0f s", alive, _JOIN_TIMEOUT_S)
    if alive:
        raise RuntimeError(f"actor threads {alive} did not stop within {_JOIN_TIMEOUT_S} s")

    report.actor_stats = [handle.stats for handle in handles]
    report.actor_restarts = sum(stats.restarts for stats in report.actor_stats)
    params = jax.device_get(state.params)
    if run_dir is not None:
        (run_dir / "params.msgpack").write_bytes(flax.serialization.to_bytes(params))
    return TrainResult(params, report)
