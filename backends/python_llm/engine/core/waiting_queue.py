"""Requests waiting for admission: higher priority first, FCFS within a
priority, preempted requests back at the front of their priority level."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from .request import Request


class WaitingQueue:
    def __init__(self) -> None:
        self._levels: dict[int, deque[Request]] = {}
        self._priorities: list[int] = []  # ascending; the last one is served first
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def _level(self, priority: int) -> deque[Request]:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = deque()
            bisect.insort(self._priorities, priority)
        return level

    def append(self, request: Request) -> None:
        self._level(request.priority).append(request)
        self._len += 1

    def appendleft(self, request: Request) -> None:
        self._level(request.priority).appendleft(request)
        self._len += 1

    def peek(self) -> Request:
        for priority in reversed(self._priorities):
            level = self._levels[priority]
            if level:
                return level[0]
        raise IndexError("peek from an empty WaitingQueue")

    def popleft(self) -> Request:
        request = self.peek()
        self._levels[request.priority].popleft()
        self._len -= 1
        self._drop_if_empty(request.priority)
        return request

    def remove(self, request: Request) -> bool:
        level = self._levels.get(request.priority)
        if level is None:
            return False
        try:
            level.remove(request)
        except ValueError:
            return False
        self._len -= 1
        self._drop_if_empty(request.priority)
        return True

    def _drop_if_empty(self, priority: int) -> None:
        # keeps peek() O(distinct live priorities), usually one
        if not self._levels[priority]:
            del self._levels[priority]
            self._priorities.remove(priority)

    def __iter__(self) -> Iterator[Request]:
        for priority in reversed(self._priorities):
            yield from self._levels[priority]
