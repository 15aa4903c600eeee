"""Schemathesis against the gateway's own OpenAPI schema (`/openapi.json`), in
front of the real tritonserver, with a valid API key, bounded for CI.

What it asserts:
- no response ≥ 500 other than the documented 503 (overloaded / unreachable),
  and no request that timed out or lost its connection: every response's
  status is collected by an `after_call` hook, not read off Schemathesis's
  summary;
- a measured share of the generated requests reached Triton, and it is > 0:
  the gateway's own counters (`gateway_key_requests_total`: requests the engine
  answered; `gateway_upstream_errors_total`: engine refusals) against every
  request Schemathesis sent, cross-checked with Triton's
  `nv_inference_request_success` / `_failure` for `ensemble` and `llm_bls`;
- afterwards the gateway's `/health`, Triton's readiness and a normal chat
  completion are still fine, and the gateway logged no unhandled error.

Bounded: Schemathesis 4.x through its CLI (`st run`, which runs Hypothesis
with no deadline), every phase, `--max-examples` per operation, one worker,
a request timeout, a fixed seed (`FUZZ_SEED` / `FUZZ_MAX_EXAMPLES` change them).
The key's tier caps `max_tokens` at 4 and sets no rate limit, so a fuzzed
`max_tokens` cannot make a run long and no 429 hides a request.

The published schema is typed, but looser than the validators behind it:
`model` is any string (the served models are no enum), `role` lists `tool`
and `function`, `prompt` may be empty, `tools`, `response_format`, `audio`...
are `{}` (anything) though only null / empty / neutral is accepted. Fuzzed as
published, not one generated request reached Triton (measured: 0 of 1082 and
0 of 1308, every positive body refused with 400 or 404 at the door). So a
`before_load_schema` hook tightens exactly those properties to what the
gateway enforces (`SCHEMA_GAPS`, printed with the results): Schemathesis then
generates valid bodies as positive cases, and the refused values as negative
ones, which the gateway must reject. The rest (`stream_options` only with
`stream: true`, `n` × prompts ≤ `max_n`, `best_of` = `n`) cannot be said in
JSON Schema and stays as generated. Other findings of Schemathesis's checks
(schema-valid bodies refused, 405 without `Allow`) are printed, not asserted:
they are about the schema's precision, not the gateway failing."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.process import GatewayProcess
from serving.launcher import TritonServer, free_local_ports
from tests.e2e.triton_calls import scrape_metrics

pytestmark = pytest.mark.e2e

MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "60"))
SEED = int(os.environ.get("FUZZ_SEED", "20261201"))
RUN_TIMEOUT_S = 420           # the whole Schemathesis run: about 100 s on 2 busy cores
REQUEST_TIMEOUT_S = 60
TOKENS_CAP = 4                # the fuzz tier's max_tokens_cap
DOCUMENTED_5XX = {503}        # overloaded engine / unreachable Triton / rate limiter unavailable
PUBLIC_MODELS = ("ensemble", "llm_bls")
GENERATION_ROUTES = ("chat", "completions")

_NULL: dict[str, Any] = {"type": "null"}


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, _NULL]}


_EMPTY_LIST = _or_null({"type": "array", "maxItems": 0})
_STOP = {"anyOf": [{"type": "string", "minLength": 1},
                   {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 16}, _NULL]}
_N = _or_null({"type": "integer", "minimum": 1, "maximum": 4})           # gateway.max_n
_SERVED = {"type": "string", "enum": list(PUBLIC_MODELS)}
_BOTH = ("ChatCompletionRequest", "CompletionRequest")
# (component, property, what the gateway enforces and the published schema does not say, the precise schema)
SCHEMA_GAPS: list[tuple[str, str, str, dict[str, Any]]] = [
    *[(c, "model", "only the served models (else 404)", _SERVED) for c in _BOTH],
    *[(c, "n", "at most gateway.max_n (4)", _N) for c in _BOTH],
    *[(c, "stop", "non-empty strings, at most 16", _STOP) for c in _BOTH],
    *[(c, "logit_bias", "must be empty", _or_null({"type": "object", "maxProperties": 0})) for c in _BOTH],
    ("ChatMessage", "role", "'tool' and 'function' refused",
     {"type": "string", "enum": ["system", "developer", "user", "assistant"]}),
    ("ChatMessage", "tool_calls", "must be empty", _EMPTY_LIST),
    *[("ChatMessage", p, "must be null", _NULL) for p in ("function_call", "audio")],
    *[("ChatCompletionRequest", p, "must be empty", _EMPTY_LIST) for p in ("tools", "functions")],
    *[("ChatCompletionRequest", p, "null or 'none'", {"enum": ["none", None]})
      for p in ("tool_choice", "function_call")],
    ("ChatCompletionRequest", "response_format", "null or {'type': 'text'}",
     _or_null({"type": "object", "properties": {"type": {"const": "text"}}, "required": ["type"],
               "additionalProperties": False})),
    *[("ChatCompletionRequest", p, "must be null", _NULL)
      for p in ("audio", "prediction", "reasoning_effort", "verbosity", "web_search_options", "moderation")],
    ("ChatCompletionRequest", "modalities", "null or ['text']",
     _or_null({"type": "array", "items": {"const": "text"}, "minItems": 1, "maxItems": 1})),
    ("ChatCompletionRequest", "top_logprobs", "0 or null", {"enum": [0, None]}),
    ("CompletionRequest", "prompt", "non-empty string(s)",
     {"anyOf": [{"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 4}]}),
    ("CompletionRequest", "logprobs", "0 or null", {"enum": [0, None]}),
    ("CompletionRequest", "echo", "false or null", {"enum": [False, None]}),
    ("CompletionRequest", "suffix", "empty or null", {"enum": ["", None]}),
    ("CompletionRequest", "best_of", "must equal n (null here)", _NULL),
]

# Loaded by `st run` (SCHEMATHESIS_HOOKS): one JSON line per response and network
# error in $FUZZ_LOG; the schema tightened by $FUZZ_SCHEMA_GAPS.
HOOKS = '''
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
def before_load_schema(context, raw_schema):
    components = raw_schema["components"]["schemas"]
    for component, prop, _, precise in json.loads(os.environ["FUZZ_SCHEMA_GAPS"]):
        properties = components[component]["properties"]
        title = properties[prop].get("title")
        properties[prop] = {**precise, **({"title": title} if title else {})}


@schemathesis.hook
def after_call(context, case, response):
    phase, mode = _meta(case)
    body = case.body if isinstance(case.body, dict) else None
    status = response.status_code
    _write({"kind": "response", "method": case.method, "path": case.path, "status": status,
            "phase": phase, "mode": mode, "model": body.get("model") if body else None,
            "elapsed_s": response.elapsed,
            "error": response.text[:300] if status >= 400 else None,
            "body": json.dumps(case.body, default=repr)[:2000] if status >= 500 else None,
            "token_timeout_ms": body.get("token_timeout_ms") if body else None})


@schemathesis.hook
def after_network_error(context, case, request):
    _write({"kind": "network_error", "method": case.method, "path": case.path, "status": None,
            "body": json.dumps(case.body, default=repr)[:2000]})

'''


@dataclass
class FuzzGateway:
    process: GatewayProcess
    url: str
    key: str


@pytest.fixture(scope="module")
def fuzz_gateway(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzGateway]:
    work = tmp_path_factory.mktemp("gateway-fuzz")
    settings = work / "gateway.toml"
    tiers = {"fuzz": {"max_tokens_cap": TOKENS_CAP}}       # no QPS / TPS limit: no 429 hides a request
    settings.write_text(f"[gateway]\ntiers = '{json.dumps(tiers)}'\n")
    keys = work / "keys.json"
    created = subprocess.run([sys.executable, "-m", "gateway", "keys", "--settings", str(settings),
                              "--keys-file", str(keys), "create", "--tier", "fuzz", "--label", "schemathesis"],
                             capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    port, = free_local_ports(1)
    process = GatewayProcess([f"gateway.port={port}", "gateway.host=127.0.0.1",
                              f"gateway.upstream_grpc_url={triton_server.grpc_url}", f"gateway.keys_file={keys}",
                              "gateway.public_grpc_port=0"],
                             log_path=work / "gateway.log", port=port, settings_file=str(settings))
    process.start()
    try:
        yield FuzzGateway(process, f"http://127.0.0.1:{port}", key)
    finally:
        assert process.stop() == 0


def _sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    """A metric summed over the label sets that have all of `labels`."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(value for key, value in metrics.items()
               if key.startswith(name + "{") and all(w in key for w in wanted))


def _triton_requests(metrics: dict[str, float]) -> float:
    return sum(_sum(metrics, name, model=model) for name in ("nv_inference_request_success",
                                                               "nv_inference_request_failure")
               for model in PUBLIC_MODELS)


def _gateway_requests(metrics: dict[str, float], routes: tuple[str, ...] | None = None) -> float:
    return sum(value for key, value in metrics.items() if key.startswith("gateway_requests_total{")
               and (routes is None and 'route="health"' not in key and 'route="metrics"' not in key
                    or routes is not None and any(f'route="{r}"' in key for r in routes)))


def test_schemathesis_finds_no_server_error_and_reaches_triton(fuzz_gateway: FuzzGateway,
                                                               triton_server: TritonServer,
                                                               tmp_path: Path) -> None:
    hooks, log = tmp_path / "fuzz_hooks.py", tmp_path / "fuzz.jsonl"
    hooks.write_text(HOOKS)
    command = [str(Path(sys.executable).with_name("st")), "run", f"{fuzz_gateway.url}/openapi.json",
               "--header", f"Authorization: Bearer {fuzz_gateway.key}",
               "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "1",
               "--request-timeout", str(REQUEST_TIMEOUT_S), "--continue-on-failure",
               "--generation-database", "none", "--no-color",
               "--report", "junit", "--report-junit-path", str(tmp_path / "junit.xml")]
    gateway_before = scrape_metrics(f"{fuzz_gateway.url}/metrics")
    triton_before = scrape_metrics(triton_server.metrics_url)
    started = time.monotonic()
    # cwd: anything Schemathesis writes (reports, config discovery) stays in tmp_path
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                         env={**os.environ, "SCHEMATHESIS_HOOKS": str(hooks), "FUZZ_LOG": str(log),
                              "FUZZ_SCHEMA_GAPS": json.dumps(SCHEMA_GAPS)})
    elapsed = time.monotonic() - started
    gateway_after = scrape_metrics(f"{fuzz_gateway.url}/metrics")
    triton_after = scrape_metrics(triton_server.metrics_url)
    output = run.stdout + run.stderr
    summary = output[output.find("SUMMARY") - 40:] if "SUMMARY" in output else output[-4000:]
    gaps = collections.defaultdict(list)
    for component, prop, enforced, _ in SCHEMA_GAPS:
        gaps[enforced].append(f"{component}.{prop}")
    print("\n[schemathesis] the published schema, tightened where it is looser than the validators:")
    for enforced, where in gaps.items():
        print(f"    {', '.join(where)}: {enforced}")
    print(f"[schemathesis] {' '.join(command[:3])} … -n {MAX_EXAMPLES} --seed {SEED}: exit {run.returncode} "
          f"in {elapsed:.0f} s\n{summary}")

    # 0: nothing found, 1: check failures (its summary, above); anything else is Schemathesis itself failing
    assert run.returncode in (0, 1), output[-4000:]
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    responses = [r for r in records if r["kind"] == "response"]
    lost = [r for r in records if r["kind"] == "network_error"]
    operations = {(r["method"], r["path"]) for r in responses}
    assert {("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
            ("GET", "/v1/models/{model}")} <= operations, f"operations not exercised: {operations}"

    statuses = collections.Counter(r["status"] for r in responses)
    by_operation = collections.Counter((r["method"], r["path"], r["status"]) for r in responses)
    generation = [r for r in responses if r["method"] == "POST" and r["path"].endswith("completions")]
    answered = _sum(gateway_after, "gateway_key_requests_total") - _sum(gateway_before, "gateway_key_requests_total")
    refused_upstream = (_sum(gateway_after, "gateway_upstream_errors_total")
                        - _sum(gateway_before, "gateway_upstream_errors_total"))
    triton_requests = _triton_requests(triton_after) - _triton_requests(triton_before)
    seen_by_gateway = _gateway_requests(gateway_after) - _gateway_requests(gateway_before)
    generation_seen = (_gateway_requests(gateway_after, GENERATION_ROUTES)
                       - _gateway_requests(gateway_before, GENERATION_ROUTES))
    reached = answered + refused_upstream
    print(f"[schemathesis] {len(responses)} responses ({len(generation)} POSTs to the generation routes), "
          f"{len(lost)} network errors; the gateway counted {seen_by_gateway:.0f} requests "
          f"({generation_seen:.0f} on the generation routes)")
    print(f"[schemathesis] statuses: {dict(sorted(statuses.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))}")
    for (method, path, status), count in sorted(by_operation.items(), key=lambda kv: (kv[0][1], kv[0][0],
                                                                                      kv[0][2] or 0)):
        print(f"    {method:7} {path:24} {status}: {count}")
    print(f"[schemathesis] reached Triton: {answered:.0f} requests answered by the engine + {refused_upstream:.0f} "
          f"engine refusals = {reached:.0f} of {len(responses)} generated requests "
          f"({100 * reached / max(len(responses), 1):.2f} %; {100 * reached / max(len(generation), 1):.2f} % of "
          f"the generation POSTs); Triton counted {triton_requests:.0f} inference requests on "
          f"{' + '.join(PUBLIC_MODELS)} (n > 1 fans out)")
    reached_models = collections.Counter(r["model"] for r in generation if r["status"] == 200)
    print(f"[schemathesis] 200s on the generation routes by model: {dict(reached_models)}")
    refusals = collections.Counter((r["error"] or "")[:110] for r in generation if r["status"] == 400)
    print("[schemathesis] most common 400s on the generation routes:")
    for message, count in refusals.most_common(6):
        print(f"    {count:4}× {message}")

    # a 504 `upstream_timeout` for a request that set its own `token_timeout_ms` is
    # that deadline at work (the fuzz sends 1 ms), not the gateway failing
    own_deadline = [r for r in responses if r["status"] == 504 and r.get("token_timeout_ms")
                    and "upstream_timeout" in (r["error"] or "")]
    print(f"[schemathesis] {len(own_deadline)} answers were the caller's own token_timeout_ms expiring (504)")
    server_errors = [r for r in responses if r["status"] >= 500 and r["status"] not in DOCUMENTED_5XX
                     and r not in own_deadline]
    if server_errors:
        warnings = [line for line in fuzz_gateway.process.log_path.read_text().splitlines()
                    if '"level": "WARNING"' in line and "gateway.upstream" in line or '"level": "ERROR"' in line]
        print(f"[schemathesis] {len(server_errors)} responses ≥ 500; the gateway's upstream warnings and errors:")
        for line in warnings[:10]:
            print(f"    {line[:400]}")
    assert not server_errors, f"{len(server_errors)} responses ≥ 500: " + "; ".join(
        f"{r['method']} {r['path']} {r['body']} → {r['status']} {r['error']}" for r in server_errors[:5])
    assert not lost, f"{len(lost)} requests got no response (timeout or connection lost): {lost[:5]}"
    for r in responses:
        if r["status"] in DOCUMENTED_5XX:
            print(f"[schemathesis] documented {r['status']}: {r['error']}")
    assert answered > 0, "no generated request reached the engine: the fuzz was all refused at the door"
    assert triton_requests >= answered, (triton_requests, answered)

    # the stack is still fine afterwards
    health = httpx.get(f"{fuzz_gateway.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["replicas_routable"] == 1
    assert fuzz_gateway.process.alive()
    assert triton_server.is_ready()
    ready = httpx.get(f"{triton_server.http_url}/v2/health/ready", timeout=10)
    assert ready.status_code == 200
    answer = httpx.post(f"{fuzz_gateway.url}/v1/chat/completions", timeout=120,
                        headers={"Authorization": f"Bearer {fuzz_gateway.key}"},
                        json={"model": "ensemble", "max_tokens": 64, "temperature": 0,
                              "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    assert body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    assert 0 < body["usage"]["completion_tokens"] <= TOKENS_CAP, body["usage"]     # the tier's cap held
    gateway_log = fuzz_gateway.process.log_path.read_text()
    assert "unhandled error" not in gateway_log
    print(f"[after] gateway /health ok, Triton ready, chat: {body['choices'][0]['message']['content']!r} "
          f"({body['usage']})")
