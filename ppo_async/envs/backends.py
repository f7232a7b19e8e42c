"""The env backend interface: one `EnvBackend` per env-id prefix.

A backend owns everything that depends on which family an env belongs to:
checking its ids, the `ActorProgram` actors run, whole-episode evaluation,
the episodes a video is drawn from, and whether the synchronous twin can jit
its envs. Everything else drives backends through this interface:

==================== ==================================================
``make_actor_program`` the actors (threads or Ray processes), the learner's chunk spec
`ppo_async.runtime.evaluate` whole-episode evaluation, periodic or final
`ppo_async.tools.video`  ``ppo-async enjoy``: episodes played and drawn
`ppo_async.sync`         the twin, when `EnvBackend.jitted_env` gives an env
==================== ==================================================

`ppo_async.envs.registry.env_backend` picks the backend of an env id (the
built-in ones: `ppo_async.envs.gymnax_backend`, `ppo_async.envs.host_backend`);
`ppo_async.envs.registry.register_env_backend` adds a prefix. A new backend is
a subclass in its own module plus that one registration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ppo_async.envs.episodes import EpisodePolicy, run_episodes
from ppo_async.envs.registry import env_backend

if TYPE_CHECKING:
    from ppo_async.config import AsyncActorLearnerConfig
    from ppo_async.envs.program import ActorProgram


VIDEO_EXTRA = "pip install 'ppo-async[video]'"  # what drawing an env or writing a video needs


class RenderError(RuntimeError):
    """An env that cannot be rendered, or a video that cannot be written; the message says why."""


class EpisodeEnv(Protocol):
    """``B`` envs stepped from Python for whole episodes (evaluation's and video's loop).

    Same-step auto-reset, as every backend's training envs: where an episode
    ends, ``step`` returns the next episode's first observation.
    """

    observation_shape: tuple[int, ...]
    action_space: Any

    def reset(self, seed: int) -> np.ndarray:
        """Fresh episodes, seeded from ``seed``: obs ``[B, *observation_shape]`` float32."""
        ...

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(obs [B, ...] float32, reward [B] float32, done [B] bool)``; actions unclipped."""
        ...

    def close(self) -> None:
        ...


class Player(EpisodeEnv, Protocol):
    """One env whose episodes can be drawn (`EnvBackend.player`)."""

    def snapshot(self) -> Any:
        """What `draw` needs of the current state (a frame, or the env's state)."""
        ...

    def draw(self, snapshots: list[Any]) -> list[np.ndarray]:
        """The frames ``[H, W, 3]`` uint8 of ``snapshots``."""
        ...


class EnvBackend:
    """The env families behind one env-id prefix (subclass it; `register_env_backend`).

    Every method takes the run's config; ``name`` is an env id without its prefix.
    """

    def id_problem(self, name: str) -> str | None:
        """Why ``name`` is not an env of this backend, as a fix for the user; None if it is.

        The config's validation calls it: it must build no env.
        """
        raise NotImplementedError

    def actor_program(self, config: AsyncActorLearnerConfig) -> ActorProgram:
        """The `ActorProgram` an actor of ``config`` runs (built once per run, shared)."""
        raise NotImplementedError

    def episode_env(self, config: AsyncActorLearnerConfig, num_envs: int) -> EpisodeEnv:
        """``num_envs`` envs made for evaluation (an Atari game's evaluation settings, say)."""
        raise NotImplementedError

    def evaluate(self, envs: EpisodeEnv, policy: EpisodePolicy, params: Any, seed: int,
                 episodes_per_env: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(returns [N], lengths [N], episodes done [B])``: whole episodes of ``envs``.

        The default steps them from Python (`ppo_async.envs.episodes.run_episodes`);
        a backend whose envs jit may run the same loop compiled instead.
        """
        return run_episodes(envs, policy, params, seed, episodes_per_env)

    def player(self, config: AsyncActorLearnerConfig, seed: int) -> Player:
        """One env whose episodes can be drawn; `RenderError` (before playing) if none can."""
        raise RenderError(f"{config.env_id}: its backend cannot draw episodes")

    def jitted_env(self, config: AsyncActorLearnerConfig, num_envs: int) -> Any | None:
        """``num_envs`` envs that jit (`ppo_async.envs.gymnax_env.BatchedEnv`'s interface), or
        None: the synchronous twin runs only backends that give one."""
        return None

    @property
    def runs_in_twin(self) -> bool:
        """Whether the synchronous twin can run this backend's envs (it jits them)."""
        return type(self).jitted_env is not EnvBackend.jitted_env


def make_actor_program(config: AsyncActorLearnerConfig) -> ActorProgram:
    """The `ActorProgram` for ``config.env_id``, built by its backend.

    gymnax ids (no prefix, or ``gymnax:``) are rolled out by a jitted
    ``lax.scan`` (`ppo_async.envs.gymnax_env.make_gymnax_actor_program`);
    ``gymnasium:``, ``envpool:`` and ``host:`` ids by a Python loop over env
    steps (`ppo_async.envs.host_rollout.make_host_actor_program`).
    """
    return env_backend(config.env_id).actor_program(config)
