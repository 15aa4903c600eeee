"""The names of the engine's metric families (docs/interface.md, "Engine
metrics"), as the engine exports them on Triton's metrics port (labels `model`
and `version`) and the gateway's router, the doctor and the deployment's
autoscaling read them. The engine's own code (kinds, descriptions, buckets,
the sinks) stays with the engine: python_llm/engine/core/metrics.py."""

from __future__ import annotations

KV_BLOCKS_USED = "llm_kv_cache_blocks_used"
KV_BLOCKS_CAPACITY = "llm_kv_cache_blocks_capacity"
REQUESTS_RUNNING = "llm_num_requests_running"
REQUESTS_WAITING = "llm_num_requests_waiting"
BATCH_SIZE = "llm_batch_size"
PROMPT_TOKENS = "llm_prompt_tokens_total"
GENERATION_TOKENS = "llm_generation_tokens_total"
PREFIX_CACHE_HIT_TOKENS = "llm_prefix_cache_hit_tokens_total"
PREEMPTIONS = "llm_preemptions_total"
REQUESTS_CANCELLED = "llm_requests_cancelled_total"
REQUESTS_TIMED_OUT = "llm_requests_timed_out_total"
REQUESTS_REJECTED = "llm_requests_rejected_total"
TIME_TO_FIRST_TOKEN = "llm_time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "llm_inter_token_latency_seconds"
TIME_PER_OUTPUT_TOKEN = "llm_time_per_output_token_seconds"
REQUEST_QUEUE_TIME = "llm_request_queue_time_seconds"
E2E_REQUEST_LATENCY = "llm_e2e_request_latency_seconds"
