"""`ConfigError`: a configuration that cannot run; `RunFileError`: a write the disk refused.

Below every other module, so that the config's validation and the math's
lookups that a config names (`ppo_async.core.devices` resolving a device
string) raise the same error without the math importing the config.
``ppo_async.config.ConfigError`` is this class. `did_you_mean` is the hint
every "unknown name" message gives; `one_line` is how the command line and a
sweep's table say an error.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the fix."""


class RunFileError(OSError):
    """Writing a run's file failed (no space, read-only, a quota, a vanished directory).

    ``filename`` is the file the run was writing (not a temporary one);
    ``errno`` and ``strerror`` are the system's. Its message is one line.
    """

    @classmethod
    def of(cls, path: str | os.PathLike, error: OSError) -> RunFileError:
        """``error`` as the failure to write ``path`` (itself, if it already is one)."""
        if isinstance(error, RunFileError):
            return error
        return cls(error.errno, error.strerror or str(error), str(path))

    def __str__(self) -> str:
        why = f"[Errno {self.errno}] {self.strerror}" if self.errno is not None else self.strerror
        return f"writing {self.filename} failed: {why}"


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'X'?)"`` with the choice closest to ``name``; ``""`` if none is close.

    Case is ignored (``cartpol-v1`` finds ``CartPole-v1``); the choice comes back as spelled.
    """
    by_lower = {str(choice).lower(): str(choice) for choice in choices}
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def one_line(error: BaseException) -> str:
    """The message of ``error`` in one line ("" if it has none): its first line, and where
    that line ends in ':' (``actor 1 failed:``, then a traceback) what was raised in the
    first place, the innermost ``__cause__``, with the last line of a traceback its own
    message quotes (an env worker's error quotes the worker's)."""
    lines = [text.strip() for text in str(error).splitlines() if text.strip()]
    line = lines[0] if lines else ""
    inner, seen = error, {id(error)}
    while inner.__cause__ is not None and id(inner.__cause__) not in seen:
        inner = inner.__cause__
        seen.add(id(inner))
    if inner is error or not line.endswith(":"):
        return line
    said = [text.strip() for text in str(inner).splitlines() if text.strip()]
    line += f" {type(inner).__name__}" + (f": {said[0]}" if said else "")
    if len(said) > 1 and said[0].endswith(":"):
        line += f" {said[-1]}"
    return line
