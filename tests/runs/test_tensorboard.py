"""TensorBoard event files beside metrics.jsonl: one event per update, the same scalars.

The files are read back with a TFRecord reader written here from the format
(length, masked CRC-32C of the length, payload, masked CRC-32C of the payload)
and tensorboardX's own protos, so a file TensorBoard would reject as corrupt
fails the test; tensorboardX itself has no reader, and tensorboard is not a
dependency.
"""

import json
import struct
import sys
import threading
import time

import numpy as np
import pytest

from ppo_async import AsyncActorLearnerConfig, train
from ppo_async.runs.run_log import RunLog

tensorboardX = pytest.importorskip("tensorboardX")
from tensorboardX.proto.event_pb2 import Event  # noqa: E402
from tensorboardX.record_writer import masked_crc32c  # noqa: E402

TINY = AsyncActorLearnerConfig(
    num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=1, num_minibatches=2,
    total_env_steps=64,
)


def read_scalar_events(path) -> list[tuple[int, dict[str, float]]]:
    """(step, {tag: value}) of each event in ``path`` that holds a summary."""
    raw, offset, events = path.read_bytes(), 0, []
    while offset < len(raw):
        header = raw[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", raw[offset + 8:offset + 12])
        assert header_crc == masked_crc32c(header), f"{path}: bad length CRC at byte {offset}"
        payload = raw[offset + 12:offset + 12 + length]
        (payload_crc,) = struct.unpack("<I", raw[offset + 12 + length:offset + 16 + length])
        assert payload_crc == masked_crc32c(payload), f"{path}: bad payload CRC at byte {offset}"
        offset += 16 + length
        event = Event.FromString(payload)
        if event.HasField("summary"):
            events.append((event.step, {v.tag: v.simple_value for v in event.summary.value}))
    return events


def test_a_run_writes_one_event_per_metrics_line_with_the_same_scalars(tmp_path):
    train(TINY, run_dir=tmp_path, progress=False)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (events_file,) = tmp_path.glob("events.out.tfevents.*")
    events = read_scalar_events(events_file)

    assert len(lines) == TINY.num_updates == 2
    assert [step for step, _ in events] == [line["env_steps"] for line in lines]
    for (_, scalars), line in zip(events, lines):
        assert set(scalars) == set(line)
        tags = sorted(line)
        # simple_value is float32; episode_return is NaN before any episode ends.
        np.testing.assert_allclose(
            [scalars[tag] for tag in tags], np.float32([line[tag] for tag in tags]),
            rtol=1e-6, equal_nan=True,
        )


def fake_metrics(update: int) -> dict[str, float]:
    return {"update": update, "env_steps": 32 * update, "env_steps_per_s": 1.0,
            "episode_return": 9.0, "policy_lag_max": 0}


def test_a_fresh_run_replaces_old_event_files_and_a_resumed_one_adds_a_file(tmp_path):
    def log_updates(updates, append):
        run_log = RunLog(TINY, tmp_path, progress=False, start_update=updates[0] - 1 if append else 0)
        for update in updates:
            run_log(fake_metrics(update))
        run_log.close()

    log_updates([1, 2], append=False)
    log_updates([1, 2, 3], append=False)
    (fresh,) = tmp_path.glob("events.out.tfevents.*")
    assert [step for step, _ in read_scalar_events(fresh)] == [32, 64, 96]

    log_updates([4], append=True)
    files = sorted(tmp_path.glob("events.out.tfevents.*"))
    assert len(files) == 2
    steps = sorted(step for path in files for step, _ in read_scalar_events(path))
    assert steps == [32, 64, 96, 128]


def test_without_tensorboardx_only_the_json_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import raises ImportError
    run_log = RunLog(TINY, tmp_path, progress=False)
    run_log(fake_metrics(1))
    run_log.close()
    assert not list(tmp_path.glob("events.out.tfevents.*"))
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1


def test_an_evaluation_is_a_line_and_an_event_at_the_update_it_evaluated(tmp_path):
    run_log = RunLog(TINY, tmp_path, progress=False)
    for update in (1, 2, 3):
        run_log(fake_metrics(update))
    evaluation = {"update": 2, "env_steps": 64, "eval_return_mean": 20.0, "eval_return_std": 1.5,
                  "eval_policy_version": 2}
    run_log.evaluation(evaluation)  # it finished after update 3
    run_log.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1] == evaluation and len(lines) == 4
    (events_file,) = tmp_path.glob("events.out.tfevents.*")
    assert read_scalar_events(events_file)[-1] == (
        64, {"eval_return_mean": 20.0, "eval_return_std": 1.5, "eval_policy_version": 2.0})


def block_the_writer_thread(monkeypatch, write):
    """Patch `EventFile._write` so that on the ``ppo-tensorboard`` thread it calls ``write``."""
    from ppo_async.runs.run_log import EventFile

    real = EventFile._write

    def patched(self, event):
        if threading.current_thread().name == "ppo-tensorboard":
            write()
        real(self, event)

    monkeypatch.setattr(EventFile, "_write", patched)


def test_an_event_file_that_never_closes_does_not_keep_the_run_from_its_checkpoint(
        tmp_path, monkeypatch):
    # A disk that stalls (or a writer stuck any other way) costs at most EVENTS_CLOSE_TIMEOUT_S.
    from ppo_async.runs import run_log

    release = threading.Event()
    block_the_writer_thread(monkeypatch, lambda: release.wait(60))
    monkeypatch.setattr(run_log, "EVENTS_CLOSE_TIMEOUT_S", 0.5)
    try:
        with pytest.warns(RuntimeWarning, match="thread ppo-tensorboard still writes"):
            result = train(TINY, run_dir=tmp_path, progress=False)
    finally:
        release.set()  # the stuck write returns, and the thread ends
    assert result.report.updates == TINY.num_updates
    assert list((tmp_path / "checkpoints").glob("ckpt_*.msgpack"))
    assert (tmp_path / "summary.json").is_file()
    for thread in threading.enumerate():
        if thread.name == "ppo-tensorboard":
            thread.join(timeout=10)


def test_a_failed_event_write_is_raised_by_the_next_update_or_warned_at_close(
        tmp_path, monkeypatch):
    def full_disk():
        raise OSError(28, "No space left on device")

    block_the_writer_thread(monkeypatch, full_disk)
    run_log = RunLog(TINY, tmp_path, progress=False)
    run_log(fake_metrics(1))
    run_log.events._thread.join(timeout=10)
    with pytest.raises(OSError, match=r"^writing \S+/events\.out\.tfevents\.\S+ failed: "
                                      r"\[Errno 28\] No space left on device$") as raised:
        run_log(fake_metrics(2))
    assert "No space left" in str(raised.value.__cause__)
    run_log.close()  # raised once: closing does not warn again
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2

    (tmp_path / "other").mkdir()
    other = RunLog(TINY, tmp_path / "other", progress=False)
    other(fake_metrics(1))
    with pytest.warns(RuntimeWarning, match="No space left"):
        other.close()


def test_events_reach_the_file_while_the_run_goes_on(tmp_path, monkeypatch):
    # A live TensorBoard reads the file as it grows: the writer flushes every EVENTS_FLUSH_S.
    from ppo_async.runs import run_log

    monkeypatch.setattr(run_log, "EVENTS_FLUSH_S", 0.05)
    log = RunLog(TINY, tmp_path, progress=False)
    try:
        log(fake_metrics(1))
        (events_file,) = tmp_path.glob("events.out.tfevents.*")
        deadline = time.monotonic() + 10
        while not read_scalar_events(events_file) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [step for step, _ in read_scalar_events(events_file)] == [32]
    finally:
        log.close()
