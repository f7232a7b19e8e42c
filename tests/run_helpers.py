"""Helpers the tests of several packages share."""

import importlib
import threading


def interrupt_at(update: int):
    """An ``on_update`` callback that presses Ctrl-C (raises KeyboardInterrupt) at ``update``."""
    def on_update(metrics):
        if metrics["update"] == update:
            raise KeyboardInterrupt
    return on_update


def patch_rollout(monkeypatch, wrap):
    """Make `train` build its actor program with ``wrap(program.rollout)`` as the rollout."""
    train_module = importlib.import_module("ppo_async.train")  # the name is shadowed by train()
    original_make = train_module.make_actor_program

    def make(config):
        program = original_make(config)
        return program._replace(rollout=wrap(program.rollout))

    monkeypatch.setattr(train_module, "make_actor_program", make)


def break_actor_once(monkeypatch, actor_id: int, chunk: int) -> None:
    """Make actor ``actor_id``'s ``chunk``-th rollout (from 1) raise once; every other one runs."""
    calls = {"n": 0}

    def wrap(rollout):
        def maybe_fail(params, carry):
            if threading.current_thread().name == f"ppo-actor-{actor_id}":
                calls["n"] += 1
                if calls["n"] == chunk:
                    raise RuntimeError(f"actor {actor_id} breaks once")
            return rollout(params, carry)
        return maybe_fail

    patch_rollout(monkeypatch, wrap)


def drawn_figures(monkeypatch):
    """The matplotlib Figures that get saved from now on, in order."""
    import matplotlib.figure

    figures = []
    original = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return figures
