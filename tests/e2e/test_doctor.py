"""`python -m serving doctor` on a live tritonserver with batching turned off
(engine.max_num_seqs = 1) under 8 concurrent clients: the real command,
watching the real metrics port, names "not batched" first."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.doctor_load import SCENARIOS, BackgroundLoad
from tests.e2e.fleet_helpers import wait_until
from tests.e2e.triton_calls import scrape_metrics

pytestmark = pytest.mark.e2e


def test_doctor_names_missing_batching_on_a_live_server(start_triton):
    server = start_triton(**{"engine.max_num_seqs": 1})
    with BackgroundLoad(server.grpc_url, SCENARIOS["not_batched"]):
        queued = wait_until(
            lambda: scrape_metrics(server.metrics_url)["llm_num_requests_waiting"] >= 2, 60, "requests queued"
        )
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "serving",
                "doctor",
                "--metrics",
                server.metrics_url,
                "--window",
                "8",
                "--interval",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    print(
        f"\n[queue formed after {queued:.1f} s; doctor watched and answered in "
        f"{time.monotonic() - started:.1f} s]\n{done.stdout}"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    first = next(line for line in lines if line.startswith("1. "))
    assert "requests are not batched" in first
    assert not any(line.startswith("2. ") for line in lines), "only the one cause"
    server.stop()
