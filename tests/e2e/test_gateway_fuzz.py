"""Schemathesis against the gateway's own OpenAPI schema (`/openapi.json`), in
front of the real tritonserver, with a valid API key, bounded for CI:
Schemathesis's own verdict is the gate.

The published schema is generated from the pydantic models the validators are
(gateway/openai/schemas.py, fields.py, openapi.py), so it is used as published:
no patching. What it asserts:
- `st run` exits 0: every check (`--checks all`) passed, and no warning that
  the schema and the validation disagree fired (`warnings.fail-on` in its
  config; the output is searched for them too);
- most positive cases (schema-valid bodies) POSTed to the generation routes
  were answered 2xx (measured by an `after_call` hook, > 50 %);
- no response ≥ 500 but the caller's own `token_timeout_ms` expiring (504
  `upstream_timeout`), and no request that timed out or lost its connection;
- generated requests reached Triton: the gateway's own counters
  (`gateway_key_requests_total`, `gateway_upstream_errors_total`) against
  Triton's `nv_inference_request_success` / `_failure`;
- afterwards the gateway's `/health`, Triton's readiness and a normal chat
  completion are still fine, and the gateway logged no unhandled error.

Bounded: Schemathesis 4.x through its CLI, every phase, `--max-examples` per
operation, one worker, a request timeout, a fixed seed (`FUZZ_SEED` /
`FUZZ_MAX_EXAMPLES` change them). The key's tier caps `max_tokens` at 1 and
sets no rate limit, so a fuzzed `max_tokens` cannot make a run long and no 429
hides a request."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.launcher import TritonServer
from tests.e2e.fuzz_gateway import FuzzGateway, fuzz_gateway_process
from tests.e2e.triton_calls import scrape_metrics

pytestmark = pytest.mark.e2e

MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "60"))
SEED = int(os.environ.get("FUZZ_SEED", "20261201"))
RUN_TIMEOUT_S = 540  # the whole Schemathesis run: about 4 min on 2 busy cores
REQUEST_TIMEOUT_S = 60
TOKENS_CAP = 1  # the fuzz tier's max_tokens_cap: each accepted case is one engine token
PUBLIC_MODELS = ("ensemble", "llm_bls")
GENERATION = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
GENERATION_ROUTES = ("chat", "completions", "responses")
MIN_POSITIVE_ACCEPTED = 0.5

# The checks all run. Configured, each for a reason:
# - the coverage phase sends only its negative cases (every boundary and type
#   violation, all refused at the door): its positive ones, each a generation,
#   would take about 10 min on 2 cores; positive cases come from the examples
#   and fuzzing phases (`--max-examples` each), and the coverage phase's
#   positive cases are checked in-process, against the fake engine, by
#   tests/unit/gateway/test_openai_openapi.py (Schemathesis's generator there too).
# - not_a_server_error also takes 504: the caller's own `token_timeout_ms`
#   expiring is that deadline at work (Schemathesis sends 1 ms), answered as the
#   engine timing out; the hook records every 504 and the test asserts each one
#   was a request with its own token_timeout_ms and code `upstream_timeout`.
# - every warning fails the run but `missing_test_data`: the id-addressed
#   operations (`/v1/responses/{id}`, `/v1/streams/{id}`) answer 404 for ids
#   nobody was issued, by design (ids are random and scoped to the key); the
#   test asserts that this warning names no other operation.
CONFIG = """
[phases.coverage.generation]
mode = "negative"

[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "504"]

[warnings]
fail-on = ["validation_mismatch", "low_valid_rate", "missing_auth", "rate_limited", "base_url_mismatch",
           "missing_deserializer", "unresolvable_reference", "unsupported_regex"]

# The id-addressed operations answer 404 to every generated id (no stream or
# response has it), so no request of theirs is ever "accepted", and
# Schemathesis's missing_auth heuristic then reads the one case that sends a
# wrong key (a 401, as it should be) as "returns only 401". Everywhere else an
# accepted request clears that heuristic; the unit test
# test_every_published_operation_needs_the_api_key_and_refuses_without_it checks
# the 401 on these too.
[[operations]]
include-path-regex = "[{](response|stream)_id[}]"
warnings.fail-on = ["validation_mismatch", "low_valid_rate", "rate_limited", "base_url_mismatch",
                    "missing_deserializer", "unresolvable_reference", "unsupported_regex"]
"""
# what Schemathesis prints when the schema and the validation disagree
MISMATCH_WARNINGS = (
    "mostly rejected generated data",
    "Schema validation mismatch",
    "Low valid-input rate",
    "accepted few of the requests",
)
ID_ADDRESSED = ("/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel", "/v1/streams/{stream_id}")

# Loaded by `st run` (SCHEMATHESIS_HOOKS): one JSON line per response and network error in $FUZZ_LOG.
HOOKS = """
import json, os
import schemathesis

_OUT = os.environ["FUZZ_LOG"]


def _write(record):
    with open(_OUT, "a", encoding="utf-8") as out:
        out.write(json.dumps(record, default=repr) + "\\n")


def _meta(case):
    meta = case.meta
    if meta is None:
        return None, None
    return meta.phase.name.value if hasattr(meta.phase.name, "value") else str(meta.phase.name), \\
        str(meta.generation.mode.value if hasattr(meta.generation.mode, "value") else meta.generation.mode)


@schemathesis.hook
def after_call(context, case, response):
    phase, mode = _meta(case)
    body = case.body if isinstance(case.body, dict) else None
    status = response.status_code
    _write({"kind": "response", "method": case.method, "path": case.path, "status": status,
            "phase": phase, "mode": mode, "model": body.get("model") if body else None,
            "error": response.text[:300] if status >= 400 else None,
            "body": json.dumps(case.body, default=repr)[:2000] if status >= 400 else None,
            "token_timeout_ms": body.get("token_timeout_ms") if body else None})


@schemathesis.hook
def after_network_error(context, case, request):
    _write({"kind": "network_error", "method": case.method, "path": case.path, "status": None,
            "body": json.dumps(case.body, default=repr)[:2000]})

"""


@pytest.fixture(scope="module")
def fuzz_gateway(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzGateway]:
    with fuzz_gateway_process(
        triton_server, tmp_path_factory.mktemp("gateway-fuzz"), tokens_cap=TOKENS_CAP, label="schemathesis"
    ) as gateway:
        yield gateway


def _sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    """A metric summed over the label sets that have all of `labels`."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(value for key, value in metrics.items() if key.startswith(name + "{") and all(w in key for w in wanted))


def _triton_requests(metrics: dict[str, float]) -> float:
    return sum(
        _sum(metrics, name, model=model)
        for name in ("nv_inference_request_success", "nv_inference_request_failure")
        for model in PUBLIC_MODELS
    )


def _run_schemathesis(fuzz_gateway: FuzzGateway, work: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    hooks, config = work / "fuzz_hooks.py", work / "schemathesis.toml"
    hooks.write_text(HOOKS)
    config.write_text(CONFIG)
    command = [
        str(Path(sys.executable).with_name("st")),
        "--config-file",
        str(config),
        "run",
        f"{fuzz_gateway.url}/openapi.json",
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {fuzz_gateway.key}",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--request-timeout",
        str(REQUEST_TIMEOUT_S),
        "--continue-on-failure",
        "--generation-database",
        "none",
        "--no-color",
        "--report",
        "junit",
        "--report-junit-path",
        str(work / "junit.xml"),
    ]
    started = time.monotonic()
    try:
        # cwd: anything Schemathesis writes (reports) stays in the test's directory
        run = subprocess.run(
            command,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env={**os.environ, "SCHEMATHESIS_HOOKS": str(hooks), "FUZZ_LOG": str(work / "fuzz.jsonl")},
        )
    except subprocess.TimeoutExpired as exc:
        shown = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"Schemathesis ran over {RUN_TIMEOUT_S} s; its output so far:\n{shown[-4000:]}")
    return run, time.monotonic() - started


def _print_statuses(responses: list[dict[str, Any]]) -> None:
    statuses = collections.Counter(r["status"] for r in responses)
    print(f"[schemathesis] statuses: {dict(sorted(statuses.items()))}")
    by_operation = collections.Counter((r["path"], r["method"], r["mode"], r["status"]) for r in responses)
    for (path, method, mode, status), count in sorted(by_operation.items(), key=str):
        print(f"    {method:7} {path:36} {mode or '-':9} {status}: {count}")


def test_schemathesis_passes_on_the_published_schema_and_reaches_triton(
    fuzz_gateway: FuzzGateway, triton_server: TritonServer, tmp_path: Path
) -> None:
    metrics_url = fuzz_gateway.process.metrics_url
    assert metrics_url, "the fuzzed gateway serves its /metrics on the ops listener"
    gateway_before, triton_before = scrape_metrics(metrics_url), scrape_metrics(triton_server.metrics_url)
    run, elapsed = _run_schemathesis(fuzz_gateway, tmp_path)
    gateway_after, triton_after = scrape_metrics(metrics_url), scrape_metrics(triton_server.metrics_url)
    output = run.stdout + run.stderr
    summary = output[output.find("SUMMARY") - 40 :] if "SUMMARY" in output else output[-6000:]
    print(
        f"\n[schemathesis] st run {fuzz_gateway.url}/openapi.json --checks all -n {MAX_EXAMPLES} --seed {SEED}: "
        f"exit {run.returncode} in {elapsed:.0f} s\n{summary}"
    )

    log = tmp_path / "fuzz.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    responses = [r for r in records if r["kind"] == "response"]
    lost = [r for r in records if r["kind"] == "network_error"]
    _print_statuses(responses)
    positive = [r for r in responses if r["method"] == "POST" and r["path"] in GENERATION and r["mode"] == "positive"]
    accepted = [r for r in positive if 200 <= r["status"] < 300]
    share = len(accepted) / max(len(positive), 1)
    print(
        f"[schemathesis] {len(responses)} responses, {len(lost)} network errors; positive POSTs on the "
        f"generation routes: {len(accepted)} of {len(positive)} accepted ({100 * share:.1f} %)"
    )
    refusals = collections.Counter(f"{r['status']} {(r['error'] or '')[:150]}" for r in positive if r["status"] >= 400)
    for message, count in refusals.most_common(8):
        print(f"    refused positive {count:4}× {message}")

    # Schemathesis's verdict: no check failed, no schema-mismatch warning
    assert run.returncode == 0, f"Schemathesis exit {run.returncode}:\n{summary[-6000:]}"
    mismatch = [w for w in MISMATCH_WARNINGS if w in output]
    assert not mismatch, f"Schemathesis warns that the schema and the validation disagree: {mismatch}"
    # the one warning allowed: only the id-addressed operations answered their positive cases 404
    unreachable = {(r["method"], r["path"]) for r in responses if r["mode"] == "positive"} - {
        (r["method"], r["path"]) for r in responses if r["mode"] == "positive" and r["status"] != 404
    }
    assert {path for _, path in unreachable} <= set(ID_ADDRESSED), unreachable
    missing = re.search(r"Missing test data: (\d+) operation", output)
    assert missing is None or int(missing.group(1)) <= len(unreachable), missing.group(0)
    operations = {(r["method"], r["path"]) for r in responses}
    assert {("POST", p) for p in GENERATION} | {("GET", "/v1/models"), ("GET", "/v1/models/{model}")} <= operations

    # no 5xx but the caller's own deadline, nothing lost
    own_deadline = [
        r
        for r in responses
        if r["status"] == 504 and r["token_timeout_ms"] and "upstream_timeout" in (r["error"] or "")
    ]
    server_errors = [r for r in responses if r["status"] >= 500 and r not in own_deadline]
    print(f"[schemathesis] {len(own_deadline)} answers were the caller's own token_timeout_ms expiring (504)")
    assert not server_errors, f"{len(server_errors)} responses ≥ 500: " + "; ".join(
        f"{r['method']} {r['path']} {r['body']} → {r['status']} {r['error']}" for r in server_errors[:5]
    )
    assert not lost, f"{len(lost)} requests got no response (timeout or connection lost): {lost[:5]}"
    assert share > MIN_POSITIVE_ACCEPTED, f"only {100 * share:.1f} % of the schema-valid bodies were accepted"

    answered = _sum(gateway_after, "gateway_key_requests_total") - _sum(gateway_before, "gateway_key_requests_total")
    refused_upstream = _sum(gateway_after, "gateway_upstream_errors_total") - _sum(
        gateway_before, "gateway_upstream_errors_total"
    )
    triton_requests = _triton_requests(triton_after) - _triton_requests(triton_before)
    print(
        f"[schemathesis] reached Triton: {answered:.0f} answered by the engine + {refused_upstream:.0f} engine "
        f"refusals; Triton counted {triton_requests:.0f} inference requests (n > 1 fans out)"
    )
    assert answered > 0, "no generated request reached the engine: the fuzz was all refused at the door"
    assert triton_requests >= answered, (triton_requests, answered)

    # the stack is still fine afterwards
    health = httpx.get(f"{fuzz_gateway.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["replicas_routable"] == 1
    assert fuzz_gateway.process.alive()
    assert triton_server.is_ready()
    answer = httpx.post(
        f"{fuzz_gateway.url}/v1/chat/completions",
        timeout=120,
        headers={"Authorization": f"Bearer {fuzz_gateway.key}"},
        json={
            "model": "ensemble",
            "max_tokens": 64,
            "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
        },
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    assert body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    assert 0 < body["usage"]["completion_tokens"] <= TOKENS_CAP, body["usage"]  # the tier's cap held
    assert "unhandled error" not in fuzz_gateway.process.log_path.read_text()
    print(
        f"[after] gateway /health ok, Triton ready, chat: {body['choices'][0]['message']['content']!r} "
        f"({body['usage']})"
    )
