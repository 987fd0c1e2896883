"""Row strides read from an array's shape and strides (no GPU needed: the rule is arithmetic)."""
from __future__ import annotations

import pytest

from aicg.runtime.arrays import row_stride


@pytest.mark.parametrize("shape, strides, expected", [
    ((4, 6), (6, 1), 6),                 # dense
    ((4, 6), (10, 1), 10),               # x[:, :6] of a (4, 10) matrix
    ((2, 3, 6), (30, 10, 1), 10),        # batches of strided rows that nest evenly
    ((1, 6), (99, 1), 6),                # one row: its stride says nothing
    ((4, 1), (2, 5), 2),                 # one column: the last stride says nothing
    ((6,), (1,), 6),
    ((4, 6), None, 6),                   # no strides given: dense
])
def test_rows_lying_evenly_apart_give_their_stride(shape, strides, expected):
    assert row_stride("x", shape, strides) == expected


@pytest.mark.parametrize("shape, strides, message", [
    ((4, 6), (1, 4), "last stride 1"),           # a transpose
    ((2, 3, 6), (40, 10, 1), "evenly apart"),    # batches with a gap between them
    ((4, 6), (0, 1), "overlap"),                 # a broadcast row
])
def test_rows_that_do_not_lie_evenly_apart_are_refused(shape, strides, message):
    with pytest.raises(ValueError, match=message):
        row_stride("x", shape, strides)
