"""One caller's engine request on the fleet, and its migration.

A stream whose replica dies (the RPC breaks) or stalls (nothing for
`stall_timeout_s`) after its first token is not lost: the prompt and the
tokens generated so far (`continuation_ids`) go to another replica, which
counts them as output already generated (max_tokens, stops, penalties) and
sends only what follows, with a clean text delta. The caller's stream goes on
without an error event: greedy requests continue exactly; seeded sampled ones
continue with the same seed (the text may differ after the switch, its
distribution does not). A stalled replica's request is stopped by key once it
answers again (orphans.py).

This is why the gateway always asks for `output_ids`: they are the only
exact record of what was generated."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from client import GenerationOptions, StreamEvent

from ..core.errors import GatewayError
from ..core.upstream import UpstreamFailure, UpstreamStalled
from ..ops.metrics import MIGRATIONS
from .replica import Replica
from .replica_client import ReplicaStream

if TYPE_CHECKING:
    from .fleet import Fleet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoutedRequest:
    """What a migration sends again."""

    model: str
    text_input: str
    options: GenerationOptions
    streaming: bool
    tier: str | None


class RoutedStream:
    """An engine request on one replica at a time: counted in that replica's
    in-flight load until closed; a stream that breaks or stalls counts
    against its replica."""

    def __init__(self, inner: ReplicaStream, replica: Replica, fleet: Fleet, request: RoutedRequest) -> None:
        self._inner: ReplicaStream | None = inner
        self.replica = replica
        self._fleet = fleet
        self._request = request
        self._closed = False
        self.first = inner.first
        self.generated: list[int] = list(inner.first.output_ids)
        self.migrations = 0

    @property
    def request_id(self) -> str:
        return self._request.options.request_id or ""

    async def rest(self) -> AsyncIterator[StreamEvent]:
        config = self._fleet.config
        while self._inner is not None:
            try:
                async for event in self._inner.rest(config.fleet.stall_timeout_s):
                    self.generated.extend(event.output_ids)
                    yield event
            except UpstreamFailure as failure:
                reason = "stalled" if isinstance(failure, UpstreamStalled) else "died"
                self._fleet.failed(self.replica, f"stream_{reason}")
                moved = await self._migrate(reason, failure)
                if moved is None:
                    self._fleet.outcome(False)
                    raise
                self.generated.extend(moved.output_ids)
                yield moved
                if moved.final:
                    break
                continue
            break
        if self._inner is not None:
            self.replica.health.failures = 0  # a whole answer: the replica works
        self._fleet.outcome(True)

    async def _migrate(self, reason: str, failure: UpstreamFailure) -> StreamEvent | None:
        """Continue on another replica; its first event, or None when the
        stream cannot move (the caller then gets the error event)."""
        config, request = self._fleet.config, self._request
        if not request.streaming or self.migrations >= config.fleet.migrate_attempts or self._inner is None:
            MIGRATIONS.labels(reason=reason, outcome="failed").inc()
            return None
        old, old_replica = self._inner, self.replica
        max_tokens = request.options.max_tokens
        if max_tokens is not None and len(self.generated) >= max_tokens:
            # the last token came, its final response did not: the answer is whole
            self._leave(old, old_replica)
            MIGRATIONS.labels(reason=reason, outcome="moved").inc()
            return StreamEvent(text="", finish_reason="length", final=True)
        options = dataclasses.replace(request.options, continuation_ids=list(self.generated))
        try:
            inner, replica = await self._fleet.route(
                dataclasses.replace(request, options=options), exclude={old_replica.name}
            )
        except GatewayError as error:
            MIGRATIONS.labels(reason=reason, outcome="failed").inc()
            log.warning(
                "stream %s could not move off replica %s (%s): %s",
                self.request_id,
                old_replica.name,
                reason,
                error.message,
            )
            return None
        self._leave(old, old_replica)
        self._inner, self.replica, self._closed = inner, replica, False
        self.migrations += 1
        MIGRATIONS.labels(reason=reason, outcome="moved").inc()
        log.warning(
            "stream %s moved from replica %s (%s: %s) to %s after %d tokens",
            self.request_id,
            old_replica.name,
            reason,
            failure,
            replica.name,
            len(self.generated),
        )
        return inner.first

    def _leave(self, old: ReplicaStream, replica: Replica) -> None:
        """The old engine request is the orphan stopper's now."""
        self._fleet.orphans.adopt(replica, old)
        self._fleet.track(replica, -1)
        self._inner, self._closed = None, True

    async def aclose(self) -> None:
        try:
            if self._inner is not None:
                await self._inner.aclose()
        finally:
            if not self._closed:
                self._closed = True
                self._fleet.track(self.replica, -1)
