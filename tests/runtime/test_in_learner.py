"""sampler='learner': the learner's program collects the actors' chunks, with the bits
of thread actors at the same exact lag, checkpoints they resume from, and the
learner's checks."""

import dataclasses
import functools
import importlib
import json
import logging

import flax.serialization
import jax
import jax.numpy as jnp
import optax
import pytest

from ppo_async import (
    AsyncActorLearnerConfig,
    ConfigError,
    NonFiniteError,
    StopTraining,
    train,
)
from ppo_async.runs.analysis import read_metrics
from ppo_async.runs.checkpoint import _decode, list_checkpoints
from ppo_async.runtime import in_learner

from run_helpers import interrupt_at
from run_helpers import learning_metrics as _learning_metrics
from run_helpers import params_bytes as _bytes

EXACT = AsyncActorLearnerConfig(
    num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=2, num_minibatches=2,
    total_env_steps=2 * 2 * 8 * 8, exact_policy_lag=1, learner_timeout_s=30.0,
    shutdown_timeout_s=10.0, seed=5, sampler="shared",  # thread actors, to compare with
)
IN_LEARNER = dataclasses.replace(EXACT, sampler="learner")

def _steps(run_dir):
    return [int(p.stem.split("_")[1]) for p in list_checkpoints(run_dir / "checkpoints")]


def test_the_learners_program_gives_the_bytes_metrics_and_checkpoints_of_thread_actors(
        tmp_path):
    # Checkpoints every 3 updates and evaluations every 4 each end a call there.
    config = dataclasses.replace(EXACT, checkpoint_every_updates=3, keep_checkpoints=5,
                                 eval_every_updates=4, eval_episodes=2, batch_inference=True)
    threads = train(config, run_dir=tmp_path / "threads", progress=False)
    in_learner = train(dataclasses.replace(config, sampler="learner"),
                       run_dir=tmp_path / "learner", progress=False)
    assert _bytes(in_learner.params) == _bytes(threads.params)
    assert _learning_metrics(tmp_path / "learner") == _learning_metrics(tmp_path / "threads")
    assert in_learner.report.eval_returns == threads.report.eval_returns
    assert len(in_learner.report.eval_returns) == 2
    assert in_learner.report.policy_lag_counts == threads.report.policy_lag_counts == {
        0: 2, 1: 2 * 7}
    assert in_learner.report.recent_returns == threads.report.recent_returns
    assert _steps(tmp_path / "learner") == _steps(tmp_path / "threads") == [3, 6, 8]
    # Learner state, counters, every actor's env carry and the params history, byte for byte.
    for name in ("threads", "learner"):
        assert json.loads((tmp_path / name / "summary.json").read_text())["reproducible"]
    saved = [list_checkpoints(tmp_path / run / "checkpoints") for run in ("threads", "learner")]
    for theirs, ours in zip(*saved, strict=True):  # all but the config (its sampler)
        (step, counters, _, state), ours = _decode(theirs.read_bytes()), _decode(
            ours.read_bytes())
        assert ours[:2] == (step, counters) and ours[2]["sampler"] == "learner"
        assert flax.serialization.msgpack_serialize(ours[3]) == (
            flax.serialization.msgpack_serialize(state))
    stats = in_learner.report.actor_stats
    assert [s.rollouts_sent for s in stats] == [8, 8]
    assert [s.env_steps for s in stats] == [8 * 2 * 8] * 2


@pytest.mark.parametrize("fields", [
    dict(exact_policy_lag=0),
    dict(exact_policy_lag=3, num_actors=4, envs_per_actor=1),
    dict(normalize_observations=True, normalize_rewards=True),
    dict(network="gru", num_minibatches=1),
    dict(batch_inference=False),
    dict(num_actors=1, envs_per_actor=4),
], ids=["lag0", "lag3-4actors", "normalized", "gru", "each-actor-alone", "one-actor"])
def test_other_lags_normalization_and_recurrent_actors_give_thread_actors_bytes(fields):
    # One rollout program for every actor's chunks, in both runs, unless batch_inference
    # is False (each actor's in turn; thread actors calling alone, the threads' default
    # below 8 actors) or there is one actor.
    config = dataclasses.replace(EXACT, **{"batch_inference": True, **fields})
    if config.num_actors == 1:
        config = dataclasses.replace(config, batch_inference=None)
    threads = train(config, progress=False)
    in_learner = train(dataclasses.replace(config, sampler="learner"), progress=False)
    assert _bytes(in_learner.params) == _bytes(threads.params)
    assert in_learner.report.policy_lag_counts == threads.report.policy_lag_counts


def test_a_run_cut_short_resumes_byte_identically_with_either_sampler(tmp_path):
    config = dataclasses.replace(IN_LEARNER, checkpoint_every_updates=3, keep_checkpoints=2,
                                 exact_policy_lag=2, batch_inference=True)
    whole = train(config, run_dir=tmp_path / "whole", progress=False)
    for name, sampler in (("again", "learner"), ("threads", "shared")):
        with pytest.raises(KeyboardInterrupt) as info:  # Ctrl-C in on_update at update 5
            train(config, run_dir=tmp_path / name, progress=False, on_update=interrupt_at(5))
        assert info.value.updates == 5  # kept and saved, as thread actors keep it
        assert _steps(tmp_path / name) == [3, 5]
        resumed = train(dataclasses.replace(config, sampler=sampler),
                        resume_from=tmp_path / name, progress=False)
        assert resumed.report.updates == whole.report.updates
        assert _bytes(resumed.params) == _bytes(whole.params)
        assert _learning_metrics(tmp_path / name) == _learning_metrics(tmp_path / "whole")


def test_stop_training_in_the_middle_of_a_call_ends_the_run_with_that_updates_params(tmp_path):
    seen = []

    def stop_at_3(metrics):
        seen.append(metrics["update"])
        if metrics["update"] >= 3:
            raise StopTraining

    config = dataclasses.replace(IN_LEARNER, total_env_steps=IN_LEARNER.batch_size * 40)
    stopped = train(config, run_dir=tmp_path, progress=False, on_update=stop_at_3)
    assert stopped.report.updates == 3 and seen == [1, 2, 3]
    assert [row["update"] for row in read_metrics(tmp_path)] == seen
    assert _steps(tmp_path) == [3]
    assert [s.rollouts_sent for s in stopped.report.actor_stats] == [3, 3]
    # The call ran on past update 3 (the whole run fits in a call or two); the params
    # returned are update 3's all the same: thread actors stopped there end with them.
    threads = dataclasses.replace(config, sampler="shared", batch_inference=True)
    ran = train(threads, progress=False, on_update=stop_at_3)
    assert ran.report.updates == 3
    assert _bytes(ran.params) == _bytes(stopped.params)


def test_calls_split_anywhere_or_launched_after_the_last_give_the_same_bytes(monkeypatch):
    # Calls aimed at a few microseconds run one update each after the first two.
    monkeypatch.setattr(in_learner, "_CALL_S", 1e-6)
    one_by_one = train(IN_LEARNER, progress=False)
    monkeypatch.undo()
    whole = train(IN_LEARNER, progress=False)
    assert _bytes(one_by_one.params) == _bytes(whole.params)
    # Each call launched only once the last one's updates are passed on.
    train_module = importlib.import_module("ppo_async.train")  # the name is shadowed by train()
    monkeypatch.setattr(train_module, "in_learner_loop", functools.partial(
        in_learner.in_learner_loop, pipeline=False))
    in_turn = train(IN_LEARNER, progress=False)
    assert in_turn.report.updates == whole.report.updates
    assert _bytes(in_turn.params) == _bytes(whole.params)


def test_an_update_that_is_not_finite_raises_and_the_update_before_it_is_kept(
        tmp_path, monkeypatch):
    train_module = importlib.import_module("ppo_async.train")  # the name is shadowed by train()
    original = train_module.learner_update
    steps_per_update = IN_LEARNER.num_epochs * IN_LEARNER.num_minibatches

    def poisoned_update(*args, **kwargs):
        update = original(*args, **kwargs)

        def poisoned(state, batch):  # NaN rewards from the 4th update on
            count = optax.tree_utils.tree_get_all_with_path(state.opt_state, "count")[-1][1]
            bad = count >= 3 * steps_per_update
            return update(state, batch._replace(reward=jnp.where(bad, jnp.nan, batch.reward)))
        return poisoned

    monkeypatch.setattr(train_module, "learner_update", poisoned_update)
    with pytest.raises(NonFiniteError, match="update 4"):
        train(IN_LEARNER, run_dir=tmp_path, progress=False)
    monkeypatch.undo()
    assert _steps(tmp_path) == [3]  # the last good update, checkpointed as the run ended
    resumed = train(IN_LEARNER, resume_from=tmp_path, progress=False)
    threads = dataclasses.replace(EXACT, batch_inference=True)
    assert _bytes(resumed.params) == _bytes(train(threads, progress=False).params)


@pytest.mark.parametrize("fields, match", [
    (dict(env_id="gymnasium:CartPole-v1"), "steps on the host"),
    (dict(actor_backend="processes"), "actor_backend='processes'"),
    (dict(exact_policy_lag=None), "free-running"),
    (dict(exact_policy_lag="auto", max_lead_steps=16), "free-running"),
    (dict(broadcast_every=2), "broadcast_every=2"),
])
def test_what_the_learners_program_cannot_run_is_refused_with_the_reason(fields, match):
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(IN_LEARNER, **fields)


def test_a_sweep_point_or_the_next_run_finds_the_loop_the_first_one_built():
    # The learning rate and the budget are the loop's argument, not part of it.
    from ppo_async.core.update import default_schedule
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.runtime.in_learner import loop_program
    from ppo_async.train import learner_update

    def loop_of(config, wrap=False):
        program = make_actor_program(config)
        if wrap:  # a replaced rollout computes other chunks: not shared
            program = program._replace(rollout=program.rollout, identity=None)
        update = learner_update(config, program, default_schedule(config.update_options()))
        return loop_program(config, program, update)

    first = loop_of(IN_LEARNER)
    sweep_point = loop_of(dataclasses.replace(IN_LEARNER, learning_rate=1e-3,
                                              total_env_steps=IN_LEARNER.batch_size * 4))
    assert sweep_point.run is first.run and sweep_point.rate != first.rate
    assert loop_of(dataclasses.replace(IN_LEARNER, exact_policy_lag=2)).run is not first.run
    assert loop_of(IN_LEARNER, wrap=True).run is not first.run


def test_the_warm_ups_call_and_the_runs_calls_share_one_compiled_loop(caplog):
    # The warm-up lowers the loop for zero carries of the reset's traced shapes in the
    # caller's thread and compiles it in its own; a carry of another dtype, weak type
    # or placement, or a call that missed the lowered program, would compile it again.
    in_learner._LOOPS.clear()
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.WARNING, logger="jax"):
            train(dataclasses.replace(IN_LEARNER, total_env_steps=IN_LEARNER.batch_size * 3),
                  progress=False)
    finally:
        jax.config.update("jax_log_compiles", False)
    (run,) = in_learner._LOOPS.values()
    assert run._cache_size() == 1
    # Logged once per compile or persistent-cache load of the loop.
    compiles = [r for r in caplog.records if r.getMessage().startswith("Compiling jit(run) ")]
    assert len(compiles) == 1


def test_the_default_sampler_is_the_learners_program_where_it_can_run(monkeypatch):
    from ppo_async.core import devices
    from ppo_async.runtime import layout
    from ppo_async.runtime.layout import collects_in_learner

    config = dataclasses.replace(EXACT, sampler="auto")
    assert collects_in_learner(config)
    assert layout.resolve_layout(config).collection == "learner"
    for fields in (dict(sampler="shared"), dict(exact_policy_lag=None),
                   dict(broadcast_every=2), dict(actor_backend="processes"),
                   dict(actors_per_process=1)):
        assert not collects_in_learner(dataclasses.replace(config, **fields)), fields
    assert not collects_in_learner(config, learner_program=False)  # a replaced rollout
    assert not collects_in_learner(dataclasses.replace(config, env_id="gymnasium:CartPole-v1"))
    # A learner on another device than the actors' (a GPU's): thread actors.
    monkeypatch.setattr(devices, "resolve_device", lambda spec: None)
    assert not collects_in_learner(config)
