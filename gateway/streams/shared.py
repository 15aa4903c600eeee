"""Streams shared through Redis, so that a client can resume or cancel a
stream through any gateway process behind the balancer.

The process that runs a stream (its owner) mirrors every event into a Redis
stream (`XADD`, entry id `0-<seq>`, trimmed to the same events as its own
buffer) next to a small hash (the key id it belongs to, whether it ended and
its last event). Another process serves a resume from there (`XREAD BLOCK`)
and tells the owner it is reading with a short-lived key renewed while it
reads, so the owner's grace period does not stop a stream that is being read
elsewhere. A `DELETE` through another process is published on one channel
that every owner listens to.

Events reach Redis in order through one writer task per stream; a Redis
failure loses the mirror (a resume elsewhere then ends early), never the
stream itself."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from .session import Event, StreamGone, StreamSession

log = logging.getLogger(__name__)

_CANCEL_CHANNEL = "streams:cancel"
# a reader elsewhere renews its mark this often; the mark lives three times as long
_ATTACHED_RENEW_S = 1.0
_ATTACHED_TTL_MS = 3000
# how long a mirrored stream outlives its last write when its owner vanished
_ORPHAN_TTL_S = 300


class SharedStreams:
    def __init__(self, redis: Any, prefix: str = "gateway") -> None:
        self._redis = redis
        self._prefix = prefix
        self._listener: asyncio.Task[None] | None = None
        self._writers: set[asyncio.Task[None]] = set()

    @classmethod
    def from_url(cls, redis_url: str, prefix: str = "gateway") -> SharedStreams:
        import redis.asyncio as aioredis  # late: the memory path never needs it

        return cls(aioredis.Redis.from_url(redis_url), prefix)

    def _meta(self, stream_id: str) -> str:
        return f"{self._prefix}:stream:{stream_id}"

    def _events(self, stream_id: str) -> str:
        return f"{self._prefix}:stream:{stream_id}:events"

    def _attached(self, stream_id: str) -> str:
        return f"{self._prefix}:stream:{stream_id}:attached"

    # the owner

    def mirror(self, session: StreamSession, cancel_local: Callable[[str], bool], retention_s: float) -> None:
        if self._listener is None:
            self._listener = asyncio.ensure_future(self._listen(cancel_local))
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        session.on_event(queue.put_nowait)
        task = asyncio.ensure_future(self._write(session, queue, max(int(retention_s) + 1, 2)))
        self._writers.add(task)
        task.add_done_callback(self._writers.discard)

    async def _write(self, session: StreamSession, queue: asyncio.Queue[Event | None], retention_s: int) -> None:
        meta, events = self._meta(session.stream_id), self._events(session.stream_id)
        try:
            await self._redis.hset(meta, mapping={"key_id": session.key_id, "done": 0, "last_seq": 0})
            await self._redis.expire(meta, _ORPHAN_TTL_S)
            while True:
                event = await queue.get()
                pipe = self._redis.pipeline(transaction=False)
                if event is None:
                    end: dict[str, Any] = {"done": 1, "last_seq": session.last_seq}
                    if session.summary is not None:
                        end["summary"] = json.dumps(session.summary.snapshot())
                    pipe.hset(meta, mapping=end)  # one command: a reader sees the end and the summary together
                    pipe.expire(meta, retention_s)
                    pipe.expire(events, retention_s)
                    await pipe.execute()
                    return
                pipe.xadd(events, {"data": event.data}, id=f"0-{event.seq}")
                pipe.xtrim(events, minid=f"0-{session.oldest_seq}")
                pipe.hset(meta, "last_seq", event.seq)
                pipe.expire(events, _ORPHAN_TTL_S)
                pipe.expire(meta, _ORPHAN_TTL_S)
                await pipe.execute()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning(
                "stream %s: mirroring to Redis failed; it can be resumed only through this process",
                session.stream_id,
                exc_info=True,
            )

    async def _listen(self, cancel_local: Callable[[str], bool]) -> None:
        channel = f"{self._prefix}:{_CANCEL_CHANNEL}"
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(channel)
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            data = message["data"]
                            cancel_local(data.decode() if isinstance(data, bytes) else str(data))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("the stream cancel channel failed; resubscribing", exc_info=True)
                await asyncio.sleep(1.0)

    async def attached_elsewhere(self, stream_id: str) -> bool:
        try:
            return bool(await self._redis.exists(self._attached(stream_id)))
        except Exception:
            log.warning("stream %s: cannot read its reader mark from Redis", stream_id, exc_info=True)
            return False

    # any process

    async def owner_key(self, stream_id: str) -> str | None:
        value = await self._redis.hget(self._meta(stream_id), "key_id")
        return value.decode() if isinstance(value, bytes) else value

    async def summary(self, stream_id: str) -> dict[str, Any] | None:
        """The final summary the owner wrote when the stream ended (a response object)."""
        value = await self._redis.hget(self._meta(stream_id), "summary")
        return json.loads(value) if value else None

    async def request_cancel(self, stream_id: str) -> None:
        await self._redis.publish(f"{self._prefix}:{_CANCEL_CHANNEL}", stream_id)

    async def check_resumable(self, stream_id: str, after: int) -> None:
        """StreamGone when the events after `after` were trimmed or expired."""
        first = await self._redis.xrange(self._events(stream_id), count=1)
        last_seq = int(await self._redis.hget(self._meta(stream_id), "last_seq") or 0)
        oldest = _seq(first[0][0]) if first else last_seq + 1
        if after + 1 < oldest:
            raise StreamGone(f"events after {after} are no longer buffered (oldest kept: {oldest})")

    async def read(self, stream_id: str, after: int, keepalive_s: float) -> AsyncIterator[Event | None]:
        """Like StreamSession.read, from the mirror: events after `after` to
        the end; None after `keepalive_s` without one."""
        position, idle_s = after, 0.0
        block_s = min(keepalive_s, _ATTACHED_RENEW_S)
        while True:
            await self._redis.set(self._attached(stream_id), 1, px=_ATTACHED_TTL_MS)
            replies = await self._redis.xread(
                {self._events(stream_id): f"0-{position}"}, block=int(block_s * 1000), count=256
            )
            entries = replies[0][1] if replies else []
            for entry_id, fields in entries:
                seq = _seq(entry_id)
                if seq != position + 1:
                    raise StreamGone(f"event {position + 1} was trimmed before it was read")
                position, idle_s = seq, 0.0
                yield Event(seq, fields[b"data"])
            if entries:
                continue
            meta = await self._redis.hgetall(self._meta(stream_id))
            if not meta or (meta.get(b"done") == b"1" and position >= int(meta.get(b"last_seq", 0))):
                return
            idle_s += block_s
            if idle_s >= keepalive_s:
                idle_s = 0.0
                yield None

    async def release(self, stream_id: str) -> None:
        """A reader elsewhere left: the owner's grace period may run out."""
        try:
            await self._redis.delete(self._attached(stream_id))
        except Exception:
            log.debug("stream %s: cannot clear its reader mark", stream_id, exc_info=True)

    async def aclose(self) -> None:
        tasks = [t for t in (self._listener, *self._writers) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._redis.aclose()


def _seq(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[1])
