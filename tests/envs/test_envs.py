"""Tests of `ppo_async.envs.gymnax_env`: batched gymnax envs and the jitted rollout.

The policies here are not networks but small hand-written ``apply_fn``s whose
value is a known function of the observation, so every number the rollout
stores can be recomputed: CartPole's and Pendulum's dynamics are
deterministic given the action, so the observation an episode ended on can be
rebuilt from the stored ``(obs, action)`` pair with gymnax's own ``step_env``,
independently of how the rollout splits its keys.

Each env gets one rollout, compiled once per module (compiling a rollout
costs seconds on a 2-core machine); every test reuses it.
"""

import math
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control.cartpole import EnvState as CartPoleState

from ppo_async.envs.gymnax_env import BatchedEnv, EnvCarry, make_gymnax_env, make_rollout
from ppo_async.envs.program import Trajectory
from ppo_async.envs.registry import UnknownEnvError
from ppo_async.networks.distributions import Categorical, DiagGaussian

GAMMA = 0.99
RESET_BOUND = 0.05  # gymnax's CartPole resets every state component in U(-0.05, 0.05)


# --------------------------------------------------------------------------
# Fake policies: value = bias + scale * sum(obs), fixed action distribution.
# --------------------------------------------------------------------------


def _value(params, obs, event_ndim):
    axes = tuple(range(-event_ndim, 0))
    return params["bias"] + params["scale"] * jnp.sum(obs, axis=axes)


def make_categorical_apply(event_ndim, trace_counter=None):
    """``apply_fn`` with a Categorical of fixed logits ``params['logits']``."""

    def apply_fn(params, obs):
        if trace_counter is not None:
            trace_counter["traces"] += 1  # Python side effect: runs only while tracing
        batch_shape = obs.shape[: obs.ndim - event_ndim]
        logits = jnp.broadcast_to(params["logits"], batch_shape + params["logits"].shape)
        return Categorical(logits), _value(params, obs, event_ndim)

    return apply_fn


def make_gaussian_apply(action_dim):
    """``apply_fn`` with a zero-mean diagonal Gaussian of std ``exp(params['log_std'])``."""

    def apply_fn(params, obs):
        batch_shape = obs.shape[:-1]
        mean = jnp.zeros(batch_shape + (action_dim,), jnp.float32)
        log_std = jnp.broadcast_to(params["log_std"], mean.shape)
        return DiagGaussian(mean, log_std), _value(params, obs, 1)

    return apply_fn


def value_params(*, bias=0.0, scale=1.0, **extra):
    params = {"bias": jnp.float32(bias), "scale": jnp.float32(scale)}
    params.update({k: jnp.asarray(v, jnp.float32) for k, v in extra.items()})
    return params


def with_time_limit(env: BatchedEnv, limit: int) -> BatchedEnv:
    env.env_params = env.env_params.replace(max_steps_in_episode=limit)
    env.max_episode_steps = limit
    return env


def to_numpy(tree):
    return jax.tree.map(np.asarray, tree)


# --------------------------------------------------------------------------
# CartPole: a short time limit and a right-leaning policy, so that one rollout
# holds both pole falls (terminations) and time-limit truncations.
# --------------------------------------------------------------------------

CP_ENVS, CP_STEPS, CP_LIMIT = 4, 32, 12


@pytest.fixture(scope="module")
def cartpole():
    trace_counter = {"traces": 0}
    env = with_time_limit(BatchedEnv("CartPole-v1", CP_ENVS), CP_LIMIT)
    apply_fn = make_categorical_apply(1, trace_counter)
    rollout = make_rollout(env, apply_fn, CP_STEPS, GAMMA)
    params = value_params(logits=[0.0, 1.0])
    return types.SimpleNamespace(
        env=env, apply_fn=apply_fn, rollout=rollout, params=params,
        trace_counter=trace_counter, transition=make_cartpole_transition(env),
    )


@pytest.fixture(scope="module")
def cartpole_run(cartpole):
    """Two chained rollouts from a fresh reset: chunk boundaries are crossed."""
    carry0 = cartpole.env.reset(jax.random.key(0))
    carry1, traj1, boot1 = cartpole.rollout(cartpole.params, carry0)
    carry2, traj2, boot2 = cartpole.rollout(cartpole.params, carry1)
    return types.SimpleNamespace(
        carry0=carry0, carry1=carry1, traj1=traj1, boot1=boot1,
        carry2=carry2, traj2=traj2, boot2=boot2,
    )


def make_cartpole_transition(env: BatchedEnv):
    """``transition(obs, action) -> (obs_reached, terminated)``: CartPole's step before any reset.

    Rebuilt from stored observations and actions ``[..., 4]``, ``[...]`` with
    gymnax's own ``step_env`` (deterministic; ``time`` does not enter the
    dynamics), independently of the keys the rollout used. Jitted: eager
    dispatch of the vmapped step costs seconds.
    """

    @jax.jit
    def transition(obs, action):
        flat_obs = obs.reshape(-1, 4)
        state = CartPoleState(
            x=flat_obs[:, 0], x_dot=flat_obs[:, 1], theta=flat_obs[:, 2],
            theta_dot=flat_obs[:, 3], time=jnp.zeros(flat_obs.shape[:1], jnp.int32),
        )
        step = jax.vmap(env.env.step_env, in_axes=(None, 0, 0, None))
        next_obs, _, _, terminated, _ = step(
            jax.random.key(0), state, action.reshape(-1), env.env_params
        )
        return next_obs.reshape(obs.shape), terminated.reshape(obs.shape[:-1])

    def transition_np(obs, action):
        return tuple(np.asarray(x) for x in transition(jnp.asarray(obs), jnp.asarray(action)))

    return transition_np


def test_cartpole_shapes_and_dtypes(cartpole, cartpole_run):
    T, E = CP_STEPS, CP_ENVS
    traj, carry, boot = cartpole_run.traj1, cartpole_run.carry1, cartpole_run.boot1
    assert isinstance(traj, Trajectory) and isinstance(carry, EnvCarry)
    assert cartpole.env.observation_shape == (4,)
    assert not cartpole.env.continuous
    chex.assert_shape(traj.obs, (T, E, 4))
    chex.assert_type(traj.obs, jnp.float32)
    chex.assert_shape(traj.action, (T, E))
    chex.assert_type(traj.action, jnp.int32)
    chex.assert_shape(
        [traj.reward, traj.terminated, traj.truncated, traj.behaviour_logp,
         traj.behaviour_value, traj.episode_return, traj.episode_length, traj.done],
        (T, E),
    )
    for name in ("reward", "behaviour_logp", "behaviour_value", "episode_return"):
        chex.assert_type(getattr(traj, name), jnp.float32)
    for name in ("terminated", "truncated", "done"):
        chex.assert_type(getattr(traj, name), jnp.bool_)
    chex.assert_type(traj.episode_length, jnp.int32)

    chex.assert_shape(boot, (E,))
    chex.assert_type(boot, jnp.float32)

    chex.assert_shape(carry.obs, (E, 4))
    chex.assert_type(carry.obs, jnp.float32)
    chex.assert_shape(carry.episode_return, (E,))
    chex.assert_type(carry.episode_return, jnp.float32)
    chex.assert_shape(carry.episode_length, (E,))
    chex.assert_type(carry.episode_length, jnp.int32)
    for leaf in jax.tree.leaves(carry.env_state):
        assert leaf.shape[:1] == (E,), leaf.shape
    assert carry.key.shape == cartpole_run.carry0.key.shape
    assert carry.key.dtype == cartpole_run.carry0.key.dtype
    # The carry's structure and dtypes are those reset() makes: it is fed back in.
    chex.assert_trees_all_equal_shapes_and_dtypes(carry, cartpole_run.carry0)
    chex.assert_tree_all_finite((traj.obs, traj.reward, traj.behaviour_logp, boot))


def test_cartpole_terminated_and_truncated_are_disjoint_and_follow_the_time_limit(cartpole_run):
    for traj in (cartpole_run.traj1, cartpole_run.traj2):
        terminated = np.asarray(traj.terminated)
        truncated = np.asarray(traj.truncated)
        length = np.asarray(traj.episode_length)
        done = terminated | truncated
        np.testing.assert_array_equal(np.asarray(traj.done), done)
        assert not np.any(terminated & truncated), "a terminated step is never truncated"
        # Every truncation happens exactly at the time limit ...
        np.testing.assert_array_equal(length[truncated], CP_LIMIT)
        # ... no episode outlives it, and one that ends earlier was terminated.
        assert np.all(length <= CP_LIMIT)
        assert np.all(terminated[done & (length < CP_LIMIT)])
    # The fixture's policy and limit are chosen so that both kinds occur.
    both = [cartpole_run.traj1, cartpole_run.traj2]
    assert sum(int(np.sum(t.terminated)) for t in both) > 0
    assert sum(int(np.sum(t.truncated)) for t in both) > 0


def test_cartpole_reward_folds_in_discounted_value_of_final_obs_at_truncation(cartpole, cartpole_run):
    for traj in (cartpole_run.traj1, cartpole_run.traj2):
        final_obs, _ = cartpole.transition(traj.obs, traj.action)
        truncated = np.asarray(traj.truncated)
        reward = np.asarray(traj.reward)
        # V(x) = sum(x) under the fixture's params: the bootstrap is visible.
        expected = np.where(truncated, 1.0 + GAMMA * final_obs.sum(-1), 1.0)
        np.testing.assert_allclose(reward, expected, rtol=1e-5, atol=1e-6)
        # Steps that were not truncated (terminated ones included) carry the
        # plain CartPole reward, exactly.
        np.testing.assert_array_equal(reward[~truncated], 1.0)


def test_cartpole_constant_value_truncation_reward(cartpole):
    """Hand-checkable: with V == 3 every truncated step pays 1 + 0.99 * 3, every other 1."""
    # New param values of the same structure reuse the compiled rollout.
    params = value_params(bias=3.0, scale=0.0, logits=[0.0, 0.0])
    _, traj, boot = cartpole.rollout(params, cartpole.env.reset(jax.random.key(3)))
    truncated = np.asarray(traj.truncated)
    assert np.any(truncated)
    np.testing.assert_array_equal(np.asarray(traj.episode_length)[truncated], CP_LIMIT)
    np.testing.assert_allclose(np.asarray(traj.reward)[truncated], 1.0 + GAMMA * 3.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(traj.reward)[~truncated], 1.0)
    np.testing.assert_allclose(np.asarray(boot), 3.0)
    np.testing.assert_allclose(np.asarray(traj.behaviour_value), 3.0)


def test_cartpole_episode_statistics(cartpole_run):
    trajs = (cartpole_run.traj1, cartpole_run.traj2)
    done = np.concatenate([np.asarray(t.done) for t in trajs])
    length = np.concatenate([np.asarray(t.episode_length) for t in trajs])
    ret = np.concatenate([np.asarray(t.episode_return) for t in trajs])
    # Nonzero exactly where an episode ended.
    np.testing.assert_array_equal(length != 0, done)
    np.testing.assert_array_equal(ret != 0, done)
    # CartPole pays 1 per step: the undiscounted return is the length (and the
    # truncation bootstrap is not in it).
    np.testing.assert_array_equal(ret, length.astype(np.float32))
    # Lengths count steps since the previous episode ended, across the chunk
    # boundary between the two rollouts.
    since_done = np.zeros(done.shape[1], np.int64)
    for t in range(done.shape[0]):
        since_done += 1
        np.testing.assert_array_equal(length[t][done[t]], since_done[done[t]])
        since_done[done[t]] = 0
    np.testing.assert_array_equal(np.asarray(cartpole_run.carry2.episode_length), since_done)
    np.testing.assert_array_equal(np.asarray(cartpole_run.carry2.episode_return), since_done)
    # Some episode straddles the boundary and is truncated at the limit.
    done1 = np.asarray(cartpole_run.traj1.done)
    open_at_boundary = ~done1[-1]
    assert np.any(open_at_boundary & np.any(np.asarray(cartpole_run.traj2.done), axis=0))


def test_cartpole_next_obs_after_done_is_fresh_reset(cartpole, cartpole_run):
    for carry_before, traj, carry_after in (
        (cartpole_run.carry0, cartpole_run.traj1, cartpole_run.carry1),
        (cartpole_run.carry1, cartpole_run.traj2, cartpole_run.carry2),
    ):
        obs = np.asarray(traj.obs)
        # The observation acted on after step t: obs[t+1], or the carry's after the last step.
        next_obs = np.concatenate([obs[1:], np.asarray(carry_after.obs)[None]])
        done = np.asarray(traj.done)
        reached, terminated = cartpole.transition(obs, traj.action)
        assert np.all(np.abs(next_obs[done]) <= RESET_BOUND)
        # The episode's own next observation was not passed on as the reset one.
        assert not np.any(np.all(np.isclose(next_obs[done], reached[done]), axis=-1))
        # Within an episode the observation is the dynamics' next state, and the
        # stored termination is the dynamics' termination.
        np.testing.assert_allclose(next_obs[~done], reached[~done], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(traj.terminated), terminated)
        # Chunks join up: the first observation is the carry's.
        np.testing.assert_array_equal(obs[0], np.asarray(carry_before.obs))


def test_cartpole_behaviour_logp_value_and_bootstrap(cartpole, cartpole_run):
    traj = cartpole_run.traj1
    obs = np.asarray(traj.obs)
    action = np.asarray(traj.action)
    assert set(np.unique(action)) <= {0, 1}
    log_p = np.log(np.exp([0.0, 1.0]) / np.exp([0.0, 1.0]).sum())
    np.testing.assert_allclose(np.asarray(traj.behaviour_logp), log_p[action], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(traj.behaviour_value), obs.sum(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(cartpole_run.boot1), np.asarray(cartpole_run.carry1.obs).sum(-1),
        rtol=1e-5, atol=1e-6,
    )


def _comparable(result):
    """A rollout's output as numpy, with the typed PRNG key as its raw data."""
    carry, traj, boot = result
    carry = carry._replace(key=jax.random.key_data(carry.key))
    return to_numpy((carry, traj, boot))


def test_rollout_is_reproducible_from_its_key(cartpole, cartpole_run):
    first = _comparable((cartpole_run.carry1, cartpole_run.traj1, cartpole_run.boot1))
    again = _comparable(cartpole.rollout(cartpole.params, cartpole.env.reset(jax.random.key(0))))
    chex.assert_trees_all_equal(again, first)

    other = cartpole.rollout(cartpole.params, cartpole.env.reset(jax.random.key(1)))
    assert not np.array_equal(np.asarray(other[1].obs), first[1].obs)
    assert not np.array_equal(np.asarray(other[1].action), first[1].action)


def test_rollout_does_not_recompile(cartpole):
    carry = cartpole.env.reset(jax.random.key(7))
    carry, _, _ = cartpole.rollout(cartpole.params, carry)  # compiled (or cached) here
    traces = cartpole.trace_counter["traces"]
    # New param values of the same structure, and the carry the rollout returned
    # (not the one reset() made), reuse the compiled program.
    other_params = value_params(bias=1.0, scale=2.0, logits=[0.5, -0.5])
    for params in (cartpole.params, other_params, cartpole.params):
        carry, traj, _ = cartpole.rollout(params, carry)
    jax.block_until_ready(traj)
    assert cartpole.trace_counter["traces"] == traces
    assert cartpole.rollout._cache_size() == 1


# --------------------------------------------------------------------------
# Pendulum: continuous actions [T, E, 1]; every episode is truncated.
# --------------------------------------------------------------------------

PD_ENVS, PD_STEPS, PD_LIMIT = 2, 12, 5
PD_VALUE = 1000.0
PD_MAX_COST = math.pi**2 + 0.1 * 8.0**2 + 0.001 * 2.0**2  # theta^2 + .1 theta_dot^2 + .001 u^2


@pytest.fixture(scope="module")
def pendulum_run():
    env = with_time_limit(BatchedEnv("Pendulum-v1", PD_ENVS), PD_LIMIT)
    rollout = make_rollout(env, make_gaussian_apply(1), PD_STEPS, GAMMA)
    # Wide actions (std 3) so that some exceed the torque bound of 2; a
    # constant value so that the folded-in bootstrap stands out of the reward.
    params = value_params(bias=PD_VALUE, scale=0.0, log_std=[math.log(3.0)])
    carry0 = env.reset(jax.random.key(0))
    carry, traj, boot = rollout(params, carry0)
    return types.SimpleNamespace(
        env=env, rollout=rollout, params=params, carry0=carry0, carry=carry, traj=traj, boot=boot
    )


def test_pendulum_shapes_and_dtypes(pendulum_run):
    T, E = PD_STEPS, PD_ENVS
    env, traj, carry = pendulum_run.env, pendulum_run.traj, pendulum_run.carry
    assert env.continuous
    assert env.observation_shape == (3,)
    chex.assert_shape(traj.obs, (T, E, 3))
    chex.assert_type(traj.obs, jnp.float32)
    chex.assert_shape(traj.action, (T, E, 1))
    chex.assert_type(traj.action, jnp.float32)
    chex.assert_shape(
        [traj.reward, traj.terminated, traj.truncated, traj.behaviour_logp,
         traj.behaviour_value, traj.episode_return, traj.episode_length],
        (T, E),
    )
    chex.assert_type([traj.reward, traj.behaviour_logp, traj.episode_return], jnp.float32)
    chex.assert_type(traj.episode_length, jnp.int32)
    chex.assert_shape(pendulum_run.boot, (E,))
    chex.assert_shape(carry.obs, (E, 3))
    chex.assert_trees_all_equal_shapes_and_dtypes(carry, pendulum_run.carry0)
    chex.assert_tree_all_finite((traj.obs, traj.action, traj.reward, traj.behaviour_logp))


def test_pendulum_stores_unclipped_actions_and_their_logp(pendulum_run):
    traj = pendulum_run.traj
    action = np.asarray(traj.action)
    assert np.any(np.abs(action) > 2.0), "the sample is stored unclipped"
    std = 3.0
    expected_logp = (-0.5 * (action / std) ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)
    np.testing.assert_allclose(np.asarray(traj.behaviour_logp), expected_logp, rtol=1e-5)


def test_pendulum_time_limit_truncates_and_bootstraps(pendulum_run):
    traj = pendulum_run.traj
    truncated = np.asarray(traj.truncated)
    expected_truncated = np.broadcast_to(
        (np.arange(PD_STEPS) % PD_LIMIT == PD_LIMIT - 1)[:, None], truncated.shape
    )
    np.testing.assert_array_equal(truncated, expected_truncated)
    assert not np.any(traj.terminated)
    np.testing.assert_array_equal(np.asarray(traj.episode_length)[truncated], PD_LIMIT)
    np.testing.assert_array_equal(np.asarray(traj.episode_length)[~truncated], 0)
    # Pendulum pays -cost in [-PD_MAX_COST, 0]; a truncated step adds gamma * V.
    env_reward = np.asarray(traj.reward) - np.where(truncated, GAMMA * PD_VALUE, 0.0)
    assert np.all(env_reward <= 1e-4) and np.all(env_reward >= -PD_MAX_COST - 1e-3)
    # The undiscounted return leaves the bootstrap out.
    ret = np.asarray(traj.episode_return)[truncated]
    assert np.all(ret <= 0) and np.all(ret >= -PD_LIMIT * PD_MAX_COST)
    np.testing.assert_allclose(np.asarray(pendulum_run.boot), PD_VALUE)


# --------------------------------------------------------------------------
# Breakout-MinAtar: image observations [T, E, 10, 10, 4].
# --------------------------------------------------------------------------


def test_breakout_minatar_shapes_and_dtypes():
    T, E = 4, 2
    env = BatchedEnv("Breakout-MinAtar", E)
    assert env.observation_shape == (10, 10, 4)
    assert not env.continuous
    num_actions = env.action_space.n
    rollout = make_rollout(env, make_categorical_apply(3), T, GAMMA)
    params = value_params(logits=np.zeros(num_actions))
    carry0 = env.reset(jax.random.key(0))
    carry, traj, boot = rollout(params, carry0)

    chex.assert_shape(traj.obs, (T, E, 10, 10, 4))
    chex.assert_type(traj.obs, jnp.float32)
    assert set(np.unique(np.asarray(traj.obs))) <= {0.0, 1.0}
    chex.assert_shape(traj.action, (T, E))
    chex.assert_type(traj.action, jnp.int32)
    assert np.all((np.asarray(traj.action) >= 0) & (np.asarray(traj.action) < num_actions))
    chex.assert_shape(
        [traj.reward, traj.terminated, traj.truncated, traj.behaviour_logp,
         traj.behaviour_value, traj.episode_return, traj.episode_length],
        (T, E),
    )
    np.testing.assert_allclose(np.asarray(traj.behaviour_logp), -math.log(num_actions), rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(traj.behaviour_value), np.asarray(traj.obs).sum((-3, -2, -1)), rtol=1e-6
    )
    chex.assert_shape(boot, (E,))
    chex.assert_shape(carry.obs, (E, 10, 10, 4))
    chex.assert_type(carry.obs, jnp.float32)
    chex.assert_trees_all_equal_shapes_and_dtypes(carry, carry0)


# --------------------------------------------------------------------------
# Env ids.
# --------------------------------------------------------------------------


def test_make_gymnax_env_known_id():
    env, env_params = make_gymnax_env("CartPole-v1")
    assert env.name == "CartPole-v1"
    assert int(env_params.max_steps_in_episode) == 500


@pytest.mark.parametrize("env_id", ["NoSuchEnv-v0", "cartpole-v1", ""])
def test_unknown_env_id_lists_valid_ids(env_id):
    with pytest.raises(UnknownEnvError) as excinfo:
        make_gymnax_env(env_id)
    assert isinstance(excinfo.value, ValueError)
    message = str(excinfo.value)
    assert repr(env_id) in message
    for valid in ("CartPole-v1", "Pendulum-v1", "Breakout-MinAtar"):
        assert valid in message
    with pytest.raises(UnknownEnvError):
        BatchedEnv(env_id, 2)


def test_discrete_observations_leave_a_batched_env_one_hot():
    # FrozenLake-misc's observation is its state, one of 16: the actors, the
    # learner and the network see it one-hot, the rest of the env as gymnax's.
    env = BatchedEnv("FrozenLake-misc", 3)
    assert env.observation_shape == (16,)
    env_keys = jax.random.split(jax.random.key(1), 3)
    carry = env.reset_from(env_keys, jax.random.key(2))
    raw_obs, raw_state = jax.vmap(env.env.reset, in_axes=(0, None))(env_keys, env.env_params)
    np.testing.assert_array_equal(carry.obs, np.eye(16, dtype=np.float32)[raw_obs])
    actions, step_key = jnp.array([0, 1, 2]), jax.random.key(3)
    obs, _, reward, *_, final_obs = env.step(step_key, carry.env_state, actions)
    raw_obs, _, raw_reward, *_, info = jax.vmap(env.env.step, in_axes=(0, 0, 0, None))(
        jax.random.split(step_key, 3), raw_state, actions, env.env_params)
    np.testing.assert_array_equal(obs, np.eye(16, dtype=np.float32)[raw_obs])
    np.testing.assert_array_equal(
        final_obs, np.eye(16, dtype=np.float32)[info["final_observation"]])
    np.testing.assert_array_equal(reward, raw_reward)


def test_pendulum_rollout_does_not_recompile_on_its_own_carry(pendulum_run):
    # Pendulum's reset leaves `last_u` weakly typed while step makes it strong:
    # unless reset() normalizes the carry, the second call compiles again.
    carry, traj, _ = pendulum_run.rollout(pendulum_run.params, pendulum_run.carry)
    jax.block_until_ready(traj)
    assert pendulum_run.rollout._cache_size() == 1


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_an_actors_reset_splits_its_keys_on_the_host_as_batched_env_reset_does(env_id):
    # The actor program's reset splits the key on the host (ppo_async.core.keys) and
    # runs BatchedEnv.reset_from; the twin traces BatchedEnv.reset: the same carry.
    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.envs.backends import make_actor_program

    config = AsyncActorLearnerConfig(env_id=env_id, envs_per_actor=3, hidden_sizes=(8,))
    program = make_actor_program(config)
    key = jax.random.fold_in(jax.random.key(4), 1)
    carry = program.reset(key, jax.devices("cpu")[0])
    traced = jax.jit(lambda k: BatchedEnv(env_id, 3).reset(
        k, track_return=config.normalization_options().rewards))(key)
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, carry.env_state),
                                jax.tree.map(np.asarray, traced.env_state))
    for field in ("obs", "episode_return", "episode_length", "discounted_return"):
        chex.assert_trees_all_equal(getattr(carry, field), getattr(traced, field))
    np.testing.assert_array_equal(jax.random.key_data(carry.key), jax.random.key_data(traced.key))
