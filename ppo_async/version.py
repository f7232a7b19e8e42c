"""The package's version: one number, from the installed metadata or ``pyproject.toml``.

Imports nothing but the standard library, so ``ppo-async --version`` and
``ppo_async.__version__`` cost no JAX start-up.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

DISTRIBUTION = "ppo-async"


def package_version() -> str:
    """The installed ``ppo-async`` version; in a source tree that is not installed, ``pyproject.toml``'s."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


__version__ = package_version()
