"""Batched inference (`ppo_async.runtime.inference`) and the host rollout's per-chunk bookkeeping."""

import dataclasses
import functools
import inspect
import os
import sys
import threading
import time
import traceback

import flax.serialization
import gymnasium
import jax
import numpy as np
import pytest

from ppo_async import ActorError, AsyncActorLearnerConfig, PolicyBroadcast, train
from ppo_async.core import keys
from ppo_async.envs import workers
from ppo_async.envs.host_rollout import HostRollout, episode_statistics
from ppo_async.envs.program import ChunkEnd
from ppo_async.envs.registry import register_host_env
from ppo_async.runtime.layout import resolve_layout
from ppo_async.runtime.inference import (
    COHORT_ACTORS,
    LockstepSampler,
    InferenceError,
    InferenceServer,
    RolloutStopped,
    SharedParams,
    cohorts_for,
)


class Walk:
    """A tiny host env with 3 observations and 2 actions (only its spaces matter here)."""

    observation_shape = (3,)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, num_envs):
        self.num_envs = num_envs

    def reset(self, seed):
        return np.zeros((self.num_envs, 3), np.float32)

    def step(self, actions):
        raise NotImplementedError


def _policy(network: str, envs: int = 4):
    register_host_env("inference-walk", Walk)
    config = AsyncActorLearnerConfig(env_id="host:inference-walk", envs_per_actor=envs,
                                     network=network, rnn_hidden_size=8, hidden_sizes=(16,),
                                     num_minibatches=2)
    rollout = HostRollout(config)
    template = rollout.program().params_template
    params = jax.tree.map(lambda x: np.random.default_rng(1).normal(size=np.shape(x))
                          .astype(np.float32), template)
    return rollout.policy, params


def _inputs(rng, policy, actors: int):
    envs, state = policy.num_envs, policy.state_size
    hidden = rng.normal(size=(actors, envs, state)).astype(np.float32) if state else None
    reset = rng.random((actors, envs)) < 0.3 if state else None
    obs = rng.normal(size=(actors, envs, 3)).astype(np.float32)
    keys = rng.integers(0, 2**32, size=(actors, 2), dtype=np.uint32)
    return hidden, obs, reset, keys


@pytest.mark.parametrize("network", ["mlp", "gru"])
def test_an_actors_row_does_not_depend_on_the_other_rows_of_its_call(network):
    """What keeps batched runs fixed by their seed: row i is the same bits whoever shares the call."""
    policy, params = _policy(network)
    rng = np.random.default_rng(0)
    hidden, obs, reset, keys = _inputs(rng, policy, actors=5)
    full = np.asarray(policy.act(params, hidden, obs, reset, keys))
    other_hidden, other_obs, other_reset, other_keys = _inputs(rng, policy, actors=5)
    for i in range(5):
        def mixed(mine, others):
            if mine is None:
                return None
            out = others.copy()
            out[i] = mine[i]
            return out

        row = np.asarray(policy.act(params, mixed(hidden, other_hidden), mixed(obs, other_obs),
                                    mixed(reset, other_reset), mixed(keys, other_keys)))[i]
        assert row.tobytes() == full[i].tobytes()
    # ... and the call really reads each row (another row's inputs give other outputs).
    assert full[0].tobytes() != full[1].tobytes()


def test_an_actor_alone_gets_the_row_it_gets_in_a_batch_and_its_key_advances():
    policy, params = _policy("mlp")
    hidden, obs, reset, keys = _inputs(np.random.default_rng(2), policy, actors=4)
    batched = policy.act_batched(params, [(None, obs[i], None, keys[i]) for i in range(4)])
    alone = policy.act_alone(params, None, obs[2], None, keys[2])
    np.testing.assert_allclose(alone, batched[2], rtol=1e-6, atol=1e-6)
    packed, next_key = policy.split(alone)
    expected_key = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(keys[2]))[0])
    np.testing.assert_array_equal(next_key, np.asarray(expected_key))  # exact through float32 bits
    actions = policy.actions(packed)
    assert actions.dtype == np.int32 and set(actions.tolist()) <= {0, 1}
    step = policy.unpack(packed)
    np.testing.assert_array_equal(step.action, actions)
    assert step.logp.shape == step.value.shape == (policy.num_envs,)


def _serve(server, actors, calls_each, make_input, params_of=lambda i: "p"):
    results, errors = {}, []

    def actor(i):
        try:
            for c in range(calls_each):
                results[i, c] = server.act(i, params_of(i), make_input(i, c))
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=actor, args=(i,)) for i in range(actors)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    return results, errors


def test_the_server_hands_every_actor_its_own_row_of_calls_grouped_by_params():
    stop = threading.Event()
    seen_params = []

    def fn(params, per_actor):
        seen_params.append(params)
        return np.stack([x * 2 + (100 if params == "b" else 0) for (x,) in per_actor])

    server = InferenceServer(fn, 6, stop.is_set).start()
    try:
        results, errors = _serve(server, 6, 50, lambda i, c: np.full((2,), i * 1000 + c, np.float32),
                                 params_of=lambda i: "b" if i % 2 else "a")
    finally:
        stop.set()
        server.thread.join(5)
    assert errors == [] and not server.thread.is_alive()
    for (i, c), row in results.items():
        np.testing.assert_array_equal(row, 2 * (i * 1000 + c) + (100 if i % 2 else 0))
    assert set(seen_params) == {"a", "b"} and server.requests == 300
    assert server.calls < 300  # some calls served several actors (threads wait on one another)


def test_a_failing_call_reaches_the_actors_that_waited_on_it_and_a_stop_ends_a_wait():
    stop = threading.Event()

    def fn(params, per_actor):
        raise ValueError("broken policy")

    server = InferenceServer(fn, 2, stop.is_set).start()
    _, errors = _serve(server, 2, 1, lambda i, c: np.zeros(1, np.float32))
    assert len(errors) == 2 and all(isinstance(e, InferenceError) for e in errors)
    assert all(isinstance(e.__cause__, ValueError) for e in errors)
    # A server that never answers (a stuck call) does not hold an actor once the run stops.
    release = threading.Event()
    stuck = InferenceServer(lambda params, per_actor: release.wait(30) and per_actor, 1,
                            stop.is_set).start()
    stop_timer = threading.Timer(0.2, stop.set)
    stop_timer.start()
    with pytest.raises(RolloutStopped):
        stuck.act(0, "p", np.zeros(1, np.float32))
    release.set()
    stuck.thread.join(5)
    server.thread.join(5)
    assert not stuck.thread.is_alive() and not server.thread.is_alive()


def test_shared_params_load_each_version_once_into_one_object():
    template = {"w": np.zeros((2, 3), np.float32)}
    shared = SharedParams(template, jax.devices("cpu")[0], keep=2)

    def broadcast(version):
        params = {"w": np.full((2, 3), version, np.float32)}
        return PolicyBroadcast(version, flax.serialization.to_bytes(params))

    first = shared(broadcast(1))
    assert shared(broadcast(1)) is first and shared.loads == 1
    np.testing.assert_array_equal(np.asarray(first["w"]), 1.0)
    shared(broadcast(2)), shared(broadcast(3))
    assert shared(broadcast(1)) is not first and shared.loads == 4  # evicted, loaded again


def _episode_statistics_reference(reward, done, return_before, length_before):
    """The per-step loop of the paper-free definition: sum rewards until done, then restart."""
    steps, envs = reward.shape
    ret, length = return_before.astype(np.float64), length_before.copy()
    episode_return, episode_length = np.zeros((steps, envs)), np.zeros((steps, envs), int)
    for t in range(steps):
        ret, length = ret + reward[t], length + 1
        episode_return[t] = np.where(done[t], ret, 0)
        episode_length[t] = np.where(done[t], length, 0)
        ret, length = np.where(done[t], 0, ret), np.where(done[t], 0, length)
    return episode_return, episode_length, ret, length


def test_episode_statistics_of_a_chunk_match_a_step_by_step_loop():
    rng = np.random.default_rng(3)
    for _ in range(20):
        steps, envs = rng.integers(1, 40), rng.integers(1, 6)
        reward = rng.normal(size=(steps, envs)).astype(np.float32)
        done = rng.random((steps, envs)) < rng.choice([0.0, 0.05, 0.3, 1.0])
        before = (rng.normal(size=envs).astype(np.float32) * 10,
                  rng.integers(0, 50, size=envs).astype(np.int32))
        got = episode_statistics(reward, done, *before)
        want = _episode_statistics_reference(reward, done, *before)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-5)
        assert got[0].dtype == got[2].dtype == np.float32
        assert got[1].dtype == got[3].dtype == np.int32
        np.testing.assert_array_equal(got[1], want[1])  # lengths are exact
        # A chunk where no episode ended takes a shorter way to the same bits: as the
        # general way gives them when one env's episode ends at its first step.
        if not done.any():
            padded = [np.concatenate([a[:, :1], a], axis=1) for a in (reward, done)]
            padded[1][0, 0] = True
            general = episode_statistics(*padded, *(np.concatenate([b[:1], b]) for b in before))
            for g, w in zip(got, general):
                assert g.dtype == w.dtype and g.tobytes() == w[..., 1:].tobytes()


def test_one_vmapped_gymnax_rollout_gives_each_actor_its_own_chunk_bit_for_bit():
    """The fused chunk of several gymnax actors: actor i's part depends on its carry alone,
    and is its own rollout's chunk (to rounding: a vmapped program rounds differently)."""
    from ppo_async.envs.backends import make_actor_program

    config = AsyncActorLearnerConfig(env_id="CartPole-v1", num_actors=3, envs_per_actor=2,
                                     num_steps=8, hidden_sizes=(16,))
    program = make_actor_program(config)
    device = jax.devices("cpu")[0]
    params = jax.tree.map(lambda x: np.random.default_rng(4).normal(size=np.shape(x))
                          .astype(np.float32), program.params_template)
    carries = [program.reset(jax.random.key(i), device) for i in range(3)]
    others = [program.reset(jax.random.key(10 + i), device) for i in range(3)]
    fused = program.inference.fn(params, [(c,) for c in carries])
    mixed = program.inference.fn(params, [(others[0],), (carries[1],), (others[2],)])
    leaves = [np.asarray(x).tobytes() for x in jax.tree.leaves(jax.device_get(
        jax.tree.map(lambda k: jax.random.key_data(k) if jax.dtypes.issubdtype(
            k.dtype, jax.dtypes.prng_key) else k, (fused[1], mixed[1]))))]
    half = len(leaves) // 2
    assert leaves[:half] == leaves[half:]
    alone = program.rollout(params, carries[1])
    np.testing.assert_allclose(np.asarray(alone[1].behaviour_logp),
                               np.asarray(fused[1][1].behaviour_logp), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(alone[1].action), np.asarray(fused[1][1].action))
    assert not np.array_equal(np.asarray(fused[0][1].obs), np.asarray(fused[1][1].obs))


@pytest.mark.parametrize("network", ["mlp", "lstm"])
def test_the_fused_rollout_bootstraps_a_truncated_episode_as_the_actors_own_rollout(network):
    """In the fused chunk an actor whose episodes hit the time limit gets gamma V(final_obs)
    folded into that step's reward, as in its own rollout; the others' chunks do not change."""
    from ppo_async.envs.backends import make_actor_program

    config = AsyncActorLearnerConfig(env_id="CartPole-v1", num_actors=3, envs_per_actor=2,
                                     num_steps=8, num_minibatches=2, hidden_sizes=(16,),
                                     network=network, rnn_hidden_size=8)
    program = make_actor_program(config)
    device = jax.devices("cpu")[0]
    params = jax.tree.map(lambda x: np.random.default_rng(5).normal(size=np.shape(x))
                          .astype(np.float32), program.params_template)
    carries = [program.reset(jax.random.key(i), device) for i in range(3)]
    # Actor 1's envs reach CartPole-v1's limit of 500 steps at the chunk's third step.
    limited = carries[1]._replace(env_state=carries[1].env_state.replace(
        time=np.full(2, 497, np.int32)))
    plain = program.inference.fn(params, [(c,) for c in carries])
    fused = program.inference.fn(params, [(carries[0],), (limited,), (carries[2],)])
    alone = program.rollout(params, limited)[1]
    truncated = np.asarray(alone.truncated)
    assert truncated[2].all() and truncated.sum() == 2, truncated
    reward = np.asarray(fused[1][1].reward)
    assert np.all(reward[truncated] != 1.0) and np.all(reward[~truncated] == 1.0), reward
    np.testing.assert_allclose(reward, np.asarray(alone.reward), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(fused[1][1].action), np.asarray(alone.action))
    for i in (0, 2):  # the actors beside it: the same bytes as in a chunk without a truncation
        assert [np.asarray(x).tobytes() for x in jax.tree.leaves(fused[i][1])] == [
            np.asarray(x).tobytes() for x in jax.tree.leaves(plain[i][1])]


def test_batched_actors_at_an_exact_lag_give_the_same_bytes_twice(monkeypatch):
    env_id = "gymnasium:CartPole-v1"  # gymnax actors: the test below
    servers = []
    original_init = InferenceServer.__init__

    def recorded_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        servers.append(self)

    monkeypatch.setattr(InferenceServer, "__init__", recorded_init)
    config = AsyncActorLearnerConfig(env_id=env_id, num_actors=3, envs_per_actor=2,
                                     num_steps=8, num_minibatches=2, num_epochs=1,
                                     hidden_sizes=(16,), total_env_steps=3 * 2 * 8 * 4,
                                     batch_inference=True)
    first, second = (train(config, progress=False) for _ in range(2))
    as_bytes = flax.serialization.to_bytes
    assert as_bytes(first.params) == as_bytes(second.params)
    assert first.report.policy_lag_counts == {0: 3, 1: 9}
    # Both runs shared each env step's calls (fewer calls than asked)...
    assert len(servers) == 2 and all(12 <= s.requests and s.calls < s.requests for s in servers)
    # ...and another seed gives other bytes: the check can fail.
    other = train(dataclasses.replace(config, seed=1), progress=False)
    assert as_bytes(other.params) != as_bytes(first.params)


def test_a_group_of_gymnax_actors_gives_the_bytes_of_shared_chunks_and_restarts_together(
        monkeypatch):
    """batch_inference=True on gymnax: one thread ("ppo-actors-0-2") makes every chunk of the
    3 actors as one call, the run's bytes those of an `InferenceServer` of the same calls
    (actor threads); a failure of that call is counted as its first actor's, and the run
    goes on."""
    import importlib

    from ppo_async.runtime import transport

    train_module = importlib.import_module("ppo_async.train")
    original_make = train_module.make_actor_program
    callers, broken = [], {"at": None}

    def make(config):
        program = original_make(config)

        def rollout_group(params, carries):
            callers.append(threading.current_thread().name)
            if len(callers) == broken["at"]:
                raise RuntimeError("the group breaks once")
            return program.rollout_group(params, carries)
        return program._replace(rollout_group=rollout_group, identity=None)  # a wrapper

    def not_in_learner(monkeypatch):  # the learner's program would not run the wrapper
        monkeypatch.setattr(train_module, "make_actor_program", make)
        monkeypatch.setattr(train_module, "resolve_layout",
                            functools.partial(resolve_layout, learner_program=False))

    not_in_learner(monkeypatch)
    config = AsyncActorLearnerConfig(num_actors=3, envs_per_actor=2, num_steps=8,
                                     num_minibatches=2, num_epochs=1, hidden_sizes=(16,),
                                     total_env_steps=3 * 2 * 8 * 4, batch_inference=True)
    group = train(config, progress=False)
    assert set(callers) == {"ppo-actors-0-2"} and len(callers) >= 4
    assert [s.env_steps >= 4 * 2 * 8 and s.rollouts_sent >= 4 for s in group.report.actor_stats
            ] == [True] * 3
    monkeypatch.setattr(transport, "collects_as_group", lambda config: False)
    served = train(config, progress=False)
    as_bytes = flax.serialization.to_bytes
    assert as_bytes(group.params) == as_bytes(served.params)
    assert group.report.policy_lag_counts == served.report.policy_lag_counts == {0: 3, 1: 9}
    monkeypatch.undo()
    not_in_learner(monkeypatch)
    callers.clear()
    broken["at"] = 2
    with pytest.raises(ActorError, match="the group breaks once"):
        train(config, progress=False)
    callers.clear()
    restarted = train(dataclasses.replace(config, max_actor_restarts=1), progress=False)
    assert restarted.report.updates == 4
    assert [s.restarts for s in restarted.report.actor_stats] == [1, 0, 0]
    assert as_bytes(restarted.params) != as_bytes(group.params)  # fresh episodes after it


def test_gymnax_actors_collected_from_one_thread_give_the_bytes_of_a_thread_each(monkeypatch):
    """By default (sampler None, 2+ gymnax actors) one thread calls each actor's own rollout
    in turn: the bytes of a thread per actor (sampler='actors'); an actor whose rollout
    raises is the one restarted (and counted)."""
    from ppo_async.runtime.actor import current_actor
    from run_helpers import patch_rollout

    seen = []

    def wrap(rollout):
        def recorded(params, carry):
            seen.append((threading.current_thread().name, current_actor()))
            calls = sum(actor == broken["actor"] for _, actor in seen)
            if broken["actor"] == current_actor() and calls == 2:  # its second chunk
                raise RuntimeError(f"actor {current_actor()} breaks once")
            return rollout(params, carry)
        return recorded

    broken = {"actor": None}
    patch_rollout(monkeypatch, wrap)
    config = AsyncActorLearnerConfig(num_actors=3, envs_per_actor=2, num_steps=8,
                                     num_minibatches=2, num_epochs=1, hidden_sizes=(16,),
                                     total_env_steps=3 * 2 * 8 * 4)
    one_thread = train(config, progress=False)
    assert {name for name, _ in seen} == {"ppo-actors-0-2"}
    assert {actor for _, actor in seen} == {0, 1, 2}
    seen.clear()
    alone = train(dataclasses.replace(config, sampler="actors"), progress=False)
    assert {name for name, _ in seen} == {"ppo-actor-0", "ppo-actor-1", "ppo-actor-2"}
    as_bytes = flax.serialization.to_bytes
    assert as_bytes(one_thread.params) == as_bytes(alone.params)
    assert one_thread.report.policy_lag_counts == alone.report.policy_lag_counts
    seen.clear()
    broken["actor"] = 1
    restarted = train(dataclasses.replace(config, max_actor_restarts=1), progress=False)
    assert restarted.report.updates == 4
    assert [s.restarts for s in restarted.report.actor_stats] == [0, 1, 0]


class AsyncCartPoles:
    """gymnasium's CartPole with its own ``step_async`` / ``step_wait``: the step runs in
    ``step_wait``, whose threads are recorded."""

    waited_in: set = set()

    def __init__(self, num_envs):
        from ppo_async.envs.host import GymnasiumVectorEnv

        self.envs = GymnasiumVectorEnv("CartPole-v1", num_envs)
        self.observation_shape, self.action_space = self.envs.observation_shape, self.envs.action_space
        self.reset, self.close = self.envs.reset, self.envs.close

    def step(self, actions):
        raise AssertionError("step_async / step_wait are used when an env has them")

    def step_async(self, actions):
        self.actions = actions

    def step_wait(self):
        self.waited_in.add(threading.current_thread().name)
        return self.envs.step(self.actions)


def test_a_shared_sampler_gives_the_bytes_of_batched_per_step_calls(monkeypatch):
    """sampler='shared' (one thread drives every actor's chunk, envs in stepper threads) is
    the same run, bit for bit, as thread actors sharing each env step's call, though it
    began some chunks itself where the last ones ended; both groups
    of each actor step in their own thread, and the sampler made fewer calls than steps.
    An env with its own step_async / step_wait gives the same run again, started and
    waited for by the sampler's thread itself: no stepper thread."""
    samplers, steppers = [], []
    original_init = LockstepSampler.__init__

    def recorded_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        samplers.append(self)

    monkeypatch.setattr(LockstepSampler, "__init__", recorded_init)
    original_stepper = workers._Stepper.__init__

    def recorded_stepper(self, *args, **kwargs):
        original_stepper(self, *args, **kwargs)
        steppers.append(self)

    monkeypatch.setattr(workers._Stepper, "__init__", recorded_stepper)
    config = AsyncActorLearnerConfig(env_id="gymnasium:CartPole-v1", num_actors=3,
                                     envs_per_actor=2, env_groups=2, num_steps=8,
                                     num_minibatches=2, num_epochs=1, hidden_sizes=(16,),
                                     total_env_steps=3 * 2 * 8 * 4, batch_inference=True)
    batched = train(config, progress=False)
    shared = train(dataclasses.replace(config, sampler="shared"), progress=False)
    as_bytes = flax.serialization.to_bytes
    assert as_bytes(shared.params) == as_bytes(batched.params)
    assert shared.report.policy_lag_counts == batched.report.policy_lag_counts
    (sampler,) = samplers
    assert sampler.requests >= 3 * 4 * 8 * 2 and sampler.calls < sampler.requests
    assert sampler.followed > 0  # chunks begun by the sampler where the last ones ended
    assert len(steppers) == 3 * 2
    assert not any(t.name.startswith("ppo-env-stepper") for t in threading.enumerate())

    register_host_env("async-cartpole", AsyncCartPoles)
    native = train(dataclasses.replace(config, env_id="host:async-cartpole", sampler="shared"),
                   progress=False)
    assert as_bytes(native.params) == as_bytes(batched.params)
    assert len(steppers) == 3 * 2 and AsyncCartPoles.waited_in == {"ppo-sampler"}
    # The three actors in one actor process, its sampler beginning their chunks: the same.
    in_a_process = train(dataclasses.replace(config, sampler="shared", actor_backend="processes",
                                             actors_per_process=3), progress=False)
    (pid,) = {s.pid for s in in_a_process.report.actor_stats}
    assert pid != os.getpid()
    assert as_bytes(in_a_process.params) == as_bytes(batched.params)


def _steps(index: int, steps: int, fail_at: int | None = None):
    """A chunk's generator as `HostRollout.chunk_steps` drives it: one policy call and one
    env start per step; its env raises at step ``fail_at``."""
    rows = []
    for t in range(steps):
        if t == fail_at:
            raise ValueError(f"env of actor {index} broke at step {t}")
        rows.append((yield (index, t)))
        yield None  # its envs were started
    return rows


def _drive_all(sampler: LockstepSampler, chunks: dict) -> dict:
    """``{actor: what its drive returned or raised}`` for chunks driven from their own threads."""
    outcomes = {}

    def drive(index, steps):
        try:
            outcomes[index] = sampler.drive(index, "params", steps)
        except BaseException as error:  # noqa: BLE001 - what the test looks at
            outcomes[index] = error

    threads = [threading.Thread(target=drive, args=item) for item in chunks.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return outcomes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority: Linux")
def test_a_background_samplers_clients_run_below_it_from_their_first_drive():
    """background_clients (actor processes): a thread that hands a chunk over runs at nice
    19 from its first drive on, and so does the next thread to drive (an actor restarted
    in its process); a thread it started before (an actor's env stepper) keeps its
    priority, and so do the sampler's thread and the test's. Without it nothing moves."""

    def nice(thread_id: int) -> int:
        return os.getpriority(os.PRIO_PROCESS, thread_id)

    base = nice(threading.get_native_id())
    stop, seen, samplers = threading.Event(), {}, []
    for background in (False, True):
        sampler = LockstepSampler(lambda params, inputs: [f"row {i} step {t}" for i, t in inputs],
                                  1, stop.is_set, background_clients=background).start()
        samplers.append(sampler)

        def actor(sampler=sampler, background=background):
            release = threading.Event()
            stepper = threading.Thread(target=release.wait, args=(10,))
            stepper.start()
            rows = sampler.drive(0, "params", _steps(0, 3))
            seen.setdefault(background, []).append(
                (rows, nice(threading.get_native_id()), nice(stepper.native_id),
                 nice(sampler.thread.native_id)))
            release.set()
            stepper.join(10)

        for _ in range(2):  # the second driver in place of the first, once it ended
            driver = threading.Thread(target=actor)
            driver.start()
            driver.join(10)
    stop.set()
    for sampler in samplers:
        sampler.thread.join(10)
    rows = [f"row 0 step {t}" for t in range(3)]
    assert seen[False] == [(rows, base, base, base)] * 2
    assert seen[True] == [(rows, 19, base, base)] * 2
    assert nice(threading.get_native_id()) == base


def test_a_shared_sampler_fails_only_the_chunk_whose_env_raised_and_ends_on_a_stop():
    """An env that raises ends its own actor's chunk with its error (traceback kept); the
    other actors' chunks finish, each with its own rows. A failing policy call fails the
    actors of that call; a stop ends every wait."""
    stop = threading.Event()
    calls = []

    def fn(params, inputs):
        calls.append(list(inputs))
        return [f"row {i} step {t}" for i, t in inputs]

    sampler = LockstepSampler(fn, 3, stop.is_set).start()
    outcomes = _drive_all(sampler, {0: _steps(0, 4), 1: _steps(1, 4, fail_at=2),
                                    2: _steps(2, 4)})
    assert outcomes[0] == [f"row 0 step {t}" for t in range(4)]
    assert outcomes[2] == [f"row 2 step {t}" for t in range(4)]
    assert isinstance(outcomes[1], ValueError) and "broke at step 2" in str(outcomes[1])
    assert "_steps" in "".join(traceback.format_tb(outcomes[1].__traceback__))
    assert all(len(inputs) == 3 for inputs in calls)  # every call has every actor's row

    def broken(params, inputs):
        raise RuntimeError("broken policy")

    failing = LockstepSampler(broken, 2, stop.is_set).start()
    outcomes = _drive_all(failing, {0: _steps(0, 3), 1: _steps(1, 3)})
    assert all(isinstance(e, InferenceError) and isinstance(e.__cause__, RuntimeError)
               for e in outcomes.values())
    stop.set()
    with pytest.raises(RolloutStopped):
        sampler.drive(0, "params", _steps(0, 3))
    for s in (sampler, failing):
        s.thread.join(5)
        assert not s.thread.is_alive()


def test_a_shared_sampler_of_many_actors_keeps_its_cohorts_small():
    """From 16 actors on the sampler splits them into more than two cohorts, none of
    more than `COHORT_ACTORS` (up to `MAX_COHORTS` cohorts); each actor still gets its
    own rows from calls that hold every actor's."""
    assert [cohorts_for(n) for n in (1, 2, 16, 17, 32, 64)] == [2, 2, 2, 3, 4, 4]
    stop, calls = threading.Event(), []

    def fn(params, inputs):
        calls.append(len(inputs))
        return [f"row {i} step {t}" for i, t in inputs]

    sampler, sizes = LockstepSampler(fn, 17, stop.is_set), []
    advance = sampler._advance
    sampler._advance = lambda cohort: (sizes.append(len(cohort)), advance(cohort))
    outcomes = _drive_all(sampler.start(), {i: _steps(i, 3) for i in range(17)})
    stop.set()
    sampler.thread.join(5)
    assert len(sampler._cohorts) == 3 and 0 < max(sizes) <= COHORT_ACTORS
    assert outcomes == {i: [f"row {i} step {t}" for t in range(3)] for i in range(17)}
    assert set(calls) == {17}


class Lengths:
    """Host envs whose episodes end every ``i + 2`` steps (env ``i``)."""

    observation_shape = (3,)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, num_envs):
        self.num_envs, self.t, self.length = num_envs, np.zeros(num_envs, int), np.arange(num_envs) + 2
        self.rng = np.random.default_rng(0)

    def reset(self, seed):
        self.rng, self.t[:] = np.random.default_rng(seed), 0
        return self.rng.normal(size=(self.num_envs, 3)).astype(np.float32)

    def step(self, actions):
        self.t += 1
        terminated = self.t >= self.length
        self.t[terminated] = 0
        obs = self.rng.normal(size=(self.num_envs, 3)).astype(np.float32)
        return obs, np.ones(self.num_envs, np.float32), terminated, np.zeros_like(terminated), obs


def test_a_host_chunks_follower_begins_as_the_next_chunk_would():
    """`ChunkEnd.follow` begins the next chunk from where the chunk ended, before it is
    finished: its first policy call's inputs (recurrent state, observations, which envs
    begin an episode, keys) are those of `chunk_steps` on the finished chunk's carry."""
    register_host_env("inference-lengths", Lengths)
    config = AsyncActorLearnerConfig(env_id="host:inference-lengths", envs_per_actor=4,
                                     num_steps=4, network="gru", rnn_hidden_size=8,
                                     hidden_sizes=(16,), num_minibatches=2)
    rollout = HostRollout(config)
    policy, params = rollout.policy, _policy("gru")[1]
    carry = rollout.reset(keys.key(0), jax.devices("cpu")[0])
    steps = rollout.chunk_steps(params, carry)
    request = next(steps)
    try:
        while True:
            request = steps.send(None if request is None else policy.act_alone(params, *request))
    except StopIteration as finished:
        end = finished.value
    after = end.finish(carry)[0]
    begun, fresh = next(end.follow(params)), next(rollout.chunk_steps(params, after))
    for a, b in zip(begun, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    assert begun[2].tolist() == [True, False, True, False]  # episodes of 2 and 4 steps ended
    assert np.abs(begun[0]).sum() > 0
    rollout.close(carry)


def _steps_from(index: int, first: int, last: int):
    rows = []
    for t in range(first, last):
        rows.append((yield (index, t)))
        yield None
    return rows


def test_a_shared_sampler_begins_an_actors_next_chunk_where_its_last_ended():
    """With the next chunk's params at hand as a chunk ends (asked once, from the
    sampler's thread), the sampler begins that chunk itself: the actor's next drive with
    those params takes it over (its own generator left unstarted) and gets the steps that
    follow. Without them the next drive's own chunk runs. A follower that another lineage
    (a restarted actor's envs) or other params find is dropped, and the new chunk runs
    from its own start."""
    stop = threading.Event()

    def fn(params, inputs):
        return [f"{params} row {i} step {t}" for i, t in inputs]

    def chunk(first, begun=False):
        """Three steps; begun by the sampler, its last one waits (as a slow env's would)
        until its actor's thread has taken it over, or dropped it."""
        rows = yield from _steps_from(0, first, first + 3)
        while begun and not any(c.next_params or c.abandoned
                                for cohort in sampler._cohorts for c in cohort):
            time.sleep(0.001)
        return ChunkEnd(lambda carry: rows, lambda params: chunk(first + 3, begun=True))

    sampler = LockstepSampler(fn, 2, stop.is_set).start()
    envs, unused, asked = object(), chunk(100), []

    def next_params(params):
        return lambda: asked.append(threading.current_thread().name) or params

    first = sampler.drive(0, "p0", chunk(0), next_params("p1"), envs)
    assert first.finish(None) == [f"p0 row 0 step {t}" for t in range(3)]
    assert sampler.followed == 1 and asked == ["ppo-sampler"]
    second = sampler.drive(0, "p1", unused, next_params(None), envs)  # p2 not at hand
    assert second.finish(None) == [f"p1 row 0 step {t}" for t in range(3, 6)]
    assert inspect.getgeneratorstate(unused) == inspect.GEN_CREATED  # never started
    assert sampler.followed == 1 and len(asked) == 2

    third = sampler.drive(0, "p2", chunk(6), next_params("p3"), envs)
    assert third.finish(None) == [f"p2 row 0 step {t}" for t in range(6, 9)]
    assert sampler.followed == 2
    restarted = sampler.drive(0, "p3", chunk(0), None, object())  # other envs: from step 0
    assert restarted.finish(None) == [f"p3 row 0 step {t}" for t in range(3)]
    sampler.drive(0, "p3", chunk(3), next_params("p4"), envs)
    assert sampler.followed == 3
    again = sampler.drive(0, "p9", chunk(50), None, envs)  # other params: its own chunk
    assert again.finish(None) == [f"p9 row 0 step {t}" for t in range(50, 53)]
    assert not any(c.params == "p4" for cohort in sampler._cohorts for c in cohort)
    stop.set()
    sampler.thread.join(5)
    assert not sampler.thread.is_alive()


class _HangingCartPoles:
    """gymnasium CartPole for a shared sampler; actor 2's envs never return from their
    third step (until ``release``)."""

    release = threading.Event()

    def __init__(self, num_envs):
        from ppo_async.envs.host import GymnasiumVectorEnv

        self.envs = GymnasiumVectorEnv("CartPole-v1", num_envs)
        self.observation_shape = self.envs.observation_shape
        self.action_space = self.envs.action_space
        self.reset, self.close = self.envs.reset, self.envs.close
        self.hangs, self.steps = threading.current_thread().name == "ppo-actor-2", 0

    def step(self, actions):
        self.steps += 1
        if self.hangs and self.steps == 3:
            self.release.wait(120)
        return self.envs.step(actions)


def test_a_sampler_stuck_in_a_chunk_says_whose_it_is():
    """An env's own step_wait runs in the sampler's thread: stuck there, the sampler says
    whose chunk it is in (the actor, counted from ``first_actor``), before its frames."""
    from ppo_async.runtime.transport import stop_threads

    stop, release, entered = threading.Event(), threading.Event(), threading.Event()

    def steps():  # one policy call, then a step_wait that does not return until released
        yield ("inputs",)
        entered.set()
        release.wait(10)
        return "done"

    sampler = LockstepSampler(lambda params, inputs: ["row 0", "row 1"], 2, stop.is_set,
                              first_actor=4).start()
    outcome = []
    driver = threading.Thread(target=lambda: outcome.append(sampler.drive(1, "p", steps())))
    driver.start()
    try:
        assert entered.wait(10)
        (line,) = stop_threads([sampler.thread], 0.05, doing={sampler.thread: sampler.doing})
    finally:
        release.set()
        driver.join(10)
        stop.set()
        sampler.thread.join(10)
    assert line.startswith("ppo-sampler (in actor 5's chunk, at ") and "in steps" in line
    assert outcome == ["done"] and sampler.doing() == "in its own loop"


def test_an_env_hung_under_a_shared_sampler_is_named_by_its_actor_and_line():
    """A hung env stops every actor of the sampler; the error names the thread left in the
    env's own code, with the actor: its stepper thread (the sampler ends on the stop). An
    env hung in its own step_wait holds the sampler itself: the test above."""
    import time

    from ppo_async.runtime.learner import LearnerTimeoutError

    register_host_env("hanging-cartpole", _HangingCartPoles)
    config = AsyncActorLearnerConfig(env_id="host:hanging-cartpole", num_actors=4,
                                     envs_per_actor=2, num_steps=8, num_minibatches=2,
                                     num_epochs=1, hidden_sizes=(16,),
                                     total_env_steps=4 * 2 * 8 * 50,
                                     sampler="shared", learner_timeout_s=3.0,
                                     shutdown_timeout_s=3.0)
    _HangingCartPoles.release.clear()
    start = time.monotonic()
    try:
        with pytest.raises(LearnerTimeoutError) as info:
            train(config, progress=False)
        elapsed = time.monotonic() - start
    finally:
        _HangingCartPoles.release.set()
        deadline = time.monotonic() + 30
        while any(t.name.startswith("ppo-") for t in threading.enumerate()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert elapsed < config.learner_timeout_s + config.shutdown_timeout_s + 8
    (stuck,) = [note for note in info.value.__notes__ if "threads still running" in note]
    assert "test_inference.py:" in stuck and " in step" in stuck  # the env's own line
    assert "ppo-env-stepper-2-0 (at " in stuck
    assert "ppo-sampler" not in stuck  # it ended on the stop
    assert not any("also failed while stopping" in note for note in info.value.__notes__)


def test_a_shared_sampler_is_for_host_envs_with_several_actors_in_a_process():
    from ppo_async.errors import ConfigError

    with pytest.raises(ConfigError, match="sampler='threads': must be one of"):
        AsyncActorLearnerConfig(env_id="gymnasium:CartPole-v1", sampler="threads")
    with pytest.raises(ConfigError, match="applies to thread actors only"):
        AsyncActorLearnerConfig(env_id="CartPole-v1", sampler="shared", actor_backend="processes")
    with pytest.raises(ConfigError, match="a Ray actor process runs one actor"):
        AsyncActorLearnerConfig(env_id="gymnasium:CartPole-v1", sampler="shared",
                                actor_backend="ray")
