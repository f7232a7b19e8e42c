"""Checkpoints: the learner's state on disk, written atomically, read back exactly.

A checkpoint is one file ``ckpt_<step:09d>.msgpack`` in a checkpoint
directory. It is flax msgpack all the way down (never pickle): an envelope

    {"format": "ppo_async-checkpoint", "format_version": 1,
     "sha256": <32 bytes>, "payload": <bytes>}

around a payload that holds the step, the integer counters, the run's config
as a JSON string, and the state pytree as a flax state dict. The checksum
covers the payload; a truncated envelope does not decode at all. Either way
a damaged file is detected, reported with `warnings.warn` and skipped in favour
of the previous checkpoint.

Writing goes to a temporary file in the same directory, which is flushed and
``fsync``-ed, then ``os.replace``-d onto its final name, and the directory is
``fsync``-ed: a crash at any moment leaves either the old set of checkpoints
or the new one, plus at worst a stray temporary file that readers ignore and
the next save (or the next run opening the directory) removes. One writer per directory is assumed.

The state can be any pytree of arrays that flax serializes (dicts, NamedTuples
such as `LearnerState` and optax's states, ``flax.struct`` dataclasses).
New-style typed PRNG keys (``jax.random.key``) are stored as their
``jax.random.key_data`` and rewrapped, with the template's key implementation,
by ``jax.random.wrap_key_data``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import flax.serialization
import jax
import numpy as np

from ppo_async.config import ConfigError
from ppo_async.runs.run_dir import RunFileError, is_temp_file, write_atomically

_FORMAT = "ppo_async-checkpoint"
_FORMAT_VERSION = 1
_NAME = re.compile(r"ckpt_(\d{9,})\.msgpack")

# A checkpoint's header (format, checksum, step, counters, config) is in its
# first bytes, the state after it; a config of a few KB leaves room to spare.
HEADER_LIMIT = 1 << 20
# What a file may hold beyond its arrays' own bytes: per leaf its msgpack key,
# shape and dtype (tens of bytes), and the envelope.
_MARGIN_PER_LEAF = 512
_MARGIN = 64 << 10

# Config fields a resumed run may not change, and why:
#   env_id       -- observation and action spaces, hence every param shape, and
#                   the task the params were trained on;
#   hidden_sizes -- the param (and Adam moment) shapes;
#   network, rnn_hidden_size -- the params (a recurrent cell or none) and the
#                   hidden state each actor's carry holds;
#   normalize_observations, normalize_rewards -- the params' structure (their
#                   statistics travel in them) and the actors' env carries.
# Everything else (total_env_steps, learning_rate, anneal_lr, timeouts,
# topology...) may change: the params still fit, and the optimizer state is
# fitted (anneal_lr adds or drops the schedule's step counter). A new budget or
# learning_rate re-plans the annealed schedule: see ppo_async.resume.
RESUME_LOCKED_FIELDS: tuple[str, ...] = (
    "env_id", "hidden_sizes", "network", "rnn_hidden_size",
    "normalize_observations", "normalize_rewards")

# Locked fields that checkpoints written before them do not record: such a
# checkpoint was written with this value (a feed-forward network).
LOCKED_FIELD_DEFAULTS: dict[str, Any] = {
    "network": "mlp", "rnn_hidden_size": 128,
    # ...and without normalization (its statistics travel in the params).
    "normalize_observations": False, "normalize_rewards": False,
}


class CheckpointError(RuntimeError):
    """No usable checkpoint, or a checkpoint that does not fit the template."""


class CheckpointWarning(UserWarning):
    """A checkpoint file was skipped because it is damaged or does not fit."""


class LoadedCheckpoint(NamedTuple):
    """One checkpoint read back."""

    state: Any  # pytree like the template: numpy leaves, typed keys as jax key arrays
    step: int  # the step in the file name (and payload)
    counters: dict[str, int]  # e.g. updates, env_steps, policy_version
    config: dict[str, Any]  # the config dict that was saved (JSON types: tuples are lists)
    path: pathlib.Path  # the file it came from


def checkpoint_path(directory: str | os.PathLike, step: int) -> pathlib.Path:
    """The file name a checkpoint of ``step`` gets in ``directory``."""
    return pathlib.Path(directory) / f"ckpt_{step:09d}.msgpack"


def list_checkpoints(directory: str | os.PathLike) -> list[pathlib.Path]:
    """Checkpoint files in ``directory``, oldest step first (temporary files excluded)."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.fullmatch(path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def _step_of(path: pathlib.Path) -> int:
    return int(_NAME.fullmatch(path.name).group(1))


# --- state <-> state dict ----------------------------------------------------


def _is_typed_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _keys_to_data(state: Any) -> Any:
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_typed_key(x) else x, state)


def _leaf_signature(state_dict: Any) -> list[tuple[str, tuple[int, ...], str]]:
    """``(path, shape, dtype)`` of every leaf of a flax state dict."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(state_dict)
    return [
        (jax.tree_util.keystr(path), tuple(np.shape(leaf)), str(np.asarray(leaf).dtype))
        for path, leaf in leaves
    ]


def _state_dict(state: Any) -> Any:
    # device_get waits for the computation that produced ``state`` and copies
    # it to host numpy, so the bytes never see a buffer still being written.
    return flax.serialization.to_state_dict(jax.device_get(_keys_to_data(state)))


def _restore_state(template: Any, saved_state_dict: Any) -> Any:
    """``saved_state_dict`` in ``template``'s structure; raises ValueError on any mismatch."""
    host_template = _state_dict(template)
    expected = _leaf_signature(host_template)
    received = _leaf_signature(saved_state_dict)
    if jax.tree.structure(host_template) != jax.tree.structure(saved_state_dict) or (
        expected != received
    ):
        differing = sorted(set(received) ^ set(expected))
        raise ValueError(
            "state does not fit the template (another network, optimizer or state "
            f"layout); differing leaves (path, shape, dtype): {differing[:6]}"
        )
    data_template = jax.device_get(_keys_to_data(template))
    restored = flax.serialization.from_state_dict(data_template, saved_state_dict)
    return jax.tree.map(
        lambda t, x: jax.random.wrap_key_data(x, impl=jax.random.key_impl(t))
        if _is_typed_key(t) else x,
        template, restored,
    )


def size_bounds(state_dict: Any) -> tuple[int, int]:
    """The fewest and most bytes flax msgpack of ``state_dict`` takes: its arrays' bytes, and
    those plus a margin for the keys, shapes and dtypes (``_MARGIN_PER_LEAF`` per leaf)."""
    leaves = jax.tree.leaves(state_dict)
    low = sum(leaf.nbytes for leaf in map(np.asarray, leaves) if leaf.dtype != object)
    return low, low + _MARGIN + _MARGIN_PER_LEAF * len(leaves)


def _check_size(size: int, low: int, high: int, what: str) -> None:
    """Raise ValueError giving both sizes unless ``low <= size <= high`` (checked before
    reading: a huge file, a sparse one say, is refused without reading a byte of it)."""
    if size < low:
        raise ValueError(f"is {size} bytes, where {what} would be {low} to {high}: truncated, "
                         "or another run's that does not fit")
    if size > high:
        raise ValueError(f"is {size} bytes, where {what} would be {low} to {high}: it does not fit "
                         "(another run's, or damaged)")


def read_params(path: str | os.PathLike, template: Any) -> Any:
    """A params file (``params.msgpack``: flax bytes of a params pytree) in ``template``'s structure.

    Raises ValueError saying what is wrong: a size that ``template`` rules out
    (checked before reading), bytes that do not decode (a file cut by a
    crash), or params that do not fit ``template`` (another run's: another
    env or network). The file has no checksum; a decoded tree must match
    every leaf's path, shape and dtype.
    """
    path = pathlib.Path(path)
    _check_size(path.stat().st_size, *size_bounds(_state_dict(template)),
                "the params of this run's network")
    content = path.read_bytes()
    try:
        state_dict = flax.serialization.msgpack_restore(content)
    except Exception as error:  # noqa: BLE001 - msgpack's errors vary with the damage
        raise ValueError(f"does not decode, damaged or cut short ({error})") from None
    if not isinstance(state_dict, dict):
        raise ValueError(f"holds a {type(state_dict).__name__}, not a params tree")
    expected = set(_leaf_signature(_state_dict(template)))
    differing = sorted(expected ^ set(_leaf_signature(state_dict)))
    if differing:
        path, shape, dtype = differing[0]
        raise ValueError(
            f"does not fit this run's network: params of another run (another env, "
            f"hidden_sizes or network)? {len(differing)} leaves differ, e.g. {path} {shape} {dtype}")
    return _restore_state(template, state_dict)


# --- writing ------------------------------------------------------------------


def encode_checkpoint(
    *, step: int, state: Any, counters: Mapping[str, int], config_dict: Mapping[str, Any]
) -> bytes:
    """The bytes `save_checkpoint` writes (envelope with checksum around the payload)."""
    counters = {str(name): _as_int(name, value) for name, value in counters.items()}
    payload = flax.serialization.msgpack_serialize({
        "step": _as_int("step", step),
        "counters": counters,
        "config_json": json.dumps(dict(config_dict), sort_keys=True),
        "state": _state_dict(state),
    })
    return flax.serialization.msgpack_serialize({
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        "sha256": hashlib.sha256(payload).digest(),
        "payload": payload,
    })


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"checkpoint counter {name!r}={value!r}: must be an integer")
    return int(value)


def save_checkpoint(
    directory: str | os.PathLike,
    *,
    step: int,
    state: Any,
    counters: Mapping[str, int],
    config_dict: Mapping[str, Any],
    keep: int,
) -> pathlib.Path:
    """Write ``ckpt_<step:09d>.msgpack`` atomically; keep the newest ``keep``.

    Args:
      directory: created if missing. One writer per directory.
      step: names the file; usually the learner updates done.
      state: pytree of arrays (e.g. `LearnerState`), on any device. Call this
        only with a state known to be good (e.g. after the NaN check): the file
        is what a resume continues from.
      counters: integers to restore with the state (updates, env steps, ...).
      config_dict: the run's ``config.to_dict()``, stored as JSON.
      keep: how many checkpoints to keep, this one included (>= 1).

    Checkpoints with a step above ``step`` are deleted too: they can only be
    left by a run that was resumed from an earlier checkpoint (theirs was
    damaged, or the run was rewound), and a later resume must not pick them
    over this one. Stray temporary files from a crashed save are removed.

    Returns the path written.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep={keep!r}: must be an integer >= 1")
    if _as_int("step", step) < 0:
        raise ValueError(f"step={step}: must be >= 0")
    directory = pathlib.Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunFileError.of(directory, error) from error
    content = encode_checkpoint(
        step=step, state=state, counters=counters, config_dict=config_dict
    )
    path = checkpoint_path(directory, step)
    write_atomically(path, content)

    existing = list_checkpoints(directory)
    older = [p for p in existing if _step_of(p) < step]
    stale = older[: max(0, len(older) - (keep - 1))]
    stale += [p for p in existing if _step_of(p) > step]
    stale += [p for p in directory.iterdir() if is_temp_file(p.name)]
    for stale_path in stale:
        try:
            stale_path.unlink()
        except FileNotFoundError:
            pass
        except OSError as error:
            raise RunFileError.of(stale_path, error) from error
    return path


# --- reading ------------------------------------------------------------------


def _decode(content: bytes) -> tuple[int, dict[str, int], dict[str, Any], Any]:
    """``(step, counters, config, state_dict)``; raises ValueError naming what is wrong."""
    try:
        envelope = flax.serialization.msgpack_restore(content)
    except Exception as error:  # msgpack raises several types on bad input
        raise ValueError(
            f"not a readable msgpack file, likely truncated "
            f"({len(content)} bytes; {type(error).__name__}: {error})"
        ) from error
    if not isinstance(envelope, dict) or envelope.get("format") != _FORMAT:
        raise ValueError("not a ppo_async checkpoint (no format marker)")
    if envelope.get("format_version") != _FORMAT_VERSION:
        raise ValueError(
            f"checkpoint format version {envelope.get('format_version')!r}, this "
            f"code reads {_FORMAT_VERSION}"
        )
    payload, digest = envelope.get("payload"), envelope.get("sha256")
    if not isinstance(payload, bytes) or hashlib.sha256(payload).digest() != digest:
        raise ValueError("checksum mismatch: the payload is corrupt")
    try:
        body = flax.serialization.msgpack_restore(payload)
        config = json.loads(body["config_json"])
        step, counters, state = body["step"], body["counters"], body["state"]
    except Exception as error:
        raise ValueError(
            f"payload does not decode ({type(error).__name__}: {error})"
        ) from error
    # A file can pass its checksum and still hold nonsense (written by other
    # code, or by a bug): every value is checked before anything trusts it.
    if not _is_count(step):
        raise ValueError(f"step {step!r} is not an integer >= 0")
    if not isinstance(counters, dict) or not all(
        isinstance(name, str) and _is_count(value) for name, value in counters.items()
    ):
        raise ValueError(f"counters {counters!r} are not integers >= 0 by name")
    if not isinstance(config, dict):
        raise ValueError("the saved config is not a JSON object")
    return int(step), {name: int(value) for name, value in counters.items()}, config, state


def _is_count(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0


# template_state, or a function of the saved config dict that builds it (for a
# state whose shapes depend on the saved run's config, e.g. its topology).
Template = Any
# validate(loaded) raises ValueError for a checkpoint whose values make no sense.
Validator = Callable[[LoadedCheckpoint], None]


def read_checkpoint(
    path: str | os.PathLike,
    template_state: Template,
    *,
    config_dict: Mapping[str, Any] | None = None,
    locked_fields: Sequence[str] = RESUME_LOCKED_FIELDS,
    validate: Validator | None = None,
) -> LoadedCheckpoint:
    """One checkpoint file, restored into ``template_state``'s structure.

    ``template_state`` may be a callable: it is called with the saved config
    dict and returns the template. ``validate``, if given, checks the loaded
    checkpoint's values; a ValueError from it counts as damage.

    Raises `CheckpointError` if the file is unreadable, damaged, its state
    does not fit the template, or ``validate`` rejects it; `ConfigError`
    (before touching the state) if ``config_dict`` is given and changes a
    locked field of the saved config.
    """
    path = pathlib.Path(path)
    try:
        size = path.stat().st_size
        header_config, state_at = _read_header(path)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint {path}: {error}") from error
    if config_dict is not None:
        check_resume_compatible(header_config, config_dict, locked_fields=locked_fields)
    try:
        template = template_state(header_config) if callable(template_state) else template_state
        low, high = size_bounds(_state_dict(template))
        _check_size(size, state_at + low, state_at + high, "a checkpoint of this state")
        step, counters, saved_config, state_dict = _decode(path.read_bytes())
        match = _NAME.fullmatch(path.name)
        if match and int(match.group(1)) != step:
            raise ValueError(f"file name says step {int(match.group(1))}, contents say {step}")
        state = _restore_state(template, state_dict)
        loaded = LoadedCheckpoint(state, step, counters, saved_config, path)
        if validate is not None:
            validate(loaded)
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise CheckpointError(f"checkpoint {path}: {error}") from error
    return loaded


def _read_header(path: pathlib.Path) -> tuple[dict[str, Any], int]:
    """``(saved config, offset of the state)`` from a checkpoint's first `HEADER_LIMIT` bytes.

    The envelope keeps the payload last, and the payload its state last
    (`encode_checkpoint`), so both are found without reading the state. The
    checksum is checked later, when the whole file is read.
    """
    import msgpack

    with open(path, "rb") as file:
        prefix = file.read(HEADER_LIMIT)
    try:
        envelope = msgpack.Unpacker(raw=False)
        envelope.feed(prefix)
        fields = {}
        for _ in range(envelope.read_map_header()):
            key = envelope.unpack()
            if key == "payload":
                break
            fields[key] = envelope.unpack()
        else:
            raise ValueError("no payload")
        if fields.get("format") != _FORMAT:
            raise ValueError("not a ppo_async checkpoint (no format marker)")
        at = envelope.tell()
        at += 1 + {0xc4: 1, 0xc5: 2, 0xc6: 4}[prefix[at]]  # the payload's bin8/16/32 header
        body = msgpack.Unpacker(raw=False)
        body.feed(prefix[at:])
        payload = {}
        for _ in range(body.read_map_header()):
            key = body.unpack()
            if key == "state":
                config = json.loads(payload["config_json"])
                if not isinstance(config, dict):
                    raise ValueError("the saved config is not a JSON object")
                return config, at + body.tell()
            payload[key] = body.unpack()
        raise ValueError("no state")
    except Exception as error:  # noqa: BLE001 - msgpack raises several types on bad input
        raise ValueError(
            f"its header does not decode, likely truncated ({len(prefix)} bytes read; "
            f"{type(error).__name__}: {error})") from error


def load_latest_checkpoint(
    directory: str | os.PathLike,
    template_state: Template,
    *,
    config_dict: Mapping[str, Any] | None = None,
    locked_fields: Sequence[str] = RESUME_LOCKED_FIELDS,
    validate: Validator | None = None,
) -> LoadedCheckpoint | None:
    """The newest usable checkpoint in ``directory``, or None if there is none at all.

    A newest checkpoint that is damaged (truncated, corrupt, or not fitting the
    template) is reported with a `CheckpointWarning` naming the file and the
    reason, and the next older one is tried.

    Args:
      directory: the checkpoint directory (missing: None).
      template_state: a state of the structure, shapes, dtypes and PRNG key
        implementation to restore into; its values are not used.
      config_dict: the resuming run's ``config.to_dict()``; if given, each
        checkpoint's saved config is checked with `check_resume_compatible`
        first, and an incompatible one raises `ConfigError` at once (an older
        checkpoint of the same run would not fit either).
      locked_fields: passed to `check_resume_compatible`.
      validate: passed to `read_checkpoint`; a checkpoint it rejects is
        skipped like a damaged file.

    Raises:
      CheckpointError: checkpoint files exist but none is usable (the message
        lists each file and why).
      ConfigError: ``config_dict`` changes a locked field.
    """
    paths = list_checkpoints(directory)
    failures = []
    for path in reversed(paths):
        try:
            return read_checkpoint(
                path, template_state, config_dict=config_dict, locked_fields=locked_fields,
                validate=validate,
            )
        except CheckpointError as error:
            failures.append(str(error))
            warnings.warn(
                f"skipping unusable {error}; trying an older checkpoint",
                CheckpointWarning,
                stacklevel=2,
            )
    if failures:
        raise CheckpointError(
            f"no usable checkpoint in {directory} ({len(failures)} found, all "
            "unusable):\n  " + "\n  ".join(failures)
        )
    return None


def _normalise(value: Any) -> Any:
    # Saved configs went through JSON (tuples became lists); compare alike.
    return json.loads(json.dumps(value))


def check_resume_compatible(
    saved_config: Mapping[str, Any],
    config_dict: Mapping[str, Any],
    *,
    locked_fields: Sequence[str] = RESUME_LOCKED_FIELDS,
) -> None:
    """Raise `ConfigError` naming the field if resuming would change the network or env.

    ``saved_config`` is the dict stored in a checkpoint, ``config_dict`` the
    resuming run's ``config.to_dict()``. Only ``locked_fields`` are compared
    (see `RESUME_LOCKED_FIELDS` for why those); other fields may differ.
    """
    saved_config = {**LOCKED_FIELD_DEFAULTS, **saved_config}
    for field in locked_fields:
        if field not in saved_config:
            raise ConfigError(
                f"{field}: the checkpoint's config does not record it, so resuming "
                "cannot check that it is unchanged; start a fresh run"
            )
        if field not in config_dict:
            raise ConfigError(f"{field}: missing from the resuming run's config")
        saved, new = _normalise(saved_config[field]), _normalise(config_dict[field])
        if saved != new:
            raise ConfigError(
                f"{field}={config_dict[field]!r}: the checkpoint was written with "
                f"{field}={saved_config[field]!r}, and changing it changes the "
                f"network or env the saved params belong to. Resume with "
                f"{field}={saved_config[field]!r}, or start a fresh run."
            )
    # 'ewma' keeps a moving average of the params in the learner state; the
    # other anchors keep none, and may replace each other.
    saved_anchor = saved_config.get("ppo_ratio_anchor", "behaviour")
    new_anchor = config_dict.get("ppo_ratio_anchor", "behaviour")
    if (saved_anchor == "ewma") != (new_anchor == "ewma"):
        raise ConfigError(
            f"ppo_ratio_anchor={new_anchor!r}: the checkpoint was written with "
            f"ppo_ratio_anchor={saved_anchor!r}; 'ewma' keeps a moving average of the params "
            "in the learner state and the other anchors do not, so a run cannot switch to or "
            "from it. Resume with ppo_ratio_anchor='ewma' on both sides or neither, or start "
            "a fresh run."
        )
