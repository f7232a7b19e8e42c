"""The freeze watchdog: a learner that cannot run ends the process, with every thread's stack.

A thread actor whose env spins in C while holding the GIL (a ``step`` that
calls ``sum(range(10**15))``) stops every other Python thread: the learner
cannot raise `LearnerTimeoutError`, and Ctrl-C, whose Python handler never
runs, is ignored. `faulthandler.dump_traceback_later` runs in a C thread that
needs no GIL. Armed when a run with thread actors starts and re-armed by the
learner on every wait and every update (`FreezeWatchdog.heartbeat`), it fires
only when the learner has not come round for ``2 x learner_timeout_s``
(``learner_timeout_s`` is how long it waits for a silent actor, so a learner
that can run has raised by then). It then writes every thread's stack and ends
the process with exit status 1; checkpoints already written stay.

Until the run's first update is done, the allowance is
``_START_UP_S + 2 x learner_timeout_s``: compiling the update can take
minutes, and the learner does not come round while it compiles.

Where the dump goes: faulthandler writes to one file descriptor, and nothing
that needs the GIL can run when it fires. The descriptor is a pipe to a tiny
``sh`` relay (a process, started with the run) that keeps what it is sent and,
only if a dump arrives, writes it to stderr and to ``RUN_DIR/error.txt``
(with a run directory), after the one-line explanation and the names of the
threads sent when the actors started or restarted (faulthandler names threads by
id only). A run that ends normally closes the pipe, and the relay exits without a
word. Where there is no ``sh``, the dump goes straight to stderr, without
the explanation.

A process has one such timer: a run arms it only when no other run of this
process holds it, and ``freeze_watchdog=False`` leaves it alone (for a
program that sets its own). Ray actors are processes, which the learner kills
and restarts, so a Ray run never arms it.
"""

from __future__ import annotations

import faulthandler
import os
import pathlib
import shutil
import subprocess
import threading
import time

from ppo_async.config import AsyncActorLearnerConfig

_START_UP_S = 600.0  # as long as train waits for the update's compile
_REARM_FRACTION = 0.05  # re-arm when this much of the allowance is gone: it fires within 95-100%

# Keeps what it is sent; prints it only if faulthandler's dump ("Timeout (h:mm:ss)!") came.
_RELAY = r"""
dump=$(cat)
case "$dump" in *"Timeout ("*) ;; *) exit 0 ;; esac
if [ -n "$1" ]; then printf '%s\n' "$dump" | tee -a "$1" >&2; else printf '%s\n' "$dump" >&2; fi
"""

_owner_lock = threading.Lock()
_owner: FreezeWatchdog | None = None  # the run of this process that holds the timer


def explanation(timeout_s: float, run_dir: pathlib.Path | None) -> str:
    """The line that comes before the dump: what happened, what stays, what to do."""
    kept = (f"; {run_dir} keeps its checkpoints: resume with ppo-async train --resume {run_dir}"
            if run_dir is not None else "")
    return (
        f"ppo-async: the learner could not run for {timeout_s:g} s (2 x learner_timeout_s): a "
        "thread holds Python's GIL and does not let go (an env stepping in C code that never "
        "returns?), so no Python runs, not even Ctrl-C. Every thread's stack follows, newest "
        "call first: the stuck actor's ends in its env's step (actor threads are named below). "
        f"The process exits with status 1{kept}. With actor_backend='processes' or 'ray' each "
        "actor is a process, which is killed and restarted instead."
    )


class FreezeWatchdog:
    """One run's faulthandler timer (see the module docstring); `close` it on every way out."""

    def __init__(self, timeout_s: float, start_up_s: float, start_updates: int,
                 header: str, error_file: pathlib.Path | None):
        self.timeout_s = timeout_s
        self._allowance_s = start_up_s
        self._start_updates, self._starting = start_updates, True
        self._armed_at = 0.0
        self._fd, self._relay = _start_relay(error_file)
        if self._relay is not None:
            self._send(header)

    @classmethod
    def for_run(cls, config: AsyncActorLearnerConfig, run_dir: pathlib.Path | None,
                start_updates: int, error_file: pathlib.Path | None = None
                ) -> FreezeWatchdog | None:
        """The armed watchdog of a run with thread actors; None for processes, when disabled, or taken.

        ``error_file``: where the stacks of a frozen run are written (``RUN_DIR/error.txt``).
        """
        global _owner
        if config.actor_backend != "threads" or not config.freeze_watchdog:
            return None
        timeout_s = 2 * config.learner_timeout_s
        with _owner_lock:
            if _owner is not None:
                return None
            _owner = cls(timeout_s, _START_UP_S + timeout_s, start_updates,
                         explanation(timeout_s, run_dir),
                         error_file)
            _owner._arm(time.monotonic())
            return _owner

    def _send(self, line: str) -> None:
        try:
            os.write(self._fd, (line + "\n").encode())
        except OSError:  # the relay is gone (killed with its session): the dump has no reader
            pass

    def _arm(self, now: float) -> None:
        faulthandler.dump_traceback_later(self._allowance_s, exit=True, file=self._fd)
        self._armed_at = now

    def name_threads(self) -> None:
        """Tell the relay the name of each thread (a dump shows only their ids)."""
        if self._relay is not None:
            names = ", ".join(f"{t.name} is Thread 0x{t.ident:016x}" for t in threading.enumerate()
                              if t.ident is not None)
            self._send(f"ppo-async: threads: {names}")

    def heartbeat(self, updates: int) -> None:
        """The learner came round (``updates`` done so far); the first update ends the start-up.

        Re-arming starts a C thread, so it happens only once 5% of the
        allowance has gone (and at the first update); otherwise this is a
        clock read and a comparison.
        """
        now = time.monotonic()
        if self._starting and updates != self._start_updates:
            self._starting, self._allowance_s = False, self.timeout_s
        elif now - self._armed_at < self._allowance_s * _REARM_FRACTION:
            return
        self._arm(now)

    def allow(self, seconds: float) -> None:
        """Re-arm for ``seconds`` (the run's shutdown, which joins threads, may take that long)."""
        self._allowance_s = seconds
        self._arm(time.monotonic())

    def close(self) -> None:
        """Cancel the timer, let the relay end (it says nothing), release the process's timer."""
        global _owner
        faulthandler.cancel_dump_traceback_later()
        if self._relay is not None:
            os.close(self._fd)
            try:
                self._relay.wait(timeout=5.0)
            except subprocess.TimeoutExpired:  # a forked child still holds the pipe open
                self._relay.kill()
                self._relay.wait(timeout=5.0)
        with _owner_lock:
            if _owner is self:
                _owner = None


def _start_relay(error_file: pathlib.Path | None) -> tuple[int, subprocess.Popen | None]:
    """(the fd faulthandler writes to, the relay process): a pipe to ``sh``, else stderr's fd."""
    shell = shutil.which("sh")
    if shell is None:
        return 2, None
    read_fd, write_fd = os.pipe()  # not inheritable: no other child keeps the relay waiting
    try:
        relay = subprocess.Popen(
            [shell, "-c", _RELAY, "relay", str(error_file) if error_file is not None else ""],
            # A session of its own: Ctrl-C at the terminal, which a frozen run ignores,
            # must not end the reader of the dump that follows.
            stdin=read_fd, stdout=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        os.close(write_fd)
        return 2, None
    finally:
        os.close(read_fd)
    return write_fd, relay
