"""A ``host:`` env's factory on its way to another process, with its source file.

Actor processes (``actor_backend="processes"`` and Ray) and env worker
processes (``env_workers=N``) build a ``host:NAME`` env from the factory
registered in the parent. A factory from the user's own module or from the
script being run cannot be imported by name there, so cloudpickle sends its
code by value, and code sent by value comes back with ``<dynamic-code>`` for
its file: a traceback from the env had no file and no source lines.
`host_env_payload` sends the module's name and file along, and
`load_host_env_payload` gives the factory's functions their file back.

This module imports no JAX: env workers use it.
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
import types
from collections.abc import Callable
from typing import Any, NamedTuple

from ppo_async.envs.host import SingleEnvFactory
from ppo_async.envs.registry import HOST, host_env_factory, register_host_env, split_env_id

_DYNAMIC_CODE = "<dynamic-code>"  # cloudpickle's file name for code sent by value


class HostEnvPayload(NamedTuple):
    """A ``host:NAME`` env's factory on its way to another process (`host_env_payload`)."""

    name: str
    factory: bytes  # pickled by cloudpickle
    module: str | None = None  # the factory's module, when its code travels by value,
    filename: str | None = None  # and that module's file


# The payloads this process was built from, by env name, with the factory each gave: a
# process that received a factory and sends it on (an actor process starting env
# workers) sends what it received, file included.
_RECEIVED: dict[str, tuple[Any, HostEnvPayload]] = {}


def host_env_payload(pickler: Any, env_id: str, *,
                     modules_by_value: bool = True) -> HostEnvPayload | None:
    """A ``host:NAME`` env's factory, pickled with ``pickler`` (cloudpickle) so another
    process can load it (`load_host_env_payload`); None for other ids.

    Code from the script being run (``__main__``) always travels by value. With
    ``modules_by_value`` the code of the user's own modules does too (an actor
    process, or a Ray worker, may not find them on its path); without it they are
    imported by name where they are loaded (env workers, which share the
    parent's ``sys.path``).
    """
    backend, name = split_env_id(env_id)
    if backend != HOST:
        return None
    factory = host_env_factory(name)
    received = _RECEIVED.get(name)
    if received is not None and received[0] is factory:
        return received[1]
    module = _users_module(factory)
    # A factory defined in a script or test module may not be importable by name in
    # another process; its code travels with it.
    by_value = modules_by_value and module is not None and module.__name__ != "__main__"
    if by_value:
        pickler.register_pickle_by_value(module)
    try:
        data = pickler.dumps(factory)
    finally:
        if by_value:
            pickler.unregister_pickle_by_value(module)
    # Code from a script (__main__) travels by value too, whatever the pickler is told.
    sent_by_value = by_value or (module is not None and module.__name__ == "__main__")
    if not sent_by_value or getattr(module, "__file__", None) is None:  # a notebook has none
        return HostEnvPayload(name, data)
    return HostEnvPayload(name, data, module.__name__, os.path.abspath(module.__file__))


def sendable_payload(env_id: str, *, modules_by_value: bool = True, load_back: bool = True
                     ) -> tuple[HostEnvPayload | None, str | None]:
    """``(payload, None)``: `host_env_payload` with cloudpickle, checked by loading it
    back here (``(None, None)`` for ids that are not ``host:``); or ``(None, why)`` when
    the factory cannot travel (it holds a lock or an open simulator), ``why`` the
    error in one line. Loading back sets a by-value class's methods on the class this
    process defined (cloudpickle's class tracking), so a caller that keeps using the
    factory here passes ``load_back=False``: the pickling alone is checked."""
    import cloudpickle  # a gymnasium dependency

    try:
        payload = host_env_payload(cloudpickle, env_id, modules_by_value=modules_by_value)
        if payload is not None and load_back:
            pickle.loads(payload.factory)
    except Exception as error:  # noqa: BLE001 - any failure means: it stays in this process
        first_line = str(error).splitlines()[0] if str(error) else ""
        return None, f"{type(error).__name__}: {first_line}"
    return payload, None


def _users_module(factory: Any) -> types.ModuleType | None:
    """The module of the user's code behind ``factory`` (a class, a function, or those
    wrapped by `register_single_env` or `functools.partial`); None when that code is the
    package's, an installed library's or the standard library's (imported by name)."""
    while isinstance(factory, (SingleEnvFactory, functools.partial)):
        factory = factory.make_env if isinstance(factory, SingleEnvFactory) else factory.func
    name = getattr(factory, "__module__", None) or ""
    module = sys.modules.get(name)
    if module is None or name.partition(".")[0] in sys.stdlib_module_names or (
            name.startswith("ppo_async") or "site-packages" in str(getattr(module, "__file__", ""))):
        return None
    return module


def load_host_env_payload(payload: HostEnvPayload, loads: Callable[[bytes], Any]) -> Any:
    """The factory of ``payload``, read by ``loads``, with the file of its code given back.

    Code that traveled by value comes back with ``<dynamic-code>`` for its file
    (cloudpickle erases it); the functions of the factory's module get their
    file back, so that a traceback or a hung actor's note from this process
    names the env's file and shows its lines.
    """
    factory = loads(payload.factory)
    if payload.filename is not None:
        _restore_filenames(factory, payload.module, payload.filename, set())
    return factory


def register_host_env_payload(payload: HostEnvPayload, loads: Callable[[bytes], Any]) -> None:
    """Register the env of ``payload`` in this process (`load_host_env_payload`)."""
    factory = load_host_env_payload(payload, loads)
    register_host_env(payload.name, factory)
    _RECEIVED[payload.name] = (host_env_factory(payload.name), payload)


def _restore_filenames(obj: Any, module: str, filename: str, seen: set[int]) -> None:
    """`load_host_env_payload`'s walk: ``obj`` and what it reaches (methods, wrapped
    factories, the module-level functions its functions call) that comes from ``module``."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (staticmethod, classmethod)):
        _restore_filenames(obj.__func__, module, filename, seen)
    elif isinstance(obj, property):
        for accessor in (obj.fget, obj.fset, obj.fdel):
            if accessor is not None:
                _restore_filenames(accessor, module, filename, seen)
    elif isinstance(obj, functools.partial):
        _restore_filenames(obj.func, module, filename, seen)
    elif isinstance(obj, types.FunctionType):
        if obj.__module__ != module:
            return
        if obj.__code__.co_filename == _DYNAMIC_CODE:
            obj.__code__ = _code_in(obj.__code__, filename)
        for value in list(obj.__globals__.values()):
            _restore_filenames(value, module, filename, seen)
    elif isinstance(obj, type):
        for cls in obj.__mro__:
            if cls.__module__ == module:
                for value in list(vars(cls).values()):
                    _restore_filenames(value, module, filename, seen)
    elif isinstance(obj, SingleEnvFactory):  # register_single_env's wrapper
        _restore_filenames(obj.make_env, module, filename, seen)


def _code_in(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` and the code objects nested in it, with ``filename`` for their file."""
    consts = tuple(_code_in(c, filename) if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)
