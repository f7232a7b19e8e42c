"""The former address of `ppo_async.presets` (named configs and config files).

The presets moved beside the config, below every part that reads them (a
sweep names its starting preset); ``from ppo_async.tools.presets import
preset`` keeps working.
"""

from ppo_async.presets import (
    LEARNING_RESULTS_PRESETS,
    PRESETS,
    apply_overrides,
    config_to_toml,
    load_config_file,
    preset,
    preset_names,
    preset_overrides,
    read_config_file,
)

__all__ = ["LEARNING_RESULTS_PRESETS", "PRESETS", "apply_overrides", "config_to_toml",
           "load_config_file", "preset", "preset_names", "preset_overrides", "read_config_file"]
