"""python_llm's TensorRT-LLM-named metrics on a live tritonserver: under load
`nv_trt_llm_request_metrics` and `nv_trt_llm_kv_cache_block_metrics` move with
`llm_num_requests_*` and `llm_kv_cache_*` (same values at the same scrape, as
TensorRT-LLM defines them), and both go back to idle after."""

from __future__ import annotations

import re
import time

import pytest

from bench.doctor_load import BackgroundLoad, Scenario
from tests.e2e.fleet_helpers import wait_until
from tests.e2e.triton_calls import scrape_metrics

pytestmark = pytest.mark.e2e

_LABELS = re.compile(r'(\w+)="([^"]*)"')
REQUESTS = "nv_trt_llm_request_metrics"
KV = "nv_trt_llm_kv_cache_block_metrics"
# two sequences per step under five streams: some run, some wait
LOAD = Scenario("router_metrics", {"max_num_seqs": 2}, streams=5, max_tokens=24)


def _family(values: dict[str, float], family: str, label: str) -> dict[str, float]:
    """label value -> value, for the python_llm model's series of one family."""
    found = {}
    for key, value in values.items():
        if key.startswith(family + "{"):
            labels = dict(_LABELS.findall(key))
            if labels.get("model") == "python_llm":
                found[labels[label]] = value
    return found


def _check_one_scrape(values: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    requests = _family(values, REQUESTS, "request_type")
    kv = _family(values, KV, "kv_cache_block_type")
    running, waiting = values["llm_num_requests_running"], values["llm_num_requests_waiting"]
    used, capacity = values["llm_kv_cache_blocks_used"], values["llm_kv_cache_blocks_capacity"]
    assert requests["scheduled"] == running and requests["waiting"] == waiting, (requests, running, waiting)
    assert requests["active"] == running + waiting and requests["max"] == 2
    assert kv["used"] == used and kv["max"] == capacity and kv["free"] == capacity - used, (kv, used, capacity)
    assert kv["fraction"] == pytest.approx(used / capacity, abs=1e-6) and kv["tokens_per"] == 16
    return requests, kv


# the sink sets each llm_* gauge and then its derived router values, each a
# call of its own to tritonserver: a scrape can fall between them (seen once
# in ~30 scrapes: `scheduled` 2 against running 0). So a scrape whose views
# disagree is taken again, and such races must stay rare.
RACE_RETRIES = 3


def _agreeing_scrape(url: str) -> tuple[dict[str, float], dict[str, float], bool]:
    """(requests, kv, whether a scrape raced an update first)."""
    for attempt in range(RACE_RETRIES + 1):
        try:
            return (*_check_one_scrape(scrape_metrics(url)), attempt > 0)
        except AssertionError:
            if attempt == RACE_RETRIES:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def test_router_metrics_move_with_the_engines_own(start_triton):
    server = start_triton(**{"engine.max_num_seqs": 2})
    idle_requests, idle_kv = _check_one_scrape(scrape_metrics(server.metrics_url))
    assert (idle_requests["waiting"], idle_requests["scheduled"], idle_kv["fraction"]) == (0, 0, 0)

    seen_waiting = seen_scheduled = seen_fraction = 0.0
    scrapes = races = 0
    started = time.monotonic()
    with BackgroundLoad(server.grpc_url, LOAD):
        wait_until(lambda: scrape_metrics(server.metrics_url)["llm_num_requests_waiting"] >= 1, 60, "a queue")
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            requests, kv, raced = _agreeing_scrape(server.metrics_url)
            races += raced
            seen_waiting = max(seen_waiting, requests["waiting"])
            seen_scheduled = max(seen_scheduled, requests["scheduled"])
            seen_fraction = max(seen_fraction, kv["fraction"])
            scrapes += 1
            time.sleep(0.2)
    assert races <= scrapes // 5, f"{races} of {scrapes} scrapes fell between the two views' updates"
    # moved with the load
    assert seen_waiting >= 1 and seen_scheduled >= 1 and seen_fraction > 0, (
        seen_waiting,
        seen_scheduled,
        seen_fraction,
    )

    def idle() -> bool:
        requests, kv, _ = _agreeing_scrape(server.metrics_url)
        return requests["active"] == 0 and kv["used"] == 0 and kv["fraction"] == 0

    wait_until(idle, 60, "idle again")
    print(
        f"\n[{scrapes} scrapes under load in {time.monotonic() - started:.1f} s ({races} raced an update): "
        f"waiting up to {seen_waiting:.0f}, "
        f"scheduled up to {seen_scheduled:.0f}, KV fraction up to {seen_fraction:.3f}]"
    )
    server.stop()
