"""The contract between an env backend and the actor loop: `ActorProgram` and `Trajectory`.

An env backend (jitted gymnax envs, `ppo_async.envs.gymnax_env`; host
simulators, `ppo_async.envs.host_rollout`) builds an `ActorProgram`
(`ppo_async.envs.backends.make_actor_program` picks it from the env id); the
actor loop runs it, whichever transport carries its messages, and every
backend's rollout returns the same `Trajectory`.
"""

from __future__ import annotations

import threading
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
    """How the actors of one device may share their jitted calls (`ActorProgram.inference`).

    ``fn(params, per_actor)`` is the call of ``N`` actors at once: it takes
    the inputs tuple of every actor's own call, in actor order, and returns
    a result per actor (``[i]``: actor ``i``'s), which depends on actor
    ``i``'s inputs alone. Host envs share each env step's policy call
    (inputs ``(hidden, obs, reset, key)``); gymnax envs share a whole chunk
    (inputs ``(carry,)``, one rollout program). An actor whose carry is an
    `AttachedCarry` gets its result from ``act(params, *inputs)``, its
    client of such a call (`ppo_async.runtime.inference.InferenceServer`),
    instead of calling alone.
    """

    fn: Callable[..., Any]
    # How long the call waits, after a first actor asks, for the others (a chunk
    # costs about the same for all actors as for one; an env step's call is short).
    gather_s: float = 0.0
    # The program's rollout is a generator of these calls (host envs) that a
    # `ChunkClient` may drive among other actors' (sampler="shared").
    lockstep: bool = False


class AttachedCarry(NamedTuple):
    """An actor's env carry with its client of a batched call (`BatchedInference`)."""

    carry: Any
    act: Callable[..., Any]


class ChunkClient(NamedTuple):
    """An actor's client of a lock-step sampler (`ppo_async.runtime.inference.LockstepSampler`).

    ``drive(params, steps, next_params, lineage)`` runs a chunk's generator of
    policy calls (a rollout's steps,
    `ppo_async.envs.host_rollout.HostRollout.chunk_steps`) beside the chunks of
    the other actors it serves, one policy call per env step for all of them,
    and returns what the generator returns. ``next_params()`` (or None), asked
    by the sampler as the chunk ends, gives the params of the actor's next
    chunk if they are at hand (else None): where the generator returns a
    `ChunkEnd`, the sampler then begins that chunk itself at once, and the
    next ``drive`` with those params and the same ``lineage`` (the actor's
    envs) takes it over instead of ``steps``. ``stopped()`` says the run is stopping;
    ``adopt(threads)`` hands the sampler the threads started for the chunk's
    envs (stepper threads), so that it can name one still stuck in its env
    when the run ends.
    """

    drive: Callable[[Any, Any, Callable[[], Any] | None, Any], Any]
    stopped: Callable[[], bool]
    adopt: Callable[[list[threading.Thread]], None]


class ChunkEnd(NamedTuple):
    """What a host chunk's generator returns (`ppo_async.envs.host_rollout.HostRollout.chunk_steps`)."""

    # finish(carry the chunk started from) -> (carry, trajectory, bootstrap_obs,
    # bootstrap_value): the once-per-chunk work, in the actor's own thread
    finish: Callable[[Any], tuple]
    # follow(params) -> the generator of the actor's next chunk, from where this one
    # ended: a sampler may begin it before ``finish`` has run
    follow: Callable[[Any], Any]


def unattached(carry: Any) -> tuple[Any, Callable[..., Any] | None]:
    """``(env carry, client or None)`` of a carry that may be an `AttachedCarry`."""
    if isinstance(carry, AttachedCarry):
        return carry.carry, carry.act
    return carry, None


def reattached(carry: Any, act: Callable[..., Any] | None) -> Any:
    """``carry`` attached to ``act`` again (as it came in: `unattached`)."""
    return carry if act is None else AttachedCarry(carry, act)


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
    #                            bootstrap_value [E]); arrays may live on the device. A
    # lock-step program's (`BatchedInference.lockstep`) also takes next_params (a
    # `ChunkClient`'s): rollout(params, carry, next_params)
    rollout: Callable[[Any, Carry], tuple[Carry, Trajectory, Any, Any]]
    # (trajectory, bootstrap_obs, bootstrap_value) of one chunk as jax.ShapeDtypeStructs,
    # where the rollout can be traced (gymnax); None where it steps host envs
    chunk_spec: Any = None
    # close(carry): release what a carry holds (host simulators); None: nothing to release
    close: Callable[[Carry], None] | None = None
    # how actors of one device may share their policy calls; None: each rollout calls its own
    inference: BatchedInference | None = None
    # rollout_group(params, carries) -> [rollout(params, carry) for carry in carries], each
    # actor's chunk as its own rollout gives it (to rounding), made as one call (gymnax: one
    # program). A program that has one also rolls out without blocking its thread (a jitted
    # chunk), so that a thread transport collects all its actors' chunks from one thread
    # (`ppo_async.runtime.actor.ActorGroup`): with this call where they share their calls,
    # else each actor's rollout in turn. None: a thread per actor.
    rollout_group: Callable[[Any, list[Carry]], list[tuple]] | None = None
    # Equal (and hashable) for programs whose rollouts compute the same chunks (gymnax:
    # the process-wide jitted programs they call), so that a program built on one
    # serves the next run in the process (`ppo_async.runtime.in_learner`); None: not shared.
    # A program whose rollout is replaced (a wrapper) must drop it: _replace(identity=None).
    identity: Any = None
    # one actor's fresh carry as jax.ShapeDtypeStructs, where the reset can be traced
    # (gymnax): what a loop is compiled on ahead of the reset; None where it cannot
    carry_spec: Any = None
