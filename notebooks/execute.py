"""Execute a notebook in a kernel of this interpreter and save the executed copy.

    python notebooks/execute.py                                   # quickstart at its own budget -> docs/quickstart.ipynb
    python notebooks/execute.py --total-env-steps 16384 --out /tmp/quick.ipynb   # a quick check

The kernel runs this Python (a kernel spec in a temporary JUPYTER_PATH, as
tests/tools/test_notebook.py does), in a temporary working directory, with
matplotlib's inline figures embedded as PNG, and progress bars as text (see
``text_progress`` in `execute`). ``--total-env-steps`` rewrites
the ``TOTAL_ENV_STEPS = ...`` line of the first code cell. The committed
``notebooks/quickstart.ipynb`` stays without outputs; ``docs/quickstart.ipynb``
is the executed copy a reader can open without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def with_budget(notebook, total_env_steps: int):
    """``notebook`` with its first code cell's ``TOTAL_ENV_STEPS = ...`` line replaced."""
    cell = next(cell for cell in notebook.cells if cell.cell_type == "code")
    lines = cell.source.splitlines()
    (index,) = [i for i, line in enumerate(lines) if line.startswith("TOTAL_ENV_STEPS =")]
    lines[index] = f"TOTAL_ENV_STEPS = {total_env_steps}"
    cell.source = "\n".join(lines)
    return notebook


def execute(source: pathlib.Path, out: pathlib.Path, total_env_steps: int | None = None,
            timeout_s: int = 1800, text_progress: bool = True) -> pathlib.Path:
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(source, as_version=4)
    if total_env_steps is not None:
        notebook = with_budget(notebook, total_env_steps)
    with tempfile.TemporaryDirectory() as scratch:
        kernel_dir = pathlib.Path(scratch) / "jupyter" / "kernels" / "ppo-async-execute"
        kernel_dir.mkdir(parents=True)
        (kernel_dir / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (ppo_async)", "language": "python",
        }))
        os.environ["JUPYTER_PATH"] = str(pathlib.Path(scratch) / "jupyter")
        if text_progress:
            # An IPython start-up file of the kernel (not a cell of the notebook) hides
            # ipywidgets, so train()'s bar is its plain-text fallback: a saved widget shows
            # only its first frame ("0%") in a static viewer, text shows where it ended.
            startup = pathlib.Path(scratch) / "ipython" / "profile_default" / "startup"
            startup.mkdir(parents=True)
            (startup / "00-text-progress.py").write_text("import sys\nsys.modules['ipywidgets'] = None\n")
            os.environ["IPYTHONDIR"] = str(pathlib.Path(scratch) / "ipython")
        os.environ.setdefault("MPLBACKEND", "Agg")
        client = NotebookClient(notebook, kernel_name="ppo-async-execute", timeout=timeout_s,
                                resources={"metadata": {"path": scratch}})
        client.execute()
    # A reader's Jupyter has no "ppo-async-execute" kernel: name the usual one.
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", nargs="?", default=str(ROOT / "notebooks" / "quickstart.ipynb"))
    parser.add_argument("--out", default=str(ROOT / "docs" / "quickstart.ipynb"))
    parser.add_argument("--total-env-steps", type=int, default=None,
                        help="rewrite the first code cell's TOTAL_ENV_STEPS (default: keep it)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = execute(pathlib.Path(args.notebook), pathlib.Path(args.out), args.total_env_steps)
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
