"""The package's version and licence: one version number everywhere, the Apache-2.0 text."""

import importlib.metadata
import pathlib
import subprocess
import sys
import tomllib

import ppo_async
from ppo_async import version

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_version_is_the_installed_metadata_and_pyproject():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert ppo_async.__version__ == importlib.metadata.version("ppo-async") == pyproject


def test_version_falls_back_to_pyproject_when_not_installed(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version.package_version() == pyproject


def test_version_module_imports_nothing_heavy():
    # Importing ppo_async.version runs ppo_async/__init__ first; check the module alone.
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location("
            f"'v', {str(ROOT / 'ppo_async' / 'version.py')!r}); v = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(v); print(v.__version__); "
            "print(sorted(m for m in ('jax', 'numpy', 'flax', 'wandb') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [ppo_async.__version__, "[]"]


def test_cli_version_prints_the_version_and_exits_0(capsys):
    from ppo_async.tools.cli import main

    main(["--version"])
    assert capsys.readouterr().out.strip() == f"ppo-async {ppo_async.__version__}"
    run = subprocess.run([sys.executable, "-m", "ppo_async.tools.cli", "--version"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == f"ppo-async {ppo_async.__version__}"


def test_the_licence_is_apache_2_as_pyproject_declares():
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 190
