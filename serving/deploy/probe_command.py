"""`python -m serving probe`: is this tritonserver fit to take requests? The
readiness probe of a Triton pod (an exec probe) and compose's health check.

Ready means what the gateway's probe means (gateway/fleet/probe.py, the same
code): Triton says ready, then a fixed greedy prompt sent at top priority
answers exactly the golden tokens that `serving prepare-model` / `serve`
recorded from the packaged weights (`<build>/probe/<model>.json`). A process
whose weights or engine are broken still says ready: only the answer shows it.
An `overloaded:` refusal counts as ready (the replica is healthy, only busy:
taking it out of the Service would move its load onto the others). Without a
golden file any complete answer of the probe's length passes.

Exit 0 when ready, 1 otherwise; one line on stdout says which outcome."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from pathlib import Path

from ..probe_golden import Golden, GoldenError, golden_path, load_golden, probe_request

READY = ("ok", "overloaded")


def default_grpc_url() -> str:
    return f"127.0.0.1:{os.environ.get('LLM_TRITON_GRPC_PORT', '8001')}"


def served_model_dir(settings_file: str | None) -> str:
    """engine.model_dir as `serve` resolves it (settings, else $LLM_MODEL_DIR, else the
    default model's folder), without converting anything."""
    from ..default_model import default_model_dir
    from ..settings import DeploymentSettings

    settings = DeploymentSettings.load(
        settings_file=settings_file,
        default_model_dir=lambda: os.environ.get("LLM_MODEL_DIR") or str(default_model_dir()),
    )
    return settings.engine.model_dir


async def probe(grpc_url: str, golden: Golden | None, timeout_s: float) -> str:
    """One verdict: the gateway's outcomes (ok, overloaded, not_ready, ready_timeout,
    unreachable, timeout, refused, error, wrong_answer)."""
    from client import (
        AsyncLLMClient,
        ClientConfig,
        GenerationOptions,
        RequestError,
        RetryConfig,
        ServerConnectionError,
        TimeoutConfig,
    )
    from contract.errors import OVERLOADED_MARKER
    from gateway.fleet.probe import PROBE_PRIORITY, probe_once

    config = ClientConfig(
        url=grpc_url,
        transport="grpc",
        model="ensemble",
        retry=RetryConfig(max_attempts=1),
        timeouts=TimeoutConfig(connect_s=min(5.0, timeout_s), first_token_s=timeout_s, token_s=timeout_s),
    )
    client = AsyncLLMClient(config)
    try:
        outcome = await probe_once(client, golden, ready_timeout_s=min(5.0, timeout_s), answer_timeout_s=timeout_s)
        if golden is not None or outcome != "ok":
            return outcome
        # no golden answer: the engine must still answer the probe in full
        prompt, max_tokens = probe_request()
        options = GenerationOptions(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            return_output_ids=True,
            priority=PROBE_PRIORITY,
            request_id=f"probe-{uuid.uuid4().hex}",
        )
        try:
            result = await asyncio.wait_for(client.generate(prompt, options), timeout_s)
        except TimeoutError:
            return "timeout"
        except RequestError as exc:  # mapped as the gateway's probe maps them
            return "overloaded" if OVERLOADED_MARKER in exc.message else "refused"
        except ServerConnectionError:
            return "unreachable"
        if result.error is not None or len(result.output_ids) != max_tokens:
            return "error"
        return "ok"
    finally:
        await client.aclose()


def main(args: argparse.Namespace) -> int:
    grpc_url = args.grpc_url or default_grpc_url()
    golden: Golden | None = None
    path = Path(args.golden) if args.golden else golden_path(served_model_dir(args.settings))
    note = f"golden {path}"
    try:
        golden = load_golden(path)
    except GoldenError as exc:
        if args.golden or path.exists():  # asked for, or there and broken: never pass silently
            print(f"probe: error: {exc}", flush=True)
            return 1
        note = "no golden answer: any full answer passes"
    started = time.monotonic()
    outcome = asyncio.run(probe(grpc_url, golden, args.timeout_s))
    print(f"probe: {outcome} in {time.monotonic() - started:.2f} s ({grpc_url}; {note})", flush=True)
    return 0 if outcome in READY else 1
