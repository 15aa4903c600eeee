"""`python -m serving drain`: a Triton pod's preStop hook. Kubernetes takes a
stopping pod out of the headless Service at once, but each gateway learns it
only at its next DNS refresh: for `--delay-s` the replica keeps serving as
usual. Then it waits until its engine has no request running or waiting
(`llm_num_requests_running` + `llm_num_requests_waiting` on its own metrics
port), at most `--timeout-s`, before Kubernetes sends SIGTERM (which stops
tritonserver). Exit 0 once idle (or once the server is gone), 1 at the bound."""

from __future__ import annotations

import argparse
import os
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

BUSY_METRICS = ("llm_num_requests_running", "llm_num_requests_waiting")


def default_metrics_url() -> str:
    return f"http://127.0.0.1:{os.environ.get('LLM_TRITON_METRICS_PORT', '8002')}/metrics"


def busy(exposition: str) -> float:
    """Requests running + waiting in the engine, from a Prometheus text exposition."""
    total = 0.0
    for family in text_string_to_metric_families(exposition):
        if family.name in BUSY_METRICS:
            total += sum(sample.value for sample in family.samples)
    return total


def scrape(url: str, timeout_s: float = 5.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError):
        return None


def main(args: argparse.Namespace) -> int:
    url = args.metrics_url or default_metrics_url()
    if args.delay_s > 0:
        print(f"drain: serving on for {args.delay_s:g} s while the gateways drop this replica", flush=True)
        time.sleep(args.delay_s)
    deadline = time.monotonic() + args.timeout_s
    while True:
        text = scrape(url)
        if text is None:
            print(f"drain: {url} does not answer: nothing left to wait for", flush=True)
            return 0
        left = busy(text)
        if left == 0:
            print("drain: the engine is idle", flush=True)
            return 0
        if time.monotonic() >= deadline:
            print(f"drain: {left:g} requests still in the engine after {args.timeout_s:g} s", flush=True)
            return 1
        time.sleep(args.interval_s)
