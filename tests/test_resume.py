"""Checkpoints inside train(): resume, kill -9, NaN, damaged files, bad resumes."""

import contextlib
import dataclasses
import errno
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import flax.serialization
import numpy as np
import pytest

from run_helpers import held_by_another_process, interrupt_at
from ppo_async import AsyncActorLearnerConfig, ConfigError, NonFiniteError, train
from ppo_async.runs.checkpoint import CheckpointWarning, list_checkpoints

LOCK_STEP = AsyncActorLearnerConfig(
    num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=1, num_minibatches=2,
    total_env_steps=2 * 2 * 8 * 10, max_lead_steps=8, checkpoint_every_updates=3,
    keep_checkpoints=2, seed=4,
)


@pytest.mark.parametrize("batch_inference", [None, True], ids=["actor-threads", "one-group"])
def test_lock_step_resume_is_byte_identical_to_an_uninterrupted_run(tmp_path, batch_inference):
    # True: both actors' chunks are one call from one thread, which resumes each from its carry.
    config = dataclasses.replace(LOCK_STEP, batch_inference=batch_inference)
    whole = train(config, run_dir=tmp_path / "whole", progress=False)

    run_dir = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        train(config, run_dir=run_dir, progress=False, on_update=interrupt_at(7))
    steps = [int(p.stem.split("_")[1]) for p in list_checkpoints(run_dir / "checkpoints")]
    assert steps == [6, 7]  # every 3 updates, and where it stopped; keep_checkpoints=2
    resumed = train(config, resume_from=run_dir, progress=False)

    assert resumed.report.updates == whole.report.updates == 10
    assert resumed.report.env_steps == whole.report.env_steps
    assert flax.serialization.to_bytes(resumed.params) == flax.serialization.to_bytes(whole.params)
    assert resumed.report.episode_return_mean == whole.report.episode_return_mean
    # The resumed run's metrics follow the first segment's, each update once.
    updates = [json.loads(line)["update"] for line in (run_dir / "metrics.jsonl").open()]
    assert updates == list(range(1, 11))


_KILLED_RUN = textwrap.dedent("""
    import dataclasses, sys
    from ppo_async import AsyncActorLearnerConfig, train
    config = AsyncActorLearnerConfig(
        num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=1, num_minibatches=2,
        total_env_steps=2 * 2 * 8 * 100_000, checkpoint_every_updates=5, seed=1)
    train(config, run_dir=sys.argv[1], progress=False)
""")


def test_a_killed_run_resumes_losing_at_most_one_checkpoint_interval(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, str(run_dir)], env=env)
    try:
        deadline = time.monotonic() + 240
        while len(list_checkpoints(run_dir / "checkpoints")) < 2:
            assert process.poll() is None, "the training process died on its own"
            assert time.monotonic() < deadline, "no second checkpoint within 240 s"
            time.sleep(0.2)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    done = len((run_dir / "metrics.jsonl").read_text().splitlines())
    newest = max(int(p.stem.split("_")[1]) for p in list_checkpoints(run_dir / "checkpoints"))
    assert newest >= 10 and done - newest <= 5

    config = AsyncActorLearnerConfig(
        num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=1, num_minibatches=2,
        total_env_steps=2 * 2 * 8 * (newest + 3), checkpoint_every_updates=5, seed=1)
    resumed = train(config, resume_from=run_dir, progress=False)
    assert resumed.report.updates == newest + 3
    assert resumed.report.env_steps == (newest + 3) * config.batch_size
    # The killed run's lines past its checkpoint were cut: each update once, in order.
    updates = [json.loads(line)["update"] for line in (run_dir / "metrics.jsonl").open()]
    assert updates == list(range(1, newest + 4))


def test_nan_stops_the_run_and_the_last_checkpoint_stays_loadable(tmp_path, monkeypatch):
    import importlib

    train_module = importlib.import_module("ppo_async.train")
    original_make = train_module.make_actor_program
    calls = {"n": 0}

    def make(config):
        program = original_make(config)

        def poisoned(params, carry):
            carry, trajectory, bootstrap_obs, bootstrap_value = program.rollout(params, carry)
            calls["n"] += 1
            if calls["n"] >= 2 * 8:  # both actors' 8th chunk onwards
                trajectory = trajectory._replace(reward=trajectory.reward * np.nan)
            return carry, trajectory, bootstrap_obs, bootstrap_value
        return program._replace(rollout=poisoned)

    monkeypatch.setattr(train_module, "make_actor_program", make)
    config = dataclasses.replace(LOCK_STEP, total_env_steps=LOCK_STEP.batch_size * 30)
    with pytest.raises(NonFiniteError, match=r"update \d+"):
        train(config, run_dir=tmp_path, progress=False)
    monkeypatch.undo()

    steps = [int(p.stem.split("_")[1]) for p in list_checkpoints(tmp_path / "checkpoints")]
    assert steps and max(steps) <= 8  # nothing written at or after the poisoned update
    finish = dataclasses.replace(config, total_env_steps=config.batch_size * (max(steps) + 2))
    resumed = train(finish, resume_from=tmp_path, progress=False)
    assert resumed.report.updates == max(steps) + 2
    assert all(np.isfinite(leaf).all() for leaf in _leaves(resumed.params))


def _leaves(tree):
    import jax
    return jax.tree.leaves(tree)


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        train(LOCK_STEP, run_dir=tmp_path, progress=False, on_update=interrupt_at(7))
    newest = list_checkpoints(tmp_path / "checkpoints")[-1]
    content = newest.read_bytes()
    newest.write_bytes(content[: len(content) // 2])
    with pytest.warns(CheckpointWarning, match=newest.name):
        resumed = train(LOCK_STEP, resume_from=tmp_path, progress=False)
    assert resumed.report.updates == 10
    segments = json.loads((tmp_path / "segments.json").read_text())
    assert segments[1]["start_update"] == 6  # the previous checkpoint
    assert segments[1]["resumed_from_checkpoint"].endswith("ckpt_000000006.msgpack")
    # Lines 7.. of the first segment were cut before the resumed run wrote its own.
    updates = [json.loads(line)["update"] for line in (tmp_path / "metrics.jsonl").open()]
    assert updates == list(range(1, 11))


def test_bad_resumes_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="resume_from"):
        train(LOCK_STEP, resume_from=tmp_path / "missing", progress=False)
    with pytest.raises(ConfigError, match="resume_from"):
        train(LOCK_STEP, resume_from=tmp_path, progress=False)  # exists, no checkpoint
    with pytest.raises(ConfigError, match="checkpoint_every_updates"):
        train(LOCK_STEP, progress=False)  # checkpoints without a run directory

    with pytest.raises(KeyboardInterrupt):
        train(LOCK_STEP, run_dir=tmp_path, progress=False, on_update=interrupt_at(4))
    wider = dataclasses.replace(LOCK_STEP, hidden_sizes=(32, 32))
    with pytest.raises(ConfigError, match="hidden_sizes"):
        train(wider, resume_from=tmp_path, progress=False)
    assert pathlib.Path(tmp_path / "checkpoints").is_dir()


SHORT = dataclasses.replace(LOCK_STEP, total_env_steps=LOCK_STEP.batch_size * 4,
                            checkpoint_every_updates=0)


def _rate_changes(caplog):
    return [r.getMessage() for r in caplog.records if "learning rate changes" in r.getMessage()]


def _params_moved(before, after):
    return any(not np.array_equal(a, b) for a, b in zip(_leaves(before), _leaves(after)))


def test_extending_a_finished_run_re_plans_the_learning_rate_and_trains(tmp_path, caplog):
    finished = train(SHORT, run_dir=tmp_path, progress=False)
    longer = dataclasses.replace(SHORT, total_env_steps=SHORT.batch_size * 8)
    seen = []
    with caplog.at_level(logging.WARNING, logger="ppo_async.resume"):
        extended = train(longer, resume_from=tmp_path, progress=False, on_update=seen.append)
    # Update u starts at optimizer step 2 (u - 1) of 16: the schedule of a run
    # planned for 8 updates from the start, not the finished run's rate of 0.
    rates = [m["learning_rate"] for m in seen]
    assert rates == pytest.approx([longer.learning_rate * (1 - u / 8) for u in range(4, 8)],
                                  rel=1e-6)
    assert min(rates) > 0
    assert all(m["approx_kl"] > 0 for m in seen)
    assert _params_moved(finished.params, extended.params)
    (line,) = _rate_changes(caplog)
    assert "optimizer step 8: the learning rate changes from 0 to 0.00025" in line


def test_anneal_lr_may_be_switched_on_resume(tmp_path, caplog):
    constant = dataclasses.replace(SHORT, anneal_lr=False)
    first = train(constant, run_dir=tmp_path, progress=False)
    seen = []
    annealed = dataclasses.replace(constant, anneal_lr=True, total_env_steps=SHORT.batch_size * 8)
    with caplog.at_level(logging.WARNING, logger="ppo_async.resume"):
        second = train(annealed, resume_from=tmp_path, progress=False, on_update=seen.append)
    assert [m["learning_rate"] for m in seen] == pytest.approx(
        [SHORT.learning_rate * (1 - u / 8) for u in range(4, 8)], rel=1e-6)
    assert _params_moved(first.params, second.params)
    seen.clear()
    constant_again = dataclasses.replace(constant, total_env_steps=SHORT.batch_size * 10)
    third = train(constant_again, resume_from=tmp_path, progress=False, on_update=seen.append)
    assert [m["learning_rate"] for m in seen] == pytest.approx([SHORT.learning_rate] * 2)
    assert all(m["approx_kl"] > 0 for m in seen) and _params_moved(second.params, third.params)
    assert len(_rate_changes(caplog)) == 2  # one line per resume that changed the rate


def test_a_resume_removes_the_temporary_files_a_killed_writer_left(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        train(LOCK_STEP, run_dir=tmp_path, progress=False, on_update=interrupt_at(7))
    checkpoints = tmp_path / "checkpoints"
    stale = [checkpoints / ".ckpt_x1y2.tmp",  # an older version's checkpoint temporary
             checkpoints / ".tmp-ckpt_000000008.msgpack.a1b2", tmp_path / ".tmp-params.msgpack.c3"]
    kept = [tmp_path / "notes.tmp", checkpoints / "README"]
    for path in stale + kept:
        path.write_bytes(b"partial")
    # The run's own budget: it ends at update 10 and writes its last checkpoint.
    train(LOCK_STEP, resume_from=tmp_path, progress=False)
    assert [p for p in stale if p.exists()] == []
    assert all(p.read_bytes() == b"partial" for p in kept)
    assert [p.name for p in list_checkpoints(checkpoints)] == [
        "ckpt_000000009.msgpack", "ckpt_000000010.msgpack"]


def test_resuming_a_host_env_run_starts_no_envs_for_its_checkpoint_template():
    """Host envs' carries are not saved: reading a checkpoint must not reset the program,
    which would start envs (and env worker processes, with shared memory) nothing closes."""
    from ppo_async.envs.backends import make_actor_program
    from ppo_async.resume import _carries_template

    config = AsyncActorLearnerConfig(env_id="gymnasium:CartPole-v1", num_actors=2,
                                     envs_per_actor=2, env_workers=1)

    def reset(key, device):
        raise AssertionError("the template reset the host program")

    program = make_actor_program(config)._replace(reset=reset)
    assert _carries_template(config, program, {"num_actors": 2, "envs_per_actor": 2}) == ()


def _snapshot(run_dir):
    return {str(p.relative_to(run_dir)): p.read_bytes()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_second_writer_of_a_run_directory_is_refused_and_changes_nothing(tmp_path, capsys):
    from ppo_async.runs.run_lock import RunDirectoryBusy
    from ppo_async.tools.cli import main

    run_dir, empty = tmp_path / "run", tmp_path / "empty"
    with pytest.raises(KeyboardInterrupt):
        train(LOCK_STEP, run_dir=run_dir, progress=False, on_update=interrupt_at(4))
    assert not (run_dir / ".lock").exists()  # released, and removed, when the run ended
    empty.mkdir()
    with held_by_another_process(run_dir) as holder, held_by_another_process(empty) as other:
        before = _snapshot(run_dir)
        with pytest.raises(RunDirectoryBusy, match=rf"being written by process {holder.pid} "):
            train(LOCK_STEP, resume_from=run_dir, progress=False)
        with pytest.raises(RunDirectoryBusy, match=rf"being written by process {other.pid} "):
            train(LOCK_STEP, run_dir=empty, progress=False)  # a fresh run into a held directory
        with pytest.raises(SystemExit) as info:
            main(["train", "--resume", str(run_dir), "--no-progress"])
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and line.startswith(
            f"ppo-async: run directory {run_dir} is being written by process {holder.pid} "), line
        assert _snapshot(run_dir) == before
        assert [p.name for p in empty.iterdir()] == [".lock"]
    # The holder gone, the run resumes where it was.
    assert train(LOCK_STEP, resume_from=run_dir, progress=False).report.updates == 10


def test_a_resume_of_a_run_that_is_training_is_refused_between_two_real_processes(tmp_path):
    cli = [sys.executable, "-m", "ppo_async.tools.cli", "train"]
    tiny = ["--num-actors", "2", "--envs-per-actor", "2", "--num-steps", "8", "--num-epochs",
            "1", "--num-minibatches", "2", "--no-progress"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    first = subprocess.Popen([*cli, *tiny, "--total-env-steps", str(32 * 100_000),
                              "--run-root", str(tmp_path)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("*/metrics.jsonl")) or (
                next(tmp_path.glob("*/metrics.jsonl")).read_text().count("\n") < 2):
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        (run_dir,) = tmp_path.iterdir()
        before = {name: (run_dir / name).read_bytes() for name in ("config.json", "segments.json")}
        second = subprocess.run([*cli, "--resume", str(run_dir), "--no-progress"], env=env,
                                capture_output=True, text=True, timeout=120)
        assert first.poll() is None  # the first writer goes on
        first.send_signal(signal.SIGINT)
        _, first_err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
    assert second.returncode == 2, second.stderr
    (line,) = second.stderr.strip().splitlines()
    assert f"is being written by process {first.pid} " in line, line
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert first.returncode == 130, first_err
    assert not (run_dir / "error.txt").exists() and not (run_dir / ".lock").exists()
    updates = [json.loads(line)["update"] for line in (run_dir / "metrics.jsonl").open()]
    assert updates == list(range(1, len(updates) + 1))


def test_a_huge_newest_checkpoint_or_params_file_is_passed_over_by_its_size(tmp_path, capsys):
    """Sparse 2 GiB files: read whole, each cost tens of seconds and GiBs; their size refuses them."""
    from ppo_async.resume import load_run_config, load_run_params
    from ppo_async.tools.cli import main

    huge = 2 << 30
    with pytest.raises(KeyboardInterrupt):
        train(LOCK_STEP, run_dir=tmp_path, progress=False, on_update=interrupt_at(7))
    newest = list_checkpoints(tmp_path / "checkpoints")[-1]
    os.truncate(newest, huge)
    capsys.readouterr()
    start = time.monotonic()
    main(["train", "--resume", str(tmp_path), "--no-progress"])
    assert time.monotonic() - start < 120  # the whole resumed run, compile included
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"ppo-async: warning: skipping unusable checkpoint {newest}: is "
                           f"{huge} bytes, where a checkpoint of this state would be "), line
    segments = json.loads((tmp_path / "segments.json").read_text())
    assert segments[1]["start_update"] == 6
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == [
        "ckpt_000000009.msgpack", "ckpt_000000010.msgpack"]  # the huge file pruned as later ones came

    params_file = tmp_path / "params.msgpack"
    os.truncate(params_file, huge)
    config = load_run_config(tmp_path)
    start = time.monotonic()
    params = load_run_params(tmp_path, config)
    assert time.monotonic() - start < 30 and params is not None
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"ppo-async: warning: {params_file} is {huge} bytes, where the params "
                           "of this run's network would be "), line
    assert line.endswith("using the params of the newest valid checkpoint, "
                         "ckpt_000000010.msgpack (update 10)"), line


# --- a run's writes that fail: one line, the traceback kept, the newest checkpoint whole ---

CLI_RUN = ["--num-actors", "2", "--envs-per-actor", "2", "--num-steps", "8", "--num-epochs", "1",
           "--num-minibatches", "2", "--checkpoint-every-updates", "3", "--total-env-steps",
           str(32 * 10), "--no-progress"]


def _fail_writes(monkeypatch, *names, errno_=errno.ENOSPC):
    """Writes to files whose path holds one of ``names`` fail as on a full disk: their fsync
    (every whole file, `write_atomically`) and ``os.write`` (each line of ``metrics.jsonl``)."""
    real_fsync, real_write = os.fsync, os.write

    def refuse(fd):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if any(name in path for name in names):
            raise OSError(errno_, os.strerror(errno_))

    def fsync(fd):
        refuse(fd)
        return real_fsync(fd)

    def write(fd, data):
        refuse(fd)
        return real_write(fd, data)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("failing, resumable", [
    ("checkpoints/.tmp-ckpt_000000006", True),  # the second checkpoint, mid-run
    ("metrics.jsonl", True),  # the first update's line: the run checkpoints it as it stops
    ("segments.json", False),  # as the run starts, before any checkpoint
    ("params.msgpack", True),  # at the end, after the final checkpoint
    ("summary.json", True),
])
def test_a_failed_write_ends_the_run_in_one_line_naming_the_file_and_errno(
        tmp_path, capsys, monkeypatch, failing, resumable):
    from ppo_async.tools.cli import main

    _fail_writes(monkeypatch, failing)
    with pytest.raises(SystemExit) as info:
        main(["train", *CLI_RUN, "--run-root", str(tmp_path)])
    monkeypatch.undo()
    (run_dir,) = tmp_path.iterdir()
    (line,) = capsys.readouterr().err.strip().splitlines()
    name = failing.replace(".tmp-", "") + (".msgpack" if "ckpt" in failing else "")
    expected = (f"ppo-async: writing {run_dir / name} failed: [Errno 28] No space left on device "
                f"(traceback in {run_dir / 'error.txt'})")
    resume = f"; resume with: ppo-async train --resume {run_dir}"
    assert info.value.code == 1 and line == expected + (resume if resumable else ""), line
    assert "Traceback" in (run_dir / "error.txt").read_text()
    assert not [p for p in run_dir.rglob(".tmp-*")]  # no temporary file left
    if "ckpt" in failing:  # the newest complete checkpoint is whole: the run resumes from it
        assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == [
            "ckpt_000000003.msgpack"]
        main(["train", "--resume", str(run_dir), "--no-progress"])
        updates = [json.loads(line)["update"] for line in (run_dir / "metrics.jsonl").open()]
        assert updates == list(range(1, 11))


def test_a_run_whose_traceback_cannot_be_kept_still_says_so_in_one_line(tmp_path, capsys,
                                                                        monkeypatch):
    from ppo_async.tools.cli import main

    _fail_writes(monkeypatch, "ckpt_000000006", "error.txt", errno_=errno.EROFS)
    with pytest.raises(SystemExit) as info:
        main(["train", *CLI_RUN, "--run-root", str(tmp_path)])
    monkeypatch.undo()
    (run_dir,) = tmp_path.iterdir()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 1 and line == (
        f"ppo-async: writing {run_dir / 'checkpoints' / 'ckpt_000000006.msgpack'} failed: "
        f"[Errno 30] Read-only file system (no traceback kept: writing {run_dir / 'error.txt'} "
        f"failed: [Errno 30] Read-only file system); resume with: ppo-async train --resume "
        f"{run_dir}"), line
    assert not (run_dir / "error.txt").exists()


_FILE_SIZE_LIMIT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails (EFBIG), not the process
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from ppo_async.tools.cli import main
main(sys.argv[2:])
"""


def test_a_file_size_limit_ends_a_real_run_in_one_line_with_the_checkpoint_whole(tmp_path):
    """``ulimit -f`` in a real process: the kernel refuses the checkpoint's bytes past the limit."""
    with pytest.raises(KeyboardInterrupt):
        train(LOCK_STEP, run_dir=tmp_path, progress=False, on_update=interrupt_at(4))
    newest = list_checkpoints(tmp_path / "checkpoints")[-1]
    kept = newest.read_bytes()
    limit = len(kept) // 2  # above every other file the run writes, below a checkpoint
    assert (tmp_path / "metrics.jsonl").stat().st_size * 3 < limit
    process = subprocess.run(
        [sys.executable, "-c", _FILE_SIZE_LIMIT, str(limit), "train", "--resume", str(tmp_path),
         "--no-progress"], capture_output=True, text=True, timeout=180)
    (line,) = process.stderr.strip().splitlines()
    assert process.returncode == 1, process.stderr
    assert line == (f"ppo-async: writing {tmp_path / 'checkpoints' / 'ckpt_000000006.msgpack'} "
                    f"failed: [Errno {errno.EFBIG}] {os.strerror(errno.EFBIG)} (traceback in "
                    f"{tmp_path / 'error.txt'}); resume with: ppo-async train --resume {tmp_path}")
    assert newest.read_bytes() == kept and not list(tmp_path.rglob(".tmp-*"))
    assert train(LOCK_STEP, resume_from=tmp_path, progress=False).report.updates == 10


@contextlib.contextmanager
def _tmpfs(path, size_bytes):
    """A tmpfs of ``size_bytes`` at ``path``, unmounted after (skipped where none can be mounted)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs",
                              str(path)], capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"this machine cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], timeout=30, check=False)


def test_a_full_and_a_read_only_disk_end_a_resume_in_one_line_and_it_resumes_after(
        tmp_path, capsys):
    from ppo_async.tools.cli import main

    with _tmpfs(tmp_path / "disk", 4 << 20) as disk:
        run_dir = disk / "run"
        with pytest.raises(KeyboardInterrupt):
            train(LOCK_STEP, run_dir=run_dir, progress=False, on_update=interrupt_at(4))
        newest = list_checkpoints(run_dir / "checkpoints")[-1]
        kept = newest.read_bytes()
        resume = f"; resume with: ppo-async train --resume {run_dir}"
        # Full: room for the log's lines, none for a checkpoint.
        stats = os.statvfs(disk)
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize - len(kept) // 2))
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            main(["train", "--resume", str(run_dir), "--no-progress"])
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 1, line
        assert line.startswith(f"ppo-async: writing {run_dir}") and line.endswith(resume), line
        assert "failed: [Errno 28] No space left on device (" in line, line
        assert newest.read_bytes() == kept
        filler.unlink()
        # Read-only: refused at the first write, the lock file.
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True, timeout=30)
        try:
            with pytest.raises(SystemExit) as info:
                main(["train", "--resume", str(run_dir), "--no-progress"])
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True, timeout=30)
        (line,) = capsys.readouterr().err.strip().splitlines()
        error_txt = run_dir / "error.txt"
        assert info.value.code == 1 and line == (
            f"ppo-async: writing {run_dir / '.lock'} failed: [Errno 30] Read-only file system "
            f"(no traceback kept: writing {error_txt} failed: [Errno 30] Read-only file system)"
            + resume), line
        assert newest.read_bytes() == kept
        main(["train", "--resume", str(run_dir), "--no-progress"])  # room again: it finishes
        updates = [json.loads(line)["update"] for line in (run_dir / "metrics.jsonl").open()]
        assert updates == list(range(1, 11))
