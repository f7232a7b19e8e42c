"""One member of a population: a normal run directory trained in segments, as a Tune trainable.

`member_segments` is the Tune function trainable. Each segment continues the
member's run directory (`ppo_async.train.train` resuming from its newest
checkpoint) for ``interval_updates`` updates with the explored fields Tune
gives, reports the training return, and hands Tune a checkpoint: the run's
newest checkpoint file (`ppo_async.resume`: params, optimizer state,
normalization statistics, the learning-rate schedule's position, env carries)
and ``member.json`` (whose it is, at which update). When Tune starts a member
from a checkpoint (`adopt_checkpoint`) -- a donor's on exploit, its own after a
failure or a rerun -- that file becomes the run's newest checkpoint, and the
run resumes from it with the fields Tune gives.

Each segment that ends appends a line to ``RUN_DIR/pbt_schedule.jsonl``: the
update and env steps it started at, the update it ended at, the explored
fields it trained with, and how it began (``start``, ``continue``, ``exploit``
with the donor, ``resume``: its own checkpoint after a pause, a failure or a rerun).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ppo_async.runs.checkpoint import checkpoint_path, list_checkpoints
from ppo_async.runs.run_dir import (
    PARAMS_FILE,
    SUMMARY_FILE,
    checkpoint_dir,
    strict_json,
    write_atomically,
)

SCHEDULE_FILE = "pbt_schedule.jsonl"
MEMBER_FILE = "member.json"  # in a Tune checkpoint: whose checkpoint it is
MEMBER_PREFIX = "member_"


def member_name(index: int) -> str:
    """The run directory's (and the Tune trial's) name of member ``index``: ``member_0``."""
    return f"{MEMBER_PREFIX}{index}"


def member_index(name: str) -> int:
    return int(name[len(MEMBER_PREFIX):])


class SegmentStart(NamedTuple):
    """How a segment began (a line of ``pbt_schedule.jsonl``)."""

    source: str  # start | continue | exploit | resume
    donor: str | None  # exploit: the member whose checkpoint was copied
    env_steps: int  # env steps at the checkpoint it starts from


def checkpoint_step(path: pathlib.Path) -> int:
    return int(path.stem.split("_")[1])


def newest_update(run_dir: pathlib.Path) -> int:
    """The update of the run's newest checkpoint (0: none)."""
    directory = run_dir / "checkpoints"
    files = list_checkpoints(directory) if directory.is_dir() else []
    return max((checkpoint_step(p) for p in files), default=0)


def read_schedule(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    """The lines of a member's ``pbt_schedule.jsonl`` (empty before its first segment)."""
    path = pathlib.Path(run_dir) / SCHEDULE_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _append_schedule(run_dir: pathlib.Path, line: Mapping[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / SCHEDULE_FILE, "a") as file:  # one write of a whole line, like metrics
        file.write(strict_json(line) + "\n")


def _drop_final_files(run_dir: pathlib.Path) -> None:
    """A segment's ``params.msgpack`` and ``summary.json`` say the run finished: only the last may."""
    for name in (PARAMS_FILE, SUMMARY_FILE):
        (run_dir / name).unlink(missing_ok=True)


def adopt_checkpoint(run_dir: pathlib.Path, tune_dir: pathlib.Path, name: str) -> SegmentStart:
    """Make the checkpoint Tune restores (``tune_dir``) the run's newest.

    The member's own (a failure, a rerun): its checkpoints after that one are
    dropped, since Tune continues from what it was last told. A donor's
    (exploit): every checkpoint of the member's own line is dropped, so that
    the run resumes from the donor's learner state.
    """
    meta = json.loads((tune_dir / MEMBER_FILE).read_text())
    # By name: Tune may report a restored member's checkpoints into a directory it already
    # used (seen with Ray 2.60 after an exploit), so it can hold older files beside this one.
    saved = tune_dir / checkpoint_path(tune_dir, meta["updates"]).name
    own = meta["member"] == name
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    for path in list_checkpoints(directory):
        if not own or checkpoint_step(path) > meta["updates"]:
            path.unlink()
    write_atomically(directory / saved.name, saved.read_bytes())
    _drop_final_files(run_dir)
    if own:
        return SegmentStart("resume", None, meta["env_steps"])
    return SegmentStart("exploit", meta["member"], meta["env_steps"])


def _report(tune: Any, run_dir: pathlib.Path, name: str, result: Any,
            fields: Mapping[str, Any]) -> None:
    """Tell Tune the segment's return and hand it the run's newest checkpoint."""
    report = result.report
    updates = report.updates
    newest = checkpoint_dir(run_dir) / f"ckpt_{updates:09d}.msgpack"
    ret = report.episode_return_mean
    # Not the explored fields: they are the trial's config, which Tune's table shows already.
    metrics = {"episode_return": float(ret) if ret == ret else float("-inf"),  # NaN: none yet
               "env_steps": report.env_steps, "updates": updates}
    with tempfile.TemporaryDirectory(prefix="ppo-pbt-") as temp:
        shutil.copyfile(newest, pathlib.Path(temp) / newest.name)
        (pathlib.Path(temp) / MEMBER_FILE).write_text(json.dumps(
            {"member": name, "updates": updates, "env_steps": report.env_steps,
             "fields": dict(fields)}))
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(temp))


def _stop_at(update: int) -> Callable[[dict[str, float]], None]:
    from ppo_async.runtime.learner import StopTraining

    def on_update(metrics: dict[str, float]) -> None:
        if metrics["update"] >= update:
            raise StopTraining

    return on_update


def member_segments(tune_config: dict[str, Any], *, table: dict[str, Any], out: str,
                    hook: Callable[[str, int], None] | None = None) -> None:
    """Tune's function trainable: train one member in segments of ``interval_updates``.

    ``tune_config`` holds the explored fields (Tune's PBT changes them between
    restarts); ``table`` is the population's spec (`PBTSpec.to_table`); ``out``
    the population directory. ``hook(name, update)``, if given, is called as
    each segment starts (tests inject failures with it).
    """
    from ray import tune

    from ppo_async.pbt.spec import load_pbt
    from ppo_async.train import train

    spec = load_pbt(table)
    name = tune.get_context().get_trial_name()
    run_dir = pathlib.Path(out) / name
    fields = {field: tune_config[field] for field in spec.explored()}
    config = spec.member_config(member_index(name), fields)
    start = SegmentStart("start", None, 0)
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as tune_dir:
            start = adopt_checkpoint(run_dir, pathlib.Path(tune_dir), name)
    elif run_dir.exists():  # a restart before the first report: Tune holds nothing to continue
        shutil.rmtree(run_dir)
    while True:
        updates = newest_update(run_dir)
        if updates >= config.num_updates:  # restored at its end: nothing is left to train
            return
        if hook is not None:
            hook(name, updates)
        end = min(updates + spec.interval_updates, config.num_updates)
        result = train(config, run_dir=run_dir, resume_from=run_dir if updates else None,
                       progress=False, on_update=_stop_at(end))
        _append_schedule(run_dir, {"update": updates, "end_update": result.report.updates,
                                   **start._asdict(), "fields": fields})
        if result.report.updates < config.num_updates:
            _drop_final_files(run_dir)
        _report(tune, run_dir, name, result, fields)
        if result.report.updates >= config.num_updates:
            return
        start = SegmentStart("continue", None, result.report.env_steps)

