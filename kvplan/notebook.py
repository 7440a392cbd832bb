"""How results show in a notebook (Jupyter's `_repr_markdown_` and `_repr_html_`): a report as the command
prints it, kept preformatted, and a planning table as a real table. Text from a config is data: HTML is escaped,
and Markdown keeps it in a code fence longer than any run of backticks it holds, or escapes it cell by cell."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvplan.tables import Table

RIGHT = ' style="text-align: right"'


class ShownAsReport:
    """A result a notebook shows as the command prints it: its `report()` text, preformatted."""

    def report(self, width: int = 80) -> str:
        raise NotImplementedError

    def _repr_markdown_(self) -> str:
        return preformatted_markdown(self.report())

    def _repr_html_(self) -> str:
        return preformatted_html(self.report())


def preformatted_markdown(text: str) -> str:
    """`text` as a Markdown code block, shown as it is."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", text)), default=0))
    return f"{fence}text\n{text}{'' if text.endswith(chr(10)) else chr(10)}{fence}\n"


def preformatted_html(text: str) -> str:
    from html import escape

    return f"<pre>{escape(text)}</pre>"


def table_html(table: Table) -> str:
    """A planning table as an HTML table, the columns and the lines under it of its Markdown form."""
    from html import escape

    from kvplan.tables import below, text_columns

    columns = text_columns(table, short=True)

    def cells(tag: str, values, numeric) -> str:
        return "".join(f"<{tag}{RIGHT if right else ''}>{escape(value)}</{tag}>"
                       for value, right in zip(values, numeric, strict=True))

    numeric = [column.numeric for column in columns]
    head = f"<tr>{cells('th', [column.header for column in columns], numeric)}</tr>"
    body = "".join(f"<tr>{cells('td', [column.cell(row) for column in columns], numeric)}</tr>"
                   for row in table.rows)
    notes = "".join(f"<p>{escape(line)}</p>" for line in below(table, short=True))
    return f"<table><thead>{head}</thead><tbody>{body}</tbody></table>{notes}"
