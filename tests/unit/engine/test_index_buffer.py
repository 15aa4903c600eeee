"""IndexBuffer: a step's index tensors as views of one persistent buffer."""

from __future__ import annotations

import array

import pytest

from python_llm.engine.worker.index_buffer import IndexBuffer


def test_views_hold_the_values_and_are_reused_for_the_same_shape() -> None:
    buffer = IndexBuffer(capacity=8)
    first = buffer.load(array.array("q", [1, 2, 3, 4, 5]), (2, 3))
    assert [v.tolist() for v in first] == [[1, 2], [3, 4, 5]]
    second = buffer.load(array.array("q", [6, 7, 8, 9, 10]), (2, 3))
    assert all(a is b for a, b in zip(first, second))  # no new tensors
    assert [v.tolist() for v in second] == [[6, 7], [8, 9, 10]]


def test_new_shape_and_growth() -> None:
    buffer = IndexBuffer(capacity=2)
    views = buffer.load(array.array("q", range(7)), (3, 0, 4))
    assert [v.tolist() for v in views] == [[0, 1, 2], [], [3, 4, 5, 6]]
    assert [v.tolist() for v in buffer.load(array.array("q", [9]), (1,))] == [[9]]
    assert buffer.load(array.array("q"), ()) == ()


def test_sizes_must_cover_the_values() -> None:
    with pytest.raises(ValueError, match="do not add up"):
        IndexBuffer().load(array.array("q", [1, 2]), (1,))
