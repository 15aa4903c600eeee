"""BlockTableRows: the runner's persistent copy of the decodes' block tables."""
from __future__ import annotations

from python_llm.engine.worker.block_table_rows import BlockTableRows
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.core.scheduler_output import ScheduledSequence


def seq(request_id: str, table: list[int]) -> ScheduledSequence:
    return ScheduledSequence(request_id, [1], 0, table, True, SamplingParams())


def test_rows_follow_growing_tables_and_are_reused() -> None:
    rows = BlockTableRows(max_blocks_per_seq=4, initial_rows=2)
    a, b = [7], [3, 9]
    assert rows.rows_for([seq("a", a), seq("b", b)]) == [0, 1]
    a.append(5)   # the KV manager appends a block to a's table
    assert rows.rows_for([seq("b", b), seq("a", a)]) == [1, 0]
    assert rows.tensor.tolist() == [[7, 5, 0, 0], [3, 9, 0, 0]]
    rows.release(["a"])
    assert rows.num_rows_in_use == 1
    assert rows.rows_for([seq("c", [2])]) == [0]       # a's row, its old ids cleared
    assert rows.tensor[0].tolist() == [2, 0, 0, 0]


def test_a_new_table_list_is_rewritten() -> None:
    """A request re-admitted after preemption gets a new list from the KV manager."""
    rows = BlockTableRows(max_blocks_per_seq=3)
    rows.rows_for([seq("a", [1, 2, 3])])
    rows.rows_for([seq("a", [8])])
    assert rows.tensor[0].tolist() == [8, 0, 0]


def test_grows_past_its_initial_size() -> None:
    rows = BlockTableRows(max_blocks_per_seq=2, initial_rows=1)
    tables = {f"r{i}": list(range(i, i + 3)) for i in range(3)}   # wider than 2 blocks, more than 1 row
    assigned = rows.rows_for([seq(rid, table) for rid, table in tables.items()])
    assert sorted(assigned) == [0, 1, 2]
    for row, table in zip(assigned, tables.values()):
        assert rows.tensor[row, :3].tolist() == table
