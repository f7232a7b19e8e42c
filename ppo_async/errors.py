"""`ConfigError`: a configuration that cannot run.

Below every other module, so that the config's validation and the math's
lookups that a config names (`ppo_async.core.devices` resolving a device
string) raise the same error without the math importing the config.
``ppo_async.config.ConfigError`` is this class. `did_you_mean` is the hint
every "unknown name" message gives.
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
