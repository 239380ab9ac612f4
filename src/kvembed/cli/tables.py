"""Tables that fit the console's width without cutting a number.

Rich shrinks a table wider than the console by wrapping or cutting cells (``configu…``,
``1.00000…``). :func:`fitted_tables` gives every value column the width of its widest cell
(headers wrap at spaces, numbers never), lets the key columns (names, labels) wrap, and
when all the columns cannot fit side by side stacks them: one table per group of value columns
that fits, each repeating the key columns.
"""

from __future__ import annotations

from typing import Sequence

from rich.table import Table
from rich.text import Text

#: a column's padding (one space each side) and its right border; the table adds its left border
_PER_COLUMN, _BORDER = 3, 1


def _cell_width(cell: str) -> int:
    return Text.from_markup(cell).cell_len


def _longest_word(cell: str) -> int:
    return max((Text(word).cell_len for word in Text.from_markup(cell).plain.split()), default=1)


def fitted_tables(
    title: str | None, keys: Sequence[str], values: Sequence[str], rows: Sequence[Sequence[str]], width: int,
    summary: Sequence[str] | None = None,
) -> list[Table]:
    """``rows`` (key cells then value cells, rich markup) as tables no wider than ``width``: one
    when the columns fit side by side, else one per group of value columns, the key columns in each.
    ``summary``: a last row set apart by a rule (a total, a verdict)."""
    rows = [list(row) for row in rows] + ([list(summary)] if summary is not None else [])
    key_need = [max([_longest_word(keys[i])] + [_longest_word(row[i]) for row in rows]) for i in range(len(keys))]
    value_need = [max([_longest_word(values[j])] + [_cell_width(row[len(keys) + j]) for row in rows]) for j in range(len(values))]
    base = _BORDER + sum(w + _PER_COLUMN for w in key_need)
    groups: list[list[int]] = [[]]
    used = base
    for j, need in enumerate(value_need):
        if groups[-1] and used + need + _PER_COLUMN > width:
            groups.append([])
            used = base
        groups[-1].append(j)
        used += need + _PER_COLUMN
    tables = []
    for number, group in enumerate(groups):
        heading = title if number == 0 or title is None else f"{title} (continued)"
        table = Table(title=heading)
        for i, key in enumerate(keys):
            table.add_column(key, overflow="fold", min_width=key_need[i])
        spare = width - base - sum(value_need[j] + _PER_COLUMN for j in group)
        for j in group:  # room left: a header on one line
            grow = max(0, min(_cell_width(values[j]) - value_need[j], spare))
            spare -= grow
            table.add_column(values[j], justify="right", overflow="fold", width=value_need[j] + grow)
        for index, row in enumerate(rows):
            table.add_row(*row[: len(keys)], *(row[len(keys) + j] for j in group),
                          end_section=summary is not None and index == len(rows) - 2)
        tables.append(table)
    return tables


__all__ = ["fitted_tables"]
