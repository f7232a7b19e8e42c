"""The gymnax backend: jitted envs, rolled out, evaluated and drawn.

Actors roll out in one jitted ``lax.scan`` (`ppo_async.envs.gymnax_env`);
evaluation runs the whole episode loop as one compiled ``lax.while_loop``
(`GymnaxEpisodes`), compiled once per evaluator; videos step one env and draw
each of its states with gymnasium's classic-control renderer or gymnax's
``Visualizer``. The twin jits the same `BatchedEnv`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.envs.backends import VIDEO_EXTRA, EnvBackend, RenderError
from ppo_async.envs.episodes import EpisodePolicy
from ppo_async.envs.registry import ENV_BACKENDS, split_env_id
from ppo_async.errors import did_you_mean
from ppo_async.networks.actor_critic import reset_hidden

class GymnaxBackend(EnvBackend):
    """gymnax ids: ``CartPole-v1`` or ``gymnax:CartPole-v1``."""

    def id_problem(self, name: str) -> str | None:
        from ppo_async.envs.gymnax_env import import_gymnax

        gymnax = import_gymnax()

        if name not in gymnax.registered_envs:
            return (f"unknown environment{did_you_mean(name, gymnax.registered_envs)}; "
                    "choose one of " + ", ".join(gymnax.registered_envs)
                    + " (or a host env: " + ", ".join(f"{b}:NAME" for b in ENV_BACKENDS[1:])
                    + ")")
        return None

    def actor_program(self, config):
        from ppo_async.envs.gymnax_env import make_gymnax_actor_program

        return make_gymnax_actor_program(config)

    def jitted_env(self, config, num_envs: int):
        from ppo_async.envs.gymnax_env import BatchedEnv

        return BatchedEnv(split_env_id(config.env_id)[1], num_envs)

    def episode_env(self, config, num_envs: int) -> GymnaxEpisodes:
        return GymnaxEpisodes(self.jitted_env(config, num_envs))

    def evaluate(self, envs: GymnaxEpisodes, policy: EpisodePolicy, params: Any, seed: int,
                 episodes_per_env: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return envs.run_compiled(policy, params, seed, episodes_per_env)

    def player(self, config, seed: int) -> GymnaxPlayer:
        return GymnaxPlayer(config.env_id, self.jitted_env(config, 1), seed)


def backend(prefix: str) -> GymnaxBackend:
    del prefix
    return GymnaxBackend()


class _Loop(NamedTuple):
    """State of the compiled evaluation loop (``B`` envs, ``N`` episodes)."""

    env_state: Any  # gymnax state pytree, leaves [B, ...]
    obs: jax.Array  # [B, *obs_shape] float32
    episode_return: jax.Array  # [B] float32, of the running episode
    episode_length: jax.Array  # [B] int32, of the running episode
    episodes_done: jax.Array  # [B] int32, counted episodes of each env (capped at its share)
    returns: jax.Array  # [N] float32, filled slot by slot
    lengths: jax.Array  # [N] int32
    steps: jax.Array  # [] int32, loop iterations so far
    key: jax.Array  # PRNG key for actions and auto-resets
    hidden: jax.Array | None = None  # [B, state_size] recurrent policies only, as in EnvCarry


class GymnaxEpisodes:
    """``B`` gymnax envs for whole episodes: stepped from Python, or the loop compiled.

    Episodes of env ``b`` start from ``BatchedEnv(env_id, B).reset(k)[b]`` with
    ``k = jax.random.split(jax.random.key(seed))[0]`` in the compiled loop.
    """

    def __init__(self, env: Any):
        self.env = env
        self.observation_shape, self.action_space = env.observation_shape, env.action_space
        self.traces = 0  # how often the compiled loop was traced; tests read it
        self._compiled: dict[tuple, Any] = {}  # (policy, shares) -> jitted loop
        self._step = jax.jit(env.step)
        self._key = self._state = None

    # --- the Python loop (videos) ---
    def reset(self, seed: int) -> np.ndarray:
        self._key = jax.random.key(seed + 1)
        carry = self.env.reset(self._key)
        self._state = carry.env_state
        return np.asarray(carry.obs)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._key, step_key = jax.random.split(self._key)
        obs, self._state, reward, terminated, truncated, _ = self._step(
            step_key, self._state, action)
        return np.asarray(obs), np.asarray(reward), np.asarray(terminated | truncated)

    def close(self) -> None:
        pass

    # --- the compiled loop (evaluation) ---
    def run_compiled(self, policy: EpisodePolicy, params: Any, seed: int,
                     episodes_per_env: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        share = tuple(int(n) for n in episodes_per_env)
        run = self._compiled.get((policy, share))
        if run is None:
            run = self._compiled[(policy, share)] = jax.jit(
                lambda params, key: self._loop(policy, np.asarray(share, np.int32), params, key))
        # An uncommitted key follows the params to their device.
        returns, lengths, episodes_done = jax.device_get(run(params, jax.random.key(seed)))
        return np.asarray(returns, np.float32), np.asarray(lengths, np.int32), episodes_done

    def _loop(self, policy: EpisodePolicy, share_np: np.ndarray, params: Any, key: jax.Array):
        self.traces += 1
        env, apply, num_envs = self.env, policy.apply, len(share_np)
        share = jnp.asarray(share_np)
        first_slot = jnp.asarray(np.cumsum(share_np) - share_np)
        n = int(share_np.sum())
        # Within max_episode_steps every env finishes at least one episode, so
        # this many steps always suffice; the bound only guards the loop.
        max_steps = env.max_episode_steps * int(share_np.max()) + 1

        def body(loop: _Loop) -> _Loop:
            key, action_key, step_key = jax.random.split(loop.key, 3)
            hidden = None
            if policy.recurrent:
                # The state is carried within an episode and zeroed at its
                # first step, exactly as the actors' rollout does.
                hidden = reset_hidden(loop.hidden, loop.episode_length == 0)
                hidden, dist, _ = apply(params, hidden, loop.obs)
            else:
                dist, _ = apply(params, loop.obs)
            action = dist.mode() if policy.greedy else dist.sample(action_key)
            obs, env_state, reward, terminated, truncated, _ = env.step(
                step_key, loop.env_state, action)
            episode_return = loop.episode_return + reward
            episode_length = loop.episode_length + 1
            done = terminated | truncated
            counted = done & (loop.episodes_done < share)
            # Slot n is out of range and dropped: episodes past an env's share.
            slot = jnp.where(counted, first_slot + loop.episodes_done, n)
            return _Loop(
                env_state=env_state,
                obs=obs,
                episode_return=jnp.where(done, 0.0, episode_return),
                episode_length=jnp.where(done, 0, episode_length),
                episodes_done=loop.episodes_done + counted.astype(jnp.int32),
                returns=loop.returns.at[slot].set(episode_return, mode="drop"),
                lengths=loop.lengths.at[slot].set(episode_length, mode="drop"),
                steps=loop.steps + 1,
                key=key,
                hidden=hidden,
            )

        def not_finished(loop: _Loop) -> jax.Array:
            return jnp.any(loop.episodes_done < share) & (loop.steps < max_steps)

        reset_key, loop_key = jax.random.split(key)
        carry = env.reset(reset_key, policy.network.state_size if policy.recurrent else None)
        start = _Loop(
            env_state=carry.env_state,
            obs=carry.obs,
            episode_return=carry.episode_return,
            episode_length=carry.episode_length,
            episodes_done=jnp.zeros((num_envs,), jnp.int32),
            returns=jnp.zeros((n,), jnp.float32),
            lengths=jnp.zeros((n,), jnp.int32),
            steps=jnp.zeros((), jnp.int32),
            key=loop_key,
            hidden=carry.hidden,
        )
        end = jax.lax.while_loop(not_finished, body, start)
        return end.returns, end.lengths, end.episodes_done


class GymnaxPlayer(GymnaxEpisodes):
    """One gymnax env whose states are drawn by `_ClassicControlCanvas` or gymnax's ``Visualizer``."""

    def __init__(self, env_id: str, env: Any, seed: int):
        super().__init__(env)
        self.env_id = env_id
        self._canvas: _ClassicControlCanvas | None = None
        self.reset(seed)
        self.draw([self.snapshot()])  # refuses an env gymnax cannot draw, before playing

    def snapshot(self) -> Any:
        return jax.tree.map(lambda leaf: leaf[0], self._state)

    def draw(self, snapshots: list[Any]) -> list[np.ndarray]:
        import gymnasium
        from gymnax.visualize import vis_gym

        states = jax.device_get(snapshots)  # one transfer, not one per field per frame
        if self.env.env.name not in vis_gym.SUPPORTED_GYM_ENVS:
            return self._draw_with_matplotlib(states)
        if self._canvas is None:
            try:
                self._canvas = _ClassicControlCanvas(self.env.env.name, self.env.env_params)
            except gymnasium.error.DependencyNotInstalled as error:
                raise RenderError(f"{self.env_id}: drawing it needs pygame "
                                  f"({VIDEO_EXTRA}): {error}") from None
        return [self._canvas.draw(state) for state in states]

    def _draw_with_matplotlib(self, states: list[Any]) -> list[np.ndarray]:
        """gymnax's ``Visualizer`` (MinAtar, Catch, mazes, PointRobot), titled with the step."""
        import matplotlib.pyplot as plt
        from gymnax.visualize import Visualizer

        visualizer = Visualizer(self.env.env, self.env.env_params, states)
        try:
            visualizer.init()
            if not hasattr(visualizer, "im"):
                raise RenderError(
                    f"{self.env_id}: gymnax has no renderer for this env, so it cannot "
                    "be watched (gymnax draws classic control, MinAtar, Catch, mazes and "
                    "PointRobot)")
            frames = []
            for index in range(len(states)):
                visualizer.update(index)
                visualizer.fig.canvas.draw()
                frames.append(np.asarray(visualizer.fig.canvas.buffer_rgba())[..., :3].copy())
            return frames
        finally:
            plt.close(visualizer.fig)

    def close(self) -> None:
        if self._canvas is not None:
            self._canvas.close()


class _ClassicControlCanvas:
    """gymnasium's pygame renderer of a classic-control env, fed gymnax states.

    gymnax's own adapter makes, resets and closes a gymnasium env for every
    frame (pygame started and stopped each time); this keeps one env and only
    sets its state, with gymnax's mappings of the env's parameters and state
    onto gymnasium's (``experiments/bench_render.py`` times both).
    """

    def __init__(self, name: str, env_params: Any):
        import gymnasium
        from gymnax.visualize import vis_gym

        self._name, self._vis_gym = name, vis_gym
        self._env = gymnasium.make(name, render_mode="rgb_array")
        self._env.reset(seed=0)  # gymnasium renders only after a reset
        vis_gym.set_gym_params(self._env.unwrapped, name, env_params)

    def draw(self, state: Any) -> np.ndarray:
        unwrapped = self._env.unwrapped
        unwrapped.state = self._vis_gym.get_gym_state(state, self._name)
        if self._name == "Pendulum-v1":
            unwrapped.last_u = np.asarray(state.last_u, dtype=np.float64)
        return np.asarray(self._env.render(), np.uint8)

    def close(self) -> None:
        self._env.close()
