"""experiments/device_check.py on a machine without a GPU: says so, exits 0."""

import pathlib
import subprocess
import sys

import jax
import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "experiments" / "device_check.py"


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="this machine has a GPU")
def test_device_check_without_a_gpu_says_so_and_exits_zero():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=120, cwd=SCRIPT.parent.parent)
    assert done.returncode == 0, done.stderr
    assert "no GPU on this machine" in done.stdout


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="this machine has a GPU")
def test_device_check_on_forced_cpu_devices_checks_agreement_only(tmp_path):
    import os
    import re

    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                          + " --xla_force_host_platform_device_count=2").strip())
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent.parent,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert "2 forced host CPU devices share its cores, so no speed-up is expected" in done.stdout
    found = re.search(r"on 2 CPU devices against 1: max relative difference (\S+)", done.stdout)
    assert found is not None, done.stdout
    assert float(found.group(1)) <= 1e-4
    assert (tmp_path / "summary.json").is_file()
