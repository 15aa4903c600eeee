"""Streams that outlive their replica, and tier pools, on two real
tritonservers behind one real gateway process (times printed):

- `kill -9` of one of 2 replicas under 8 concurrent greedy streams of 64
  tokens: every stream completes without an error event, and its text equals
  its uninterrupted run.
- The same with SIGSTOP past the stall timeout; after SIGCONT the orphaned
  requests there are stopped by key (its KV blocks back to idle).
- A replica dedicated to the paid tier: free keys never reach it, and paid
  requests spill over to the shared replica while it is down."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.e2e.fleet_helpers import (
    SIGCONT,
    SIGKILL,
    SIGSTOP,
    FleetGateway,
    Load,
    kill_group,
    kv_blocks_used,
    start_fleet_gateway,
    wait_until,
)
from tests.e2e.triton_calls import scrape_metrics

pytestmark = pytest.mark.e2e

STALL_TIMEOUT_S = 4.0
STREAMS, TOKENS = 8, 64
PROMPT = "Tell me about the sea"


@pytest.fixture(scope="module")
def gateway(replicas, golden, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetGateway]:
    started = start_fleet_gateway(
        replicas,
        tmp_path_factory.mktemp("migration"),
        golden,
        f"gateway.fleet.stall_timeout_s={STALL_TIMEOUT_S}",
        "gateway.fleet.routing_policy=least_load",
    )
    yield started
    assert started.process.stop() == 0


@pytest.fixture(scope="module")
def uninterrupted(gateway) -> list[str]:
    gateway.wait_routable(120, r0=True, r1=True)
    outcomes = Load(gateway, STREAMS, max_tokens=TOKENS, prompt=PROMPT).start().wait()
    assert all(o.done for o in outcomes), [o.error for o in outcomes]
    return [o.text for o in outcomes]


def _same_texts(outcomes, expected: list[str]) -> list[int]:
    return [i for i, (o, text) in enumerate(zip(outcomes, expected)) if o.text != text]


def _load_underway(gateway: FleetGateway) -> Load:
    load = Load(gateway, STREAMS, max_tokens=TOKENS, prompt=PROMPT).start()
    wait_until(lambda: load.streaming(min_chars=12), 120, "every stream under way")
    return load


def test_kill_9_of_a_replica_under_8_streams_loses_none_and_changes_no_text(gateway, replicas, uninterrupted):
    moved_before = gateway.total("gateway_stream_migrations_total", reason="died", outcome="moved")
    load = _load_underway(gateway)
    cut_s = time.monotonic()
    kill_group(replicas["r1"], SIGKILL)
    outcomes = load.wait()
    took = time.monotonic() - cut_s
    moved = gateway.total("gateway_stream_migrations_total", reason="died", outcome="moved") - moved_before
    differing = _same_texts(outcomes, uninterrupted)
    print(
        f"\n[kill -9 r1 under {STREAMS} streams of {TOKENS} tokens: {sum(o.done for o in outcomes)} completed, "
        f"{moved:.0f} moved to r0, {len(differing)} texts differ from the uninterrupted run; the last ended "
        f"{took:.1f} s after the kill]"
    )
    assert all(o.done and not o.error for o in outcomes), [o.error for o in outcomes]
    assert moved >= 1, "no stream was on the killed replica: the test proved nothing"
    assert not differing, [(uninterrupted[i], outcomes[i].text) for i in differing]
    replicas["r1"].stop()
    replicas["r1"].start()
    back = gateway.wait_routable(120, r1=True)
    print(f"[r1 restarted; re-admitted {back:.1f} s after it was ready]")


def test_a_frozen_replicas_streams_move_and_its_orphans_are_stopped_after_sigcont(gateway, replicas, uninterrupted):
    gateway.wait_routable(120, r0=True, r1=True)
    moved_before = gateway.total("gateway_stream_migrations_total", reason="stalled", outcome="moved")
    stopped_before = gateway.total("gateway_orphans_stopped_total")
    load = _load_underway(gateway)
    frozen_s = time.monotonic()
    kill_group(replicas["r1"], SIGSTOP)
    try:
        outcomes = load.wait()
        took = time.monotonic() - frozen_s
    finally:
        kill_group(replicas["r1"], SIGCONT)
    resumed_s = time.monotonic()
    moved = gateway.total("gateway_stream_migrations_total", reason="stalled", outcome="moved") - moved_before
    differing = _same_texts(outcomes, uninterrupted)
    print(
        f"\n[SIGSTOP r1 under {STREAMS} streams (stall timeout {STALL_TIMEOUT_S:.0f} s): "
        f"{sum(o.done for o in outcomes)} completed, {moved:.0f} moved, {len(differing)} texts differ; "
        f"the last ended {took:.1f} s after the freeze]"
    )
    assert all(o.done and not o.error for o in outcomes), [o.error for o in outcomes]
    assert moved >= 1, "no stream was on the frozen replica: the test proved nothing"
    assert not differing, [(uninterrupted[i], outcomes[i].text) for i in differing]
    stopped = wait_until(
        lambda: gateway.total("gateway_orphans_stopped_total") - stopped_before >= moved,
        90,
        "the orphans stopped by key",
    )
    idle = wait_until(
        lambda: (
            kv_blocks_used(replicas["r1"]) == 0
            and scrape_metrics(replicas["r1"].metrics_url)["llm_num_requests_running"] == 0
        ),
        60,
        "r1's KV back to idle",
    )
    print(
        f"[SIGCONT r1: {moved:.0f} orphans stopped by key {stopped:.1f} s after it, KV idle after "
        f"{time.monotonic() - resumed_s:.1f} s; outcomes: stopped "
        f"{gateway.total('gateway_orphans_stopped_total', outcome='stopped'):.0f}, gone "
        f"{gateway.total('gateway_orphans_stopped_total', outcome='gone'):.0f}]"
    )
    assert idle < 60


def test_free_keys_never_reach_a_paid_replica_and_paid_spills_over_while_it_is_down(replicas, golden, tmp_path_factory):
    pools = (
        'gateway.fleet.replicas={"paid0": {"grpc_url": "%s", "metrics_url": "%s", "dedicated_to": ["paid"]}, '  # noqa: UP031 (JSON braces)
        '"shared": {"grpc_url": "%s", "metrics_url": "%s"}}'
        % (replicas["r0"].grpc_url, replicas["r0"].metrics_url, replicas["r1"].grpc_url, replicas["r1"].metrics_url)
    )
    gateway = start_fleet_gateway(replicas, tmp_path_factory.mktemp("pools"), golden, pools)
    try:
        gateway.wait_routable(120, paid0=True, shared=True)
        # the free tier's own limits allow 2 requests a second
        free = Load(gateway, 2, max_tokens=8, key=gateway.free_key).start().wait()
        paid = Load(gateway, 4, max_tokens=8).start().wait()
        assert all(o.done for o in free + paid), [o.error for o in free + paid]
        routed = {name: gateway.routed(name) for name in ("paid0", "shared")}
        print(
            f"\n[tier pools: 2 free + 4 paid requests: {routed['paid0']:.0f} to the paid replica, "
            f"{routed['shared']:.0f} to the shared one]"
        )
        assert routed == {"paid0": 4, "shared": 2}, "free keys reached the paid replica, or paid left its own"
        kill_group(replicas["r0"], SIGSTOP)
        try:
            out = gateway.wait_routable(30, paid0=False)
            spilled = Load(gateway, 4, max_tokens=8).start().wait()
            spill_count = gateway.total("gateway_routed_total", replica="shared", reason="spill_over")
        finally:
            kill_group(replicas["r0"], SIGCONT)
        print(
            f"[paid replica frozen, out after {out:.1f} s: 4 paid requests "
            f"{sum(o.done for o in spilled)} done, {spill_count:.0f} spilled over to the shared one]"
        )
        assert all(o.done for o in spilled), [o.error for o in spilled]
        assert spill_count == 4
    finally:
        gateway.process.stop()
