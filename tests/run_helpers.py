"""Helpers the tests of several packages share."""


def interrupt_at(update: int):
    """An ``on_update`` callback that presses Ctrl-C (raises KeyboardInterrupt) at ``update``."""
    def on_update(metrics):
        if metrics["update"] == update:
            raise KeyboardInterrupt
    return on_update
