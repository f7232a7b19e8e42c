"""`ConfigError`: a configuration that cannot run.

Below every other module, so that the config's validation and the math's
lookups that a config names (`ppo_async.core.devices` resolving a device
string) raise the same error without the math importing the config.
``ppo_async.config.ConfigError`` is this class.
"""


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the fix."""
