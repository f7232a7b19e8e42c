"""Evaluation: run a policy for a number of whole episodes and report their returns.

`Evaluator` is a driver over any env backend (`ppo_async.envs.backends`): it
builds the backend's evaluation envs and the network once; calling it with
params (a pytree, flax bytes, or the `PolicyBroadcast` the actors receive)
runs until every env of the batch has finished its share of the episodes
(`ppo_async.envs.episodes.episode_shares`). gymnax envs run the whole loop
compiled, host envs step in Python. An evaluator thread keeps one
`Evaluator`, and so compiles once. `evaluate` is the one-call form.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import jax
import numpy as np

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.core.devices import resolve_device
from ppo_async.core.normalization import wrap_params
from ppo_async.envs.episodes import EpisodePolicy, episode_shares
from ppo_async.envs.program import ActorProgram
from ppo_async.envs.registry import env_backend
from ppo_async.networks.actor_critic import is_recurrent, params_template
from ppo_async.runtime.messages import (
    PolicyBroadcast,
    PolicyLoadError,
    decode_params,
    load_policy_from_broadcast,
    params_mismatch,
)

MAX_EVAL_ENVS = 16  # envs stepped together; more episodes than this take several rounds


class EvalResult(NamedTuple):
    """Returns and lengths of ``N = num_episodes`` whole evaluation episodes."""

    episode_returns: np.ndarray  # [N] float32, undiscounted
    episode_lengths: np.ndarray  # [N] int32, env steps
    mean_return: float  # mean of episode_returns
    std_return: float  # population standard deviation of episode_returns


class Evaluator:
    """Evaluation of one config's network on its env; built once, called many times.

    Args:
      config: gives ``env_id`` (its backend makes the envs), the network fields,
        the normalization fields and ``actor_device``. A recurrent policy
        carries its state through each episode and starts every episode from
        zeros.
      num_episodes: episodes per evaluation (>= 1); ``min(num_episodes, 16)``
        envs step together.
      greedy: act with the distribution's mode (argmax / mean); else sample.
      device: where to evaluate; default ``config.actor_device`` (the CPU), so
        that an evaluator thread never competes with the learner's device.
      program: the run's `ActorProgram`, whose network and params template
        the evaluator then shares instead of building its own.

    Calls may come from any thread; they run one at a time.
    """

    def __init__(
        self,
        config: AsyncActorLearnerConfig,
        num_episodes: int = 10,
        *,
        greedy: bool = True,
        device: jax.Device | None = None,
        program: ActorProgram | None = None,
    ):
        if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
            raise ValueError(f"num_episodes={num_episodes!r}: must be an integer >= 1")
        self.env_id = config.env_id
        self.num_episodes = num_episodes
        self.greedy = bool(greedy)
        self.device = device if device is not None else resolve_device(config.actor_device)
        self.num_envs = min(num_episodes, MAX_EVAL_ENVS)
        self.backend = env_backend(config.env_id)
        self.env = self.backend.episode_env(config, self.num_envs)
        # The actors' observation transform, with the statistics the params carry.
        self.normalization = config.normalization_options()
        if program is not None:
            self.network, self.params_template = program.network, program.params_template
        else:
            self.network = config.make_network(self.env.observation_shape, self.env.action_space)
            # Host params with the network's structure, for decoding bytes.
            self.params_template = wrap_params(
                params_template(self.network, self.env.observation_shape),
                self.env.observation_shape, self.normalization)
        self._template_network = self.network
        self.recurrent = is_recurrent(self.network)
        self.episodes_per_env = episode_shares(num_episodes, self.num_envs)  # [B]
        self.first_slot_of_env = np.cumsum(self.episodes_per_env) - self.episodes_per_env  # [B]
        self._policy: EpisodePolicy | None = None
        self._lock = threading.Lock()  # a host env batch steps one evaluation at a time

    @property
    def traces(self) -> int:
        """How often a compiled evaluation loop was traced (gymnax; 0 for host envs)."""
        return getattr(self.env, "traces", 0)

    def _episode_policy(self) -> EpisodePolicy:
        # Built at the first call, from the network as it is then.
        if self._policy is None or self._policy.network is not self.network:
            self._policy = EpisodePolicy(self.network, self.greedy, self.normalization,
                                         recurrent=self.recurrent)
        return self._policy

    def __call__(self, params: Any, seed: int = 0) -> EvalResult:
        """Evaluate ``params``: a params pytree (any device) or flax msgpack bytes.

        The envs are reset with ``seed`` (`ppo_async.envs.gymnax_backend.GymnaxEpisodes`
        says which batch a gymnax env starts from); the same params and seed
        give the same result.
        """
        what = f"{self.env_id}: the params do not fit the config's network"
        if isinstance(params, (bytes, bytearray)):
            params = decode_params(bytes(params), self.params_template, what)
        elif self.network is self._template_network:
            # (A caller may have set another network since, with params of its own.)
            mismatch = params_mismatch(params, self.params_template)
            if mismatch is not None:
                raise PolicyLoadError(f"{what}: {mismatch}")
        params = jax.device_put(params, self.device)
        with self._lock:
            try:
                returns, lengths, episodes_done = self.backend.evaluate(
                    self.env, self._episode_policy(), params, seed, self.episodes_per_env)
            finally:
                self.env.close()
        if np.any(episodes_done < self.episodes_per_env):
            raise RuntimeError(
                f"{self.env_id}: evaluation stopped with {int(np.sum(episodes_done))} of "
                f"{self.num_episodes} episodes done")
        returns = np.asarray(returns, np.float32)
        return EvalResult(
            episode_returns=returns,
            episode_lengths=np.asarray(lengths, np.int32),
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
    cache_key = (config.env_id, config.envpool_kwargs, config.gymnasium_kwargs,
                 tuple(config.hidden_sizes), config.init_log_std,
                 config.actor_device,
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

    Evaluators are cached per (env, network, num_episodes, greedy), so
    repeated calls do not recompile. Every backend runs the same episodes
    (`ppo_async.envs.episodes.episode_shares`); envpool Atari games are played
    with the evaluation settings (`ppo_async.envs.registry.ATARI_EVAL_KWARGS`:
    whole games, unclipped score, sticky actions), not the training ones.
    """
    if not isinstance(config, AsyncActorLearnerConfig):
        raise TypeError(f"evaluate(config, params): config must be an AsyncActorLearnerConfig, "
                        f"not {type(config).__name__}")
    if params is None:
        raise TypeError("evaluate(config, params): params is None; pass a run's params "
                        "(train(config).params, or ppo_async.load_run(RUN_DIR).params)")
    return _cached_evaluator(config, num_episodes, greedy)(params, seed)
