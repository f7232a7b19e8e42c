"""Supervision: replace actors that raised, died or hung, while each one's restart budget lasts.

The learner calls `Supervisor.on_failure` when an actor reports an
`ActorFailure` (an exception, or -- with processes -- a process that died)
and `Supervisor.on_stuck` when actors it waits on sent nothing for
``learner_timeout_s``. A failed actor is restarted under
``max_actor_restarts``; a stuck one is first killed, which only a transport
of processes can do (a thread stuck in an env cannot be ended, so the run
then fails naming it). With thread actors, a restarted actor's
new thread is named to the run's freeze watchdog. Each restart is one line on
the ``ppo_async.runtime.supervisor`` logger; the failure's traceback goes to
``RUN_DIR/log.txt`` (and the logger's DEBUG level).
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable

from ppo_async.config import AsyncActorLearnerConfig
from ppo_async.errors import one_line
from ppo_async.runtime.actor import ActorStart
from ppo_async.runtime.learner import LearnerTimeoutError
from ppo_async.runtime.messages import ActorFailure
from ppo_async.runtime.transport import LearnerTransport
from ppo_async.runtime.watchdog import FreezeWatchdog

logger = logging.getLogger(__name__)


class Supervisor:
    """Restarts for one run's actors; ``killed`` lists the actors it had to kill."""

    def __init__(self, config: AsyncActorLearnerConfig, transport: LearnerTransport,
                 watchdog: FreezeWatchdog | None = None,
                 log: Callable[[str], pathlib.Path] | None = None):
        self.config, self.transport, self.watchdog = config, transport, watchdog
        # Appends to the run's log file and returns its path (`append_to_log`); None: no file.
        self.log = log
        self.killed: list[int] = []

    def _budget_left(self, actor_id: int) -> bool:
        return self.transport.actor_stats()[actor_id].restarts < self.config.max_actor_restarts

    def _restart(self, actor_id: int, produced_steps: int) -> None:
        stats = self.transport.actor_stats()[actor_id]
        stats.restarts += 1
        start = ActorStart(restart=stats.restarts, produced_steps=produced_steps)
        self.transport.restart_actor(actor_id, start)
        if self.watchdog is not None:
            self.watchdog.name_threads()

    def on_failure(self, failure: ActorFailure, produced_steps: int) -> bool:
        """Restart the failed actor if its budget allows; True if it was restarted."""
        actor_id = failure.actor_id
        if actor_id < 0 or not self._budget_left(actor_id):  # helper threads are not restarted
            return False
        notice = (f"actor {actor_id} failed; restarting it (restart "
                  f"{self.transport.actor_stats()[actor_id].restarts + 1} of "
                  f"{self.config.max_actor_restarts})")
        said = one_line(failure.error)
        raised = type(failure.error).__name__ + (f": {said}" if said else "")
        logger.warning("%s: %s%s", notice, raised,
                       self._keep_traceback(notice, failure.formatted_traceback))
        self._restart(actor_id, produced_steps)
        return True

    def _keep_traceback(self, notice: str, formatted_traceback: str) -> str:
        """Keep a failure's traceback off stderr: in ``RUN_DIR/log.txt`` and at DEBUG level.
        Returns what the notice says of where it went."""
        logger.debug("%s:\n%s", notice, formatted_traceback)
        if self.log is None:
            return ""
        try:
            path = self.log(f"{notice}:\n{formatted_traceback.rstrip()}\n\n")
        except OSError as error:  # the run goes on; the traceback is then said here
            return f" (the run's log: {error}):\n{formatted_traceback}"
        return f" (traceback in {path})"

    def annotate(self, error: BaseException | None) -> None:
        """Say in the run's error which stuck actors were killed (and so are not left running)."""
        if isinstance(error, LearnerTimeoutError) and self.killed:
            error.add_note(
                f"killed: {', '.join(f'actor {i}' for i in self.killed)} (its process ended; "
                f"max_actor_restarts={self.config.max_actor_restarts} allowed no restart)")
            for pid, text in self.transport.where_killed.items():  # actor processes say it
                error.add_note(f"actor process {pid}, before it was killed: {text}")

    def on_stuck(self, actor_ids: list[int], produced_steps: int) -> bool:
        """Kill the stuck actors and restart them; True if every one was restarted."""
        for actor_id in actor_ids:
            if actor_id not in self.killed and self.transport.kill_actor(actor_id):
                self.killed.append(actor_id)
        if not all(i in self.killed for i in actor_ids) or not all(
            self._budget_left(i) for i in actor_ids
        ):
            return False
        for actor_id in actor_ids:
            logger.warning(
                "actor %d sent nothing for learner_timeout_s=%s s; killed it and restarting "
                "it (restart %d of %d)", actor_id, self.config.learner_timeout_s,
                self.transport.actor_stats()[actor_id].restarts + 1,
                self.config.max_actor_restarts,
            )
            self.killed.remove(actor_id)
            self._restart(actor_id, produced_steps)
        return True
