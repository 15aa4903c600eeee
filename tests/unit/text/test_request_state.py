from __future__ import annotations

import pytest

from ensemble.request_state import RequestStateStore


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_get_or_create_builds_once_per_key() -> None:
    store: RequestStateStore[list[int]] = RequestStateStore(clock=FakeClock())
    first = store.get_or_create("a", list)
    first.append(1)
    assert store.get_or_create("a", list) is first
    assert store.get("a") == [1] and "a" in store and len(store) == 1
    assert store.pop("a") == [1] and store.get("a") is None and store.pop("a") is None


def test_untouched_entries_are_evicted_after_the_ttl() -> None:
    clock = FakeClock()
    store: RequestStateStore[str] = RequestStateStore(ttl_s=10, clock=clock)
    store.get_or_create("old", lambda: "o")
    clock.now = 6
    store.get_or_create("new", lambda: "n")
    clock.now = 11
    assert store.evict_stale() == ["old"]
    assert store.age_s("new") == 5
    store.get("new")          # a touch keeps it alive
    clock.now = 20
    assert store.evict_stale() == []
    clock.now = 21
    assert store.evict_stale() == ["new"] and len(store) == 0


def test_a_full_store_evicts_the_least_recently_used() -> None:
    store: RequestStateStore[int] = RequestStateStore(max_entries=2, clock=FakeClock())
    store.get_or_create("a", lambda: 1)
    store.get_or_create("b", lambda: 2)
    store.get("a")
    store.get_or_create("c", lambda: 3)
    assert "b" not in store and "a" in store and "c" in store


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        RequestStateStore(ttl_s=0)
    with pytest.raises(ValueError):
        RequestStateStore(max_entries=0)
