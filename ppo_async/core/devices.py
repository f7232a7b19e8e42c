"""Device strings to devices, and where the learner's arrays live on them.

``actor_device`` names one device (``'cpu'``, ``'cpu:1'``); ``learner_device``
one or several (``'gpu:0,gpu:1'``, ``'cpu:0,cpu:1,cpu:2'``, ``'gpu:all'``).
Several devices make a 1-D `jax.sharding.Mesh` whose one axis, ``'data'``,
the learner's update is data-parallel over (`LearnerPlacement`):

- the batch is sharded along its env axis, whole env sequences per device;
- params, optimizer state, normalization statistics and the proximal average
  are replicated on every device;
- inside the one jitted update (`ppo_async.core.update.make_update_fn` with
  ``mesh``), every minibatch is split across the devices; XLA's partitioner
  then computes each device's share of the loss and gradients and sums the
  shares across devices before the optimizer step (one all-reduce), so the
  update computes what it computes on one device, up to the order of the
  floating-point sums.

One device is the mesh-free program of old: no constraint, no collective, so
lock-step on one device stays byte-identical to the synchronous twin.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from ppo_async.errors import ConfigError

DATA_AXIS = "data"
FORCE_CPU_DEVICES = "on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N"


def parse_device_spec(spec: str) -> tuple[str, int] | None:
    """``(platform, index)`` of a device string such as 'gpu:1' (index 0 if absent); None if malformed."""
    platform, _, index = spec.partition(":")
    if not platform or (index and not index.isdigit()):
        return None
    return platform, int(index or 0)


def parse_device_list(spec: str) -> tuple[str, tuple[int, ...] | None] | None:
    """``(platform, indices)`` of a learner device string; indices None for 'platform:all'.

    'gpu' -> ('gpu', (0,)); 'cpu:0,cpu:2' -> ('cpu', (0, 2)); 'gpu:all' ->
    ('gpu', None). None if malformed: an empty part, two platforms, a
    repeated device, or 'all' beside other devices.
    """
    parts = [part.strip() for part in spec.split(",")]
    if len(parts) == 1 and parts[0].endswith(":all"):
        platform = parts[0][: -len(":all")]
        return (platform, None) if platform and ":" not in platform else None
    parsed = [parse_device_spec(part) for part in parts]
    if any(p is None for p in parsed) or len({p[0] for p in parsed}) != 1:
        return None
    indices = tuple(index for _, index in parsed)
    return (parsed[0][0], indices) if len(set(indices)) == len(indices) else None


def _platform_devices(spec: str, platform: str) -> list[jax.Device]:
    try:
        return jax.devices(platform)
    except RuntimeError as error:
        raise ConfigError(f"device {spec!r}: no {platform} backend here ({error})") from None


def resolve_devices(spec: str | None) -> tuple[jax.Device, ...]:
    """The devices a config device string names, in its order (``None``: JAX's default device)."""
    if spec is None:
        return (jax.devices()[0],)
    parsed = parse_device_list(spec) if isinstance(spec, str) else None
    if parsed is None:
        raise ConfigError(
            f"device {spec!r}: must look like 'cpu', 'gpu:0', 'gpu:0,gpu:1' or 'gpu:all'")
    platform, indices = parsed
    devices = _platform_devices(spec, platform)
    if indices is None:  # 'platform:all'
        return tuple(devices)
    missing = [index for index in indices if index >= len(devices)]
    if missing:
        raise ConfigError(
            f"device {spec!r}: only {len(devices)} {platform} device(s) here, no index "
            f"{missing[0]} ({FORCE_CPU_DEVICES})"
        )
    return tuple(devices[index] for index in indices)


def resolve_device(spec: str | None) -> jax.Device:
    """The one ``jax.Device`` a config device string names (``None``: the default device)."""
    devices = resolve_devices(spec)
    if len(devices) != 1:
        raise ConfigError(f"device {spec!r}: names {len(devices)} devices where one is needed")
    return devices[0]


def to_host(tree: Any) -> Any:
    """What ``jax.device_get(tree)`` returns, without its per-leaf copies where they buy nothing.

    ``jax.device_get`` starts an asynchronous copy of every leaf before it reads
    them; an array on a CPU device already is host memory, and those calls cost
    more than the reads (12 scalar metrics: 117 against 10 us; a chunk's 11 arrays:
    149 against 22 us). When every jax array of ``tree`` lives on CPU devices,
    each is read as ``np.asarray`` does (read-only, after waiting for the
    computation that makes it, as device_get does); other leaves are taken as
    device_get takes them. A tree with an array on another platform (a GPU
    learner's metrics) goes through ``jax.device_get``, whose copies overlap.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if not all(_on_cpu(leaf) for leaf in leaves if isinstance(leaf, jax.Array)):
        return jax.device_get(tree)
    with jax.transfer_guard_device_to_host("allow"):  # an explicit read, as device_get's
        return treedef.unflatten([_read(leaf) for leaf in leaves])


def _on_cpu(array: jax.Array) -> bool:
    """Whether ``array`` holds numbers (not PRNG keys) on CPU devices only."""
    return (not jax.dtypes.issubdtype(array.dtype, jax.dtypes.extended)
            and all(device.platform == "cpu" for device in array.sharding.device_set))


def _read(leaf: Any) -> Any:
    if isinstance(leaf, jax.Array):
        return np.asarray(leaf)
    to_array = getattr(leaf, "__array__", None)  # as device_get: numpy scalars become arrays
    return leaf if to_array is None else to_array()


def host_zeros(shapes: Any) -> Any:
    """Numpy zeros with the structure, shapes and dtypes of ``shapes`` (a tree of
    `jax.ShapeDtypeStruct`, as `jax.eval_shape` returns): what a program's arguments
    look like, built without running or compiling anything. A leaf of a key dtype
    (JAX's default implementation, the project's) is a key array of zero words."""
    def zeros(spec: jax.ShapeDtypeStruct) -> Any:
        if jax.dtypes.issubdtype(spec.dtype, jax.dtypes.prng_key):
            words = jax.eval_shape(jax.random.key_data, spec).shape
            return jax.random.wrap_key_data(np.zeros(words, np.uint32))
        return np.zeros(spec.shape, spec.dtype)

    return jax.tree.map(zeros, shapes)


@functools.cache
def _placer(shardings: Any) -> Any:
    return jax.jit(lambda tree: tree, out_shardings=shardings)


@functools.cache
def _device_placer(device: jax.Device) -> Any:
    return _placer(SingleDeviceSharding(device))


def place(tree: Any, device: jax.Device | None) -> Any:
    """Host arrays ``tree`` copied onto ``device`` (committed); None: `jax.device_put`'s default.

    Same result as ``jax.device_put(tree, device)``, but as one jitted identity
    whose outputs are pinned to ``device``: a single dispatch for the whole
    tree, where ``device_put`` pays its per-call overhead on every leaf
    (``experiments/bench_learner.py`` times both). Used on the hot paths: the
    learner's batch every update and an actor's params every broadcast.
    """
    if device is None:
        return jax.device_put(tree)
    return _device_placer(device)(tree)


# Batch fields whose env axis is the first ([B, ...]); every other field is
# time-major, [T, B, ...]. (Named here, not imported: core.update imports this module.)
ENV_FIRST_FIELDS = frozenset({"bootstrap_obs", "bootstrap_value", "initial_hidden", "policy_lag"})


def env_axis_spec(env_axis: int) -> PartitionSpec:
    """The spec of an array sharded along axis ``env_axis`` over the mesh's data axis."""
    return PartitionSpec(*([None] * env_axis), DATA_AXIS)


def batch_shardings(mesh: Mesh, batch: Any) -> Any:
    """A `NamedSharding` per field of a learner ``Batch`` (None for absent fields): envs split."""
    return _batch_shardings(mesh, type(batch), tuple(value is not None for value in batch))


@functools.cache
def _batch_shardings(mesh: Mesh, batch_type: type, present: tuple[bool, ...]) -> Any:
    return batch_type(*(
        NamedSharding(mesh, env_axis_spec(0 if name in ENV_FIRST_FIELDS else 1)) if here else None
        for name, here in zip(batch_type._fields, present)
    ))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def learner_mesh(spec: str | None) -> Mesh | None:
    """The mesh of a learner device string naming several devices; None for one (not looked up).

    Whether the batch splits over the mesh is the caller's to check
    (`ppo_async.config.AsyncActorLearnerConfig.learner_mesh` does).
    """
    parsed = parse_device_list(spec) if spec else None
    if parsed is None or (parsed[1] is not None and len(parsed[1]) == 1):
        return None
    return LearnerPlacement(resolve_devices(spec)).mesh


class LearnerPlacement:
    """Where the learner's state and batch live: one device, or a mesh of several.

    `put_state` and `put_batch` copy host (or other-device) arrays there in one
    jitted dispatch; ``mesh`` is None on one device.
    """

    def __init__(self, devices: tuple[jax.Device, ...] | list[jax.Device]):
        self.devices = tuple(devices)
        if not self.devices:
            raise ValueError("a learner needs at least one device")
        self.mesh = Mesh(np.array(self.devices), (DATA_AXIS,)) if len(self.devices) > 1 else None

    @property
    def device(self) -> jax.Device:
        """The first device (the only one without a mesh)."""
        return self.devices[0]

    def put_state(self, state: Any) -> Any:
        """``state`` on the learner: replicated over the mesh, or on the one device.

        ``jax.device_put``, which also moves arrays already committed to
        another device (a resumed or initialized state); not a hot path.
        """
        return jax.device_put(state, self.device if self.mesh is None else replicated(self.mesh))

    def put_batch(self, batch: Any) -> Any:
        """A host ``Batch`` on the learner: its envs split over the mesh, or on the one device."""
        if self.mesh is None:
            return place(batch, self.device)
        return _placer(batch_shardings(self.mesh, batch))(batch)

    def describe(self) -> str:
        return ",".join(f"{d.platform}:{d.id}" for d in self.devices)
