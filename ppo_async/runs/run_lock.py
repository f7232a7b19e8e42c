"""One writer per run directory: an OS file lock on ``RUN_DIR/.lock``, held for the writer's life.

A writer (``train``, ``--resume``, a sweep's or a population's member)
takes ``fcntl.flock`` on ``.lock`` before it writes anything, and the file
holds its PID and host, so a second writer is refused at once
(`RunDirectoryBusy`) naming who holds the directory. The kernel drops the
lock when its process dies, however it dies: a lock file a killed writer left
is taken over, never trusted. Readers (eval, enjoy, plot, analysis) take no
lock: every whole file is replaced atomically, so they never see a torn one.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import socket
import time

from ppo_async.errors import ConfigError, RunFileError

LOCK_FILE = ".lock"


class RunDirectoryBusy(ConfigError):
    """Another process is writing the run directory; nothing in it was changed."""


class RunLock:
    """The lock on one run directory. `acquire` takes it (again: a no-op); `release` drops it.

    Released, it removes ``.lock`` while still holding it, so a finished run
    leaves no file behind; a writer that opened the old file in that moment
    finds it gone once locked and opens the new one (`_open_locked`).
    """

    def __init__(self, run_dir: pathlib.Path):
        self.path = pathlib.Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise `RunDirectoryBusy` naming the holder (never waits)."""
        if self._fd is not None:
            return
        if self.path.is_symlink():
            raise ConfigError(f"{self.path} is a symbolic link; a run never writes through "
                              "links. Remove it, or choose another run directory.")
        try:
            self._fd = self._open_locked()
            # The holder's name, for the writer refused next: written only once it is ours.
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        except OSError as error:  # a read-only or full disk: the run could not write anyway
            self.release()
            raise RunFileError.of(self.path, error) from error

    def _open_locked(self) -> int:
        for _ in range(100):  # another writer may remove the file between our open and lock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise RunDirectoryBusy(
                    f"run directory {self.path.parent} is being written by {holder} (its "
                    f"{LOCK_FILE} is locked); one writer per run directory: wait for it to "
                    "end, or stop it, then run this again") from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path, follow_symlinks=False))
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)  # locked a file its holder had just removed: open the new one
        raise RunDirectoryBusy(f"run directory {self.path.parent}: its {LOCK_FILE} keeps being "
                               "replaced; another writer is starting and ending there")

    def release(self) -> None:
        """Remove ``.lock`` and drop the lock (a no-op when not held)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.unlink(self.path)
        except OSError:  # the directory went away or turned read-only: the lock goes anyway
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


def _holder(fd: int) -> str:
    """``process PID on HOST`` from a held lock file (its first 200 bytes)."""
    words: list[str] = []
    for _ in range(20):  # its holder writes the PID just after it takes the lock
        try:
            words = os.pread(fd, 200, 0).decode(errors="replace").split()
        except OSError:
            break
        if words:
            break
        time.sleep(0.01)
    if not words or not words[0].isdigit():
        return "another process (it has not written its PID yet)"
    host = f" on {words[1]}" if len(words) > 1 and words[1] != socket.gethostname() else ""
    return f"process {words[0]}{host}"
