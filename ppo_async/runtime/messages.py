"""The messages between actors and learner, and the weights as bytes.

An actor sends `Experience` (or, when it raised, `ActorFailure`) to the
learner; the learner sends `PolicyBroadcast` to every actor. Weights as bytes
are the only thing that crosses from the learner to an actor.

``serialize_policy`` pulls the params to the host and packs them with flax's
msgpack serialization; ``load_policy_from_broadcast`` unpacks them into a
template of the same structure and places them on the actor's device. Bytes
do not care which device either side uses, so a learner on a GPU and actors
on the CPU share one params pytree definition.
"""

from __future__ import annotations

import queue
from typing import Any, NamedTuple

import flax.serialization
import jax
import numpy as np

from ppo_async.core.devices import place, to_host
from ppo_async.envs.program import Trajectory


class Experience(NamedTuple):
    """One chunk from one actor: ``T = num_steps`` rows of its ``E`` envs (numpy)."""

    actor_id: int
    policy_version: int  # learner updates behind the params that collected it
    trajectory: Trajectory  # time-major [T, E, ...] numpy arrays
    bootstrap_obs: np.ndarray  # [E, *obs_shape] observation after the last row
    bootstrap_value: np.ndarray  # [E] V(bootstrap_obs) under the behaviour params
    # The actor's env carry after this chunk: where the actor would resume from if
    # this were the last chunk the learner consumed (checkpoints keep it).
    env_carry: Any = None


class ActorFailure(NamedTuple):
    """Sent on the experience queue by an actor that raised."""

    actor_id: int
    error: BaseException  # carries its own __traceback__
    formatted_traceback: str


class PolicyBroadcast(NamedTuple):
    """One message on an actor's broadcast queue: the learner's params after update ``version``."""

    # policy version: learner updates applied to these params, which are also
    # the updates the learner had completed when it sent them
    version: int
    payload: bytes  # flax.serialization.to_bytes of the host params


def take_all(inbox: queue.Queue) -> list[Any]:
    """Every message waiting in ``inbox``, in arrival order; never blocks."""
    taken = []
    while True:
        try:
            taken.append(inbox.get_nowait())
        except queue.Empty:
            return taken


def take_newest(inbox: queue.Queue) -> tuple[Any, int]:
    """The newest message waiting in ``inbox`` by ``.version`` (None if none), and how many were taken.

    Never blocks. Newest by version, not by arrival: a restarted actor's
    re-delivered broadcast may land behind a newer one.
    """
    newest = None
    taken = take_all(inbox)
    for message in taken:
        if newest is None or message.version >= newest.version:
            newest = message
    return newest, len(taken)


class PolicyLoadError(ValueError):
    """Broadcast bytes that do not fit the receiving network."""


def serialize_policy(params: Any) -> bytes:
    """Host copy of ``params`` as msgpack bytes.

    `ppo_async.core.devices.to_host` (``jax.device_get``) waits for the update
    that produced ``params`` to finish, so the bytes are never a half-written
    buffer, and reads device arrays as numpy so that msgpack sees plain host memory.
    """
    return flax.serialization.to_bytes(to_host(params))


def load_policy_from_broadcast(
    broadcast: PolicyBroadcast, template: Any, device: jax.Device | None = None
) -> Any:
    """Params from ``broadcast``, shaped like ``template``, placed on ``device``.

    Raises `PolicyLoadError` when the bytes hold another architecture (other
    keys, shapes or dtypes): loading them would silently act with garbage.
    """
    return place(decode_params(broadcast.payload, template,
                               f"policy version {broadcast.version}"), device)


def decode_params(payload: bytes, template: Any, what: str) -> Any:
    """``payload`` (`serialize_policy`'s bytes) as host params shaped like ``template``;
    `PolicyLoadError`, its message starting with ``what``, when they do not fit it."""
    try:
        params = flax.serialization.from_bytes(template, payload)
    except Exception as error:  # msgpack and flax raise several types
        raise PolicyLoadError(
            f"{what}: bytes do not decode into this network's params "
            f"({type(error).__name__}: {error})"
        ) from error
    mismatch = params_mismatch(params, template)
    if mismatch is not None:
        raise PolicyLoadError(f"{what}: {mismatch}")
    return params


def params_mismatch(params: Any, template: Any) -> str | None:
    """What in ``params`` differs from ``template``'s structure, shapes and dtypes (the first
    leaf that differs, by its path); None if nothing does. Reads no array's values.

    On every version an actor loads: the leaves are compared as they come, and their
    paths are worked out only to say what differs.
    """
    leaves, structure = jax.tree.flatten(params)
    expected_leaves, expected_structure = jax.tree.flatten(template)
    if structure == expected_structure and all(
            _signature(leaf) == _signature(expected)
            for leaf, expected in zip(leaves, expected_leaves, strict=True)):
        return None
    received, expected = _signatures_by_path(params), _signatures_by_path(template)
    missing = sorted(expected.keys() - received.keys())
    extra = sorted(received.keys() - expected.keys())
    if missing:
        return f"the params have no params{missing[0]}, which this network has"
    if extra:
        return f"the params have params{extra[0]}, which this network has not"
    for path, (shape, dtype) in received.items():
        if (shape, dtype) != expected[path]:
            want_shape, want_dtype = expected[path]
            return (f"params{path} is {dtype}{list(shape)}, this network's "
                    f"{want_dtype}{list(want_shape)}")
    return f"the params are a {structure}, this network's a {expected_structure}"


def _signature(leaf: Any) -> tuple[tuple[int, ...], np.dtype]:
    """A leaf's shape and dtype, without reading it (a device array stays where it is)."""
    dtype = getattr(leaf, "dtype", None)
    return tuple(np.shape(leaf)), np.dtype(dtype) if dtype is not None else np.asarray(leaf).dtype


def _signatures_by_path(tree: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path): _signature(leaf) for path, leaf in leaves}
