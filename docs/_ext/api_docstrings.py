"""Autodoc: attribute docstrings as written, ``--flags`` and guide paths rendered for the web.

Napoleon reads an attribute's or a property's docstring as ``type: description``,
so a config field whose first line has a colon ("None: keep every sample")
would show the words before it in a "Type" box. The fields' types are in their
annotations, which autodoc prints in the signature, so these docstrings skip
napoleon: they are stashed before it runs and put back after.

In every docstring, a ``--flag`` becomes inline code (docutils' smart quotes
would otherwise turn its ``--`` into an en dash, which breaks copy and paste),
and a path ``docs/guide/NAME.md``, as ``--help`` prints it, links to that page.
"""

from __future__ import annotations

import re

_FLAG = re.compile(r"(?<![\w`:-])(--[A-Za-z][\w-]*)")
_GUIDE_PATH = re.compile(r"(?<![\w`/<])docs/(guide/\w+)\.md")
_NAPOLEON_PRIORITY = 500  # sphinx.ext.napoleon connects autodoc-process-docstring at the default
_stashed: dict[str, list[str]] = {}


def _stash(app, what, name, obj, options, lines) -> None:
    if what in ("attribute", "property"):
        _stashed[name] = list(lines)


def _restore_and_mark_up(app, what, name, obj, options, lines) -> None:
    if name in _stashed:
        lines[:] = _stashed.pop(name)
    for i, line in enumerate(lines):
        if line.lstrip().startswith(">>>"):  # doctest lines are code already
            continue
        line = _FLAG.sub(r"``\1``", line)
        lines[i] = _GUIDE_PATH.sub(r":doc:`docs/\1.md </\1>`", line)


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("autodoc-process-docstring", _stash, priority=_NAPOLEON_PRIORITY - 100)
    app.connect("autodoc-process-docstring", _restore_and_mark_up, priority=_NAPOLEON_PRIORITY + 100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
