"""Sweeps split between ``make test`` and ``make test-slow``: the fast suite keeps a
representative of each behaviour, the slow suite runs every combination."""

import pytest


def diagonal(rows, columns, row_id=str, column_id=str):
    """``(row, column)`` parameters for every pair, the pairs off the diagonal marked ``slow``:
    ``make test`` runs each row once, with the columns in turn (row ``i`` with column
    ``i mod len(columns)``, so each column is kept for several rows), ``make test-slow`` all.
    Ids read ``<column>-<row>``, as two stacked ``parametrize`` would name them."""
    return [
        pytest.param(
            row,
            column,
            marks=() if j == i % len(columns) else (pytest.mark.slow,),
            id=f"{column_id(column)}-{row_id(row)}",
        )
        for j, column in enumerate(columns)
        for i, row in enumerate(rows)
    ]
