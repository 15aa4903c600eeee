"""Locust load tests for the Triton LLM stack: SSE and gRPC streaming users,
load shapes, and a headless runner that reports TTFT / ITL / TPOT against SLOs."""
