"""The gateway's settings: the `gateway` section of the deployment settings
(serving/settings.py composes it; every field is defined here, once)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TierConfig:
    """What a key's tier allows. Limits are per key; 0 means unlimited."""
    requests_per_second: float = 0.0
    tokens_per_second: float = 0.0        # prompt + completion tokens, as they flow
    priority: int = 0                     # the engine's `priority` for this tier's requests
    max_tokens_cap: int = 0               # a request's max_tokens is capped to this (0: engine limit)
    max_concurrent_requests: int = 0
    allowed_models: tuple[str, ...] = ()  # empty: every public model
    # a dropped stream keeps generating this long for a resume (GET /v1/streams/{id});
    # then it is stopped and its KV blocks freed. 0: stop at once, no resume
    stream_grace_s: float = 10.0


def _default_tiers() -> dict[str, TierConfig]:
    return {
        "free": TierConfig(requests_per_second=2, tokens_per_second=200, priority=0, max_tokens_cap=512,
                           max_concurrent_requests=4),
        "paid": TierConfig(requests_per_second=50, tokens_per_second=5000, priority=10, max_concurrent_requests=64),
    }


@dataclass(frozen=True)
class ReplicaConfig:
    """One tritonserver behind the gateway."""
    grpc_url: str                         # where requests go (through client/)
    metrics_url: str = ""                 # its Prometheus metrics, scraped for routing; empty: not scraped


ROUTING_POLICIES = ("round_robin", "least_load", "prefix_aware")


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "0.0.0.0"                 # the public front door (Triton itself stays on loopback)
    port: int = 9000
    public_grpc_port: int = 9001                # KServe v2 GRPCInferenceService for the public models; 0: off
    upstream_grpc_url: str = "127.0.0.1:8001"  # the one replica, when `replicas` is empty
    # several replicas, by name (a TOML table each; JSON in the environment / --set)
    replicas: dict[str, ReplicaConfig] = field(default_factory=dict)
    routing_policy: str = "prefix_aware"  # one of ROUTING_POLICIES
    # the score's weights (llm-d's endpoint picker defaults: queue 2, KV 2, prefix 3)
    weight_queue: float = 2.0
    weight_kv_cache: float = 2.0
    weight_prefix: float = 3.0
    weight_session: float = 1.0           # the replica a session (`user`, x-session-id) was last sent to
    metrics_interval_s: float = 0.5       # each replica's metrics scraped this often
    metrics_stale_s: float = 3.0          # older metrics count as a saturated replica
    probe_interval_s: float = 5.0         # readiness + an inference probe per replica
    probe_timeout_s: float = 20.0
    probe_golden_file: str = ""           # the expected probe answer (serving prepare-model); empty: readiness only
    eject_after_failures: int = 3         # consecutive failed probes or upstream errors / stalls
    readmit_after_successes: int = 2      # consecutive good probes of an ejected replica
    eject_backoff_s: float = 5.0          # the first ejection's minimum length; doubles per ejection (max 300 s)
    failover_attempts: int = 3            # tries of one request before its first token, on different replicas
    drain_timeout_s: float = 30.0         # SIGTERM: in-flight streams get this long to finish
    admin_key_file: str = ""              # the key of /admin/* (drain a replica); empty: <build dir>/gateway_admin_key
    keys_file: str = ""                   # the API key store (hashes only); empty: <build dir>/gateway_keys.json
    redis_url: str = ""                   # shared rate-limit counters for several gateway processes; empty: memory
    max_body_bytes: int = 1_048_576
    max_json_depth: int = 32
    max_n: int = 4                        # the largest `n` (fanned out; the prefix cache shares the prompt)
    max_concurrent_requests: int = 512    # all keys together
    # the events of one stream kept for a resume; a resume from before them is a 410
    stream_buffer_bytes: int = 262_144
    # an SSE comment this often while nothing else is sent (queueing, prefill):
    # below the 60 s read timeouts of common proxies (nginx, ALBs)
    keepalive_interval_s: float = 15.0
    # a background response (Responses API) stays readable this long after its end
    response_retention_s: float = 600.0
    tiers: dict[str, TierConfig] = field(default_factory=_default_tiers)
