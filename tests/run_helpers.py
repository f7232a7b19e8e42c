"""Helpers the tests of several packages share."""

import contextlib
import functools
import importlib
import os
import pathlib
import select
import signal
import threading
import subprocess
import sys

import flax.serialization
import jax
import numpy as np

from ppo_async.envs.host import HostStep
from ppo_async.runs.analysis import read_metrics
from ppo_async.runtime.actor import current_actor
from ppo_async.runtime.layout import resolve_layout

# Metrics fields that measure time, not learning.
WALL_CLOCK = {"env_steps_per_s", "learner_wait_s", "broadcast_s", "queue_depth"}


def params_bytes(params) -> bytes:
    """``params`` as the bytes a broadcast or ``params.msgpack`` holds: equal bytes, equal params."""
    return flax.serialization.to_bytes(jax.device_get(params))


def learning_metrics(run_dir) -> list[dict]:
    """A run directory's metrics lines without the fields that measure time."""
    return [{k: v for k, v in row.items() if k not in WALL_CLOCK}
            for row in read_metrics(run_dir)]


def interrupt_at(update: int):
    """An ``on_update`` callback that presses Ctrl-C (raises KeyboardInterrupt) at ``update``."""
    def on_update(metrics):
        if metrics["update"] == update:
            raise KeyboardInterrupt
    return on_update


def patch_rollout(monkeypatch, wrap):
    """Make `train` build its actor program with ``wrap(program.rollout)`` as the rollout."""
    train_module = importlib.import_module("ppo_async.train")  # the name is shadowed by train()
    original_make = train_module.make_actor_program

    def make(config):
        program = original_make(config)
        return program._replace(rollout=wrap(program.rollout), identity=None)

    monkeypatch.setattr(train_module, "make_actor_program", make)
    # A replaced rollout cannot run inside the learner's program: thread actors run it.
    monkeypatch.setattr(train_module, "resolve_layout",
                        functools.partial(resolve_layout, learner_program=False))


def break_actor_once(monkeypatch, actor_id: int, chunk: int) -> None:
    """Make actor ``actor_id``'s ``chunk``-th rollout (from 1) raise once; every other one runs."""
    calls = {"n": 0}

    def wrap(rollout):
        def maybe_fail(params, carry):
            if current_actor() == actor_id:
                calls["n"] += 1
                if calls["n"] == chunk:
                    raise RuntimeError(f"actor {actor_id} breaks once")
            return rollout(params, carry)
        return maybe_fail

    patch_rollout(monkeypatch, wrap)


def drawn_figures(monkeypatch):
    """The matplotlib Figures that get saved from now on, in order."""
    import matplotlib.figure

    figures = []
    original = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return figures


class MisbehavingEnv:
    """A pure-Python host env: 20-step episodes; once per run (whoever creates ``marker``
    first), the actor that gets to env step ``misbehave_after`` kills its own process with
    SIGKILL (``how = "kill"``), spins forever in pure Python (``"spin"``) or raises
    (``"raise"``). No marker: it behaves. Actor-process tests (Ray's and this package's own)
    make one per test."""

    observation_shape = (2,)
    misbehave_after = 40
    marker: str = ""
    how = "kill"

    def __init__(self, num_envs):
        import gymnasium

        self.action_space = gymnasium.spaces.Discrete(2)
        self.num_envs, self.t, self.steps = num_envs, np.zeros(num_envs), 0

    def reset(self, seed):
        return np.zeros((self.num_envs, 2), np.float32)

    def step(self, actions):
        self.steps += 1
        if self.marker and self.steps == self.misbehave_after and self._claim():
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == "raise":
                raise RuntimeError("the env failed on purpose")
            while True:  # a hung env: pure Python that never returns
                pass
        self.t += 1
        done = self.t >= 20
        self.t[done] = 0
        obs = np.stack([self.t / 20, actions.astype(np.float64)], -1).astype(np.float32)
        return HostStep(obs, np.ones(self.num_envs), done, np.zeros(self.num_envs, bool), obs)

    def _claim(self) -> bool:
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True


def register_misbehaving_env(tmp_path: pathlib.Path, how: str,
                             prefix: str) -> tuple[str, pathlib.Path]:
    """Register a `MisbehavingEnv` that misbehaves ``how``: (its env id, its marker file)."""
    from ppo_async.envs.registry import register_host_env

    marker = tmp_path / f"{how}.pid"
    env = type(f"{prefix}_{how}", (MisbehavingEnv,), {"marker": str(marker), "how": how})
    register_host_env(f"{prefix}-{how}", env)
    return f"host:{prefix}-{how}", marker


def assert_spinning_actor_was_killed(train, config, marker: pathlib.Path, gone) -> None:
    """Train ``config`` (a `MisbehavingEnv` that spins) and check that the run failed with
    `LearnerTimeoutError` within the timeout and a few seconds, naming the one actor it killed,
    and that its process is gone (``gone(pids)``: the pids still alive after a wait), after it
    said which thread was in the env's code."""
    import time

    import pytest

    from ppo_async import LearnerTimeoutError

    with pytest.raises(LearnerTimeoutError,
                       match=f"learner_timeout_s={config.learner_timeout_s}") as info:
        train(config, progress=False)
    raised_at = time.time()
    spinning_pid = int(marker.read_text())
    assert len(info.value.actor_ids) == 1
    assert f"killed: actor {info.value.actor_ids[0]}" in "\n".join(info.value.__notes__)
    assert raised_at - marker.stat().st_mtime < config.learner_timeout_s + 6
    assert gone([spinning_pid]) == []  # it was killed, not left spinning
    (where,) = [note for note in info.value.__notes__ if "before it was killed" in note]
    # The env's class traveled by value, and its file came back with it.
    assert (f"actor process {spinning_pid}, before it was killed: "
            f"ppo-actor-{info.value.actor_ids[0]} (at run_helpers.py:" in where
            and " in step <- " in where)


_HOLD = """
import sys
from ppo_async.runs.run_lock import RunLock
lock = RunLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
lock.release()
"""


@contextlib.contextmanager
def held_by_another_process(run_dir):
    """A process holding ``run_dir``'s lock until the block ends (closing its stdin)."""
    process = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready and process.stdout.readline() == "held\n", "the holder did not lock"
        yield process
    finally:
        if process.poll() is None:
            process.stdin.close()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


def raised_in_actor_thread(call):
    """What ``call()`` raised in a thread named as actor 3's (None if nothing)."""
    raised = []

    def run():
        try:
            call()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            raised.append(error)

    thread = threading.Thread(target=run, name="ppo-actor-3", daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive()
    return raised[0] if raised else None
