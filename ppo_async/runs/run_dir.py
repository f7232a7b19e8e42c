"""The run directory: what a run writes to disk, written safely.

A run directory holds

=================== =====================================================
``config.json``     the config of the newest segment (``--resume`` reads it)
``segments.json``   one entry per segment (the first run and each resume):
                    where it started, its config, and its provenance
                    (package version, git commit, command line, JAX backend
                    and devices, start time)
``metrics.jsonl``   one strict-JSON object per learner update (NaN -> null),
                    and one per periodic evaluation, keyed by the update
                    it evaluated and written when it finished
``checkpoints/``    ``ckpt_<update>.msgpack`` (`ppo_async.runs.checkpoint`)
``params.msgpack``  flax bytes of the final params
``summary.json``    the final `LearnerReport`
``log.txt``         each actor restart: its one-line notice and traceback
``.lock``           held by the one process writing the run, and removed
                    when it ends (`ppo_async.runs.run_lock`)
=================== =====================================================

Two rules hold for every file: nothing is written through a symbolic link
(a link where a run file should be is refused with `ConfigError`, so a
directory prepared by someone else cannot redirect a write outside it), and
every whole file is written atomically (a temporary file in the same
directory, fsync, rename; a killed writer's temporary file is removed when a
run next opens the directory, `remove_stale_temps`). ``metrics.jsonl`` is an
append log: each line is one ``write`` of a whole line, and cutting it back
on resume rewrites it atomically.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.errors import RunFileError
from ppo_async.runs.run_lock import LOCK_FILE

CONFIG_FILE = "config.json"
SEGMENTS_FILE = "segments.json"
METRICS_FILE = "metrics.jsonl"
PARAMS_FILE = "params.msgpack"
SUMMARY_FILE = "summary.json"
ERROR_FILE = "error.txt"  # the traceback of a run that failed (the CLI's, the freeze watchdog's)
LOG_FILE = "log.txt"  # what the run's restart notices leave off stderr: their tracebacks
CHECKPOINT_SUBDIR = "checkpoints"

# The most a reader takes of a file it reads whole, or of one metrics line: far
# above what a run writes (config.json: a few KB; segments.json and
# summary.json: that per segment or a few hundred bytes per actor; a metrics
# line: 1-2 KB), so only a damaged file is refused.
MAX_CONFIG_BYTES = 1 << 20
MAX_RECORD_BYTES = 64 << 20
MAX_METRICS_LINE_BYTES = 1 << 20

TEMP_PREFIX = ".tmp-"  # temporary files of atomic writes; readers ignore them
# Older versions' checkpoint temporaries were named .ckpt_<random>.tmp.
_OLD_CHECKPOINT_TEMP = (".ckpt_", ".tmp")


def is_temp_file(name: str) -> bool:
    """Whether ``name`` is the name of an atomic write's temporary file (never a run file)."""
    prefix, suffix = _OLD_CHECKPOINT_TEMP
    return name.startswith(TEMP_PREFIX) or (name.startswith(prefix) and name.endswith(suffix))


def refuse_link(path: pathlib.Path) -> None:
    """Raise `ConfigError` if ``path`` is a symbolic link (a run never writes through one)."""
    if path.is_symlink():
        raise ConfigError(
            f"{path} is a symbolic link; a run never writes through links. Remove it, "
            "or choose another run directory."
        )


def write_atomically(path: str | os.PathLike, content: bytes) -> pathlib.Path:
    """Write ``content`` to ``path`` via a temporary file, fsync and rename.

    Readers see the old file or the new one, never a part. The temporary file
    is created with ``O_EXCL`` (it never follows a link), and a link at
    ``path`` itself is refused rather than replaced. A failure is a
    `RunFileError` naming ``path``; the temporary file is removed.
    """
    path = pathlib.Path(path)
    refuse_link(path)
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{path.name}.")
    except OSError as error:
        raise RunFileError.of(path, error) from error
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException as error:
        try:
            os.unlink(temp)
        except OSError:  # gone already, or the directory went read-only: nothing more to do
            pass
        if isinstance(error, OSError):
            raise RunFileError.of(path, error) from error
        raise
    _fsync_directory(path.parent)
    return path


def _fsync_directory(directory: pathlib.Path) -> None:
    # Makes the rename itself durable; not every platform can open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: str | os.PathLike, value: Any) -> pathlib.Path:
    """`write_atomically` of ``value`` as indented strict JSON (NaN and inf become null; numpy values become lists and numbers)."""
    return write_atomically(path, (strict_json(value, indent=2) + "\n").encode())


def _finite_or_none(value: Any) -> Any:
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy scalars, arrays
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def strict_json(value: Any, **dumps_kwargs: Any) -> str:
    """JSON that every parser accepts: non-finite floats become ``null``."""
    return json.dumps(_finite_or_none(value), allow_nan=False, **dumps_kwargs)


# --- creating and checking a run directory -----------------------------------


def unique_run_dir(root: str | os.PathLike, name: str) -> pathlib.Path:
    """Create and return ``root/name``, or ``root/name-2``, ``-3``... if taken.

    ``mkdir`` without ``exist_ok`` is atomic, so two runs started in the same
    second (two CLI calls, a sweep) never share a directory.
    """
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 10_000):
        candidate = root / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise ConfigError(f"run_root={str(root)!r}: no free directory name for {name!r}")


def prepare_fresh(run_dir: pathlib.Path) -> None:
    """Create ``run_dir`` for a fresh run; refuse one that already holds anything (`check_fresh`)."""
    check_fresh(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)


def check_fresh(run_dir: pathlib.Path) -> None:
    """Raise `ConfigError` unless ``run_dir`` is missing or an empty directory.

    A fresh run into a used directory would mix its checkpoints and metrics
    with the old run's: resume that run instead, or choose another directory.
    """
    if run_dir.is_symlink() and not run_dir.exists():
        refuse_link(run_dir)
    if run_dir.exists():
        if not run_dir.is_dir():
            raise ConfigError(f"run_dir={str(run_dir)!r}: exists and is not a directory")
        # The lock file is its writer's (`ppo_async.runs.run_lock`), not a run file.
        entries = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_FILE)
        if entries:
            raise ConfigError(
                f"run_dir={str(run_dir)!r} is not empty ({', '.join(entries[:5])}"
                f"{', ...' if len(entries) > 5 else ''}): resume that run "
                f"(train(config, resume_from=...) or ppo-async train --resume "
                f"{run_dir}), or choose another directory"
            )


def remove_stale_temps(run_dir: pathlib.Path) -> list[pathlib.Path]:
    """Remove the temporary files a killed writer left in ``run_dir`` and its checkpoints.

    Returns the paths removed. Called when a run opens its directory for
    writing: one writer per run directory, so any temporary file there is a
    dead write's.
    """
    removed = []
    for directory in (run_dir, run_dir / CHECKPOINT_SUBDIR):
        if directory.is_symlink() or not directory.is_dir():
            continue
        for path in directory.iterdir():
            if is_temp_file(path.name) and (path.is_symlink() or path.is_file()):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def checkpoint_dir(run_dir: pathlib.Path) -> pathlib.Path:
    """``run_dir/checkpoints``, refused if it is a link."""
    path = run_dir / CHECKPOINT_SUBDIR
    refuse_link(path)
    return path


# --- provenance and segments ------------------------------------------------


def _git_commit() -> str | None:
    """The commit of the source tree the package was imported from, if it is a git checkout."""
    package_dir = pathlib.Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(package_dir), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(package_dir), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, timeout=5, check=False,
    ).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def provenance() -> dict[str, Any]:
    """Where and how this process runs: versions, commit, command line, devices, time."""
    import importlib.metadata

    import jax

    try:
        version = importlib.metadata.version("ppo-async")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "package_version": version,
        "git_commit": _git_commit(),
        "command_line": [sys.executable, *sys.argv],
        "python": sys.version.split()[0],
        "jax_version": jax.__version__,
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(device) for device in jax.devices()],
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def read_segments(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    """The segments recorded so far (an empty list for a fresh directory)."""
    path = run_dir / SEGMENTS_FILE
    if not path.is_file():
        return []
    try:
        segments = json.loads(read_bounded(path, MAX_RECORD_BYTES))
    except ValueError as error:
        raise ConfigError(f"{path}: not valid JSON ({error}); the run directory is damaged") from None
    if not isinstance(segments, list):
        raise ConfigError(f"{path}: expected a list of segments")
    return segments


def record_segment(
    run_dir: pathlib.Path, config: AsyncActorLearnerConfig, *, start_update: int,
    start_env_steps: int, resumed_from: str | None,
) -> list[dict[str, Any]]:
    """Write ``config.json`` and append this segment to ``segments.json``; returns the segments."""
    segments = read_segments(run_dir)
    segments.append({
        "segment": len(segments),
        "start_update": start_update,
        "start_env_steps": start_env_steps,
        "resumed_from_checkpoint": resumed_from,
        "config": config.to_dict(),
        "provenance": provenance(),
    })
    write_json(run_dir / CONFIG_FILE, config.to_dict())
    write_json(run_dir / SEGMENTS_FILE, segments)
    return segments


def append_to_log(run_dir: pathlib.Path, text: str) -> pathlib.Path:
    """Append ``text`` to ``RUN_DIR/log.txt`` in one write, never through a link."""
    path = run_dir / LOG_FILE
    refuse_link(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return path


# --- metrics.jsonl ------------------------------------------------------------


class MetricsFile:
    """``metrics.jsonl``: opened for appending without following links, one line per update."""

    def __init__(self, run_dir: pathlib.Path):
        self.path = run_dir / METRICS_FILE
        refuse_link(self.path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as error:
            raise RunFileError.of(self.path, error) from error

    def write(self, metrics: Mapping[str, Any]) -> None:
        """Append one line; `RunFileError` if the disk refuses it (a short write included)."""
        # One write of one whole line: a crash leaves whole lines (at most the last one cut).
        line = (strict_json(metrics) + "\n").encode()
        try:
            written = os.write(self._fd, line)
            while written < len(line):  # a full disk, or a file-size limit, takes a part
                written += os.write(self._fd, line[written:])
        except OSError as error:
            raise RunFileError.of(self.path, error) from error

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError as error:
                raise RunFileError.of(self.path, error) from error


def cut_metrics_after(run_dir: pathlib.Path, update: int) -> int:
    """Drop the lines of ``metrics.jsonl`` past ``update`` (and any cut-off line); lines kept.

    A run resumed from the checkpoint of update ``update`` repeats the updates
    after it, so their old lines would appear twice.
    """
    path = run_dir / METRICS_FILE
    refuse_link(path)
    if not path.is_file():
        return 0
    kept = [line for _, line, record in metrics_lines(path)
            if record is not None and isinstance(record.get("update"), int)
            and record["update"] <= update]
    write_atomically(path, "".join(line + "\n" for line in kept).encode())
    return len(kept)


def metrics_lines(path: pathlib.Path) -> list[tuple[int, str | None, dict[str, Any] | None]]:
    """``(line number, line, record)`` of each non-blank line of a ``metrics.jsonl``.

    ``record`` is None for a line that is not a JSON object (one cut by a
    crash, or damaged); ``line`` is None too for one over
    `MAX_METRICS_LINE_BYTES`, which is passed over without being held whole.
    Line numbers count from 1.
    """
    lines: list[tuple[int, str | None, dict[str, Any] | None]] = []
    with open(path, "rb") as file:
        for number, raw in enumerate(iter(lambda: file.readline(MAX_METRICS_LINE_BYTES + 1), b""),
                                     start=1):
            if len(raw) > MAX_METRICS_LINE_BYTES:
                while raw and not raw.endswith(b"\n"):  # the rest of it, a bounded piece at a time
                    raw = file.readline(MAX_METRICS_LINE_BYTES)
                lines.append((number, None, None))
                continue
            line = raw.decode(errors="replace").rstrip("\r\n")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            lines.append((number, line, record if isinstance(record, dict) else None))
    return lines


def read_bounded(path: pathlib.Path, limit: int) -> str:
    """``path``'s text; `ConfigError` giving both sizes, without reading it, if it is over ``limit`` bytes."""
    size = path.stat().st_size
    if size > limit:
        raise ConfigError(f"{path} is {size} bytes, more than the {limit} such a file can hold "
                          "(a run writes a few KB): damaged, or not a run's file")
    return path.read_text()


def read_config_fields(run_dir: pathlib.Path) -> dict[str, Any] | None:
    """The JSON object in ``run_dir``'s ``config.json``; None if there is none.

    Raises `ConfigError` naming the file when it is not valid JSON (cut by a
    crash) or not an object of fields.
    """
    path = pathlib.Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        fields = json.loads(read_bounded(path, MAX_CONFIG_BYTES))
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(fields, dict):
        raise ConfigError(f"{path}: expected a JSON object of config fields, "
                          f"found {type(fields).__name__}")
    return fields
