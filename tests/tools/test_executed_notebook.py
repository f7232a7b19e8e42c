"""docs/quickstart.ipynb, the executed copy a reader opens without running anything,
is the current notebook (same cells) and holds its results and figures."""

import pathlib

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "notebooks" / "quickstart.ipynb"
EXECUTED = ROOT / "docs" / "quickstart.ipynb"
REMAKE = "python notebooks/execute.py re-makes it"


def test_the_executed_copy_has_the_notebooks_cells():
    source = nbformat.read(SOURCE, as_version=4)
    executed = nbformat.read(EXECUTED, as_version=4)
    nbformat.validate(executed)
    assert [(c.cell_type, c.source) for c in executed.cells] == [
        (c.cell_type, c.source) for c in source.cells
    ], f"docs/quickstart.ipynb is out of date with notebooks/quickstart.ipynb; {REMAKE}"


def test_the_executed_copy_holds_results_and_figures():
    executed = nbformat.read(EXECUTED, as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), REMAKE
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) >= 3
    text = "".join(o.get("text", "") for o in outputs)
    assert "final return" in text and "final return per seed" in text
    # Progress as text, not a widget that a static viewer shows at 0%.
    assert not [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert "100%" in text
