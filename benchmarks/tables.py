"""The markdown tables of the benchmark reports: one header row, the rule, a line per row.

markdown_table(["critic", "ratio"], [["mlp", "1.000x"]])
-> ["| critic | ratio |", "|---|---|", "| mlp | 1.000x |"]
"""

from collections.abc import Iterable, Sequence


def table_row(cells: Iterable[object]) -> str:
    """One line of a table: ``| a | b |`` (each cell as ``str`` gives it)."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def markdown_table(head: Sequence[object], rows: Iterable[Iterable[object]]) -> list[str]:
    """The lines of a table of ``head`` and ``rows``, without a trailing blank line."""
    return [table_row(head), "|" + "---|" * len(head), *(table_row(row) for row in rows)]
