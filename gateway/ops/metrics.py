"""The gateway's Prometheus metrics, served on its own `/metrics`.

One registry per process (`REGISTRY`): access control adds its own metrics
to it (e.g. rate-limit rejections by kind) with `registry=REGISTRY`. Latencies
are measured as the caller sees them: TTFT from the request's arrival at the
gateway to the first content chunk written, ITL between content chunks.
`gateway_added_latency_seconds` is the time spent inside the gateway itself:
from arrival to the upstream request (`phase="request"`), and from the first
upstream response to its chunk being written (`phase="first_chunk"`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

REGISTRY = CollectorRegistry(auto_describe=True)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

REQUESTS = Counter(
    "gateway_requests_total", "HTTP requests by route, tier and status", ["route", "tier", "status"], registry=REGISTRY
)
IN_FLIGHT = Gauge("gateway_requests_in_flight", "HTTP requests being served", ["route"], registry=REGISTRY)
UPSTREAM_ERRORS = Counter(
    "gateway_upstream_errors_total",
    "engine requests that failed, by kind (overloaded, invalid_input, rejected, connection, "
    "timeout, stall, stream, internal)",
    ["kind"],
    registry=REGISTRY,
)
TTFT = Histogram(
    "gateway_time_to_first_token_seconds",
    "request arrival to the first content sent, per choice",
    ["route"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
ITL = Histogram(
    "gateway_inter_token_latency_seconds",
    "gap between consecutive content chunks of a choice",
    ["route"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
ADDED_LATENCY = Histogram(
    "gateway_added_latency_seconds",
    "time spent inside the gateway, by phase",
    ["phase"],
    buckets=_OVERHEAD_BUCKETS,
    registry=REGISTRY,
)
REQUEST_DURATION = Histogram(
    "gateway_request_duration_seconds",
    "arrival to the last byte sent",
    ["route"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
KEY_REQUESTS = Counter(
    "gateway_key_requests_total", "generation requests per API key id", ["key_id", "tier"], registry=REGISTRY
)
KEY_PROMPT_TOKENS = Counter(
    "gateway_key_prompt_tokens_total", "prompt tokens per API key id", ["key_id", "tier"], registry=REGISTRY
)
KEY_COMPLETION_TOKENS = Counter(
    "gateway_key_completion_tokens_total", "completion tokens per API key id", ["key_id", "tier"], registry=REGISTRY
)


def exposition() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


STREAMS_ACTIVE = Gauge("gateway_streams_active", "resumable streams whose generation is running", registry=REGISTRY)
STREAMS_ENDED = Counter(
    "gateway_streams_ended_total",
    "resumable streams by how they ended (completed, refused, expired: no reader for the grace "
    "period, deleted, hung_up: before the first event)",
    ["outcome"],
    registry=REGISTRY,
)
STREAM_RESUMES = Counter(
    "gateway_stream_resumes_total",
    "resumes served, by where the stream was read (local: this process runs it; shared: "
    "another process, through Redis)",
    ["where"],
    registry=REGISTRY,
)
REPLICA_ROUTABLE = Gauge(
    "gateway_replica_routable",
    "1 while a replica takes new requests: not ejected, draining or retired, and, with an "
    "inference probe, answered it right once any replica has; 0 for every replica before one "
    "has (callers wait for the first), unless that wait gave up",
    ["replica"],
    registry=REGISTRY,
)
REPLICA_DRAINING = Gauge(
    "gateway_replica_draining", "1 while a replica is drained by an operator", ["replica"], registry=REGISTRY
)
REPLICA_IN_FLIGHT = Gauge(
    "gateway_replica_in_flight", "engine requests this gateway has running on a replica", ["replica"], registry=REGISTRY
)
EJECTIONS = Counter(
    "gateway_replica_ejections_total",
    "replicas taken out of routing, by the failure that did it",
    ["replica", "reason"],
    registry=REGISTRY,
)
PROBES = Counter(
    "gateway_replica_probes_total",
    "health + inference probes by outcome (ok, overloaded, "
    "not_ready, ready_timeout, unreachable, timeout, refused, error, wrong_answer)",
    ["replica", "outcome"],
    registry=REGISTRY,
)
ROUTED = Counter(
    "gateway_routed_total",
    "engine requests sent to a replica, by what decided it (prefix, session, load, round_robin)",
    ["replica", "reason"],
    registry=REGISTRY,
)
FAILOVERS = Counter(
    "gateway_failovers_total",
    "attempts retried on another replica before the first token, by cause",
    ["reason"],
    registry=REGISTRY,
)
DRAINING = Gauge(
    "gateway_draining", "1 once the gateway stops admitting (SIGTERM): in-flight requests finish", registry=REGISTRY
)
MIGRATIONS = Counter(
    "gateway_stream_migrations_total",
    "streams moved to another replica after their first token, "
    "by what happened to the first (died, stalled) and the outcome (moved, failed)",
    ["reason", "outcome"],
    registry=REGISTRY,
)
ORPHANS_STOPPED = Counter(
    "gateway_orphans_stopped_total",
    "engine requests left on a stalled replica by a migration, by how the stop ended (stopped, gone, gave_up)",
    ["outcome"],
    registry=REGISTRY,
)
REPLICAS_DISCOVERED = Gauge(
    "gateway_replicas_discovered", "replicas the DNS discovery currently finds", registry=REGISTRY
)
DEGRADATION_LEVEL = Gauge(
    "gateway_degradation_level",
    "the degradation level under sustained overload (0: none; "
    "1: max_tokens capped, 2: lowest tier shed, 3: next tier in one piece, 4: fallback model)",
    registry=REGISTRY,
)
DEGRADATION_CHANGES = Counter(
    "gateway_degradation_changes_total",
    "degradation level changes, by direction (up, "
    "down) and cause (the signal held above its enter threshold: queue_time, kv_use, "
    "preemptions, error_rate; recovered: every signal at or below its exit threshold)",
    ["direction", "cause"],
    registry=REGISTRY,
)
DEGRADATION_SIGNAL = Gauge(
    "gateway_degradation_signal",
    "each degradation signal's value over the window (NaN: no "
    "data): queue_time (s), kv_use (fraction), preemptions (per s per replica), error_rate",
    ["signal"],
    registry=REGISTRY,
)
DEGRADATION_SHED = Counter(
    "gateway_degradation_shed_total",
    "requests refused (429) because the degradation level sheds their tier",
    ["tier"],
    registry=REGISTRY,
)
