"""Stream state handed between `postprocessing` instances (ensemble/shared_state.py):
a delta's state is loaded only once the previous delta stored it."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from ensemble.outbound.shared_state import InProcessStateStore, SqliteStateStore, StreamOrderError

KEY = "s" * 32


def test_in_process_store_keeps_the_latest_state_until_deleted() -> None:
    store = InProcessStateStore()
    assert store.load(KEY, 0, timeout_s=0) is None
    store.save(KEY, 2, b"a")
    store.save(KEY, 5, b"b")
    assert store.load(KEY, 5, timeout_s=0) == b"b"
    store.delete(KEY)
    assert store.load(KEY, 0, timeout_s=0) is None


def test_sqlite_store_hands_state_from_one_instance_to_the_next(tmp_path: Path) -> None:
    path = str(tmp_path / "state.sqlite")
    first, second = SqliteStateStore(path), SqliteStateStore(path)
    assert first.load(KEY, 0, timeout_s=0) is None  # a new stream starts without state
    first.save(KEY, 3, b"after three tokens")
    assert second.load(KEY, 3, timeout_s=0) == b"after three tokens"
    second.delete(KEY)
    assert first.load(KEY, 0, timeout_s=0) is None


def _open_store(path: str, barrier, errors) -> None:
    barrier.wait()
    try:
        SqliteStateStore(path)
    except Exception as exc:
        errors.put(repr(exc))


def test_instances_opening_a_new_store_at_once_all_open_it(tmp_path: Path) -> None:
    """postprocessing's instances start together; without the retry, 3
    processes opening one new file failed 'database is locked' in 25 of 60
    tries."""
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    for attempt in range(20):
        barrier = context.Barrier(3)
        path = str(tmp_path / f"state-{attempt}.sqlite")
        processes = [context.Process(target=_open_store, args=(path, barrier, errors)) for _ in range(3)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
            assert process.exitcode == 0
    assert errors.empty(), errors.get()


def test_a_delta_whose_predecessor_never_stored_its_state_is_an_error_without_the_key(tmp_path: Path) -> None:
    store = SqliteStateStore(str(tmp_path / "state.sqlite"))
    store.save(KEY, 3, b"x")
    with pytest.raises(StreamOrderError, match=r"^stream state: waited 0 s for position 5, the stream is at 3$"):
        store.load(KEY, 5, timeout_s=0)
    with pytest.raises(StreamOrderError, match=r"^stream state: waited 0 s for position 2, the stream is at None$"):
        store.load("t" * 32, 2, timeout_s=0)


def test_a_file_left_by_the_earlier_four_column_layout_still_works(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE stream_state (key TEXT PRIMARY KEY, next_start INTEGER, blob BLOB, updated REAL)")
    old.commit()
    old.close()
    store = SqliteStateStore(str(path))
    store.save(KEY, 1, b"y")
    assert store.load(KEY, 1, timeout_s=0) == b"y"
