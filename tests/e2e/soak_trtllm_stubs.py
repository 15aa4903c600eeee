"""A soak of the tensorrt_llm variant's Python stubs (not part of `make test`):
many concurrent streams through the thin step on the real tritonserver, with
the engine double, log-probs on and, with --timeouts, every other request
given a 1 ms per-token bound (a timeout reply from the watchdog thread and an
engine stop per request). It reports how many streams failed and whether a
stub process died, from tritonserver's log and the stubs still running.

    .venv/bin/python -m tests.e2e.soak_trtllm_stubs --streams 600 --tokens 16 --concurrency 16 --timeouts

Found the races of docs/benchmarks.md's "Python backend stub" section; it
samples them, so run it several times.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from serving.default_model import ensure_default_model
from tests.e2e.triton_calls import sse_stream
from tests.e2e.trtllm_double import repository_with_fake_engine, trtllm_variant_server


def _stubs(work_dir: Path) -> list[str]:
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [
        line.split()[1].split("/model_repository/")[1].split("/")[0]
        for line in listing.splitlines()
        if "triton_python_backend_stub" in line and str(work_dir) in line
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=600)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--timeouts", action="store_true", help="every other request gets token_timeout_ms=1")
    parser.add_argument("--model", default="ensemble", choices=["ensemble", "llm_bls"])
    args = parser.parse_args()
    # a `timeout` around this must still stop the server (it runs in a session of its own)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix="soak_trtllm_"))
    source = repository_with_fake_engine(root / "src" / "model_repository")
    server = trtllm_variant_server(ensure_default_model(), source, root / "work").start()
    stubs_before = sorted(_stubs(root / "work"))

    failed = threading.Event()  # a dead stub fails every later stream slowly: stop at the first

    def one(i: int) -> str | None:
        """The stream's error, "" when it succeeded, None when it was not run."""
        if failed.is_set():
            return None
        body = {
            "text_input": "Hello",
            "max_tokens": args.tokens,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0.0,
            "return_log_probs": True,
            "return_output_ids": True,
        }
        if args.timeouts and i % 2:
            body["token_timeout_ms"] = 1
        try:
            error = sse_stream(server.http_url, args.model, body, timeout=30).error
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error:
            failed.set()
        return error or ""

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(args.concurrency) as pool:
            outcomes = list(pool.map(one, range(args.streams)))
        elapsed = time.monotonic() - started
        stubs_after = sorted(_stubs(root / "work"))
    finally:
        server.stop()
    errors = [e for e in outcomes if e]
    unhealthy = server.log_path.read_text(errors="replace").count("is not healthy")
    run = sum(outcome is not None for outcome in outcomes)
    print(
        f"{run} of {args.streams} streams run ({args.model}, {args.tokens} tokens, {args.concurrency} at a time, "
        f"timeouts {'on' if args.timeouts else 'off'}) in {elapsed:.1f} s: {len(errors)} failed {errors[:3]}; "
        f"stubs gone: {sorted(set(stubs_before) - set(stubs_after)) or 'none'}; "
        f"'not healthy' in the log: {unhealthy}; log {server.log_path}"
    )
    raise SystemExit(1 if errors or unhealthy or stubs_before != stubs_after else 0)


if __name__ == "__main__":
    main()
