"""Weights as bytes: the only thing that crosses from the learner to an actor.

``serialize_policy`` pulls the params to the host and packs them with flax's
msgpack serialization; ``load_policy_from_broadcast`` unpacks them into a
template of the same structure and places them on the actor's device. Bytes
do not care which device either side uses, so a learner on a GPU and actors
on the CPU share one params pytree definition.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.serialization
import jax
import numpy as np
from jax.sharding import SingleDeviceSharding


class PolicyBroadcast(NamedTuple):
    """One message on an actor's broadcast queue."""

    version: int  # policy version: learner updates applied to these params
    learner_updates: int  # updates the learner had completed when it sent this
    payload: bytes  # flax.serialization.to_bytes of the host params


class PolicyLoadError(ValueError):
    """Broadcast bytes that do not fit the receiving network."""


@functools.cache
def _placer(device: jax.Device) -> Any:
    return jax.jit(lambda tree: tree, out_shardings=SingleDeviceSharding(device))


def place(tree: Any, device: jax.Device | None) -> Any:
    """Host arrays ``tree`` copied onto ``device`` (committed); None: `jax.device_put`'s default.

    Same result as ``jax.device_put(tree, device)``, but as one jitted identity
    whose outputs are pinned to ``device``: a single dispatch for the whole
    tree, where ``device_put`` pays its per-call overhead on every leaf (on
    this project's small pytrees, 2-5x slower; ``experiments/bench_learner.py``
    times both). Used on the hot paths: the learner's batch every update and
    an actor's params every broadcast.
    """
    if device is None:
        return jax.device_put(tree)
    return _placer(device)(tree)


def serialize_policy(params: Any) -> bytes:
    """Host copy of ``params`` as msgpack bytes.

    ``jax.device_get`` waits for the update that produced ``params`` to finish,
    so the bytes are never a half-written buffer, and it copies device arrays to
    numpy so that msgpack sees plain host memory.
    """
    return flax.serialization.to_bytes(jax.device_get(params))


def load_policy_from_broadcast(
    broadcast: PolicyBroadcast, template: Any, device: jax.Device | None = None
) -> Any:
    """Params from ``broadcast``, shaped like ``template``, placed on ``device``.

    Raises `PolicyLoadError` when the bytes hold another architecture (other
    keys, shapes or dtypes): loading them would silently act with garbage.
    """
    try:
        params = flax.serialization.from_bytes(template, broadcast.payload)
    except Exception as error:  # msgpack and flax raise several types
        raise PolicyLoadError(
            f"policy version {broadcast.version}: bytes do not decode into this "
            f"network's params ({type(error).__name__}: {error})"
        ) from error
    expected = jax.tree.map(lambda x: (np.shape(x), np.asarray(x).dtype), template)
    received = jax.tree.map(lambda x: (np.shape(x), np.asarray(x).dtype), params)
    if jax.tree.structure(expected) != jax.tree.structure(received) or expected != received:
        raise PolicyLoadError(
            f"policy version {broadcast.version}: params shapes/dtypes {received} "
            f"do not match this network's {expected}"
        )
    return place(params, device)
