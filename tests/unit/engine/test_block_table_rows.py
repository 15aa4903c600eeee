"""BlockTableRows: the runner's persistent copy of the block tables."""

from __future__ import annotations

from python_llm.engine.worker.block_table_rows import BlockTableRows


def test_rows_grow_by_what_is_written_and_are_reused() -> None:
    rows = BlockTableRows(max_blocks_per_seq=4, initial_rows=2)
    a, b = rows.add((7,)), rows.add((3, 9))
    assert (a, b) == (0, 1)
    rows.write(a, 1, (5,))  # the scheduler appended a block to a's table
    assert rows.tensor.tolist() == [[7, 5, 0, 0], [3, 9, 0, 0]]
    rows.free(a)
    assert rows.num_rows_in_use == 1
    assert rows.add((2,)) == 0  # a's row, its old ids cleared
    assert rows.tensor[0].tolist() == [2, 0, 0, 0]


def test_grows_past_its_initial_size() -> None:
    rows = BlockTableRows(max_blocks_per_seq=2, initial_rows=1)
    tables = [list(range(i, i + 3)) for i in range(3)]  # wider than 2 blocks, more than 1 row
    assigned = [rows.add(table) for table in tables]
    assert sorted(assigned) == [0, 1, 2]
    for row, table in zip(assigned, tables):
        assert rows.tensor[row, :3].tolist() == table
