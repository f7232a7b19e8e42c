"""The env backend interface (`ppo_async.envs.backends`): a backend is one class and one registration.

A toy backend defined only here (a jitted cue-matching env) is registered
under its own prefix, then trained, evaluated, drawn and run by the twin
through the same entry points the built-in backends use.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async import AsyncActorLearnerConfig, ConfigError, train
from ppo_async.envs.backends import EnvBackend, make_actor_program
from ppo_async.envs.gymnax_backend import GymnaxBackend, GymnaxEpisodes
from ppo_async.envs.gymnax_env import EnvCarry, make_jitted_actor_program
from ppo_async.envs.registry import env_backend, register_env_backend, split_env_id
from ppo_async.runtime.evaluate import evaluate
from ppo_async.sync import make_train
from ppo_async.tools.video import record_episodes

EPISODE_STEPS = 4


class _Discrete:
    def __init__(self, n):
        self.n, self.shape = n, ()


class CueEnv:
    """``E`` envs: the observation is a one-hot cue; the action equal to the cue earns 1.

    Episodes last `EPISODE_STEPS` steps and end truncated (a time limit).
    State: (cue [E] int32, step [E] int32). The interface is `BatchedEnv`'s.
    """

    continuous = False
    max_episode_steps = EPISODE_STEPS
    observation_shape = (2,)
    action_space = _Discrete(2)

    def __init__(self, num_envs):
        self.num_envs = num_envs

    def _obs(self, cue):
        return jax.nn.one_hot(cue, 2, dtype=jnp.float32)

    def reset(self, key, state_size=None, *, track_return=False):
        reset_key, carry_key = jax.random.split(key)
        cue = jax.random.randint(reset_key, (self.num_envs,), 0, 2, jnp.int32)
        zeros = jnp.zeros((self.num_envs,), jnp.float32)
        return EnvCarry(
            env_state=(cue, jnp.zeros((self.num_envs,), jnp.int32)), obs=self._obs(cue),
            episode_return=zeros, episode_length=jnp.zeros((self.num_envs,), jnp.int32),
            key=carry_key,
            hidden=None if state_size is None else jnp.zeros((self.num_envs, state_size)),
            discounted_return=zeros if track_return else None)

    def step(self, key, state, action):
        cue, step = state
        reward = (action == cue).astype(jnp.float32)
        step = step + 1
        truncated = step >= EPISODE_STEPS
        next_cue = jax.random.randint(key, (self.num_envs,), 0, 2, jnp.int32)
        final_obs = self._obs(next_cue)
        step = jnp.where(truncated, 0, step)
        terminated = jnp.zeros((self.num_envs,), bool)
        return final_obs, (next_cue, step), reward, terminated, truncated, final_obs


class CuePlayer(GymnaxEpisodes):
    """Draws the cue as a 4x4 frame: red for cue 0, green for cue 1."""

    def snapshot(self):
        return int(self._state[0][0])

    def draw(self, snapshots):
        frames = np.zeros((len(snapshots), 4, 4, 3), np.uint8)
        for frame, cue in zip(frames, snapshots):
            frame[..., cue] = 255
        return list(frames)


class CueBackend(GymnaxBackend):
    """Only what differs from gymnax: the ids it knows, the envs it makes, how it draws."""

    def id_problem(self, name):
        return None if name == "cue" else "the cue backend has one env: cue"

    def actor_program(self, config):
        return make_jitted_actor_program(config, CueEnv(config.envs_per_actor))

    def jitted_env(self, config, num_envs):
        return CueEnv(num_envs)

    def player(self, config, seed):
        player = CuePlayer(CueEnv(1))
        player.reset(seed)
        return player


@pytest.fixture(scope="module")
def cue_config():
    register_env_backend("cue", CueBackend())
    return AsyncActorLearnerConfig(
        env_id="cue:cue", num_actors=2, envs_per_actor=4, num_steps=8, total_env_steps=64 * 40,
        num_minibatches=2, learning_rate=3e-3, hidden_sizes=(16,), ent_coef=0.0)


def test_a_registered_backend_trains_evaluates_draws_and_runs_in_the_twin(cue_config):
    assert env_backend("cue:cue").runs_in_twin
    assert make_actor_program(cue_config).observation_shape == (2,)
    result = train(cue_config, progress=False)
    # A random policy earns 2 per 4-step episode; matching the cue earns 4.
    outcome = evaluate(cue_config, result.params, num_episodes=8)
    assert outcome.mean_return > 3.5, outcome
    assert np.all(outcome.episode_lengths == EPISODE_STEPS)

    recording = record_episodes(cue_config, result.params, num_episodes=2)
    assert recording.frames.shape == (2 * EPISODE_STEPS, 4, 4, 3)
    np.testing.assert_array_equal(recording.episode_lengths, [EPISODE_STEPS] * 2)
    assert np.all(recording.frames.max(axis=(1, 2, 3)) == 255)

    twin = jax.jit(make_train(dataclasses.replace(cue_config, total_env_steps=64 * 2)))
    assert np.all(np.isfinite(jax.device_get(twin(jax.random.key(0)).metrics["policy_loss"])))


def test_a_backend_checks_its_own_ids_and_prefixes_are_listed(cue_config):
    with pytest.raises(ConfigError, match="the cue backend has one env: cue"):
        dataclasses.replace(cue_config, env_id="cue:other")
    with pytest.raises(ConfigError, match="valid prefixes: gymnax:, gymnasium:, envpool:, host:, cue:"):
        dataclasses.replace(cue_config, env_id="nope:cue")
    assert split_env_id("cue:cue") == ("cue", "cue")


def test_built_in_prefixes_cannot_be_taken_and_a_bare_backend_says_what_it_lacks():
    with pytest.raises(ValueError, match="built in"):
        register_env_backend("gymnax", CueBackend())
    assert not EnvBackend().runs_in_twin
    with pytest.raises(NotImplementedError):
        EnvBackend().actor_program(None)
