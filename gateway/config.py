"""The gateway's settings: the `gateway` section of the deployment settings
(serving/settings.py composes it; every field is defined here, once)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TierConfig:
    """What a key's tier allows. Limits are per key; 0 means unlimited."""

    requests_per_second: float = 0.0  # requests admitted per second
    tokens_per_second: float = 0.0  # prompt + completion tokens, as they flow
    priority: int = 0  # the engine's `priority` for this tier's requests
    max_tokens_cap: int = 0  # a request's max_tokens is capped to this (0: engine limit)
    max_concurrent_requests: int = 0  # requests in flight at once
    allowed_models: tuple[str, ...] = ()  # empty: every public model
    # a dropped stream keeps generating this long for a resume (GET /v1/streams/{id});
    # then it is stopped and its KV blocks freed. 0: stop at once, no resume
    stream_grace_s: float = 10.0
    # when every replica dedicated to this tier (ReplicaConfig.dedicated_to) is out:
    # "when_down" (none routable) or "when_busy" (also when all of them have
    # requests waiting) sends the tier to the shared replicas; "never" answers 503
    spill_over: str = "when_down"


def _default_tiers() -> dict[str, TierConfig]:
    return {
        "free": TierConfig(
            requests_per_second=2, tokens_per_second=200, priority=0, max_tokens_cap=512, max_concurrent_requests=4
        ),
        "paid": TierConfig(requests_per_second=50, tokens_per_second=5000, priority=10, max_concurrent_requests=64),
    }


@dataclass(frozen=True)
class ReplicaConfig:
    """One tritonserver behind the gateway."""

    grpc_url: str  # where requests go (through client/)
    metrics_url: str = ""  # its Prometheus metrics, scraped for routing; empty: not scraped
    # the tiers this replica is dedicated to (no other tier reaches it); empty: shared by every tier
    dedicated_to: tuple[str, ...] = ()


SPILL_OVER_RULES = ("never", "when_down", "when_busy")


ROUTING_POLICIES = ("round_robin", "least_load", "prefix_aware")


@dataclass(frozen=True)
class LimitsConfig:
    """Bounds on what one request, and all of them together, may take."""

    max_body_bytes: int = 1_048_576  # a larger request body is a 413 (before any parsing)
    max_json_depth: int = 32  # a body nested deeper is a 400
    max_n: int = 4  # the largest `n` (fanned out; the prefix cache shares the prompt)
    max_concurrent_requests: int = 512  # all keys together


@dataclass(frozen=True)
class FleetConfig:
    """The replicas behind the gateway, how a request picks one, and how a
    failing one is ejected."""

    upstream_grpc_url: str = "127.0.0.1:8001"  # the one replica, when `replicas` is empty
    # several replicas, by name (a TOML table each; JSON in the environment / --set)
    replicas: dict[str, ReplicaConfig] = field(default_factory=dict)
    routing_policy: str = "prefix_aware"  # one of ROUTING_POLICIES
    # the score's weights (llm-d's endpoint picker defaults: queue 2, KV 2, prefix 3)
    weight_queue: float = 2.0  # weight of a replica's queue (requests waiting and running)
    weight_kv_cache: float = 2.0  # weight of a replica's KV-cache use
    weight_prefix: float = 3.0  # weight of the share of the prompt's prefix a replica likely holds
    weight_session: float = 1.0  # the replica a session (`user`, x-session-id) was last sent to
    metrics_interval_s: float = 0.5  # each replica's metrics scraped this often
    metrics_stale_s: float = 3.0  # older metrics count as a saturated replica
    probe_interval_s: float = 5.0  # readiness + an inference probe per replica
    probe_timeout_s: float = 20.0  # a probe (and the wait for the first verdicts at start)
    probe_golden_file: str = ""  # the expected probe answer (serving prepare-model); empty: readiness only
    eject_after_failures: int = 3  # consecutive failed probes or upstream errors / stalls
    readmit_after_successes: int = 2  # consecutive good probes of an ejected replica
    eject_backoff_s: float = 5.0  # the first ejection's minimum length; doubles per ejection (max 300 s)
    failover_attempts: int = 3  # tries of one request before its first token, on different replicas
    # a stream whose replica dies, or sends nothing for `stall_timeout_s`, after
    # its first token moves to another replica with the tokens so far
    # (`continuation_ids`), at most `migrate_attempts` times; 0 turns it off
    stall_timeout_s: float = 20.0
    migrate_attempts: int = 2  # moves of one stream to another replica; 0: none
    # replicas from DNS (a Kubernetes headless service): "host:grpc_port", every
    # address of the name is a replica, re-resolved every `discovery_interval_s`;
    # their metrics are scraped at http://<address>:`discovery_metrics_port`/metrics
    discovery_dns: str = ""
    discovery_interval_s: float = 10.0  # the name resolved again this often
    discovery_metrics_port: int = 8002  # the discovered replicas' metrics port (Triton's)


@dataclass(frozen=True)
class StreamsConfig:
    """The streams the gateway keeps: for a resume, and alive through silence."""

    # the events of one stream kept for a resume; a resume from before them is a 410
    buffer_bytes: int = 262_144
    # an SSE comment this often while nothing else is sent (queueing, prefill):
    # below the 60 s read timeouts of common proxies (nginx, ALBs)
    keepalive_interval_s: float = 15.0
    # a background response (Responses API) stays readable this long after its end
    response_retention_s: float = 600.0


@dataclass(frozen=True)
class DegradationConfig:
    """Degradation under sustained overload (gateway/degrade/): each signal is
    averaged over `window_s`; the level goes up one step once some signal has
    stayed above its enter threshold for `enter_dwell_s`, and down one step
    once every signal has stayed below its exit threshold for `exit_dwell_s`.
    Levels: 1 caps max_tokens at `max_tokens_cap`, 2 sheds the lowest tier (429),
    3 answers the lowest tier still served in one piece, 4 routes to
    `fallback_model`."""

    max_level: int = 4  # 0 turns degradation off; 4 needs a fallback model
    window_s: float = 60.0  # each signal's averaging window
    # the enter dwell must be at least the window: one extreme sample (a huge
    # prefill) lifts a window's average for a whole window, never longer
    enter_dwell_s: float = 60.0
    exit_dwell_s: float = 180.0  # every signal below its exit threshold this long: one level down
    queue_time_enter_s: float = 10.0  # the engine's mean queue time
    queue_time_exit_s: float = 2.0  # the engine's mean queue time
    kv_enter: float = 0.9  # KV blocks used / capacity
    kv_exit: float = 0.7  # KV blocks used / capacity
    preemptions_enter_per_s: float = 1.0  # the engine's preemptions
    preemptions_exit_per_s: float = 0.1  # the engine's preemptions
    error_rate_enter: float = 0.2  # failed engine requests / all
    error_rate_exit: float = 0.02  # failed engine requests / all
    max_tokens_cap: int = 256  # level 1: a request's max_tokens is capped to this
    fallback_model: str = ""  # a model on the replicas (e.g. a smaller one); empty: no level 4


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway: its listeners, its keys, and a group per concern."""

    host: str = "0.0.0.0"  # the public front door (Triton itself stays on loopback)
    port: int = 9000  # the public OpenAI API (HTTP)
    public_grpc_port: int = 9001  # KServe v2 GRPCInferenceService for the public models; 0: off
    # the operational endpoints (/metrics with its per-key labels, /admin/*) on a
    # listener of their own, never on the public port: loopback by default, so only
    # this machine (Prometheus, an operator) reaches them; a pod sets 0.0.0.0 for
    # Prometheus and keeps the port out of its public Service. 9002: next to 9000
    # and 9001, as Triton's metrics 8002 is to 8000 / 8001. 0: off
    ops_host: str = "127.0.0.1"
    ops_port: int = 9002  # the operational listener's port (see ops_host); 0: off
    drain_timeout_s: float = 30.0  # SIGTERM: in-flight streams get this long to finish
    admin_key_file: str = ""  # the key of /admin/* (ops port); empty: <build dir>/gateway_admin_key
    keys_file: str = ""  # the API key store (hashes only); empty: <build dir>/gateway_keys.json
    # shared by several gateway processes: the rate-limit counters and the
    # resumable streams; empty: each process's own memory
    redis_url: str = ""
    # the tiers keys belong to, by name (a TOML table each; JSON in the environment / --set)
    tiers: dict[str, TierConfig] = field(default_factory=_default_tiers)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    streams: StreamsConfig = field(default_factory=StreamsConfig)
    degradation: DegradationConfig = field(default_factory=DegradationConfig)
