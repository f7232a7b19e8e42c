"""The actor-learner runtime: weights as bytes, the valve, the buffer, train().

Integration runs use a tiny topology (2 actors x 2 envs x 8 steps) so that a
run is a few seconds, most of it compilation (cached on disk by conftest).
"""

import collections
import dataclasses
import json
import logging
import re
import time
from typing import NamedTuple

import chex
import flax.serialization
import jax
import numpy as np
import pytest

from ppo_async import (
    ActorError,
    ActorThrottle,
    AsyncActorLearnerConfig,
    Experience,
    LearnerTimeoutError,
    NonFiniteError,
    PolicyBroadcast,
    PolicyLoadError,
    RolloutBuffer,
    load_policy_from_broadcast,
    serialize_policy,
    train,
)
from ppo_async.core.devices import place
from ppo_async.envs.program import Trajectory
from ppo_async.runtime.actor import current_actor
from ppo_async.networks.actor_critic import init_params, make_network

from run_helpers import patch_rollout

TINY = AsyncActorLearnerConfig(
    num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=1, num_minibatches=2,
    total_env_steps=2 * 2 * 8 * 6, learner_timeout_s=30.0, seed=0,
)


# --- weights as bytes -------------------------------------------------------------

def _cartpole_params(seed):
    network = make_network((4,), type("Discrete", (), {"n": 2})(), (16, 16))
    return network, init_params(network, jax.random.key(seed), (4,))


def test_policy_bytes_round_trip_exactly_onto_requested_device():
    _, params = _cartpole_params(0)
    _, template = _cartpole_params(1)
    device = jax.devices("cpu")[0]
    message = PolicyBroadcast(3, serialize_policy(params))
    assert isinstance(message.payload, bytes)
    loaded = load_policy_from_broadcast(message, jax.device_get(template), device)
    chex.assert_trees_all_equal(jax.device_get(loaded), jax.device_get(params))
    for leaf in jax.tree.leaves(loaded):
        assert leaf.devices() == {device}


def test_place_copies_a_host_tree_onto_the_device_like_device_put():
    _, params = _cartpole_params(0)
    host = jax.device_get(params)
    host["params"]["flag"] = np.array([True, False])  # not every leaf is float32
    device = jax.devices("cpu")[0]
    placed = place(host, device)
    assert jax.tree.structure(placed) == jax.tree.structure(host)
    for leaf, expected in zip(jax.tree.leaves(placed), jax.tree.leaves(host)):
        assert isinstance(leaf, jax.Array) and leaf.committed
        assert leaf.devices() == {device}
        assert leaf.dtype == expected.dtype
        np.testing.assert_array_equal(np.asarray(leaf), expected)
    # A later change to the host arrays does not reach the placed copy.
    host["params"]["flag"][0] = False
    assert bool(placed["params"]["flag"][0])
    assert not jax.tree.leaves(place(host, None))[0].committed


def test_broadcast_of_another_architecture_is_refused():
    _, params = _cartpole_params(0)
    wider = make_network((4,), type("Discrete", (), {"n": 2})(), (32, 16))
    other = init_params(wider, jax.random.key(0), (4,))
    message = PolicyBroadcast(1, serialize_policy(other))
    with pytest.raises(PolicyLoadError, match="version 1"):
        load_policy_from_broadcast(message, jax.device_get(params))
    with pytest.raises(PolicyLoadError):
        load_policy_from_broadcast(PolicyBroadcast(2, b"not msgpack"), params)


# --- the staleness valve ----------------------------------------------------------

def test_throttle_decisions_on_hand_made_counters():
    lock_step = ActorThrottle(num_steps=8, max_lead_steps=8)
    assert lock_step.may_start_chunk(produced_steps=0, learner_updates=0)
    assert not lock_step.may_start_chunk(produced_steps=8, learner_updates=0)
    assert lock_step.may_start_chunk(produced_steps=8, learner_updates=1)
    assert not lock_step.may_start_chunk(produced_steps=16, learner_updates=1)

    two_chunks = ActorThrottle(num_steps=8, max_lead_steps=16)
    assert two_chunks.may_start_chunk(8, 0)
    assert not two_chunks.may_start_chunk(16, 0)
    assert two_chunks.may_start_chunk(16, 1)
    assert not two_chunks.may_start_chunk(24, 1)
    # A lead that is not a whole number of chunks rounds down to whole chunks.
    odd = ActorThrottle(num_steps=8, max_lead_steps=20)
    assert odd.may_start_chunk(8, 0) and not odd.may_start_chunk(16, 0)


# --- the rollout buffer -----------------------------------------------------------

def _fake_experience(actor_id, version, num_steps=2, num_envs=1):
    zeros = np.zeros((num_steps, num_envs), np.float32)
    trajectory = Trajectory(
        obs=np.full((num_steps, num_envs, 1), actor_id, np.float32),
        action=zeros.astype(np.int32), reward=zeros + version,
        terminated=zeros.astype(bool), truncated=zeros.astype(bool),
        behaviour_logp=zeros, behaviour_value=zeros,
        episode_return=zeros, episode_length=zeros.astype(np.int32),
    )
    return Experience(actor_id, version, trajectory, np.zeros((num_envs, 1)), np.zeros(num_envs))


def test_rollout_buffer_fills_by_column_and_pops_in_actor_order():
    buffer = RolloutBuffer(num_actors=3)
    buffer.add(_fake_experience(2, 0))
    buffer.add(_fake_experience(0, 0))
    buffer.add(_fake_experience(2, 1))
    assert not buffer.ready()
    with pytest.raises(RuntimeError):
        buffer.pop_batch()
    buffer.add(_fake_experience(1, 0))
    assert buffer.ready()
    batch = buffer.pop_batch()
    assert [e.actor_id for e in batch] == [0, 1, 2]
    assert [e.policy_version for e in batch] == [0, 0, 0]  # oldest chunk first
    assert not buffer.ready()  # actor 2's second chunk waits for the others
    assert len(buffer.columns[2]) == 1 and buffer.columns[2][0].policy_version == 1


def test_rollout_buffer_counts_its_empty_columns_as_chunks_come_and_go():
    """ready() is a count kept by add and pop_batch (O(1) per chunk at thousands of actors)."""
    rng = np.random.default_rng(0)
    buffer = RolloutBuffer(num_actors=5)
    for _ in range(300):
        if buffer.ready() and rng.random() < 0.3:
            buffer.pop_batch()
        else:
            buffer.add(_fake_experience(int(rng.integers(5)), 0))
        assert buffer.ready() == all(buffer.columns)
        assert buffer.empty_columns == sum(not column for column in buffer.columns)


# --- train(): integration ---------------------------------------------------------

# --- the learner's pipelined readback ----------------------------------------------

class _ScriptedActors:
    """A learner transport whose actors are a script, with every event logged.

    ``lock_step=False``: every chunk of the run is there from the start.
    ``lock_step=True``: each broadcast of update U brings the chunks made with
    it, and nothing comes before, as with a valve of one chunk. The learner
    must never block on it: a wait with nothing queued fails the test rather
    than hang.
    """

    def __init__(self, log, updates, lock_step):
        self.log, self.lock_step = log, lock_step
        self.queue = collections.deque()
        for version in ([0] if lock_step else [0] * updates):
            self._chunks(version)

    def _chunks(self, version):
        self.queue.extend(_fake_experience(actor_id, version) for actor_id in range(2))

    def receive(self, timeout_s):
        if self.queue:
            return self.queue.popleft()
        assert timeout_s == 0.0, "the learner blocked on actors that can send nothing"
        return None

    def publish(self, params, learner_updates):
        self.log.append(("publish", learner_updates))
        if self.lock_step:
            self._chunks(learner_updates)

    def queue_depth(self):
        return len(self.queue)


class _FakeState(NamedTuple):
    params: int  # the number of updates this state has had


def _scripted_learner(log, lock_step, updates=4, nan_at=None, stop_at=None, pipeline=True):
    """Run `learner_loop` on `_ScriptedActors` with an update that counts, logging to ``log``."""
    from ppo_async import StopTraining, learner_loop
    from ppo_async.runtime.learner import LearnerConnections, LearnerHooks

    def update(state, batch):
        log.append(("update", state.params))
        finite = 0.0 if state.params + 1 == nan_at else 1.0
        return _FakeState(state.params + 1), {"params_finite": finite, "loss": 0.5}

    def on_update(metrics):
        log.append(("metrics", metrics["update"]))
        if metrics["update"] == stop_at:
            raise StopTraining

    def after_update(state, report, carries):
        log.append(("saved", state.params))

    config = dataclasses.replace(TINY, num_steps=2, envs_per_actor=1)
    channels = LearnerConnections(_ScriptedActors(log, updates, lock_step))
    return learner_loop(config, None, _FakeState(0), channels, jax.devices("cpu")[0],
                        LearnerHooks(on_update, after_update=after_update), update=update,
                        end_update=updates, pipeline=pipeline)


def _events(log, kind):
    return [n for event, n in log if event == kind]


def test_the_next_update_is_dispatched_before_the_last_one_is_read_back():
    log = []
    state, report = _scripted_learner(log, lock_step=False)
    assert log == [
        ("update", 0), ("update", 1), ("publish", 1), ("metrics", 1), ("saved", 1),
        ("update", 2), ("publish", 2), ("metrics", 2), ("saved", 2),
        ("update", 3), ("publish", 3), ("metrics", 3), ("saved", 3),
        ("metrics", 4), ("saved", 4),
    ]
    assert state.params == 4 and report.updates == 4
    # Every chunk was made by policy 0, and update k consumed its chunks after
    # k - 1 updates had been dispatched: lags 0, 1, 2, 3.
    assert report.policy_lag_counts == {0: 2, 1: 2, 2: 2, 3: 2}


def test_without_pipelining_each_update_is_read_back_before_the_next():
    log = []
    _scripted_learner(log, lock_step=False, pipeline=False)
    assert [event for event, _ in log if event in ("update", "metrics")] == ["update", "metrics"] * 4


def test_lock_step_never_waits_for_experience_with_params_unpublished():
    log = []
    state, report = _scripted_learner(log, lock_step=True)
    assert log == [
        ("update", 0), ("publish", 1), ("metrics", 1), ("saved", 1),
        ("update", 1), ("publish", 2), ("metrics", 2), ("saved", 2),
        ("update", 2), ("publish", 3), ("metrics", 3), ("saved", 3),
        ("update", 3), ("metrics", 4), ("saved", 4),
    ]
    assert report.policy_lag_counts == {0: 8}


def test_a_nan_update_is_never_published_even_with_the_next_one_in_flight():
    log = []
    with pytest.raises(NonFiniteError, match="update 2: the updated params contain NaN"):
        _scripted_learner(log, lock_step=False, nan_at=2)
    # Update 3 was dispatched on update 2's state before 2 was read back; neither
    # reached the actors or a checkpoint.
    assert log == [("update", 0), ("update", 1), ("publish", 1), ("metrics", 1), ("saved", 1),
                   ("update", 2)]


def test_stop_training_with_the_next_update_in_flight_returns_the_stopped_update():
    log = []
    state, report = _scripted_learner(log, lock_step=False, stop_at=2)
    assert state.params == 2 and report.updates == 2
    assert _events(log, "update") == [0, 1, 2]  # the third was dispatched, then dropped
    assert _events(log, "saved") == [1, 2] and _events(log, "metrics") == [1, 2]


def test_two_actors_run_a_few_updates_and_stop_cleanly(tmp_path):
    seen = []
    config = dataclasses.replace(TINY, sampler="shared")  # thread actors: broadcasts they take
    result = train(config, run_dir=tmp_path, progress=False, on_update=seen.append)
    report = result.report
    assert report.updates == TINY.num_updates == 6
    assert report.env_steps == 6 * TINY.batch_size
    assert report.wall_time_s > 0 and report.env_steps_per_s > 0
    assert len(report.actor_stats) == 2
    for stats in report.actor_stats:
        assert stats.rollouts_sent >= 6  # at least what the learner consumed
        assert stats.env_steps == stats.rollouts_sent * TINY.num_steps * TINY.envs_per_actor
        assert stats.broadcasts_received >= 1
    chex.assert_tree_all_finite(result.params)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(result.params))
    # Every update's metrics are finite and on disk, one JSON object per line.
    assert len(seen) == 6
    for metrics in seen:
        assert {"policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
                "policy_lag_mean", "policy_lag_max", "queue_depth", "learner_wait_s",
                "env_steps_per_s", "episode_return"} <= metrics.keys()
        assert all(np.isfinite(v) for k, v in metrics.items() if k != "episode_return")
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["update"] for line in lines] == [1, 2, 3, 4, 5, 6]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["max_lead_steps"] == TINY.max_lead_steps
    restored = flax.serialization.from_bytes(
        result.params, (tmp_path / "params.msgpack").read_bytes()
    )
    chex.assert_trees_all_equal(restored, result.params)


def test_a_second_run_in_the_process_compiles_nothing(caplog):
    """A notebook's next run, a sweep's next cell: another seed, budget and
    learning rate on the same env and network find every program (update,
    rollout, reset, initializers) compiled by the first run."""
    train(TINY, progress=False)  # compiles, or finds what an earlier test compiled
    other = dataclasses.replace(TINY, seed=1, learning_rate=1e-3,
                                total_env_steps=TINY.total_env_steps // 2)
    jax.config.update("jax_log_compiles", True)  # process-wide: the actors' threads too
    try:
        with caplog.at_level(logging.WARNING, logger="jax"):
            result = train(other, progress=False)
    finally:
        jax.config.update("jax_log_compiles", False)
    assert result.report.updates == other.num_updates
    compiled = [r.getMessage()[:80] for r in caplog.records if r.getMessage().startswith("Compiling")]
    assert compiled == []


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_update_compiles_once_before_the_first_batch(recorded_updates, env_id):
    updates, calls = recorded_updates
    config = dataclasses.replace(TINY, env_id=env_id, sampler="shared")  # thread actors
    train(config, progress=False)
    # One warm-up call on zeros (in its own thread, while the initializers and the
    # actors' rollout compile), then the real batches, all with the same shapes
    # and dtypes: the update compiled once.
    assert len(calls) == config.num_updates + 1
    assert all(c == calls[0] for c in calls)
    assert updates[0]._cache_size() == 1


@pytest.mark.parametrize(
    "lead_chunks, broadcast_every, use_vtrace",
    [(1, 1, False), (2, 1, False), (3, 1, True), (4, 2, False), (2, 2, True)],
)
def test_policy_lag_is_bounded_by_the_valve(lead_chunks, broadcast_every, use_vtrace):
    config = dataclasses.replace(
        TINY, max_lead_steps=lead_chunks * TINY.num_steps, broadcast_every=broadcast_every,
        use_vtrace=use_vtrace, total_env_steps=TINY.batch_size * 12,
    )
    report = train(config, progress=False).report
    assert report.updates == 12
    assert report.policy_lag_max <= config.lead_steps // config.num_steps - 1
    assert sum(report.policy_lag_counts.values()) == 12 * config.num_actors
    assert max(report.policy_lag_counts) == report.policy_lag_max


def test_lock_step_runs_are_byte_identical():
    config = dataclasses.replace(TINY, max_lead_steps=TINY.num_steps, broadcast_every=1)
    assert config.lock_step
    first = train(config, progress=False)
    second = train(config, progress=False)
    assert first.report.policy_lag_max == 0
    assert flax.serialization.to_bytes(first.params) == flax.serialization.to_bytes(
        second.params
    )
    # ...and a different seed really changes them (the check can fail).
    other = train(dataclasses.replace(config, seed=1), progress=False)
    assert flax.serialization.to_bytes(other.params) != flax.serialization.to_bytes(
        first.params
    )


class _Boom(RuntimeError):
    pass


def test_an_actor_that_raises_stops_the_run_naming_it(monkeypatch):
    calls = {}

    def wrap(rollout):
        def failing(params, carry):
            # Chunks of every actor share this counter; the 3rd chunk overall raises.
            calls["n"] = calls.get("n", 0) + 1
            if calls["n"] == 3:
                raise _Boom("env exploded")
            return rollout(params, carry)
        return failing

    patch_rollout(monkeypatch, wrap)
    config = dataclasses.replace(TINY, total_env_steps=TINY.batch_size * 50)
    with pytest.raises(ActorError, match=r"actor \d failed") as info:
        train(config, progress=False)
    assert isinstance(info.value.__cause__, _Boom)
    assert "env exploded" in str(info.value)
    assert info.value.actor_id in (0, 1)


def test_a_starved_learner_times_out(monkeypatch):
    def wrap(rollout):
        def stuck(params, carry):
            time.sleep(1.5)  # longer than the learner will wait
            return rollout(params, carry)
        return stuck

    patch_rollout(monkeypatch, wrap)
    config = dataclasses.replace(TINY, learner_timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(LearnerTimeoutError, match="learner_timeout_s=0.5"):
        train(config, progress=False)
    assert time.monotonic() - start < 30
    _wait_for_run_threads()  # slow, not hung: they end after their sleep


def _wait_for_run_threads(timeout_s=30.0):
    from conftest import run_threads_alive

    deadline = time.monotonic() + timeout_s
    while run_threads_alive() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_keyboard_interrupt_stops_cleanly():
    def interrupt(metrics):
        if metrics["update"] == 2:
            raise KeyboardInterrupt

    config = dataclasses.replace(TINY, total_env_steps=TINY.batch_size * 50)
    with pytest.raises(KeyboardInterrupt):
        train(config, progress=False, on_update=interrupt)


def test_vtrace_update_runs_and_reports_clipped_rho():
    seen = []
    config = dataclasses.replace(TINY, use_vtrace=True, vtrace_rho_bar=0.9)
    train(config, progress=False, on_update=seen.append)
    rhos = [m["vtrace_clipped_rho_mean"] for m in seen]
    assert all(0 < rho <= 0.9 + 1e-6 for rho in rhos)


def test_the_learners_vtrace_uses_target_minus_behaviour_log_probs():
    """With nonzero log-rhos of both signs, the update's V-trace equals the numpy
    reference fed log pi(a|x) - log mu(a|x) from the network itself: flipping
    the sign, or swapping the two log-probs, changes every checked figure."""
    from ppo_async.core.update import Batch, init_learner_state, make_update_fn

    from reference import vtrace_reference

    # The rho-weighted advantage (vtrace_pg_rho_bar set) shows the sign in every figure.
    config = dataclasses.replace(TINY, use_vtrace=True, vtrace_rho_bar=1.0, vtrace_c_bar=1.0,
                                 vtrace_lambda=0.9, vtrace_pg_rho_bar=1.0)
    network = make_network((4,), type("Discrete", (), {"n": 2})(), config.hidden_sizes)
    params = init_params(network, jax.random.key(3), (4,))
    rng = np.random.default_rng(0)
    T, B = config.num_steps, config.num_envs
    obs = rng.normal(size=(T, B, 4)).astype(np.float32)
    action = rng.integers(0, 2, size=(T, B)).astype(np.int32)
    dist, values = network.apply(params, obs)
    target_logp = np.asarray(dist.log_prob(action), np.float64)
    # Behaviour log-probs off by +-0.5: some rhos above 1 (clipped), some below.
    behaviour_logp = (target_logp + rng.choice([-0.5, 0.5], size=(T, B))).astype(np.float32)
    done = rng.random((T, B)) < 0.1
    batch = Batch(
        obs=obs, action=action, reward=rng.normal(size=(T, B)).astype(np.float32), done=done,
        behaviour_logp=behaviour_logp, behaviour_value=np.zeros((T, B), np.float32),
        bootstrap_obs=rng.normal(size=(B, 4)).astype(np.float32),
        bootstrap_value=np.zeros(B, np.float32),
    )
    state = init_learner_state(config.update_options(), params, jax.random.key(0))
    _, metrics = make_update_fn(config.update_options(), network)(
        state, jax.tree.map(np.asarray, batch))

    _, bootstrap_value = network.apply(params, batch.bootstrap_obs)
    log_rhos = target_logp - np.asarray(behaviour_logp, np.float64)
    targets, pg_advantages, clipped = vtrace_reference(
        batch.reward, np.asarray(values), config.gamma * (1.0 - done), np.asarray(bootstrap_value),
        log_rhos, lambda_=0.9, rho_bar=1.0, c_bar=1.0,
    )
    assert 0.2 < float(np.mean(log_rhos > 0)) < 0.8
    np.testing.assert_allclose(metrics["vtrace_clipped_rho_mean"], clipped.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["advantage_mean"], pg_advantages.mean(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(metrics["value_target_mean"], targets.mean(), rtol=1e-4, atol=1e-5)
    flipped = vtrace_reference(
        batch.reward, np.asarray(values), config.gamma * (1.0 - done), np.asarray(bootstrap_value),
        -log_rhos, lambda_=0.9, rho_bar=1.0, c_bar=1.0,
    )
    assert abs(flipped[2].mean() - clipped.mean()) > 0.05  # the check above can tell


def test_cli_train_writes_a_run_directory(tmp_path, capsys):
    from ppo_async.tools.cli import main

    main(["train", "--num-actors", "2", "--envs-per-actor", "2", "--num-steps", "8",
          "--num-epochs", "1", "--num-minibatches", "2", "--total-env-steps", "64",
          "--no-progress", "--run-root", str(tmp_path)])
    out = capsys.readouterr().out
    assert "final return" in out and "run directory" in out
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.startswith("CartPole-v1-")
    # TensorBoard event files (with tensorboardX installed) are tests/runs/test_tensorboard.py's.
    assert {p.name for p in run_dir.iterdir() if not p.name.startswith("events.out.")} == {
        "config.json", "segments.json", "metrics.jsonl", "params.msgpack", "summary.json",
        "checkpoints"}
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["ckpt_000000002.msgpack"]
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2

    main(["eval", str(run_dir), "--num-episodes", "3"])
    assert "CartPole-v1: return" in capsys.readouterr().out
    main(["plot", str(run_dir)])
    assert (run_dir / "curves.png").stat().st_size > 1000


def test_cli_resume_continues_a_run_with_its_own_config(tmp_path, capsys):
    from ppo_async.tools.cli import main

    common = ["--num-actors", "2", "--envs-per-actor", "2", "--num-steps", "8",
              "--num-epochs", "1", "--num-minibatches", "2", "--max-lead-steps", "8",
              "--no-progress", "--run-root", str(tmp_path)]
    main(["train", "--total-env-steps", "128", "--checkpoint-every-updates", "2", *common])
    (run_dir,) = tmp_path.iterdir()
    # Resume with a longer budget; the other fields come from the run's config.json.
    main(["train", "--resume", str(run_dir), "--total-env-steps", "192", "--no-progress"])
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["total_env_steps"] == 192 and saved["envs_per_actor"] == 2
    updates = [json.loads(line)["update"] for line in (run_dir / "metrics.jsonl").open()]
    assert updates == [1, 2, 3, 4, 5, 6]
    assert str(run_dir) in capsys.readouterr().out


def test_cli_rejects_a_bad_config_with_exit_code_2(capsys):
    from ppo_async.tools.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--num-minibatches", "7", "--no-progress"])
    assert info.value.code == 2
    assert "num_minibatches" in capsys.readouterr().err


# --- supervision and the NaN guard --------------------------------------------------

def _fail_actor_zero(on_chunks):
    """A rollout wrapper that raises in actor 0 on the given (1-based) chunk numbers."""
    calls = {"n": 0}

    def wrap(rollout):
        def maybe_fail(params, carry):
            if current_actor() == 0:  # its thread, or its turn in the actors' one thread
                calls["n"] += 1
                if on_chunks(calls["n"]):
                    raise _Boom(f"actor 0 chunk {calls['n']}")
            return rollout(params, carry)
        return maybe_fail

    return wrap


def test_a_failed_actor_is_restarted_and_the_run_completes(monkeypatch, caplog):
    patch_rollout(monkeypatch, _fail_actor_zero(lambda n: n == 3))
    config = dataclasses.replace(TINY, max_actor_restarts=2, total_env_steps=TINY.batch_size * 10)
    with caplog.at_level("WARNING"):
        report = train(config, progress=False).report
    assert report.updates == 10
    assert report.actor_restarts == 1
    assert [s.restarts for s in report.actor_stats] == [1, 0]
    assert report.policy_lag_max <= config.max_lead_chunks - 1
    assert "actor 0 failed; restarting it (restart 1 of 2)" in caplog.text
    assert "actor 0 chunk 3" in caplog.text  # the traceback is logged


def test_restarts_beyond_the_limit_fail_the_run_naming_the_actor(monkeypatch):
    patch_rollout(monkeypatch, _fail_actor_zero(lambda n: n >= 2))
    config = dataclasses.replace(TINY, max_actor_restarts=2, total_env_steps=TINY.batch_size * 50)
    with pytest.raises(ActorError, match="actor 0 failed") as info:
        train(config, progress=False)
    assert isinstance(info.value.__cause__, _Boom)


def test_a_nan_reward_stops_the_run_naming_the_update(monkeypatch):
    def wrap(rollout):
        calls = {"n": 0}

        def poisoned(params, carry):
            carry, trajectory, bootstrap_obs, bootstrap_value = rollout(params, carry)
            calls["n"] += 1
            if calls["n"] == 5:
                trajectory = trajectory._replace(reward=trajectory.reward.at[0, 0].set(np.nan))
            return carry, trajectory, bootstrap_obs, bootstrap_value
        return poisoned

    patch_rollout(monkeypatch, wrap)
    config = dataclasses.replace(TINY, total_env_steps=TINY.batch_size * 50)
    with pytest.raises(NonFiniteError, match=r"update \d+: ") as info:
        train(config, progress=False)
    # It names the chunk it trained on and where its NaN is (it said only "the
    # updated params contain NaN or inf", whatever the env had done).
    assert re.search(r"it trained on actor \d+'s chunk, which has nan in "
                     r"trajectory.reward at step 0, env 0", str(info.value)), info.value


def test_periodic_evaluation_runs_on_its_own_thread_and_reports(tmp_path):
    from ppo_async.runs.analysis import load_run

    config = dataclasses.replace(TINY, eval_every_updates=2, eval_episodes=3)
    report = train(config, run_dir=tmp_path, progress=False).report
    # Evaluations were asked for at updates 2, 4 and 6. One that waited while the
    # evaluator was busy is replaced by the newer one; the last is always finished
    # before train returns.
    versions = [version for version, _ in report.eval_returns]
    assert versions[-1] == 6 and versions == sorted(versions) and set(versions) <= {2, 4, 6}
    assert len(versions) + report.eval_requests_skipped == 3
    assert all(np.isfinite(mean) and mean > 0 for _, mean in report.eval_returns)
    # Every evaluation of summary.json is in metrics.jsonl too, in the row of the update it
    # evaluated, the ones that finished after the last update included.
    summary = json.loads((tmp_path / "summary.json").read_text())["eval_returns"]
    assert [version for version, _ in summary] == versions
    run = load_run(tmp_path)
    assert run.num_updates == 6
    evaluated = np.isfinite(run.metrics["eval_return_mean"])
    assert run.metrics["update"][evaluated].tolist() == versions
    np.testing.assert_allclose(run.metrics["eval_return_mean"][evaluated],
                               [mean for _, mean in summary])
    np.testing.assert_array_equal(run.metrics["env_steps"][evaluated],
                                  np.array(versions) * config.batch_size)


def test_an_evaluator_that_raises_stops_the_run(monkeypatch):
    from ppo_async.runtime.evaluate import Evaluator

    def broken(self, broadcast, seed=0):
        raise _Boom("eval exploded")

    monkeypatch.setattr(Evaluator, "evaluate_broadcast", broken)
    config = dataclasses.replace(TINY, eval_every_updates=1, total_env_steps=TINY.batch_size * 400)
    with pytest.raises(ActorError, match="evaluator thread failed") as info:
        train(config, progress=False)
    assert isinstance(info.value.__cause__, _Boom)


def test_stop_training_from_on_update_ends_the_run_normally(tmp_path):
    from ppo_async import StopTraining

    def stop_at_three(metrics):
        if metrics["update"] == 3:
            raise StopTraining

    config = dataclasses.replace(TINY, total_env_steps=TINY.batch_size * 50)
    result = train(config, run_dir=tmp_path, progress=False, on_update=stop_at_three)
    assert result.report.updates == 3
    assert (tmp_path / "params.msgpack").is_file()


def test_learner_loop_takes_its_callbacks_as_learner_hooks_and_the_old_keywords_warn():
    from ppo_async import LearnerHooks
    from ppo_async.runtime.learner import _hooks_of

    def on_update(metrics):
        pass

    assert _hooks_of(LearnerHooks(on_update), {}) == LearnerHooks(on_update)
    with pytest.warns(DeprecationWarning, match=r"pass hooks=LearnerHooks\(on_update=...\)"):
        assert _hooks_of(on_update, {}) == LearnerHooks(on_update)  # the old sixth argument
    with pytest.warns(DeprecationWarning, match=r"learner_loop\(heartbeat=...\) is deprecated"):
        assert _hooks_of(LearnerHooks(), {"heartbeat": print}) == LearnerHooks(heartbeat=print)
    with pytest.raises(TypeError, match="unexpected keyword argument 'on_updates'"):
        _hooks_of(LearnerHooks(), {"on_updates": on_update})
