"""Sphinx configuration: MyST pages, the API from the docstrings, the quickstart notebook with its stored outputs.

``make docs`` (and ``tests/test_docs.py``) builds with ``-W``: any warning fails the build.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from ppo_async.version import __version__  # noqa: E402

project = "ppo_async"
author = "ppo_async authors"
copyright = "ppo_async authors"
release = __version__
version = __version__

extensions = [
    "myst_nb",  # MyST markdown pages and .ipynb notebooks (it loads myst_parser itself)
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "api_docstrings",  # docs/_ext: config fields' docstrings as written, --flags literal
    "figures",  # docs/_ext: the {figures} tables from docs/figures.json
]

# The notebook is rendered with the outputs stored in it (notebooks/execute.py
# re-makes docs/quickstart.ipynb); the build never trains anything.
nb_execution_mode = "off"

myst_enable_extensions = ["colon_fence", "dollarmath", "substitution"]
# Every measured figure, from docs/figures.json: a page writes {{ make_train_time }}.
from figures import load_figures  # noqa: E402  (docs/_ext)

myst_substitutions = {name: fig["value"] for name, fig in load_figures()["figures"].items()}
# Links such as [Soak](results.md#soak) resolve to the heading's anchor.
myst_heading_anchors = 4

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "_ext", "figures/*.md", "Thumbs.db", ".DS_Store"]

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": False}

html_theme = "sphinx_book_theme"
html_title = f"ppo_async {__version__}"
html_theme_options = {"show_toc_level": 2}
