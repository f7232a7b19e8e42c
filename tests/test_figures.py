"""Every figure the docs state comes from one place, ``docs/figures.json``.

Pages built by Sphinx quote a figure as ``{{ name }}`` (rendered from the
file); the README, which GitHub renders as it is, may state a figure only
where it equals the file's value. A timing or a ratio written into a page's
prose that the file does not hold fails here: a figure is measured once, with
its command and date, and every page quotes that one.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "docs" / "figures.json").read_text())
# A timing (2.97 s, 1.75 ms, 50 us, 16.3 min) or a ratio (1.04x, 0.60-0.66x).
NUMBER = r"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?"
STATED = re.compile(rf"(?<![\w.-])({NUMBER})\s?(x(?!\s*\d)|s|ms|us|min)(?![\w])")
SUBSTITUTION = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def pages() -> list[pathlib.Path]:
    docs = [p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts]
    return [ROOT / "README.md", *sorted(docs)]


def prose(text: str) -> str:
    """The page without fenced blocks (code, directives) and inline code."""
    text = re.sub(r"^(`{3,}|~{3,}).*?^\1", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def stated(text: str) -> list[str]:
    return [f"{number} {unit}" if unit != "x" else f"{number}x"
            for number, unit in STATED.findall(SUBSTITUTION.sub("", prose(text)))]


def allowed() -> set[str]:
    values = {fig["value"] for fig in DATA["figures"].values()}
    return {token for value in values for token in stated(value)} | set(DATA["not_measured"])


def test_every_figure_has_its_value_command_date_and_machine():
    assert DATA["figures"]
    for name, fig in DATA["figures"].items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        for key in ("topic", "what", "value", "command", "date", "machine"):
            assert isinstance(fig.get(key), str) and fig[key].strip(), (name, key)
        datetime.date.fromisoformat(fig["date"])
        assert fig["machine"] in DATA["machines"], (name, fig["machine"])
        assert fig["command"].split()[0] in ("python", "make", "ppo-async", "CI=true"), (name, fig["command"])


def test_the_scanner_reads_timings_and_ratios_outside_code():
    text = "took 2.97 s and 0.60-0.66x, `3.1 s` in code, {{ cold_start }}, 10 s.\n```\n9 ms\n```\n"
    assert stated(text) == ["2.97 s", "0.60-0.66x", "10 s"]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_states_only_the_figures_in_the_data(page):
    text = page.read_text()
    unknown = sorted(set(stated(text)) - allowed())
    assert not unknown, (f"{page.relative_to(ROOT)} states {unknown}, which docs/figures.json does "
                         "not hold: quote a figure as {{ name }} (the README: its value), or add it "
                         "there with its command and date")
    if page.name != "README.md":
        missing = set(SUBSTITUTION.findall(text)) - set(DATA["figures"])
        assert not missing, f"{page.relative_to(ROOT)} quotes figures that are not in the data: {missing}"


def test_the_readme_quotes_make_train_as_the_data_states_it():
    readme = (ROOT / "README.md").read_text()
    assert f"{DATA['figures']['make_train_time']['value']} of training" in readme


def _table_after(text: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first markdown table after ``heading``."""
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return [rows[0], *rows[2:]]  # the header, then the body (past the |---| line)


def test_the_readme_results_table_quotes_the_learning_figures():
    header, *body = _table_after((ROOT / "README.md").read_text(), "## Results")
    values = {fig["value"] for fig in DATA["figures"].values()}
    ours = [i for i, name in enumerate(header) if name.startswith(("async", "synchronous twin"))]
    assert len(ours) == 2, header
    cells = [row[i] for row in body for i in ours if row[i]]
    assert cells
    assert not set(cells) - values, f"README.md's results table states {set(cells) - values}, not in the data"


COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


@pytest.mark.parametrize("name", ["results.md", "results_summary.md", "benchmarks.md"])
def test_a_reference_page_names_no_commit_in_its_prose(name):
    # The data's "measured at" names the commit; the page's prose does not.
    assert not COMMIT.findall(prose((ROOT / "docs" / name).read_text()))
