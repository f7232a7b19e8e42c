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
