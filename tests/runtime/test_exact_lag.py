"""exact_policy_lag: every chunk is collected with exactly the params version it needs,
so two runs with one seed give the same bytes, whatever the thread timing."""

import dataclasses
import json
import logging
import queue
import threading
import time

import gymnasium
import jax
import numpy as np
import pytest

from ppo_async import AsyncActorLearnerConfig, ConfigError, PolicyBroadcast, train
from ppo_async.config import fields_from_json
from ppo_async.envs.host import HostStep
from ppo_async.envs.registry import register_host_env
from ppo_async.runs.checkpoint import list_checkpoints
from ppo_async.runtime.actor import ActorStats, QueueEndpoint, _ExactParams, exact_version
from ppo_async.sync import make_train

from run_helpers import break_actor_once, interrupt_at
from run_helpers import learning_metrics as _learning_metrics
from run_helpers import params_bytes as _bytes

EXACT = AsyncActorLearnerConfig(
    num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=2, num_minibatches=2,
    total_env_steps=2 * 2 * 8 * 8, exact_policy_lag=1, learner_timeout_s=30.0,
    shutdown_timeout_s=10.0, seed=5, sampler="shared",  # thread actors (None: the learner's program)
)


def test_each_chunk_needs_the_version_lag_updates_behind_its_own():
    # Chunk c feeds update c + 1, which sees version c - K (0 at first); with
    # broadcasts every b updates, the newest broadcast not above it.
    assert [exact_version(c, 0, 1) for c in range(5)] == [0, 1, 2, 3, 4]
    assert [exact_version(c, 1, 1) for c in range(5)] == [0, 0, 1, 2, 3]
    assert [exact_version(c, 3, 1) for c in range(6)] == [0, 0, 0, 0, 1, 2]
    assert [exact_version(c, 1, 2) for c in range(7)] == [0, 0, 0, 2, 2, 4, 4]


def test_the_lead_is_fixed_by_the_exact_lag_and_may_not_be_set_apart():
    assert EXACT.lead_steps == 2 * EXACT.num_steps
    assert dataclasses.replace(EXACT, exact_policy_lag=3, broadcast_every=2).lead_steps == 5 * 8
    assert dataclasses.replace(EXACT, exact_policy_lag=0).lock_step
    with pytest.raises(ConfigError, match="exact_policy_lag"):
        dataclasses.replace(EXACT, max_lead_steps=3 * EXACT.num_steps)
    with pytest.raises(ConfigError, match="exact_policy_lag"):
        dataclasses.replace(EXACT, exact_policy_lag=-1)
    # A lead given alone chooses free-running actors; beside an exact lag, only its own.
    assert AsyncActorLearnerConfig(max_lead_steps=3 * 64).exact_lag is None
    assert AsyncActorLearnerConfig(**fields_from_json(EXACT.to_dict())) == EXACT


def test_a_newer_broadcast_that_arrived_early_is_not_used():
    broadcasts = queue.Queue()
    for version in (0, 1, 2, 3):  # everything has arrived before the first chunk
        broadcasts.put(PolicyBroadcast(version, b""))
    endpoint = QueueEndpoint(queue.Queue(), broadcasts, threading.Event())
    chooser = _ExactParams(EXACT, endpoint, load=lambda broadcast: broadcast.version,
                           stats=[ActorStats(0)], first_version=0)
    used = [chooser.params_for(chunk * EXACT.num_steps) for chunk in range(5)]
    assert used == [0, 0, 1, 2, 3]  # never the newest waiting, always chunk - 1
    # A version that has not come yet is waited for (None), not replaced by another.
    assert chooser.params_for(5 * EXACT.num_steps) is None


def test_params_asked_ahead_never_wait_and_leave_a_failed_load_to_the_actors_thread():
    """A sampler asks for the next chunk's params as a chunk ends (``ahead``): it gets
    them if they have arrived, else None at once; a broadcast that fails to load is
    raised by the actor's own next call, not in the sampler's thread."""
    broadcasts = queue.Queue()
    broadcasts.put(PolicyBroadcast(0, b""))
    endpoint = QueueEndpoint(queue.Queue(), broadcasts, threading.Event())

    def load(broadcast):
        if broadcast.version == 2:
            raise ValueError("a broken broadcast")
        return broadcast.version

    chooser = _ExactParams(EXACT, endpoint, load=load, stats=[ActorStats(0)], first_version=0)
    assert chooser.params_for(0) == 0
    started = time.perf_counter()
    assert chooser.params_for(2 * EXACT.num_steps, ahead=True) is None  # version 1: not yet
    assert time.perf_counter() - started < 0.02  # not the actor thread's wait of 50 ms
    broadcasts.put(PolicyBroadcast(1, b""))
    assert chooser.params_for(2 * EXACT.num_steps, ahead=True) == 1
    assert chooser.params_for(2 * EXACT.num_steps) == 1  # the same, at once
    broadcasts.put(PolicyBroadcast(2, b""))
    assert chooser.params_for(3 * EXACT.num_steps, ahead=True) is None
    with pytest.raises(ValueError, match="a broken broadcast"):
        chooser.params_for(3 * EXACT.num_steps)


@pytest.mark.parametrize("fields", [
    dict(exact_policy_lag=1, num_actors=2),
    dict(exact_policy_lag=3, num_actors=4, envs_per_actor=1),
    dict(exact_policy_lag=0, num_actors=2),
    dict(exact_policy_lag=1, num_actors=2, normalize_observations=True, normalize_rewards=True),
], ids=["lag1-2actors", "lag3-4actors", "lag0-2actors", "lag1-normalized"])
def test_two_runs_with_one_seed_give_the_same_bytes(tmp_path, fields):
    config = dataclasses.replace(EXACT, **fields)
    first = train(config, run_dir=tmp_path / "first", progress=False)
    second = train(config, run_dir=tmp_path / "second", progress=False)
    assert _bytes(first.params) == _bytes(second.params)
    assert _learning_metrics(tmp_path / "first") == _learning_metrics(tmp_path / "second")
    # The final checkpoints (learner state, counters, every actor's env carry), byte for byte.
    checkpoints = [list_checkpoints(tmp_path / run / "checkpoints")[-1] for run in ("first", "second")]
    assert checkpoints[0].name == checkpoints[1].name
    assert checkpoints[0].read_bytes() == checkpoints[1].read_bytes()
    summary = json.loads((tmp_path / "first" / "summary.json").read_text())
    assert summary["reproducible"] is True
    # Every consumed chunk was exactly K updates old once K updates were done.
    lag, updates = config.exact_lag, first.report.updates
    expected = {k: config.num_actors for k in range(lag)}
    expected[lag] = config.num_actors * (updates - lag)
    assert first.report.policy_lag_counts == expected


class NoisyWalk:
    """A host env of numpy: a random walk seeded by reset, rewarded for staying near 0."""

    observation_shape = (2,)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, num_envs):
        self.num_envs, self.rng, self.t = num_envs, None, np.zeros(num_envs, int)

    def reset(self, seed):
        self.rng = np.random.default_rng(seed)
        self.x = self.rng.normal(size=self.num_envs)
        return self._obs()

    def _obs(self):
        return np.stack([self.x, self.t / 10.0], -1).astype(np.float32)

    def step(self, actions):
        self.x = self.x + (2 * actions - 1) * 0.1 + 0.05 * self.rng.normal(size=self.num_envs)
        self.t += 1
        truncated = self.t >= 10
        final = self._obs()
        self.t[truncated] = 0
        self.x[truncated] = self.rng.normal(size=int(truncated.sum()))
        reward = -np.abs(self.x).astype(np.float32)
        return HostStep(self._obs(), reward, np.zeros(self.num_envs, bool), truncated, final)


@pytest.mark.slow
@pytest.mark.parametrize("fields", [
    dict(env_id="host:noisy-walk"),
    dict(env_id="gymnasium:CartPole-v1"),
    dict(network="lstm", num_minibatches=2, envs_per_actor=2),
    dict(exact_policy_lag=3, num_actors=1, envs_per_actor=4),
], ids=["host", "gymnasium", "lstm", "lag3-1actor"])
def test_host_envs_recurrent_networks_and_longer_lags_are_reproducible_too(tmp_path, fields):
    register_host_env("noisy-walk", NoisyWalk)
    config = dataclasses.replace(EXACT, **fields)
    first, second = (train(config, progress=False) for _ in range(2))
    assert _bytes(first.params) == _bytes(second.params)


@pytest.mark.parametrize("lag", [1, 3])
def test_one_actor_at_an_exact_lag_reproduces_the_twin_at_that_lag(lag):
    config = dataclasses.replace(EXACT, num_actors=1, envs_per_actor=4, exact_policy_lag=lag)
    async_params = train(config, progress=False).params
    sync_params = jax.jit(make_train(config, policy_lag=lag))(jax.random.key(config.seed)).params
    assert _bytes(sync_params) == _bytes(async_params)


def test_an_exact_lag_run_resumed_from_a_checkpoint_continues_byte_identically(tmp_path):
    config = dataclasses.replace(EXACT, checkpoint_every_updates=3, keep_checkpoints=2)
    whole = train(config, run_dir=tmp_path / "whole", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(config, run_dir=tmp_path / "cut", progress=False, on_update=interrupt_at(5))
    resumed = train(config, resume_from=tmp_path / "cut", progress=False)
    assert resumed.report.updates == whole.report.updates
    assert _bytes(resumed.params) == _bytes(whole.params)
    assert _learning_metrics(tmp_path / "cut") == _learning_metrics(tmp_path / "whole")
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["reproducible"] is True


def test_a_run_whose_config_json_holds_the_resolved_lag_and_lead_resumes(tmp_path):
    from ppo_async.resume import load_run_config

    config = dataclasses.replace(EXACT, checkpoint_every_updates=3, keep_checkpoints=2)
    # Older versions wrote both fields resolved, as ints: a run given both is such a run.
    old = dataclasses.replace(config, max_lead_steps=config.lead_steps)
    assert (old.to_dict()["exact_policy_lag"], old.to_dict()["max_lead_steps"]) == (1, 16)
    # "auto" is exact lag 1: the default run is the same run.
    whole = train(dataclasses.replace(config, exact_policy_lag="auto"),
                  run_dir=tmp_path / "whole", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(old, run_dir=tmp_path / "cut", progress=False, on_update=interrupt_at(5))
    saved = load_run_config(tmp_path / "cut")  # what ppo-async train --resume starts from
    assert (saved.exact_lag, saved.lead_steps) == (1, 16)
    resumed = train(dataclasses.replace(saved, num_steps=8), resume_from=tmp_path / "cut",
                    progress=False)
    assert resumed.report.updates == whole.report.updates
    assert _bytes(resumed.params) == _bytes(whole.params)


def test_a_free_running_run_and_a_restarted_actor_are_marked_not_reproducible(tmp_path,
                                                                              monkeypatch):
    free = dataclasses.replace(EXACT, exact_policy_lag=None, total_env_steps=2 * 2 * 8 * 3)
    train(free, run_dir=tmp_path / "free", progress=False)
    summary = json.loads((tmp_path / "free" / "summary.json").read_text())
    assert summary["reproducible"] is False
    assert "exact_policy_lag=None" in summary["not_reproducible_because"]

    break_actor_once(monkeypatch, actor_id=1, chunk=3)
    restarted = dataclasses.replace(EXACT, max_actor_restarts=1)
    report = train(restarted, run_dir=tmp_path / "restarted", progress=False).report
    assert report.actor_restarts == 1 and report.updates == restarted.num_updates
    summary = json.loads((tmp_path / "restarted" / "summary.json").read_text())
    assert summary["reproducible"] is False
    assert "restart" in summary["not_reproducible_because"]
    assert np.isfinite(summary["episode_return_mean"])


def test_evaluations_an_exact_lag_run_could_not_finish_are_counted_and_said(monkeypatch, caplog):
    # With an exact lag no evaluation request replaces another (which policies are
    # scored must not depend on timing); those still queued at the end are counted.
    from ppo_async.runtime.evaluate import EvalResult, Evaluator

    def slow(self, broadcast, seed=0):
        time.sleep(0.6)
        return EvalResult(np.ones(1, np.float32), np.ones(1, np.int32), 1.0, 0.0)

    monkeypatch.setattr(Evaluator, "evaluate_broadcast", slow)
    config = dataclasses.replace(EXACT, eval_every_updates=1, eval_episodes=1,
                                 shutdown_timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="ppo_async.train"):
        report = train(config, progress=False).report
    evaluated = [version for version, _ in report.eval_returns]
    assert evaluated == list(range(1, len(evaluated) + 1))  # in order, none replaced
    assert report.eval_requests_skipped > 0
    assert len(evaluated) + report.eval_requests_skipped == config.num_updates
    assert "were not run before the run ended" in caplog.text
