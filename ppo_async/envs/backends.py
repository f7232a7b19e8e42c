"""The `ActorProgram` of a config's env backend, picked from its env id's prefix."""

from __future__ import annotations

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.envs.gymnax_env import make_gymnax_actor_program
from ppo_async.envs.host_rollout import make_host_actor_program
from ppo_async.envs.program import ActorProgram
from ppo_async.envs.registry import GYMNAX, split_env_id


def make_actor_program(config: AsyncActorLearnerConfig) -> ActorProgram:
    """The `ActorProgram` for ``config.env_id``.

    gymnax ids (no prefix, or ``gymnax:``) are rolled out by a jitted
    ``lax.scan`` (`ppo_async.envs.gymnax_env.make_gymnax_actor_program`);
    ``gymnasium:``, ``envpool:`` and ``host:`` ids by a Python loop over env
    steps (`ppo_async.envs.host_rollout.make_host_actor_program`).
    """
    if split_env_id(config.env_id)[0] == GYMNAX:
        return make_gymnax_actor_program(config)
    return make_host_actor_program(config)
