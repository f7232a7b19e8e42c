"""Evaluation: episode counts, determinism, a hand-checkable policy, continuous actions, bytes."""

import types

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.train import train
from ppo_async.envs.gymnax_env import BatchedEnv
from ppo_async.networks.actor_critic import init_params, make_network
from ppo_async.runtime.evaluate import EvalResult, Evaluator, evaluate
from ppo_async.runtime.messages import PolicyBroadcast, PolicyLoadError, serialize_policy

CARTPOLE = AsyncActorLearnerConfig(env_id="CartPole-v1")


def _random_params(config, seed):
    env = BatchedEnv(config.env_id, 1)
    network = make_network(env.observation_shape, env.action_space, config.hidden_sizes)
    return jax.device_get(init_params(network, jax.random.key(seed), env.observation_shape))


@pytest.fixture(scope="module")
def cartpole_params():
    return _random_params(CARTPOLE, 0)


@pytest.fixture(scope="module")
def always_left_params(cartpole_params):
    """Params whose logits are [1, 0] for every observation: the greedy action is 0."""
    params = jax.tree.map(np.array, cartpole_params)
    head = params["params"]["Dense_1"]  # the actor's logits layer (Dense_0 is the value)
    assert head["kernel"].shape == (64, 2)
    head["kernel"][:] = 0.0
    head["bias"][:] = [1.0, 0.0]
    return params


def _direct_gymnax_episode(env: BatchedEnv, env_state, index: int, action: int):
    """Return and length of one episode from env ``index`` of a reset batch, stepped by gymnax alone."""
    state = jax.tree.map(lambda x: x[index], env_state)
    episode_return, length = 0.0, 0
    while True:
        _, state, reward, terminated, truncated, _ = env.env.step(
            jax.random.key(length), state, jnp.int32(action), env.env_params
        )
        episode_return += float(reward)
        length += 1
        if bool(terminated) or bool(truncated):
            return episode_return, length


def _reset_state_of_evaluation(env_id: str, num_envs: int, seed: int):
    """The reset batch `Evaluator` documents: BatchedEnv.reset(split(key(seed))[0])."""
    env = BatchedEnv(env_id, num_envs)
    return env, env.reset(jax.random.split(jax.random.key(seed))[0]).env_state


def test_random_policy_on_cartpole(cartpole_params):
    result = evaluate(CARTPOLE, cartpole_params, num_episodes=10, seed=0)
    assert isinstance(result, EvalResult)
    assert result.episode_returns.shape == (10,) and result.episode_lengths.shape == (10,)
    assert result.episode_returns.dtype == np.float32
    assert result.episode_lengths.dtype == np.int32
    # CartPole pays 1 per step, and no episode is shorter than the fastest
    # possible fall nor longer than the time limit. How long an untrained greedy
    # policy lasts depends on the draw: over 100 initial params, half fall in
    # under 11 steps, and some last hundreds (with this initializer or the
    # Gram-Schmidt one before it), so no tighter bound holds for every draw.
    np.testing.assert_array_equal(result.episode_returns, result.episode_lengths)
    assert np.all((result.episode_lengths >= 8) & (result.episode_lengths <= 500))
    assert 8 <= result.mean_return <= 500
    assert result.mean_return == pytest.approx(np.mean(result.episode_returns))
    assert result.std_return == pytest.approx(np.std(result.episode_returns))


def test_same_seed_same_result_and_no_recompile(cartpole_params):
    evaluator = Evaluator(CARTPOLE, 10)
    first = evaluator(cartpole_params, seed=3)
    again = evaluator(cartpole_params, seed=3)
    other_seed = evaluator(cartpole_params, seed=4)
    other_params = evaluator(_random_params(CARTPOLE, 1), seed=3)
    np.testing.assert_array_equal(first.episode_returns, again.episode_returns)
    np.testing.assert_array_equal(first.episode_lengths, again.episode_lengths)
    assert not np.array_equal(first.episode_lengths, other_seed.episode_lengths)
    assert not np.array_equal(first.episode_lengths, other_params.episode_lengths)
    assert evaluator.traces == 1  # new seeds and new params values reuse the compiled loop


def test_sampled_actions_are_seeded(cartpole_params):
    first = evaluate(CARTPOLE, cartpole_params, num_episodes=6, seed=0, greedy=False)
    again = evaluate(CARTPOLE, cartpole_params, num_episodes=6, seed=0, greedy=False)
    other = evaluate(CARTPOLE, cartpole_params, num_episodes=6, seed=1, greedy=False)
    np.testing.assert_array_equal(first.episode_lengths, again.episode_lengths)
    assert not np.array_equal(first.episode_lengths, other.episode_lengths)
    np.testing.assert_array_equal(first.episode_returns, first.episode_lengths)


def test_always_left_matches_a_direct_gymnax_loop(always_left_params):
    result = evaluate(CARTPOLE, always_left_params, num_episodes=10, seed=5)
    env, env_state = _reset_state_of_evaluation("CartPole-v1", 10, seed=5)
    expected = [_direct_gymnax_episode(env, env_state, b, action=0) for b in range(10)]
    np.testing.assert_array_equal(result.episode_returns, [r for r, _ in expected])
    np.testing.assert_array_equal(result.episode_lengths, [n for _, n in expected])
    # Pushing left from near upright falls over in about ten steps.
    assert np.all((result.episode_lengths >= 8) & (result.episode_lengths <= 12))


def test_more_episodes_than_envs_take_a_fixed_share_per_env(always_left_params):
    """20 episodes on 16 envs: envs 0-3 give two episodes each, envs 4-15 one."""
    evaluator = Evaluator(CARTPOLE, 20)
    assert evaluator.num_envs == 16
    np.testing.assert_array_equal(evaluator.first_slot_of_env, (
        [0, 2, 4, 6, *range(8, 20)]))
    result = evaluator(always_left_params, seed=5)
    assert result.episode_lengths.shape == (20,)
    env, env_state = _reset_state_of_evaluation("CartPole-v1", 16, seed=5)
    # Each env's first episode sits in its first slot and starts from the reset.
    for b, slot in enumerate(evaluator.first_slot_of_env):
        assert (result.episode_returns[slot], result.episode_lengths[slot]) == (
            _direct_gymnax_episode(env, env_state, b, action=0))
    # Second episodes (after an auto-reset) are whole episodes too.
    assert np.all((result.episode_lengths >= 8) & (result.episode_lengths <= 12))
    np.testing.assert_array_equal(result.episode_returns, result.episode_lengths)


def test_pendulum_continuous():
    config = AsyncActorLearnerConfig(env_id="Pendulum-v1")
    result = evaluate(config, _random_params(config, 0), num_episodes=3, seed=0)
    # Pendulum never terminates; every episode is cut at 200 steps. Its reward
    # per step lies in [-(pi^2 + 0.1 * 8^2 + 0.001 * 2^2), 0].
    np.testing.assert_array_equal(result.episode_lengths, [200, 200, 200])
    worst = -(np.pi**2 + 0.1 * 64 + 0.001 * 4) * 200
    assert np.all((result.episode_returns >= worst) & (result.episode_returns < 0))


def test_bytes_and_broadcast_give_the_same_result(cartpole_params):
    direct = evaluate(CARTPOLE, cartpole_params, num_episodes=10, seed=2)
    payload = serialize_policy(cartpole_params)
    from_bytes = evaluate(CARTPOLE, payload, num_episodes=10, seed=2)
    evaluator = Evaluator(CARTPOLE, 10)
    from_broadcast = evaluator.evaluate_broadcast(PolicyBroadcast(3, payload), seed=2)
    for result in (from_bytes, from_broadcast):
        np.testing.assert_array_equal(result.episode_returns, direct.episode_returns)
        np.testing.assert_array_equal(result.episode_lengths, direct.episode_lengths)


def test_other_architecture_bytes_are_refused():
    wide = AsyncActorLearnerConfig(env_id="CartPole-v1", hidden_sizes=(32,))
    payload = flax.serialization.to_bytes(_random_params(wide, 0))
    evaluator = Evaluator(CARTPOLE, 2)
    with pytest.raises(PolicyLoadError, match="policy version 7"):
        evaluator.evaluate_broadcast(PolicyBroadcast(7, payload))


def test_params_of_another_network_are_refused_naming_what_differs(cartpole_params):
    # evaluate(config, params) with params of another env or width: one line that
    # names the leaf, for a pytree as for its bytes (flax's own error named an
    # initializer).
    acrobot = AsyncActorLearnerConfig(env_id="Acrobot-v1")
    for params in (cartpole_params, serialize_policy(cartpole_params)):
        with pytest.raises(PolicyLoadError, match=r"Acrobot-v1: the params do not fit the "
                           r"config's network: params\['params'\]\['Dense_1'\]\['bias'\] is "
                           r"float32\[2\], this network's float32\[3\]"):
            evaluate(acrobot, params, num_episodes=2)
    recurrent = AsyncActorLearnerConfig(env_id="CartPole-v1", network="gru", rnn_hidden_size=8)
    with pytest.raises(PolicyLoadError, match=r"the params have no params\['params'\]\['MLP_0'\]"
                       r"\['memory_in'\]\['kernel'\], which this network has"):
        evaluate(recurrent, cartpole_params, num_episodes=2)
    with pytest.raises(PolicyLoadError, match="bytes do not decode"):
        evaluate(recurrent, serialize_policy(cartpole_params), num_episodes=2)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_episodes"):
        Evaluator(CARTPOLE, 0)
    # From a notebook: a dict for the config, or params not yet loaded.
    with pytest.raises(TypeError, match="config must be an AsyncActorLearnerConfig, not dict"):
        evaluate({"env_id": "CartPole-v1"}, None)
    with pytest.raises(TypeError, match="params is None; pass a run's params"):
        evaluate(CARTPOLE, None)
    unknown = types.SimpleNamespace(env_id="nosuchbackend:CartPole-v1", hidden_sizes=(64, 64),
                                    actor_device="cpu")
    with pytest.raises(ValueError, match="unknown backend prefix 'nosuchbackend'"):
        Evaluator(unknown, 2)


def test_periodic_evaluation_of_a_host_env_reaches_metrics_and_the_plot(tmp_path, monkeypatch):
    from ppo_async.runs.analysis import load_run
    from ppo_async.runs.plotting import plot_run

    from run_helpers import drawn_figures

    config = AsyncActorLearnerConfig(
        env_id="gymnasium:CartPole-v1", num_actors=2, envs_per_actor=2, num_steps=8,
        num_epochs=1, num_minibatches=2, total_env_steps=2 * 2 * 8 * 6, eval_every_updates=2,
        eval_episodes=3)
    report = train(config, run_dir=tmp_path, progress=False).report
    versions = [version for version, _ in report.eval_returns]
    assert versions[-1] == 6 and set(versions) <= {2, 4, 6}
    assert len(versions) + report.eval_requests_skipped == 3
    # CartPole's own reward: 1 a step, so a greedy episode returns its length (>= 8).
    assert all(mean >= 8 for _, mean in report.eval_returns)
    run = load_run(tmp_path)
    evaluated = np.isfinite(run.metrics["eval_return_mean"])
    assert run.metrics["update"][evaluated].tolist() == versions
    figures = drawn_figures(monkeypatch)
    plot_run(tmp_path)
    (figure,) = figures
    dots = [line for line in figure.axes[0].lines if line.get_marker() == "o"]
    np.testing.assert_allclose(
        [y for d in dots for y in d.get_ydata() if np.isfinite(y)], [m for _, m in report.eval_returns])
    assert "greedy evaluation" in figure.axes[0].get_title()
