"""The contract between an env backend and the actor loop: `ActorProgram` and `Trajectory`.

An env backend (jitted gymnax envs, `ppo_async.envs.gymnax_env`; host
simulators, `ppo_async.envs.host_rollout`) builds an `ActorProgram`
(`ppo_async.envs.backends.make_actor_program` picks it from the env id); the
actor loop runs it, whichever transport carries its messages, and every
backend's rollout returns the same `Trajectory`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from ppo_async.networks.actor_critic import ActorCritic


class Trajectory(NamedTuple):
    """``T`` steps of ``E`` envs, time-major."""

    obs: jax.Array  # [T, E, *obs_shape] float32, observation acted on
    action: jax.Array  # [T, E] int32, or [T, E, action_dim] float32 (unclipped sample)
    reward: jax.Array  # [T, E] float32, with gamma * V(final_obs) folded in at truncations
    terminated: jax.Array  # [T, E] bool, the MDP ended at this step
    truncated: jax.Array  # [T, E] bool, the time limit ended the episode (and it did not terminate)
    behaviour_logp: jax.Array  # [T, E] float32, log mu(a|x) of the acting policy
    behaviour_value: jax.Array  # [T, E] float32, V(x) of the acting policy
    episode_return: jax.Array  # [T, E] float32, return of the episode that ended here, else 0
    episode_length: jax.Array  # [T, E] int32, length of the episode that ended here, else 0
    # Recurrent policies only (None otherwise):
    reset: jax.Array | None = None  # [T, E] bool, an episode starts here: the state was zeroed before acting
    hidden: jax.Array | None = None  # [T, E, state_size] float32, the state the step acted with (after its reset)
    # Only when the learner bootstraps truncations (None otherwise): the
    # observation each truncated episode reached (rows where truncated; others
    # unspecified), and then ``reward`` has nothing folded in.
    final_obs: jax.Array | None = None  # [T, E, *obs_shape] float32
    # Reward scaling only (None otherwise): the learner's return statistics take these.
    discounted_return: jax.Array | None = None  # [T, E] float32, R_t of the raw env rewards

    @property
    def done(self) -> jax.Array:
        """``[T, E]`` bool: an episode ended at this step (either way)."""
        return self.terminated | self.truncated


Carry = Any  # whatever an ActorProgram's envs carry between chunks


class BatchedInference(NamedTuple):
    """How a program's per-step policy calls can be batched across actors (host envs).

    ``fn(params, hidden, obs, reset, key)`` is the jitted policy call of
    ``N`` actors at once: every array has a leading actor axis and actor
    ``i``'s output row depends on row ``i`` alone. ``attach(carry, act)``
    returns the carry whose rollouts take their actions from ``act(params,
    hidden, obs, reset, key)`` (one actor's row of ``fn``, e.g. from an
    `ppo_async.runtime.inference.InferenceServer` shared by the actors of a
    device) instead of calling the policy alone.
    """

    fn: Callable[..., Any]
    attach: Callable[[Carry, Callable[..., Any]], Carry]


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
    # how actors of one device may share their policy calls; None: each rollout calls its own
    inference: BatchedInference | None = None
