"""One writer per run directory (`ppo_async.runs.run_lock`), between real processes."""

import os
import signal
import time

import pytest

from ppo_async.runs.run_lock import LOCK_FILE, RunDirectoryBusy, RunLock

from run_helpers import held_by_another_process

def test_a_second_writer_is_refused_at_once_naming_the_holder(tmp_path):
    with held_by_another_process(tmp_path) as holder:
        start = time.monotonic()
        with pytest.raises(RunDirectoryBusy, match=rf"being written by process {holder.pid} "):
            RunLock(tmp_path).acquire()
        assert time.monotonic() - start < 1.0  # refused, not waited for
        assert (tmp_path / LOCK_FILE).read_text().split()[0] == str(holder.pid)
    # The holder ended: its lock file is gone, and the directory is free.
    assert list(tmp_path.iterdir()) == []
    with RunLock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text().split()[0] == str(os.getpid())
    assert list(tmp_path.iterdir()) == []


def test_the_lock_of_a_killed_writer_is_taken_over(tmp_path):
    with held_by_another_process(tmp_path) as holder:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    assert (tmp_path / LOCK_FILE).read_text().split()[0] == str(holder.pid)  # left behind
    lock = RunLock(tmp_path)
    lock.acquire()  # the kernel dropped the dead process's lock
    lock.acquire()  # held already: nothing to do
    assert lock.held and (tmp_path / LOCK_FILE).read_text().split()[0] == str(os.getpid())
    lock.release()
    lock.release()
    assert not lock.held and list(tmp_path.iterdir()) == []


def test_a_lock_file_that_is_a_link_is_refused(tmp_path):
    from ppo_async.config import ConfigError

    (tmp_path / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="symbolic link"):
        RunLock(tmp_path).acquire()
    assert not (tmp_path / "elsewhere").exists()
