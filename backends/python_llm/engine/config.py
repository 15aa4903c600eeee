"""Engine settings. Names follow TensorRT-LLM's Triton parameters where the
meaning is the same (see docs/interface.md of the shared contract)."""

from __future__ import annotations

from dataclasses import dataclass


class ConfigError(ValueError):
    pass


@dataclass
class EngineConfig:
    model_dir: str  # a local Hugging Face model folder (required)
    device: str = "cpu"  # "cpu" or "cuda[:N]"
    dtype: str = "float32"  # float32 | bfloat16 | float16
    block_size: int = 16  # tokens per KV block
    max_tokens_in_paged_kv_cache: int = 16384  # KV budget on CPU (tokens)
    kv_cache_free_gpu_mem_fraction: float = 0.9  # KV budget on GPU
    max_num_seqs: int = 64  # sequences per step
    max_num_batched_tokens: int = 512  # token budget per step
    max_queue_size: int = 256  # waiting requests before "overloaded:"; 0 = unbounded
    max_model_len: int | None = None  # None = model's max positions
    max_tokens_limit: int = 4096  # largest max_tokens a request may ask
    default_max_tokens: int = 128  # a request's max_tokens when it gives none
    default_token_timeout_ms: int = 0  # 0 = no per-token timeout
    enable_kv_cache_reuse: bool = True  # prefix caching: requests share the KV blocks of a common prefix
    enable_chunked_context: bool = True  # a long prompt's prefill split across steps (chunks)
    # While decodes run, a long prompt's chunks (one with more tokens than
    # max_num_batched_tokens) are cut so that the streams' inter-token
    # latency stays within (1 + ratio) x a decode-only step's, at its p99:
    # each step is planned that far below the bound as steps have lately run
    # over their plans (core/prefill_pacer.py). 0 = the token budget alone.
    # Needs enable_chunked_context. 2.0: the bound of issue 18 (ITL p99
    # within 3x its p50 before the prompt); the prompt gets what the
    # machine's noise leaves (docs/benchmarks.md, "Issue 18 on the AMX
    # machine: the pacer plans below the bound by the steps' spread").
    prefill_time_ratio: float = 2.0
    # Streaming under load (python_llm/response_pacing.py): answering every
    # stream at every step may take at most this share of the engine's time;
    # past it a stream's tokens are held (at most stream_max_hold_ms) and sent
    # together, never its first token or its end. 0 = one response per step
    # and stream.
    stream_response_share: float = 0.1
    # The longest a token may be held for its stream's next response. 500:
    # where a 64-stream decode step takes ~190 ms (2-core AVX2 machines) 250
    # let the share merge ~1.5 tokens a response; 500 gave 2.1 and +5% served
    # throughput, at response gaps p50 0.47-0.61 s instead of 0.29-0.36 (docs/
    # benchmarks.md, "Issue 18 on the Zen 3 again"). Where steps are shorter
    # the share binds first and this changes nothing.
    stream_max_hold_ms: int = 500
    num_threads: int = 0  # torch threads, process-wide (torch has one pool);
    # 0 leaves torch's default
    # decode attention: "auto" = the native CPU kernel on the CPU when it
    # builds (else PyTorch), "torch" = always the PyTorch path
    attention_backend: str = "auto"
    # projections on the CPU in fp32 (worker/models/packed_linear.py):
    # "auto" = AMX tiles by three-way bf16 splitting (fp32 accuracy) where the
    # CPU has AMX-BF16 and the native kernels build, else the native FMA GEMM
    # (AVX2: every step; AVX-512: steps of few rows, beside a second copy of
    # the weights on oneDNN for many), else oneDNN with prepacked weights; "fma" = that
    # where it builds; "onednn" = oneDNN alone (one copy of the weights);
    # "torch" = always F.linear, the reference
    linear_backend: str = "auto"
    # greedy rows' LM head (fp32 CPU models, worker/models/greedy_head.py):
    # "auto" = in bf16 where the CPU has bf16 dot products (AVX512-BF16,
    # AMX-BF16) and the native kernels build, its candidates dotted again so
    # the token is the exact argmax; else, and with "fp32", fp32 logits
    greedy_lm_head: str = "auto"
    debug_step_delay_ms: int = 0  # test-only stall injected per step (debug_faults.py)
    debug_fail_after_steps: int = 0  # test-only: a step fails after N (0 = never; debug_faults.py)
    # What a dead engine loop does to its server: after this grace period (so
    # the error responses reach their clients) the server is killed, exiting
    # non-zero, for a supervisor to restart it. < 0 keeps it running (serving
    # only errors), for debugging.
    exit_on_engine_failure_s: float = 2.0

    def __post_init__(self) -> None:
        def check(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(msg)

        check(self.dtype in ("float32", "bfloat16", "float16"), f"dtype: unsupported {self.dtype!r}")
        check(
            self.attention_backend in ("auto", "torch"),
            f"attention_backend: 'auto' or 'torch', got {self.attention_backend!r}",
        )
        check(
            self.linear_backend in ("auto", "fma", "onednn", "torch"),
            f"linear_backend: 'auto', 'fma', 'onednn' or 'torch', got {self.linear_backend!r}",
        )
        check(self.greedy_lm_head in ("auto", "fp32"), f"greedy_lm_head: 'auto' or 'fp32', got {self.greedy_lm_head!r}")
        check(self.device == "cpu" or self.device.startswith("cuda"), f"device: unsupported {self.device!r}")
        check(
            self.block_size > 0 and self.block_size & (self.block_size - 1) == 0,
            f"block_size: must be a power of two, got {self.block_size}",
        )
        check(
            self.max_tokens_in_paged_kv_cache >= self.block_size,
            "max_tokens_in_paged_kv_cache: must hold at least one block",
        )
        check(0.0 < self.kv_cache_free_gpu_mem_fraction <= 1.0, "kv_cache_free_gpu_mem_fraction: must be in (0, 1]")
        check(self.max_num_seqs > 0, "max_num_seqs: must be > 0")
        check(self.max_num_batched_tokens >= self.max_num_seqs, "max_num_batched_tokens: must be >= max_num_seqs")
        check(self.max_queue_size >= 0, "max_queue_size: must be >= 0")
        check(self.prefill_time_ratio >= 0, "prefill_time_ratio: must be >= 0")
        check(0.0 <= self.stream_response_share <= 1.0, "stream_response_share: must be in [0, 1]")
        check(self.stream_max_hold_ms >= 0, "stream_max_hold_ms: must be >= 0")
        check(self.default_max_tokens > 0, "default_max_tokens: must be > 0")
        check(self.default_token_timeout_ms >= 0, "default_token_timeout_ms: must be >= 0")

    @property
    def num_cpu_blocks(self) -> int:
        return self.max_tokens_in_paged_kv_cache // self.block_size
