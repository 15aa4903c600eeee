"""ensemble.bls_responses: a finished decoupled BLS call's response iterator
keeps its last reference in Python until an `is_cancelled()` round trip that
began after it was retired, and is then dropped by the thread that made it."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from ensemble.bls_responses import RetiredResponses, cancelled_with_release, decoupled_responses


class FakeResponses:
    """Stands in for the stub's ResponseIterator (weak-referenceable)."""

    def __init__(self, items: list[str]) -> None:
        self.items = items

    def __iter__(self):
        return iter(self.items)


class FakeRequest:
    def __init__(self, items: list[str]) -> None:
        self.responses: FakeResponses | None = FakeResponses(items)

    def exec(self, decoupled: bool) -> FakeResponses:
        assert decoupled
        responses, self.responses = self.responses, None  # the request keeps no reference
        return responses


class FakeSender:
    def __init__(self, cancelled: bool = False, during_round_trip=None) -> None:
        self.cancelled = cancelled
        self.during_round_trip = during_round_trip
        self.asked = 0

    def is_cancelled(self) -> bool:
        self.asked += 1
        if self.during_round_trip is not None:
            self.during_round_trip()
        return self.cancelled


def _finished_call(retired: RetiredResponses, items=("a", "b")) -> tuple[list[str], weakref.ref]:
    request = FakeRequest(list(items))
    ref = weakref.ref(request.responses)
    got = list(decoupled_responses(request, retired))
    gc.collect()
    return got, ref


def test_a_finished_call_is_held_until_a_round_trip_after_it():
    retired = RetiredResponses()
    got, ref = _finished_call(retired)
    assert got == ["a", "b"]
    assert ref() is not None and len(retired) == 1
    assert cancelled_with_release(FakeSender(), retired) is False
    assert ref() is None and len(retired) == 0


def test_a_cancelled_answer_releases_nothing():
    # True may be the stub's cached answer: no round trip went through its queue
    retired = RetiredResponses()
    _, ref = _finished_call(retired)
    sender = FakeSender(cancelled=True)
    assert cancelled_with_release(sender, retired) is True
    assert sender.asked == 1
    assert ref() is not None and len(retired) == 1


def test_calls_retired_during_the_round_trip_stay_held():
    retired = RetiredResponses()
    _, first = _finished_call(retired)
    later: list[weakref.ref] = []
    sender = FakeSender(during_round_trip=lambda: later.append(_finished_call(retired)[1]))
    assert cancelled_with_release(sender, retired) is False
    assert first() is None
    assert later[0]() is not None and len(retired) == 1
    cancelled_with_release(FakeSender(), retired)
    assert later[0]() is None and len(retired) == 0


@pytest.mark.parametrize("how", ["break", "raise"])
def test_a_call_left_early_is_retired_too(how: str):
    retired = RetiredResponses()
    request = FakeRequest(["a", "b", "c"])
    ref = weakref.ref(request.responses)

    def consume() -> None:
        for item in decoupled_responses(request, retired):
            if how == "raise":
                raise RuntimeError(item)
            break

    if how == "raise":
        with pytest.raises(RuntimeError, match="a"):
            consume()
    else:
        consume()
    gc.collect()
    assert ref() is not None and len(retired) == 1
    cancelled_with_release(FakeSender(), retired)
    assert ref() is None


def test_the_releasing_thread_drops_the_last_reference():
    retired = RetiredResponses()
    request = FakeRequest(["a"])
    dropped_on: list[str] = []
    weakref.finalize(request.responses, lambda: dropped_on.append(threading.current_thread().name))
    list(decoupled_responses(request, retired))
    gc.collect()
    assert dropped_on == []

    releaser = threading.Thread(target=cancelled_with_release, args=(FakeSender(), retired), name="releaser")
    releaser.start()
    releaser.join(10)
    assert dropped_on == ["releaser"]
