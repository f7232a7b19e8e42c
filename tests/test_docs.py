"""The documentation site builds with no warning, and its API page documents the public API.

The same build as ``make docs`` (``sphinx-build -W``): a broken cross-reference,
a malformed docstring or a page left out of the table of contents fails it.
The notebook is rendered from its stored outputs, so nothing trains here.
"""

import ast
import dataclasses
import html as html_lib
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import ppo_async
from ppo_async.config import AsyncActorLearnerConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    pytest.importorskip("sphinx", reason="the docs extra: pip install -e '.[docs]' (make test installs it)")
    out = tmp_path_factory.mktemp("html")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-j", "1", "-q", "-b", "html",
         "-d", str(out / ".doctrees"), str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, f"sphinx-build -W failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return out


def test_api_page_documents_every_public_name_and_config_field(built_site):
    html = (built_site / "api.html").read_text()
    for name in ppo_async.__all__:
        assert f'id="ppo_async.{name}"' in html, f"{name} has no entry on the API page"
    for field in dataclasses.fields(AsyncActorLearnerConfig):
        assert f'id="ppo_async.AsyncActorLearnerConfig.{field.name}"' in html, field.name
    # The docstrings themselves, not just the names: train's and a field's text.
    assert "TrainResult" in html and "staleness" in html.lower()


def test_every_page_is_built(built_site):
    docs = ROOT / "docs"
    pages = [p for p in docs.rglob("*.md") if "_build" not in p.parts] + [docs / "quickstart.ipynb"]
    for page in pages:
        built = built_site / page.relative_to(docs).with_suffix(".html")
        assert built.exists(), f"{page} is not built"
    # The notebook is shown with its stored figures.
    assert "<img" in (built_site / "quickstart.html").read_text()


def config_field_docstrings() -> dict[str, str]:
    """Each config field's docstring, as tyro and autodoc read it (the string after the field)."""
    body = ast.parse(inspect.getsource(AsyncActorLearnerConfig)).body[0].body
    return {field.target.id: doc.value.value for field, doc in zip(body, body[1:])
            if isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr)}


def _visible_text(fragment: str) -> str:
    """The words a reader sees: tags dropped, entities and smart quotes undone, spaces collapsed."""
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", fragment))
    for curly, straight in (("\u2018", "'"), ("\u2019", "'"), ("\u201c", '"'), ("\u201d", '"')):
        text = text.replace(curly, straight)
    return " ".join(text.split())


def test_config_reference_renders_each_field_as_written(built_site):
    """Napoleon would read "None: keep every sample" as a type; smart quotes make --flag an en dash."""
    page = (built_site / "api.html").read_text()
    docs = config_field_docstrings()
    assert set(docs) == {field.name for field in dataclasses.fields(AsyncActorLearnerConfig)}
    for name, doc in docs.items():
        entry = re.search(rf'id="ppo_async\.AsyncActorLearnerConfig\.{name}">(.*?)</dl>', page, re.S)
        assert entry, f"{name} has no entry on the API page"
        described = entry.group(1).split("</dt>", 1)[1]
        assert 'class="field-' not in described, f"{name}: its docstring became a field list (a 'Type' box)"
        assert _visible_text(described) == " ".join(doc.split()), f"{name} is not rendered as written"
        assert "\u2013" not in described and "\u2014" not in described, f"{name}: a dash was rewritten"
        for flag in re.findall(r"--[a-z][\w-]*", doc):
            assert f'<span class="pre">{flag}</span>' in described, f"{name}: {flag} is not literal"


def test_every_quoted_figure_is_rendered(built_site):
    # A {{ name }} left unreplaced (in a table cell, say) would show as written.
    figures = json.loads((ROOT / "docs" / "figures.json").read_text())["figures"]
    for page in ("results.html", "results_summary.html", "benchmarks.html"):
        html = (built_site / page).read_text()
        assert "{{" not in html, page
    summary = html_lib.unescape((built_site / "results_summary.html").read_text())
    assert figures["learn_cartpole_learner"]["value"] in summary
    results = html_lib.unescape((built_site / "results.html").read_text())
    assert figures["mujoco_ant_greedy"]["value"] in results  # a {figures} table
