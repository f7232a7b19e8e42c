"""Evaluation: run a policy for a number of whole episodes and report their returns.

`Evaluator` builds the env batch, the network and one jitted
``lax.while_loop`` for a config once; calling it with params (a pytree, flax
bytes, or the `PolicyBroadcast` the actors receive) runs until every env of
the batch has finished its share of the episodes. An evaluator thread keeps
one `Evaluator` and so compiles once. `evaluate` is the one-call form.

Which episodes count: the batch has ``B = min(num_episodes, 16)`` envs and env
``b`` contributes its first ``num_episodes // B`` (+1 for the first
``num_episodes % B`` envs) episodes. A fixed share per env, rather than the
first ``num_episodes`` episodes to finish anywhere, keeps the estimate from
favouring short episodes. Episodes are listed env by env, each env's in the
order they finished.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core.devices import resolve_device
from ppo_async.core.normalization import NormalizationOptions, acting_apply, wrap_params
from ppo_async.envs.gymnax_env import BatchedEnv
from ppo_async.networks.actor_critic import (
    is_recurrent,
    params_template,
    reset_hidden,
)
from ppo_async.runtime.messages import PolicyBroadcast, load_policy_from_broadcast

MAX_EVAL_ENVS = 16  # envs stepped together; more episodes than this take several rounds


class EvalResult(NamedTuple):
    """Returns and lengths of ``N = num_episodes`` whole evaluation episodes."""

    episode_returns: np.ndarray  # [N] float32, undiscounted
    episode_lengths: np.ndarray  # [N] int32, env steps
    mean_return: float  # mean of episode_returns
    std_return: float  # population standard deviation of episode_returns


class _Loop(NamedTuple):
    """State of the evaluation loop (``B`` envs, ``N`` episodes)."""

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


class _Outcome(NamedTuple):
    """What the compiled loop hands back to the host."""

    returns: jax.Array  # [N] float32
    lengths: jax.Array  # [N] int32
    episodes_done: jax.Array  # [B] int32
    steps: jax.Array  # [] int32


def _gymnax_id(env_id: str) -> str:
    backend, sep, name = env_id.partition(":")
    if not sep:
        return env_id
    if backend == "gymnax":
        return name
    raise ValueError(
        f"env_id={env_id!r}: evaluation runs gymnax envs (jitted); the {backend!r} "
        "backend is not supported by ppo_async.runtime.evaluate"
    )


class Evaluator:
    """Evaluation of one config's network on its env; compiled once, called many times.

    Args:
      config: gives ``env_id``, ``hidden_sizes``, ``network``,
        ``rnn_hidden_size``, ``torso`` and ``actor_device`` (nothing else is used). A
        recurrent policy carries its state through each episode and starts
        every episode from zeros.
      num_episodes: episodes per evaluation (>= 1).
      greedy: act with the distribution's mode (argmax / mean); else sample.
      device: where to evaluate; default ``config.actor_device`` (the CPU), so
        that an evaluator thread never competes with the learner's device.

    Calls may come from any thread; each runs the same compiled loop.
    """

    def __init__(
        self,
        config: AsyncActorLearnerConfig,
        num_episodes: int = 10,
        *,
        greedy: bool = True,
        device: jax.Device | None = None,
    ):
        if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
            raise ValueError(f"num_episodes={num_episodes!r}: must be an integer >= 1")
        self.num_episodes = num_episodes
        self.greedy = bool(greedy)
        self.device = device if device is not None else resolve_device(config.actor_device)
        self.num_envs = min(num_episodes, MAX_EVAL_ENVS)
        self.env = BatchedEnv(_gymnax_id(config.env_id), self.num_envs)
        self.network = config.make_network(self.env.observation_shape, self.env.action_space)
        self.recurrent = is_recurrent(self.network)
        # The actors' observation transform, with the statistics the params carry.
        options = self.normalization = config.normalization_options()
        # Host params with the network's structure, for decoding bytes.
        self.params_template = wrap_params(
            params_template(self.network, self.env.observation_shape),
            self.env.observation_shape, options)
        share = np.full(self.num_envs, num_episodes // self.num_envs, np.int32)
        share[: num_episodes % self.num_envs] += 1
        self.episodes_per_env = share  # [B] episodes each env contributes
        self.first_slot_of_env = np.cumsum(share) - share  # [B] where its episodes start
        # Within max_episode_steps every env finishes at least one episode, so
        # this many steps always suffice; the bound only guards the loop.
        self.max_steps = self.env.max_episode_steps * int(share.max()) + 1
        self.traces = 0  # how often the loop was traced (compiled); tests read it
        self._run = jax.jit(self._loop)

    def _loop(self, params: Any, key: jax.Array) -> _Outcome:
        self.traces += 1
        # Built when the loop is traced, from the network as it is then.
        env, apply = self.env, acting_apply(self.network.apply, self.normalization)
        share = jnp.asarray(self.episodes_per_env)
        first_slot = jnp.asarray(self.first_slot_of_env)
        n = self.num_episodes

        def body(loop: _Loop) -> _Loop:
            key, action_key, step_key = jax.random.split(loop.key, 3)
            hidden = None
            if self.recurrent:
                # The state is carried within an episode and zeroed at its
                # first step, exactly as the actors' rollout does.
                hidden = reset_hidden(loop.hidden, loop.episode_length == 0)
                hidden, dist, _ = apply(params, hidden, loop.obs)
            else:
                dist, _ = apply(params, loop.obs)
            action = dist.mode() if self.greedy else dist.sample(action_key)
            obs, env_state, reward, terminated, truncated, _ = env.step(
                step_key, loop.env_state, action
            )
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
            return jnp.any(loop.episodes_done < share) & (loop.steps < self.max_steps)

        reset_key, loop_key = jax.random.split(key)
        carry = env.reset(reset_key, self.network.state_size if self.recurrent else None)
        start = _Loop(
            env_state=carry.env_state,
            obs=carry.obs,
            episode_return=carry.episode_return,
            episode_length=carry.episode_length,
            episodes_done=jnp.zeros((self.num_envs,), jnp.int32),
            returns=jnp.zeros((n,), jnp.float32),
            lengths=jnp.zeros((n,), jnp.int32),
            steps=jnp.zeros((), jnp.int32),
            key=loop_key,
            hidden=carry.hidden,
        )
        end = jax.lax.while_loop(not_finished, body, start)
        return _Outcome(end.returns, end.lengths, end.episodes_done, end.steps)

    def __call__(self, params: Any, seed: int = 0) -> EvalResult:
        """Evaluate ``params``: a params pytree (any device) or flax msgpack bytes.

        Episodes of env ``b`` start from ``BatchedEnv(env_id, B).reset(k)[b]``
        with ``k = jax.random.split(jax.random.key(seed))[0]``; the same params
        and seed give the same result.
        """
        if isinstance(params, (bytes, bytearray)):
            params = self._decode(PolicyBroadcast(-1, bytes(params)))
        params = jax.device_put(params, self.device)
        key = jax.device_put(jax.random.key(seed), self.device)
        outcome = jax.device_get(self._run(params, key))
        if np.any(outcome.episodes_done < self.episodes_per_env):
            raise RuntimeError(
                f"evaluation stopped after {outcome.steps} steps with "
                f"{int(outcome.episodes_done.sum())} of {self.num_episodes} episodes done"
            )
        returns = np.asarray(outcome.returns, np.float32)
        return EvalResult(
            episode_returns=returns,
            episode_lengths=np.asarray(outcome.lengths, np.int32),
            mean_return=float(np.mean(returns)),
            std_return=float(np.std(returns)),
        )

    def evaluate_broadcast(self, broadcast: PolicyBroadcast, seed: int = 0) -> EvalResult:
        """Evaluate the params in a `PolicyBroadcast` (the bytes the actors receive).

        Raises `ppo_async.runtime.messages.PolicyLoadError` if the bytes belong to
        another network.
        """
        return self(self._decode(broadcast), seed)

    def _decode(self, broadcast: PolicyBroadcast) -> Any:
        return load_policy_from_broadcast(broadcast, self.params_template, self.device)


# Evaluators by what their compiled loop depends on, so that repeated
# `evaluate` calls (e.g. from a notebook loop) compile once.
_EVALUATORS: dict[tuple, Evaluator] = {}
_EVALUATORS_LOCK = threading.Lock()
_MAX_CACHED_EVALUATORS = 8


def _cached_evaluator(config: AsyncActorLearnerConfig, num_episodes: int,
                      greedy: bool) -> Evaluator:
    cache_key = (config.env_id, tuple(config.hidden_sizes), config.actor_device,
                 num_episodes, bool(greedy), config.network, config.rnn_hidden_size,
                 config.normalization_options(), config.torso)
    with _EVALUATORS_LOCK:
        evaluator = _EVALUATORS.get(cache_key)
        if evaluator is None:
            evaluator = Evaluator(config, num_episodes, greedy=greedy)
            if len(_EVALUATORS) >= _MAX_CACHED_EVALUATORS:
                _EVALUATORS.pop(next(iter(_EVALUATORS)))
            _EVALUATORS[cache_key] = evaluator
    return evaluator


def evaluate(
    config: AsyncActorLearnerConfig,
    params: Any,
    num_episodes: int = 10,
    seed: int = 0,
    greedy: bool = True,
) -> EvalResult:
    """Run ``num_episodes`` whole episodes of ``config.env_id`` under ``params``.

    Args:
      config: the run's config (``env_id``, ``hidden_sizes`` and
        ``actor_device`` are used).
      params: the network's params pytree, or its flax msgpack bytes (a run's
        ``params.msgpack``, a `PolicyBroadcast`'s ``payload``); with
        ``normalize_observations`` / ``normalize_rewards`` the run's
        `ppo_async.core.normalization.NormalizedPolicy`, whose observation
        statistics the actors' transform applies.
      num_episodes: how many episodes to average over.
      seed: seeds the env resets (and the actions if not greedy).
      greedy: act with the mode of the policy (argmax, or the Gaussian mean);
        else sample from it.

    The compiled loop is cached per (env, network, num_episodes, greedy), so
    repeated calls do not recompile. See `Evaluator` for which episodes count.
    Host envs (``gymnasium:``, ``envpool:``, ``host:``) run the same episodes
    in a Python loop over the env (`evaluate_host_env`).
    """
    from ppo_async.envs.registry import GYMNAX, split_env_id

    if split_env_id(config.env_id)[0] != GYMNAX:
        return evaluate_host_env(config, params, num_episodes, seed, greedy)
    return _cached_evaluator(config, num_episodes, greedy)(params, seed)


def make_host_act(network: Any, greedy: bool, normalization: NormalizationOptions | None = None):
    """The jitted policy step of a Python loop over envs, for any network.

    ``act(params, obs [B, ...], key, hidden [B, S] | None, episode_start [B] bool)
    -> (key, action [B, ...], hidden)``: the mode of the policy with
    ``greedy``, else a sample. A recurrent network's state is carried within
    an episode and zeroed at its first step, as the actors do. With
    ``normalization`` on, ``params`` is a `NormalizedPolicy` and the
    observations are normalized as the actors normalize them.
    """
    recurrent = is_recurrent(network)
    apply = network.apply if normalization is None else acting_apply(network.apply, normalization)

    @jax.jit
    def act(params, obs, key, hidden, episode_start):
        key, action_key = jax.random.split(key)
        if recurrent:
            hidden, dist, _ = apply(params, reset_hidden(hidden, episode_start), obs)
        else:
            dist, _ = apply(params, obs)
        return key, dist.mode() if greedy else dist.sample(action_key), hidden

    return act


# An env that never ends an episode would loop forever; no task here comes near.
MAX_HOST_EVAL_STEPS = 1_000_000


def evaluate_host_env(
    config: AsyncActorLearnerConfig,
    params: Any,
    num_episodes: int = 10,
    seed: int = 0,
    greedy: bool = True,
) -> EvalResult:
    """`evaluate` for host envs: the batch of envs is stepped in Python.

    The same episodes count as in `Evaluator` (a fixed share per env). The
    envs are seeded with ``seed`` and closed afterwards. envpool Atari games
    are played with the evaluation settings
    (`ppo_async.envs.registry.ATARI_EVAL_KWARGS`: whole games, unclipped
    score, sticky actions), not the training ones.
    """
    from ppo_async.envs.host import checked_array, close_envs, make_host_env

    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes={num_episodes!r}: must be an integer >= 1")
    num_envs = min(num_episodes, MAX_EVAL_ENVS)
    envs = make_host_env(config.env_id, num_envs, envpool_kwargs=config.envpool_kwargs,
                         evaluation=True)
    try:
        observation_shape = tuple(int(d) for d in envs.observation_shape)
        network = config.make_network(observation_shape, envs.action_space)
        options = config.normalization_options()
        template = wrap_params(params_template(network, observation_shape), observation_shape,
                               options)
        device = resolve_device(config.actor_device)
        if isinstance(params, (bytes, bytearray)):
            params = load_policy_from_broadcast(PolicyBroadcast(-1, bytes(params)), template)
        params = jax.device_put(params, device)
        continuous = not hasattr(envs.action_space, "n")
        low = np.asarray(getattr(envs.action_space, "low", -np.inf), np.float32)
        high = np.asarray(getattr(envs.action_space, "high", np.inf), np.float32)

        act = make_host_act(network, greedy, options)
        share = np.full(num_envs, num_episodes // num_envs, np.int32)
        share[: num_episodes % num_envs] += 1
        first_slot = np.cumsum(share) - share
        returns = np.zeros(num_episodes, np.float32)
        lengths = np.zeros(num_episodes, np.int32)
        done_count = np.zeros(num_envs, np.int32)
        episode_return = np.zeros(num_envs, np.float32)
        episode_length = np.zeros(num_envs, np.int32)
        key = jax.random.key(seed)
        hidden = network.zero_hidden(num_envs) if is_recurrent(network) else None
        obs = checked_array(config.env_id, "reset obs", envs.reset(seed),
                     (num_envs, *observation_shape), np.float32)
        for _ in range(MAX_HOST_EVAL_STEPS):
            if np.all(done_count >= share):
                break
            key, action, hidden = act(params, obs, key, hidden, episode_length == 0)
            action = np.asarray(action)
            step = envs.step(np.clip(action, low, high) if continuous else action)
            obs = checked_array(config.env_id, "obs", step[0], (num_envs, *observation_shape), np.float32)
            episode_return += np.asarray(step[1], np.float32)
            episode_length += 1
            done = np.asarray(step[2], bool) | np.asarray(step[3], bool)
            for env in np.flatnonzero(done & (done_count < share)):
                returns[first_slot[env] + done_count[env]] = episode_return[env]
                lengths[first_slot[env] + done_count[env]] = episode_length[env]
                done_count[env] += 1
            episode_return[done] = 0.0
            episode_length[done] = 0
        else:
            raise RuntimeError(
                f"evaluation stopped after {MAX_HOST_EVAL_STEPS} steps with "
                f"{int(done_count.sum())} of {num_episodes} episodes done"
            )
    finally:
        close_envs(envs)
    return EvalResult(returns, lengths, float(np.mean(returns)), float(np.std(returns)))
