"""serving/allocator.py: which malloc tritonserver gets, through LD_PRELOAD."""

from __future__ import annotations

import logging

from serving.allocator import find_tcmalloc, preload_allocator


def test_tcmalloc_goes_ahead_of_what_the_environment_preloads(tmp_path):
    library = tmp_path / "libtcmalloc_minimal.so.4"
    library.write_bytes(b"")
    env = {"LD_PRELOAD": "/opt/libother.so"}
    assert preload_allocator(env, "tcmalloc", [tmp_path / "missing.so", library]) == library
    assert env["LD_PRELOAD"] == f"{library}:/opt/libother.so"


def test_tcmalloc_alone_when_nothing_else_is_preloaded(tmp_path):
    library = tmp_path / "libtcmalloc_minimal.so.4"
    library.write_bytes(b"")
    env: dict[str, str] = {}
    preload_allocator(env, "tcmalloc", [library])
    assert env == {"LD_PRELOAD": str(library)}


def test_the_system_allocator_leaves_the_environment_alone(tmp_path):
    library = tmp_path / "libtcmalloc_minimal.so.4"
    library.write_bytes(b"")
    env = {"LD_PRELOAD": "/opt/libother.so"}
    assert preload_allocator(env, "system", [library]) is None
    assert env == {"LD_PRELOAD": "/opt/libother.so"}


def test_a_missing_library_falls_back_to_the_system_allocator_and_says_where_it_looked(tmp_path, caplog):
    env: dict[str, str] = {}
    with caplog.at_level(logging.WARNING, logger="serving.allocator"):
        assert preload_allocator(env, "tcmalloc", [tmp_path / "nowhere.so"]) is None
    assert env == {}
    assert str(tmp_path / "nowhere.so") in caplog.text and "make tools" in caplog.text


def test_the_first_existing_candidate_wins(tmp_path):
    first, second = tmp_path / "a.so", tmp_path / "b.so"
    second.write_bytes(b"")
    assert find_tcmalloc([first, second]) == second
    first.write_bytes(b"")
    assert find_tcmalloc([first, second]) == first
