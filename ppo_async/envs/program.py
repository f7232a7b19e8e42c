"""`ActorProgram`: the contract between an env backend and the actor loop.

An env backend (jitted gymnax envs in `ppo_async.runtime.actor`, host simulators in
`ppo_async.envs.host`) builds one; the actor loop runs it, whichever
transport carries its messages. It lives apart from both so that neither
imports the other to name it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from ppo_async.envs.gymnax_env import Trajectory
from ppo_async.networks.actor_critic import ActorCritic

Carry = Any  # whatever an ActorProgram's envs carry between chunks


class ActorProgram(NamedTuple):
    """How actors of a run collect: built once and shared, so the rollout compiles once.

    An env backend provides ``reset`` and ``rollout``; the actor loop does not
    care whether the envs are jitted gymnax envs or host simulators.
    """

    observation_shape: tuple[int, ...]  # one observation
    network: ActorCritic
    # host params with the network's structure, for from_bytes (a NormalizedPolicy
    # of params and statistics when the run normalizes)
    params_template: Any
    # reset(key, device) -> carry: fresh episodes in every env of one actor
    reset: Callable[[jax.Array, jax.Device], Carry]
    # rollout(params, carry) -> (carry, trajectory [T, E, ...], bootstrap_obs [E, ...],
    #                            bootstrap_value [E]); arrays may live on the device
    rollout: Callable[[Any, Carry], tuple[Carry, Trajectory, Any, Any]]
    # (trajectory, bootstrap_obs, bootstrap_value) of one chunk as jax.ShapeDtypeStructs,
    # where the rollout can be traced (gymnax); None where it steps host envs
    chunk_spec: Any = None
    # close(carry): release what a carry holds (host simulators); None: nothing to release
    close: Callable[[Carry], None] | None = None
