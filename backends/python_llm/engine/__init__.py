"""Paged-KV, continuously batching LLM engine (CPU and CUDA, PyTorch)."""
