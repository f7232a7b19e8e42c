"""`ConfigError`: a configuration that cannot run.

Below every other module, so that the config's validation and the math's
lookups that a config names (`ppo_async.core.devices` resolving a device
string) raise the same error without the math importing the config.
``ppo_async.config.ConfigError`` is this class. `did_you_mean` is the hint
every "unknown name" message gives; `one_line` is how the command line and a
sweep's table say an error.
"""

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the fix."""


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
