"""Every measured figure of the site, from one file: ``docs/figures.json``.

Each figure there has its value, what it measures, the command that measures
it, the date, the machine and, where known, the commit it was measured at.
Pages quote a value as a MyST substitution, ``{{ make_train_time }}`` (conf.py
loads them), and show a topic's figures as a table with the directive::

    ```{figures} make-train
    ```

``tests/test_figures.py`` checks that no page states a timing or a ratio that
is not in the file.
"""

from __future__ import annotations

import json
import pathlib

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

FIGURES_JSON = pathlib.Path(__file__).resolve().parents[1] / "figures.json"
COLUMNS = ("what", "value", "command", "date", "measured at")


def load_figures(path: pathlib.Path = FIGURES_JSON) -> dict:
    return json.loads(path.read_text())


def _cell(text: str, literal: bool = False) -> nodes.entry:
    entry = nodes.entry()
    paragraph = nodes.paragraph()
    if literal:
        paragraph += nodes.literal(text, text)
    else:  # `code` spans in a description become inline code
        for i, part in enumerate(text.split("`")):
            if part:
                paragraph += nodes.literal(part, part) if i % 2 else nodes.Text(part)
    entry += paragraph
    return entry


class FiguresDirective(SphinxDirective):
    """A table of one topic's figures: what, value, command, date, measured at."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(FIGURES_JSON))
        topic = self.arguments[0]
        rows = [fig for fig in load_figures()["figures"].values() if fig["topic"] == topic]
        if not rows:
            raise self.error(f"docs/figures.json has no figure of topic {topic!r}")
        table = nodes.table(classes=["figures"])
        group = nodes.tgroup(cols=len(COLUMNS))
        table += group
        for width in (40, 12, 36, 10, 8):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        header = nodes.row()
        for column in COLUMNS:
            header += _cell(column)
        head += header
        group += head
        body = nodes.tbody()
        for fig in rows:
            row = nodes.row()
            row += _cell(fig["what"])
            row += _cell(fig["value"])
            row += _cell(fig["command"], literal=True)
            row += _cell(fig["date"])
            row += _cell(fig.get("measured_at", ""), literal=bool(fig.get("measured_at")))
            body += row
        group += body
        return [table]


def setup(app):
    app.add_directive("figures", FiguresDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
