"""Paged-KV, continuously batching LLM engine (CPU and CUDA, PyTorch).

`engine.py` is the loop (intake, aborts, one step, outputs), `config.py` its
settings; `core/` decides what each step runs (requests, queue, scheduler,
KV blocks) and `worker/` runs it (runner, model, attention, sampler, kernels).
"""
