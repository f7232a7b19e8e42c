"""Whole episodes under a fixed policy, for evaluation and videos, on any backend.

`EpisodePolicy` is the policy's side (the network, greedy or sampled, the
actors' observation transform); `run_episodes` the Python loop that steps an
`ppo_async.envs.backends.EpisodeEnv` until every env has finished its share
of episodes. Evaluation of host envs and every video use that loop; gymnax
evaluation runs the same rule compiled (`ppo_async.envs.gymnax_backend`).

Which episodes count (`episode_shares`): env ``b`` of ``B`` contributes its
first ``N // B`` (+1 for the first ``N % B`` envs) episodes. A fixed share
per env, rather than the first ``N`` episodes to finish anywhere, keeps the
estimate from favouring short episodes. Episodes are listed env by env, each
env's in the order they finished.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ppo_async.core.normalization import NormalizationOptions, acting_apply
from ppo_async.envs.host import HostEnvError
from ppo_async.networks.actor_critic import is_recurrent, reset_hidden

# The most steps one episode may take here: an env without a time limit under a policy
# that never ends it would otherwise loop forever (Atari's evaluation cap is 27,000).
MAX_EPISODE_STEPS = 100_000


class EndlessEpisodeError(HostEnvError):
    """An episode ran `MAX_EPISODE_STEPS` steps without ending: the env has no time limit."""


def episode_shares(num_episodes: int, num_envs: int) -> np.ndarray:
    """``[B]`` int32: how many episodes each of ``num_envs`` envs contributes."""
    share = np.full(num_envs, num_episodes // num_envs, np.int32)
    share[: num_episodes % num_envs] += 1
    return share


class EpisodePolicy:
    """A network acting for whole episodes: the mode of its distribution with ``greedy``.

    ``apply(params, [hidden,] obs)`` is the network with the actors'
    observation transform (``params`` a `NormalizedPolicy` when
    ``normalization`` is on); ``act`` is its jitted step for a Python loop.
    A recurrent network's state is carried within an episode and zeroed at
    its first step, as the actors do.
    """

    def __init__(self, network: Any, greedy: bool,
                 normalization: NormalizationOptions | None = None, *,
                 recurrent: bool | None = None):
        self.network, self.greedy = network, bool(greedy)
        # Given: a hand-written network that carries a state (``state_size``) too.
        self.recurrent = is_recurrent(network) if recurrent is None else recurrent
        self.apply = (network.apply if normalization is None
                      else acting_apply(network.apply, normalization))
        self.act = jax.jit(self._act)

    def _act(self, params, obs, key, hidden, episode_start):
        """``(key, action [B, ...], hidden)`` for obs ``[B, ...]``."""
        key, action_key = jax.random.split(key)
        if self.recurrent:
            hidden, dist, _ = self.apply(params, reset_hidden(hidden, episode_start), obs)
        else:
            dist, _ = self.apply(params, obs)
        return key, dist.mode() if self.greedy else dist.sample(action_key), hidden

    def initial_hidden(self, num_envs: int) -> jax.Array | None:
        return self.network.zero_hidden(num_envs) if self.recurrent else None


def run_episodes(
    envs: Any, policy: EpisodePolicy, params: Any, seed: int, episodes_per_env: np.ndarray,
    observe: Callable[[], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step ``envs`` under ``policy`` until env ``b`` has finished ``episodes_per_env[b]`` episodes.

    Returns ``(returns [N], lengths [N], episodes done [B])`` with episodes
    listed env by env. ``observe()`` is called after the reset and after every
    step but the last (a video keeps a snapshot there). The envs are reset
    with ``seed`` and the policy's key is ``jax.random.key(seed)``. Raises
    `EndlessEpisodeError` once an episode that counts has run `MAX_EPISODE_STEPS`
    steps without ending.
    """
    share = np.asarray(episodes_per_env, np.int32)
    num_envs, num_episodes = len(share), int(share.sum())
    first_slot = np.cumsum(share) - share
    returns = np.zeros(num_episodes, np.float32)
    lengths = np.zeros(num_episodes, np.int32)
    done_count = np.zeros(num_envs, np.int32)
    episode_return = np.zeros(num_envs, np.float32)
    episode_length = np.zeros(num_envs, np.int32)
    key = jax.random.key(seed)
    hidden = policy.initial_hidden(num_envs)
    obs = envs.reset(seed)
    if observe is not None:
        observe()
    while True:
        key, action, hidden = policy.act(params, obs, key, hidden, episode_length == 0)
        obs, reward, done = envs.step(np.asarray(action))
        episode_return += reward
        episode_length += 1
        for env in np.flatnonzero(done & (done_count < share)):
            returns[first_slot[env] + done_count[env]] = episode_return[env]
            lengths[first_slot[env] + done_count[env]] = episode_length[env]
            done_count[env] += 1
        episode_return[done] = 0.0
        episode_length[done] = 0
        if np.all(done_count >= share):
            break
        if np.any((episode_length >= MAX_EPISODE_STEPS) & (done_count < share)):
            raise EndlessEpisodeError(
                f"{getattr(envs, 'env_id', 'the env')}: an episode ran {MAX_EPISODE_STEPS:,} "
                "steps without ending under these params; the env has no time limit that "
                "ends it: give it one (gymnasium_kwargs max_episode_steps N for a "
                "gymnasium: id, gymnasium.wrappers.TimeLimit around your own env)")
        if observe is not None:
            observe()
    return returns, lengths, done_count
