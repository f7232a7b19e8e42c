"""User-facing tools on top of the library; nothing in the library imports them.

- `cli`: the ``ppo-async`` command.
- `presets`: named configs (``ppo-async train --preset NAME``).
- `video`: ``ppo-async enjoy``'s episode videos.
"""
