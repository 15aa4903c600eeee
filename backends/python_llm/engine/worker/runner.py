"""The model runner: one SchedulerOutput in, one sampled token per finished
chunk out. It owns the weights, the paged KV cache and per-request RNGs; the
scheduler owns everything else (which blocks, which tokens, when)."""
from __future__ import annotations

import array
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..config import EngineConfig
from ..core.scheduler_output import RunnerOutput, ScheduledSequence, SchedulerOutput
from .attention import AttentionMetadata, DecodeBatch, DecodeGroup, PrefillChunk
from .block_table_rows import BlockTableRows
from .index_buffer import IndexBuffer
from .kernels import CpuKernels, cpu_kernels
from .kv_cache import KVCacheShape, PagedKVCache, bytes_per_block
from .model_info import ModelInfo
from .models import build_model
from .sampler import Sampler

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# a decode group grows while its widest table is at most this many times its
# narrowest: bounds padding waste, keeps the number of attention calls small
DECODE_GROUP_SPREAD = 1.5


def index_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """An int64 tensor of Python ints. Through NumPy: `torch.tensor(list)`
    costs ~0.3 µs per element (440 µs for a 64 x 25 block table), NumPy a sixth."""
    tensor = torch.from_numpy(np.array(values, dtype=np.int64))
    return tensor if device.type == "cpu" else tensor.to(device)


class SchedulingError(ValueError):
    """A SchedulerOutput the runner cannot execute (a scheduler bug, not bad user input)."""


@dataclass
class StepBatch:
    """Everything one forward pass needs, as device tensors."""
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor
    sampled: list[ScheduledSequence]


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        # torch's thread count is process-wide: setting it here changes it
        # for everything else in the process (a Triton stub hosts one model
        # instance; a test or benchmark may run several engines). So it is
        # touched only when asked for; 0 leaves torch's own choice.
        if config.num_threads > 0:
            torch.set_num_threads(config.num_threads)
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        self.block_size = config.block_size
        self.model_info = ModelInfo.from_model_dir(config.model_dir, config.max_model_len)
        self.model = build_model(config.model_dir, self.model_info.max_model_len, self.dtype, self.device)
        self.num_blocks = self._kv_budget_blocks()
        info = self.model_info
        self.kv_cache = PagedKVCache(
            KVCacheShape(info.num_layers, self.num_blocks, self.block_size, info.num_kv_heads, info.head_dim),
            self.dtype, self.device)
        self._generators: dict[str, torch.Generator] = {}
        # native decode attention + argmax (None: the PyTorch paths)
        self.kernels: CpuKernels | None = (
            cpu_kernels() if self.device.type == "cpu" and config.attention_backend == "auto" else None)
        # prefill chunks: the native kernel where it runs for this head_dim
        self.prefill_kernels: CpuKernels | None = (
            self.kernels if self.kernels is not None
            and self.kernels.prefill_attention_supported(self.model_info.head_dim) else None)
        self.sampler = Sampler(self.device, self.kernels)
        self._indices = IndexBuffer()
        self.block_rows = BlockTableRows(-(-self.model_info.max_model_len // self.block_size), config.max_num_seqs)
        log.info("model runner ready", extra={"device": str(self.device), "dtype": config.dtype,
                                              "kv_blocks": self.num_blocks, "block_size": self.block_size,
                                              "decode_attention": "native" if self.kernels else "torch"})

    def _kv_budget_blocks(self) -> int:
        info = self.model_info
        per_block = bytes_per_block(info.num_layers, self.block_size, info.num_kv_heads, info.head_dim, self.dtype)
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            blocks = int(free * self.config.kv_cache_free_gpu_mem_fraction) // per_block
        else:
            blocks = self.config.num_cpu_blocks
        if blocks <= 0:
            raise MemoryError(f"no room for a single KV block ({per_block} bytes)")
        return blocks

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        # the C++ guard, not the `torch.inference_mode` decorator: its Python
        # layers cost ~140 µs a step on caches the weights flushed, against ~55
        # (a private name, but torch is pinned and every runner test goes
        # through here)
        with torch._C._InferenceMode(True):
            return self._execute(scheduled)

    def _execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        for request_id in scheduled.finished_request_ids:
            self._generators.pop(request_id, None)
        self.block_rows.release(scheduled.finished_request_ids)
        if scheduled.is_empty:
            return RunnerOutput(token_ids=[])
        batch = self._prepare(scheduled.sequences)

        fused_greedy = self._fuses_greedy(batch.sampled)
        started = time.perf_counter()
        hidden = self.model(batch.input_ids, batch.positions, batch.meta, self.kv_cache)
        logits = greedy = None
        if fused_greedy:
            # the argmax happens inside the LM-head kernel: no logits at all
            greedy = self.kernels.lm_head_argmax(self.model.norm(hidden[batch.sample_rows]),  # type: ignore[union-attr]
                                                 self.model.lm_head)
        elif batch.sampled:
            logits = self.model.compute_logits(hidden[batch.sample_rows])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        model_seconds = time.perf_counter() - started
        if greedy is not None:
            return RunnerOutput(token_ids=greedy, model_seconds=model_seconds)
        if logits is None:
            return RunnerOutput(token_ids=[], model_seconds=model_seconds)

        result = self.sampler(logits, batch.sampled, self._generators_for(batch.sampled))
        wanted = any(lp is not None for lp in result.logprobs)
        return RunnerOutput(token_ids=result.token_ids, logprobs=result.logprobs if wanted else None,
                            model_seconds=model_seconds)

    def _fuses_greedy(self, sampled: list[ScheduledSequence]) -> bool:
        """Whether this step's tokens come from the fused LM head + argmax
        kernel: native kernels, fp32 weights, every sampled row plain greedy."""
        return (bool(sampled) and self.kernels is not None and self.dtype == torch.float32
                and Sampler.plain_greedy(sampled))

    def _generators_for(self, seqs: list[ScheduledSequence]) -> dict[str, torch.Generator]:
        for seq in seqs:
            seed = seq.seed if seq.seed is not None else seq.sampling.seed
            if seed is not None and seq.request_id not in self._generators:
                self._generators[seq.request_id] = torch.Generator(self.device).manual_seed(seed)
        return self._generators

    def _prepare(self, seqs: list[ScheduledSequence]) -> StepBatch:
        """Flatten the step into index tensors built once and shared by all layers.

        Single-token sequences at the head of the list are decodes, then the
        prefill chunks follow in order. For the PyTorch decode path the
        decodes are laid out sorted by context length (grouped, see
        DecodeGroup). Output order is the input order. The decode loop runs
        for every running sequence every step, so it stays inline, and all
        int64 indices go through one `array.array` into one tensor.
        """
        bs = self.block_size
        max_len = self.model_info.max_model_len
        num_decodes = 0
        while num_decodes < len(seqs) and len(seqs[num_decodes].token_ids) == 1:
            num_decodes += 1
        decode_order = list(range(num_decodes))
        if self.kernels is None:
            decode_order.sort(key=lambda i: seqs[i].start_position // bs)
        decodes = [seqs[i] for i in decode_order] if self.kernels is None else seqs[:num_decodes]

        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for seq in decodes:
            start, table = seq.start_position, seq.block_table
            block = start // bs
            if start < 0 or start >= max_len or block >= len(table):
                self._checked_table(seq)   # raises, naming what is wrong
            input_ids.append(seq.token_ids[0])
            positions.append(start)
            slots.append(table[block] * bs + start % bs)
        rows = [0] * len(seqs)           # last row of each sequence in the flat batch
        for row, index in enumerate(decode_order):
            rows[index] = row
        prefills: list[PrefillChunk] = []
        for index in range(num_decodes, len(seqs)):
            seq = seqs[index]
            table = self._checked_table(seq)
            n, start = seq.num_tokens, seq.start_position
            offset = len(input_ids)
            input_ids.extend(seq.token_ids)
            positions.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            prefills.append(self._prefill_chunk(offset, n, start, table))
            rows[index] = offset + n - 1

        native_decodes = self.kernels is not None and num_decodes > 0
        table_rows = self.block_rows.rows_for(decodes) if native_decodes else []
        context_lens = [p + 1 for p in positions[:num_decodes]] if native_decodes else []
        sampled = [seq for seq in seqs if seq.sample]
        sample_rows = [rows[i] for i, seq in enumerate(seqs) if seq.sample]
        # one conversion (array.array converts Python ints in CPython's own
        # loop, ~5x faster than np.array) and, on the CPU, no torch call in a
        # step shaped like the last one (see IndexBuffer)
        t, d = len(input_ids), len(table_rows)
        values = array.array("q", input_ids + positions + slots + sample_rows + context_lens + table_rows)
        sizes = (t, t, t, len(sample_rows), d, d)
        if self.device.type == "cpu":
            parts = self._indices.load(values, sizes)
        else:
            parts = tuple(torch.frombuffer(values, dtype=torch.int64).to(self.device).split(list(sizes)))
        ids, positions_t, slot_mapping, rows_t, context_t, table_rows_t = parts
        meta = AttentionMetadata(slot_mapping=slot_mapping, prefills=prefills, kernels=self.prefill_kernels)
        if native_decodes:
            meta.decode_batch = DecodeBatch(num_seqs=num_decodes, block_tables=self.block_rows.tensor,
                                            table_rows=table_rows_t, context_lens=context_t,
                                            kernel=self.kernels)  # type: ignore[arg-type]
        elif self.kernels is None:
            meta.decodes = self._decode_groups(decodes, [self._checked_table(seq) for seq in decodes])
        return StepBatch(input_ids=ids, positions=positions_t, meta=meta, sample_rows=rows_t, sampled=sampled)

    def _checked_table(self, seq: ScheduledSequence) -> list[int]:
        """The blocks covering the sequence's context, after checking the schedule."""
        n, start = seq.num_tokens, seq.start_position
        end, max_len = start + n, self.model_info.max_model_len
        if n == 0:
            raise SchedulingError(f"request {seq.request_id}: no tokens scheduled")
        if start < 0 or end > max_len:
            raise SchedulingError(f"request {seq.request_id}: positions {start}..{end - 1} outside 0..{max_len - 1}")
        needed = -(-end // self.block_size)
        if len(seq.block_table) < needed:
            raise SchedulingError(f"request {seq.request_id}: {len(seq.block_table)} blocks cannot hold {end} tokens")
        return seq.block_table[:needed]

    def _decode_groups(self, seqs: list[ScheduledSequence], tables: list[list[int]]) -> list[DecodeGroup]:
        """Split decodes (sorted by table length) into groups of similar length."""
        groups: list[DecodeGroup] = []
        first = 0
        for i in range(1, len(seqs) + 1):
            if i < len(seqs) and len(tables[i]) <= DECODE_GROUP_SPREAD * len(tables[first]):
                continue
            width = len(tables[i - 1])
            # padding points at block 0 (any valid block); the mask hides it
            flat = [b for table in tables[first:i] for b in (table + [0] * (width - len(table)))]
            lengths = index_tensor([s.start_position + 1 for s in seqs[first:i]], self.device)
            columns = torch.arange(width * self.block_size, device=self.device)
            mask = (columns.unsqueeze(0) < lengths.unsqueeze(1)).view(i - first, 1, 1, -1)
            groups.append(DecodeGroup(first, i - first, index_tensor(flat, self.device), mask))
            first = i
        return groups

    def _prefill_chunk(self, offset: int, n: int, start: int, table: list[int]) -> PrefillChunk:
        chunk = PrefillChunk(token_offset=offset, num_tokens=n, context_len=start + n)
        if self.prefill_kernels is not None:
            chunk.table = torch.from_numpy(np.array(table, dtype=np.int32))
        elif start > 0:
            rows = torch.arange(start, start + n, device=self.device).unsqueeze(1)
            columns = torch.arange(start + n, device=self.device).unsqueeze(0)
            chunk.block_ids = index_tensor(table, self.device)
            chunk.mask = columns <= rows
        return chunk
