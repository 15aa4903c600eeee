"""Engine requests left behind by a migration. A stream that stalled moved
on, but its request is still held by the frozen replica (its KV blocks, a
batch slot): once the replica answers again, the request is stopped by its
key, and the stop is confirmed (stopped, or already gone) rather than
assumed. A replica that died has nothing left to stop; the same path finds
that out the first time the replica (restarted) answers."""

from __future__ import annotations

import asyncio
import logging
import time

from client.errors import RequestError

from ..ops.metrics import ORPHANS_STOPPED
from .replica import Replica
from .replica_client import ReplicaStream

log = logging.getLogger(__name__)

# how long a frozen replica's orphan is watched for; a replica frozen longer
# has been ejected and, when it comes back, restarted or probed back in
GIVE_UP_AFTER_S = 900.0
_CHECK_EVERY_S = 1.0
_STOP_TIMEOUT_S = 10.0


class Orphans:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def adopt(self, replica: Replica, stream: ReplicaStream) -> None:
        """Stop `stream`'s engine request on `replica` in the background."""
        task = asyncio.ensure_future(self._stop(replica, stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def __len__(self) -> int:
        return len(self._tasks)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _stop(self, replica: Replica, stream: ReplicaStream) -> None:
        request_id, key = stream.request_id, stream.request_key
        # the client library's own clean-up: close the RPC, send the stop (it
        # may wait on a frozen replica: this task is nobody's latency)
        try:
            await stream.aclose()
        except Exception as exc:
            log.debug("closing the orphaned request %s on %s: %r", request_id, replica.name, exc)
        client = replica.upstream.client
        deadline = time.monotonic() + GIVE_UP_AFTER_S
        while time.monotonic() < deadline:
            if await client.ready():
                try:
                    stopped = await asyncio.wait_for(client.stop(key, request_id), _STOP_TIMEOUT_S)
                except (TimeoutError, RequestError, OSError) as exc:
                    log.info(
                        "stopping orphaned request %s on %s failed (%r); trying again", request_id, replica.name, exc
                    )
                else:
                    outcome = "stopped" if stopped else "gone"
                    ORPHANS_STOPPED.labels(outcome=outcome).inc()
                    log.info("orphaned request %s on replica %s: %s", request_id, replica.name, outcome)
                    return
            await asyncio.sleep(_CHECK_EVERY_S)
        ORPHANS_STOPPED.labels(outcome="gave_up").inc()
        log.warning(
            "gave up stopping orphaned request %s on replica %s after %.0f s", request_id, replica.name, GIVE_UP_AFTER_S
        )
