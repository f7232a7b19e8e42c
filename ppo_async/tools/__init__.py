"""User-facing tools on top of the library; nothing in the library imports them.

- `cli`: the ``ppo-async`` command.
- `video`: ``ppo-async enjoy``'s episode videos.
"""
