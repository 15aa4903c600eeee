"""A bounded fuzz of the OpenAI routes' bodies (`/v1/chat/completions`,
`/v1/completions`, `/v1/responses`) in front of the real tritonserver: a
seeded generator (`OPENAI_FUZZ_SEED`, `OPENAI_FUZZ_BODIES`) writes raw bytes,
so a body can hold what no JSON library emits: invalid UTF-8 in keys and
values, lone surrogates, `NaN` / `Infinity`, 5,000-digit integers, `1e400`.
Each body is a valid request with one thing broken (a value out of range or
of the wrong type for each parameter, an unknown field, a refused value, a
broken message), or a valid request (about one in twelve), or not JSON at all.

Asserted: no response ≥ 500 and no connection reset or timeout; every 4xx for
a broken field names it (in `param` or the message); every valid body is
answered 200; the refusals are OpenAI's error shape. Status counts and the
elapsed time are printed."""

from __future__ import annotations

import collections
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from serving.launcher import TritonServer
from tests.e2e.fuzz_gateway import FuzzGateway, fuzz_gateway_process
from tests.e2e.openai_fuzz_bodies import ROUTES, Body, draw_body

pytestmark = pytest.mark.e2e

BODIES = int(os.environ.get("OPENAI_FUZZ_BODIES", "2400"))
SEED = int(os.environ.get("OPENAI_FUZZ_SEED", "4817"))
REQUEST_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def fuzz_gateway(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzGateway]:
    # one engine token per accepted body: the run is about the refusals
    with fuzz_gateway_process(
        triton_server, tmp_path_factory.mktemp("gateway-openai-fuzz"), tokens_cap=1, label="openai-fuzz"
    ) as gateway:
        yield gateway


@dataclass
class Outcome:
    body: Body
    route: str
    status: int | None
    error: dict[str, Any] | None
    text: str


def _send(client: httpx.Client, route: str, body: Body) -> Outcome:
    try:
        response = client.post(route, content=body.raw, headers={"content-type": "application/json"})
    except httpx.TransportError as exc:  # a reset, a timeout: the gateway failing, whatever the body
        return Outcome(body, route, None, None, repr(exc))
    error = None
    if response.status_code >= 400:
        try:
            error = response.json().get("error")
        except (ValueError, AttributeError):
            error = None
    return Outcome(body, route, response.status_code, error, response.text[:300])


def _names_field(outcome: Outcome) -> bool:
    error = outcome.error or {}
    name = outcome.body.field or ""
    return name in str(error.get("param") or "") or name in str(error.get("message") or "")


def test_no_body_gets_a_server_error_and_every_refusal_names_its_field(fuzz_gateway: FuzzGateway) -> None:
    rng = random.Random(SEED)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    with httpx.Client(
        base_url=fuzz_gateway.url, timeout=REQUEST_TIMEOUT_S, headers={"Authorization": f"Bearer {fuzz_gateway.key}"}
    ) as client:
        for _ in range(BODIES):
            route = rng.choice(ROUTES)
            outcomes.append(_send(client, route, draw_body(rng, route)))
    elapsed = time.monotonic() - started

    statuses = collections.Counter(o.status for o in outcomes)
    by_kind = collections.Counter((o.body.kind, o.status) for o in outcomes)
    print(
        f"\n[openai fuzz] {len(outcomes)} bodies (seed {SEED}) in {elapsed:.1f} s; statuses: "
        f"{dict(sorted(statuses.items(), key=lambda kv: kv[0] or 0))}"
    )
    for (kind, status), count in sorted(by_kind.items(), key=str):
        print(f"    {kind:14} {status}: {count}")
    fields = collections.Counter(o.body.field for o in outcomes if o.body.field)
    print(
        f"[openai fuzz] {len(fields)} distinct fields broken; "
        f"{sum(1 for o in outcomes if o.body.has_bad_bytes)} bodies with invalid UTF-8 or lone surrogates, "
        f"{sum(1 for o in outcomes if o.body.has_non_finite)} with NaN / Infinity / overflowing numbers"
    )

    lost = [o for o in outcomes if o.status is None]
    assert not lost, f"{len(lost)} requests lost their connection: " + "; ".join(
        f"{o.route} {o.body.raw[:200]!r} → {o.text}" for o in lost[:5]
    )
    server_errors = [o for o in outcomes if o.status >= 500]
    assert not server_errors, f"{len(server_errors)} responses ≥ 500: " + "; ".join(
        f"{o.route} {o.body.raw[:300]!r} → {o.status} {o.text}" for o in server_errors[:5]
    )
    valid = [o for o in outcomes if o.body.kind == "valid"]
    refused_valid = [o for o in valid if o.status != 200]
    assert valid and not refused_valid, "; ".join(
        f"{o.route} {o.body.raw[:300]!r} → {o.status} {o.text}" for o in refused_valid[:5]
    )
    broken = [o for o in outcomes if o.body.kind != "valid"]
    accepted_broken = [o for o in broken if o.status < 400]
    assert not accepted_broken, f"{len(accepted_broken)} broken bodies accepted: " + "; ".join(
        f"{o.route} {o.body.raw[:300]!r} → {o.status}" for o in accepted_broken[:5]
    )
    shapeless = [o for o in broken if not (o.error and {"message", "type", "param", "code"} <= o.error.keys())]
    assert not shapeless, [f"{o.status} {o.text}" for o in shapeless[:5]]
    unnamed = [o for o in broken if o.body.field is not None and not _names_field(o)]
    assert not unnamed, f"{len(unnamed)} refusals do not name the field: " + "; ".join(
        f"{o.body.field!r}: {o.route} {o.body.raw[:200]!r} → {o.status} {o.error}" for o in unnamed[:5]
    )
    not_json = [o for o in broken if o.body.field is None]
    assert all(o.status == 400 and o.error and o.error["code"] == "invalid_json" for o in not_json), [
        f"{o.body.raw[:80]!r} → {o.status} {o.error}" for o in not_json if o.status != 400
    ][:5]
    assert len(outcomes) >= 2000 and len(fields) >= 40
    health = httpx.get(f"{fuzz_gateway.url}/health", timeout=10)
    assert health.status_code == 200 and fuzz_gateway.process.alive()
    assert "unhandled error" not in fuzz_gateway.process.log_path.read_text()
