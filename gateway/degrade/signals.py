"""The four signals of sustained overload, each a value over the last
`window_s` seconds (None: no data in the window, which is neither calm nor
overload):

- queue_time: the mean queue time (arrival → first scheduled) of the
  requests the engines scheduled in the window: Δsum / Δcount of their
  queue-time histograms, over every replica (each request weighs the same).
  The histogram only learns of a wait once it ends, so a window in which
  nothing was scheduled counts as `window_s` when requests were waiting at
  every scrape (the queue did not move for a whole window: its head has
  waited at least that long), and as 0 when the queues were empty at some
  scrape (idle, not overloaded);
- kv_use: KV blocks used / capacity over the fresh, routable replicas
  together (Σ used / Σ capacity, so the fleet's mean weighted by capacity),
  averaged over the window's scrapes. Not the max: degrading acts on every
  caller, and one full replica is the router's to avoid (it scores KV use);
  only a fleet full everywhere leaves it nowhere to send;
- preemptions: preemptions per second per replica (the window's increments
  over the replicas that reported, divided by the window: during the first
  window after start it is underestimated, never overestimated);
- error_rate: failed engine requests / all of them in the window, once the
  window holds at least MIN_OUTCOMES (two failures of three requests on an
  idle gateway are no overload).

Fed once per metrics scrape round (observe) and with every engine request's
outcome (outcome: O(1), counted until the next round)."""

from __future__ import annotations

from collections.abc import Iterable

from ..fleet.replica import Replica
from .counters import CounterDeltas
from .window import SignalWindow

QUEUE_TIME, KV_USE, PREEMPTIONS, ERROR_RATE = "queue_time", "kv_use", "preemptions", "error_rate"
SIGNALS = (QUEUE_TIME, KV_USE, PREEMPTIONS, ERROR_RATE)
MIN_OUTCOMES = 10

SignalValues = dict[str, float | None]


class Signals:
    def __init__(self, window_s: float, stale_s: float) -> None:
        self.window_s = window_s
        self._stale_s = stale_s
        self._kv = SignalWindow(window_s)
        self._waiting = SignalWindow(window_s)
        self._queue_sum, self._queue_count = SignalWindow(window_s), SignalWindow(window_s)
        self._preemptions = SignalWindow(window_s)
        self._failed, self._outcomes = SignalWindow(window_s), SignalWindow(window_s)
        self._deltas = CounterDeltas()
        self._pending_ok = 0
        self._pending_failed = 0

    def outcome(self, ok: bool) -> None:
        if ok:
            self._pending_ok += 1
        else:
            self._pending_failed += 1

    def observe(self, replicas: Iterable[Replica], now: float) -> None:
        """One scrape round: the replicas carry their fresh readings."""
        replicas = list(replicas)
        self._deltas.forget_others({r.name for r in replicas})
        used = capacity = waiting = 0.0
        queue_sum = queue_count = preempted = 0.0
        reporting = fresh = 0
        for replica in replicas:
            reading = replica.load
            if not reading.stale(self._stale_s, now):
                fresh += 1
                waiting += reading.waiting
                if replica.routable and reading.kv_capacity > 0:
                    used += reading.kv_used
                    capacity += reading.kv_capacity
            increments = self._deltas.advance(replica.name, reading)
            if increments is not None:
                reporting += 1
                queue_sum += increments.queue_time_sum
                queue_count += increments.queue_time_count
                preempted += increments.preemptions
        if capacity > 0:
            self._kv.add(now, used / capacity)
        if fresh:
            self._waiting.add(now, waiting)
        if reporting:
            self._queue_sum.add(now, queue_sum)
            self._queue_count.add(now, queue_count)
            self._preemptions.add(now, preempted / reporting)
        total = self._pending_ok + self._pending_failed
        if total:
            self._failed.add(now, self._pending_failed)
            self._outcomes.add(now, total)
            self._pending_ok = self._pending_failed = 0

    def _queue_time(self, now: float) -> float | None:
        count = self._queue_count.total(now)
        if count > 0:
            return self._queue_sum.total(now) / count
        least_waiting = self._waiting.minimum(now)
        if least_waiting is None:
            return None
        return self.window_s if least_waiting > 0 else 0.0

    def values(self, now: float) -> SignalValues:
        outcomes = self._outcomes.total(now)
        # the rate needs a report in the window: none at all is no data, not 0/s
        preemptions = self._preemptions.total(now) / self.window_s if self._preemptions.count(now) else None
        return {
            QUEUE_TIME: self._queue_time(now),
            KV_USE: self._kv.mean(now),
            PREEMPTIONS: preemptions,
            ERROR_RATE: self._failed.total(now) / outcomes if outcomes >= MIN_OUTCOMES else None,
        }
