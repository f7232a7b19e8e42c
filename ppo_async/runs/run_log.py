"""The per-update record of a run: ``metrics.jsonl``, TensorBoard events, W&B, a progress bar."""

from __future__ import annotations

import pathlib
import queue
import socket
import struct
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, TextIO

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.runs.run_dir import MetricsFile, RunFileError, cut_metrics_after
from ppo_async.runs.wandb_log import WandbRun, WandbSettings

# How long closing the TensorBoard event file may take before the run goes on without it.
EVENTS_CLOSE_TIMEOUT_S = 10.0
# Seconds between flushes of the event file, so a live TensorBoard keeps up.
EVENTS_FLUSH_S = 5.0

# Seconds between redraws of the text progress bar in a notebook without
# ipywidgets: each redraw is kept in the cell's output, so few of them.
NOTEBOOK_TEXT_REFRESH_S = 10.0
# Seconds between the plain progress lines written to a stderr that is not a terminal.
LOG_LINE_INTERVAL_S = 30.0


def _in_notebook() -> bool:
    """Running in a Jupyter kernel (where tqdm.auto would draw a widget)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


class ProgressLines:
    """Progress as plain lines: one every ``interval_s`` seconds, and one at the end.

    For a stderr that is a file or a pipe (``make train > log 2>&1``), where
    tqdm's carriage-return redraws, ten a second, would all be kept. It has
    the part of tqdm's interface that `RunLog` uses.
    """

    def __init__(self, total: int, initial: int, desc: str, file: TextIO | None = None,
                 interval_s: float = LOG_LINE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, unit: str = "update"):
        self.total, self.initial, self.n, self.desc = total, initial, initial, desc
        self.unit = unit
        self.file = sys.stderr if file is None else file
        self.interval_s, self.clock = interval_s, clock
        self.start = self.last_line_at = clock()
        self.last_line_n = initial
        self.postfix: dict[str, Any] = {}

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.clock() - self.last_line_at >= self.interval_s:
            self._write_line()

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        del refresh  # lines are written by time, not by new values
        self.postfix = values

    def close(self) -> None:
        if self.n > self.last_line_n:  # the end, unless the last line already showed it
            self._write_line()

    def _write_line(self) -> None:
        now = self.clock()
        elapsed, done = now - self.start, self.n - self.initial
        left = self.total - self.n
        eta = f", about {left * elapsed / done:.0f} s left" if done and left > 0 else ""
        values = "".join(f", {name}={value}" for name, value in self.postfix.items())
        percent = 100 * self.n / self.total if self.total else 100.0
        print(f"{self.desc}: {self.unit} {self.n}/{self.total} ({percent:.0f}%) after "
              f"{elapsed:.0f} s{eta}{values}", file=self.file, flush=True)
        self.last_line_at, self.last_line_n = now, self.n


def progress_bar(total: int, initial: int, desc: str, unit: str = "update"):
    """A tqdm bar: a widget in Jupyter with ipywidgets, plain text elsewhere.

    In a notebook without ipywidgets (tqdm.auto would warn and redraw text
    ten times a second, all of it kept in the cell's output), a text bar
    redrawn every `NOTEBOOK_TEXT_REFRESH_S` seconds. Outside a notebook, when
    stderr is not a terminal, `ProgressLines`.
    """
    from tqdm.std import tqdm as text_tqdm

    options = dict(total=total, initial=initial, unit="upd" if unit == "update" else unit,
                   desc=desc)
    if _in_notebook():
        try:
            import ipywidgets  # noqa: F401 - tqdm.notebook needs it
            from tqdm.notebook import tqdm as widget_tqdm

            return widget_tqdm(**options)
        except ImportError:  # no ipywidgets, or one tqdm cannot use ("IProgress not found")
            return text_tqdm(mininterval=NOTEBOOK_TEXT_REFRESH_S, **options)
    if not _is_terminal(sys.stderr):
        return ProgressLines(total, initial, desc, unit=unit)
    return text_tqdm(**options)


class EventFile:
    """A TensorBoard event file (``events.out.tfevents.*``) of scalar summaries.

    ``add`` only queues ``(wall time, step, [(tag, value), ...])``: a thread of
    this file's own (``ppo-tensorboard``) builds each event with tensorboardX's
    protos, frames it as a TFRecord (length, masked CRC-32C, payload, masked
    CRC-32C) and writes it, flushing at most every `EVENTS_FLUSH_S`, without
    fsync (tensorboardX's ``RecordWriter`` frames records the same way but
    fsyncs on every flush, hence the few lines of framing here). The caller
    pays one queue put, which a Ctrl-C cannot leave half done.

    tensorboardX's own ``FileWriter`` is not used: it hands events to its
    thread through a ``multiprocessing`` queue, fsyncs twice as it closes,
    joins that thread without a timeout and closes again at exit; after a
    Ctrl-C in the command line its close did not return within 10 s, and its
    exit hook printed a traceback. Here ``close`` waits at most
    `EVENTS_CLOSE_TIMEOUT_S` and then warns, naming the thread.
    """

    def __init__(self, run_dir: pathlib.Path, suffix: str = ""):
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.record_writer import masked_crc32c

        self._event, self._summary, self._crc = Event, Summary, masked_crc32c
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{suffix}"
        self.path = run_dir / name
        try:
            self._file = open(self.path, "wb")  # noqa: SIM115 (closed by the writer thread)
        except OSError as error:
            raise RunFileError.of(self.path, error) from error
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.failed: BaseException | None = None  # what stopped the writer thread
        self._reported = False
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self._thread = threading.Thread(target=self._write_queued, name="ppo-tensorboard",
                                        daemon=True)
        self._thread.start()

    def add(self, step: int, values: list[tuple[str, float]]) -> None:
        """Queue one event: ``values`` as scalars at ``step``, stamped with the time now.

        Raises what stopped the writer thread (a full disk), once, as a `RunFileError`.
        """
        if self.failed is not None and not self._reported:
            self._reported = True
            failed = (self.failed if isinstance(self.failed, OSError)
                      else OSError(None, f"{type(self.failed).__name__}: {self.failed}"))
            raise RunFileError.of(self.path, failed) from self.failed
        self._queue.put((time.time(), step, values))

    def _write(self, event) -> None:
        payload = event.SerializeToString()
        header = struct.pack("<Q", len(payload))
        self._file.write(header + struct.pack("<I", self._crc(header)) + payload
                         + struct.pack("<I", self._crc(payload)))

    def _write_queued(self) -> None:
        try:
            next_flush = time.monotonic() + EVENTS_FLUSH_S
            while True:
                try:
                    item = self._queue.get(timeout=max(next_flush - time.monotonic(), 0.0))
                except queue.Empty:
                    item = ()
                if item is None:
                    break
                if item:
                    wall_time, step, values = item
                    summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=value)
                                                   for tag, value in values])
                    self._write(self._event(wall_time=wall_time, step=step, summary=summary))
                if time.monotonic() >= next_flush:
                    self._file.flush()
                    next_flush = time.monotonic() + EVENTS_FLUSH_S
        except Exception as error:  # noqa: BLE001 - raised by the next add, or warned by close
            self.failed = error
        finally:
            try:
                self._file.close()
            except OSError as error:
                self.failed = self.failed or error

    def close(self) -> None:
        """Write what is queued and close the file, waiting at most `EVENTS_CLOSE_TIMEOUT_S`."""
        self._queue.put(None)
        self._thread.join(EVENTS_CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            warnings.warn(
                f"the TensorBoard event file was not written and closed within "
                f"{EVENTS_CLOSE_TIMEOUT_S:g} s (thread ppo-tensorboard still writes {self.path}); "
                "its last events may be missing, metrics.jsonl and the checkpoint are not "
                "affected", RuntimeWarning, stacklevel=3)
        elif self.failed is not None and not self._reported:
            warnings.warn(f"writing the TensorBoard event file {self.path} failed: "
                          f"{self.failed!r}; metrics.jsonl and the checkpoint are not affected",
                          RuntimeWarning, stacklevel=3)


class RunLog:
    """Writes each update's metrics dict where the run asked for it.

    With a run directory, each update becomes one strict-JSON line of
    ``metrics.jsonl`` (a NaN, e.g. the return before the first finished
    episode, is written as ``null``) and, when tensorboardX is importable
    (``pip install 'ppo-async[tb]'``; the ``dev`` extra has it), one
    TensorBoard event holding the same scalars under the same names, at step
    ``env_steps``, in an ``events.out.tfevents.*`` file beside it:
    ``tensorboard --logdir runs/`` shows every run. A periodic evaluation,
    which finishes updates after the one it evaluated, is logged by
    `evaluation` as a line and an event of its own.

    ``start_update`` is the update the run starts from: 0 for a fresh run
    (``metrics.jsonl`` and old event files are cleared), the checkpoint's
    update for a resumed one (lines past it are cut, so a resumed run never
    holds an update twice; a new event file is added beside the old ones).
    The progress bar counts from there too.

    With ``wandb`` settings, the config, each update's metrics (at step
    ``env_steps``) and, at the end, the run's figure also go to Weights &
    Biases (`ppo_async.runs.wandb_log`).
    """

    def __init__(self, config: AsyncActorLearnerConfig, run_dir: pathlib.Path | None,
                 progress: bool, start_update: int = 0, end_update: int | None = None,
                 wandb: WandbSettings | None = None):
        # First: it is the part that can fail (not installed, not logged in), before files are open.
        self.wandb = WandbRun(wandb, config.to_dict(), run_dir, start_update) if wandb else None
        self.metrics = None
        self.events: EventFile | None = None
        if run_dir is not None:
            cut_metrics_after(run_dir, start_update)
            self.metrics = MetricsFile(run_dir)
            self._open_events(run_dir, append=start_update > 0)
        self.bar = None
        if progress:
            total = config.num_updates if end_update is None else end_update
            self.bar = progress_bar(total, start_update, config.env_id)

    def _open_events(self, run_dir: pathlib.Path, append: bool) -> None:
        """Open an `EventFile` in ``run_dir``, if tensorboardX (its protos) is importable."""
        try:
            import tensorboardX  # noqa: F401
        except ImportError:
            return
        earlier = list(run_dir.glob("events.out.tfevents.*"))
        if not append:
            for stale in earlier:
                stale.unlink()
        # The file is named after the second it was opened and opened with "wb";
        # a resume within the same second would truncate the previous file.
        self.events = EventFile(run_dir, suffix=f".{len(earlier)}" if append else "")

    def __call__(self, metrics: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(metrics)
        if self.events is not None:
            self.events.add(int(metrics["env_steps"]),
                            [(name, float(value)) for name, value in metrics.items()])
        if self.wandb is not None:
            self.wandb.log(metrics)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(
                sps=f"{metrics['env_steps_per_s']:.0f}",
                ret=f"{metrics['episode_return']:.1f}",
                lag=f"{metrics['policy_lag_max']:.0f}",
                refresh=False,
            )

    def evaluation(self, metrics: dict[str, Any]) -> None:
        """Log one periodic evaluation (`ppo_async.runtime.learner.drain_evaluations`), which arrives
        updates after the one it evaluated: a ``metrics.jsonl`` line of its own keyed by that
        update (``read_metrics`` merges it into the update's row), a TensorBoard event at that
        update's ``env_steps``, and W&B (see `WandbRun.log_evaluation`). The bar does not move.
        """
        if self.metrics is not None:
            self.metrics.write(metrics)
        if self.events is not None:
            self.events.add(int(metrics["env_steps"]), [(name, float(value))
                            for name, value in metrics.items() if name.startswith("eval_")])
        if self.wandb is not None:
            self.wandb.log_evaluation(metrics)

    def close(self, failed: bool = False) -> None:
        """Flush and close everything; ``failed``: the run ended with an error (W&B marks it so).

        Raises the `RunFileError` of closing ``metrics.jsonl`` (a network disk may
        report a failed write only then) once the rest is closed.
        """
        unwritten = None
        if self.metrics is not None:
            try:
                self.metrics.close()
            except OSError as error:
                unwritten = error
        if self.events is not None:
            self.events.close()
        if self.bar is not None:
            self.bar.close()
        if self.wandb is not None:
            self.wandb.finish(exit_code=1 if failed or unwritten is not None else 0)
        if unwritten is not None:
            raise unwritten
