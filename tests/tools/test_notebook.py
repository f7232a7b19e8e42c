"""notebooks/quickstart.ipynb runs end to end with a small budget and draws its figures.

The notebook runs in a kernel of this interpreter (a kernel spec written to a
temporary JUPYTER_PATH, so no kernel needs installing by hand and no other
Python is picked up), with the budget set by rewriting the
``TOTAL_ENV_STEPS = ...`` line of its first code cell.
"""

import importlib.util
import json
import pathlib
import re
import sys
import tomllib

import jax
import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOK = NOTEBOOKS / "quickstart.ipynb"
BUDGET = 16_384  # 32 updates of the notebook's 512-step batch
FIGURES = 3  # learning curve, lag histogram, the twin's seeds


def _with_budget():
    """notebooks/execute.py's ``with_budget`` (the budget rewrite both use)."""
    spec = importlib.util.spec_from_file_location("notebook_execute", NOTEBOOKS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.with_budget


def test_the_committed_notebook_holds_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, cell.source[:60]


def test_the_extra_the_guide_names_for_the_notebook_installs_jupyter_lab():
    root = NOTEBOOKS.parent
    paragraph = (root / "docs" / "guide" / "first_run.md").read_text().split("**The notebook.**")[1].split("\n\n")[0]
    (extra,) = re.findall(r"pip install -e '\.\[(\w+)\]'", paragraph)
    assert "jupyter lab notebooks/quickstart.ipynb" in " ".join(paragraph.split())
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("jupyterlab") for requirement in extras[extra]), extra


def test_the_policy_lag_text_says_what_the_default_does():
    # It described free-running actors ("the staleness valve bounds the lag") while the
    # default is an exact lag of 1.
    from ppo_async import AsyncActorLearnerConfig

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    (text,) = [" ".join(c.source.split()) for c in notebook.cells
               if c.cell_type == "markdown" and c.source.startswith("## Policy lag")]
    default = AsyncActorLearnerConfig()
    assert (default.exact_policy_lag, default.exact_lag) == ("auto", 1)
    assert 'By default the lag is exact (`exact_policy_lag="auto"`, which is 1)' in text
    assert "Expect every chunk at lag 1 but those of the first update, at lag 0" in text
    assert "Free-running actors (`exact_policy_lag=None`" in text


def test_the_guide_names_the_quick_headless_route_as_execute_py_takes_it(monkeypatch):
    paragraph = (NOTEBOOKS.parent / "docs" / "guide" / "first_run.md").read_text().split(
        "**The notebook.**")[1].split("\n\n")[0]
    (command,) = [c for c in re.findall(r"`python (notebooks/execute\.py[^`]*)`",
                                        " ".join(paragraph.split())) if "--total-env-steps" in c]
    spec = importlib.util.spec_from_file_location("notebook_execute", NOTEBOOKS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    called = []
    monkeypatch.setattr(module, "execute", lambda *args: called.append(args) or args[1])
    module.main(command.split()[1:])
    ((source, out, total_env_steps),) = called
    # A small budget, written beside the committed executed copy, not over it.
    assert source == NOTEBOOK and total_env_steps == BUDGET
    assert out != NOTEBOOKS.parent / "docs" / "quickstart.ipynb"


# About 15 s of training; the rest is kernel start-up and compiles (the
# vmapped twin's takes a minute on a busy 2-core machine, unless cached).
@pytest.mark.slow
def test_quickstart_notebook_runs_and_draws_its_figures(tmp_path, monkeypatch):
    kernel_dir = tmp_path / "jupyter" / "kernels" / "ppo-async-test"
    kernel_dir.mkdir(parents=True)
    (kernel_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ppo_async test", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # The kernel inherits these: no GUI backend before the notebook's %matplotlib
    # inline, the suite's strict rank promotion, and its compilation cache.
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("JAX_NUMPY_RANK_PROMOTION", "raise")
    if jax.config.jax_compilation_cache_dir:
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", jax.config.jax_compilation_cache_dir)
        monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

    notebook = _with_budget()(nbformat.read(NOTEBOOK, as_version=4), BUDGET)
    client = NotebookClient(
        notebook, kernel_name="ppo-async-test", timeout=300,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory
    )
    client.execute()  # raises CellExecutionError, with the cell's traceback, on any error

    outputs = [output for cell in notebook.cells if cell.cell_type == "code"
               for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    figures = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(figures) >= FIGURES
    text = "".join(output.get("text", "") for output in outputs)
    assert "final return" in text and "final return per seed" in text
