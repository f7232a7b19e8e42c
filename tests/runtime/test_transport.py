"""The transport pieces alone: the publisher's order, the endpoints' newest-wins, failures named."""

import queue
import threading
import time

import flax.serialization
import numpy as np
import pytest

from ppo_async import ActorError, PolicyBroadcast, QueueEndpoint
from ppo_async.runtime.actor import PUBLISHER_ID
from ppo_async.runtime.messages import ActorFailure
from ppo_async.runtime.transport import Publisher


def _params(value: float):
    return {"w": np.full((3,), value, np.float32)}


def _wait(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert condition()


@pytest.mark.parametrize("every_version, expected", [(False, [1, 5]), (True, [1, 2, 3, 4, 5])],
                         ids=["free-running", "exact-lag"])
def test_the_publisher_delivers_versions_in_order_and_only_the_newest_of_a_backlog(every_version,
                                                                                   expected):
    delivered, release = [], threading.Event()

    def deliver(message):
        if message.version == 1:
            release.wait(10)  # a slow first delivery: versions 2..5 pile up meanwhile
        delivered.append(message.version)

    publisher = Publisher(deliver, lambda failure: None, every_version=every_version)
    publisher.publish(_params(1), 1)
    _wait(lambda: publisher.published == 0 and not publisher._mailbox)
    for version in (2, 3, 4, 5):
        publisher.publish(_params(version), version)
    release.set()
    _wait(lambda: delivered[-1:] == [5])
    publisher.stop()
    publisher.thread.join(5)
    # In order; free-running, the backlog collapses to its newest; with an exact lag
    # every version is delivered (each is some chunk's).
    assert delivered == expected
    assert publisher.latest.version == 5
    # The bytes are the params' flax serialization, made on the publisher's thread.
    loaded = flax.serialization.from_bytes(_params(0), publisher.latest.payload)
    np.testing.assert_array_equal(loaded["w"], _params(5)["w"])


def test_a_publisher_that_fails_is_reported_as_the_publisher():
    failures = []

    def deliver(message):
        raise RuntimeError("cannot deliver")

    publisher = Publisher(deliver, failures.append)
    publisher.publish(_params(1), 1)
    _wait(lambda: failures)
    publisher.thread.join(5)
    (failure,) = failures
    assert failure.actor_id == PUBLISHER_ID
    error = ActorError(failure.actor_id, failure.formatted_traceback)
    assert str(error).startswith("publisher thread failed") and "cannot deliver" in str(error)


def test_a_thread_endpoint_takes_the_newest_version_whatever_the_arrival_order():
    broadcasts = queue.Queue()
    channels = QueueEndpoint(queue.Queue(), broadcasts, threading.Event())
    for version in (3, 5, 4):  # a re-delivered older one behind a newer one
        broadcasts.put(PolicyBroadcast(version, b""))
    newest, taken = channels.take_newest()
    assert (newest.version, taken) == (5, 3)
    assert channels.take_newest() == (None, 0)
    assert channels.wait_broadcast(0.01) is None
    channels.send(ActorFailure(0, RuntimeError("x"), "tb"))
    assert isinstance(channels.experience_queue.get_nowait(), ActorFailure)


def test_the_publisher_thread_ends_on_stop():
    publisher = Publisher(lambda message: None, lambda failure: None)
    publisher.stop()
    publisher.thread.join(5)
    assert not publisher.thread.is_alive()


def test_threads_outside_the_runtime_are_those_in_env_code_not_those_waiting_in_it():
    """What a hung actor process says before it is killed: a thread inside an env's code
    (here this file's) is named with its line; one waiting inside the runtime is not."""
    from ppo_async.runtime.inference import InferenceServer
    from ppo_async.runtime.transport import threads_outside_the_runtime

    stop, release = threading.Event(), threading.Event()

    def env_step():  # an env's step that does not return until released
        release.wait(10)

    in_env = threading.Thread(target=env_step, name="ppo-test-in-env")
    server = InferenceServer(lambda params, rows: rows, 1, stop.is_set,
                             name="ppo-test-server").start()  # waits in the runtime
    in_env.start()
    try:
        time.sleep(0.2)
        found = threads_outside_the_runtime({in_env: lambda: "doing this"})
    finally:
        release.set()
        stop.set()
        in_env.join(5)
        server.thread.join(5)
    (line,) = [entry for entry in found if entry.startswith("ppo-test")]
    assert line.startswith("ppo-test-in-env (doing this, at ")
    assert "test_transport.py:" in line and "in env_step" in line
