"""Client retries against the real tritonserver: a restart mid-request and a
burst past a tiny engine queue."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from client import AsyncLLMClient, ClientConfig, GenerationResult, RetryBudget, RetryConfig, TimeoutConfig

pytestmark = pytest.mark.e2e
PROMPT = "Name three colours."


def counter_total(metrics_url: str, name: str) -> float:
    """Sum of one Prometheus counter over all its label sets."""
    text = httpx.get(metrics_url, timeout=5).text
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    ]
    if not values:
        raise AssertionError(f"{name} is missing from the metrics")
    return sum(values)


def client_config(server, transport: str, retry: RetryConfig) -> ClientConfig:
    url = server.http_url if transport == "sse" else server.grpc_url
    return ClientConfig(
        url=url,
        transport=transport,
        model="ensemble",
        retry=retry,
        timeouts=TimeoutConfig(connect_s=2.0, first_token_s=60.0, token_s=30.0),
    )


def test_retry_rides_out_a_server_restart(start_triton):
    """Both transports keep retrying connection errors while the server is down
    and complete once it is back on the same ports."""
    server = start_triton()
    server.stop()
    # Backoff capped at 1 s so the first attempt after the restart comes quickly;
    # attempts and budget sized for a restart of up to ~2 minutes on a busy machine.
    retry = RetryConfig(max_attempts=300, backoff_base_s=0.1, backoff_max_s=1.0, budget_floor=400.0, budget_cap=400.0)
    budgets = {transport: RetryBudget.from_config(retry) for transport in ("sse", "grpc")}
    results: dict[str, GenerationResult | BaseException] = {}

    def request(transport: str) -> None:
        async def one() -> GenerationResult:
            async with AsyncLLMClient(client_config(server, transport, retry), budget=budgets[transport]) as client:
                return await client.generate(PROMPT, max_tokens=8, temperature=0.0)

        try:
            results[transport] = asyncio.run(one())
        except BaseException as exc:  # reported by the main thread
            results[transport] = exc

    threads = [threading.Thread(target=request, args=(t,), daemon=True) for t in budgets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while not all(b.retries_allowed >= 2 for b in budgets.values()):
        assert time.monotonic() < deadline, "the clients did not start retrying against the stopped server"
        time.sleep(0.1)
    assert not results, f"a request ended while the server was down: {results}"

    restarted = time.monotonic()
    server.start()  # same LaunchOptions, hence the same ports
    print(f"\n[restart] server ready again after {time.monotonic() - restarted:.1f} s")
    for thread in threads:
        thread.join(timeout=90)
        assert not thread.is_alive(), "the retrying request did not finish after the restart"

    assert set(results) == set(budgets)
    for transport, outcome in results.items():
        assert isinstance(outcome, GenerationResult), f"{transport}: {outcome!r}"
        print(f"[{transport}] {outcome.attempts} attempts, text {outcome.text!r}")
        assert outcome.attempts > 1
        assert outcome.text and outcome.finish_reason in ("stop", "length")
        # Every retry was paid for by the budget, none refused.
        assert budgets[transport].retries_allowed == outcome.attempts - 1
        assert budgets[transport].retries_denied == 0


def test_burst_past_the_queue_is_retried_to_success_within_the_budget(start_triton):
    """A tiny engine queue rejects part of a burst with `overloaded:` at once;
    the client backs off and retries them, paying each retry from its budget."""
    server = start_triton(max_queue_size=2, max_num_seqs=2)
    burst = 12
    # Four requests fit (two running, two waiting); the other eight keep coming
    # back until a slot frees, so attempts and budget are sized for the whole burst.
    retry = RetryConfig(
        max_attempts=40, backoff_base_s=0.25, backoff_max_s=2.0, budget_ratio=0.2, budget_floor=250.0, budget_cap=300.0
    )
    rejected_before = counter_total(server.metrics_url, "llm_requests_rejected_total")

    async def fire() -> tuple[list[GenerationResult], RetryBudget]:
        async with AsyncLLMClient(client_config(server, "sse", retry)) as client:
            results = await asyncio.gather(
                *(client.generate(PROMPT, max_tokens=16, ignore_eos=True, seed=i) for i in range(burst))
            )
            return list(results), client.budget

    started = time.monotonic()
    results, budget = asyncio.run(fire())
    elapsed = time.monotonic() - started
    retries = sum(r.attempts - 1 for r in results)
    # Custom metrics are exported on scrape; allow a moment for the last rejection.
    deadline = time.monotonic() + 5
    while (rejected := counter_total(server.metrics_url, "llm_requests_rejected_total") - rejected_before) < retries:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    print(
        f"\n[burst] {burst} requests in {elapsed:.1f} s: {retries} retries, attempts "
        f"{sorted(r.attempts for r in results)}, engine rejected {rejected:.0f}, budget left {budget.balance:.1f}"
    )

    assert all(r.finish_reason == "length" and r.num_output_tokens == 16 for r in results), [
        (r.finish_reason, r.num_output_tokens) for r in results
    ]
    assert retries > 0, "nothing was rejected: the burst did not exceed the queue"
    # Each retry answered exactly one `overloaded:` rejection on this dedicated server.
    assert rejected == retries
    assert budget.retries_allowed == retries and budget.retries_denied == 0
    assert max(r.attempts for r in results) < retry.max_attempts
    # Budget accounting: the floor, plus the share each request deposited, minus one per retry.
    assert budget.balance == pytest.approx(retry.budget_floor + retry.budget_ratio * burst - retries)
