"""The model runner: one SchedulerOutput in, one sampled token per finished
chunk out. It owns the weights, the paged KV cache and per-request RNGs; the
scheduler owns everything else (which blocks, which tokens, when)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from .attention import AttentionMetadata, PrefillChunk
from .config import EngineConfig
from .kv_cache import KVCacheShape, PagedKVCache, bytes_per_block
from .model_info import ModelInfo
from .models import build_model
from .sampler import Sampler
from .scheduler_output import RunnerOutput, SampledToken, ScheduledSequence, SchedulerOutput

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
        self.sampler = Sampler(self.device)
        self._generators: dict[str, torch.Generator] = {}
        log.info("model runner ready", extra={"device": str(self.device), "dtype": config.dtype,
                                              "kv_blocks": self.num_blocks, "block_size": self.block_size})

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

    @torch.inference_mode()
    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        for request_id in scheduled.finished_request_ids:
            self._generators.pop(request_id, None)
        if scheduled.is_empty:
            return RunnerOutput(sampled=[])
        batch = self._prepare(scheduled.sequences)

        started = time.perf_counter()
        hidden = self.model(batch.input_ids, batch.positions, batch.meta, self.kv_cache)
        logits = self.model.compute_logits(hidden[batch.sample_rows]) if batch.sampled else None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        model_seconds = time.perf_counter() - started
        if logits is None:
            return RunnerOutput(sampled=[], model_seconds=model_seconds)

        result = self.sampler(logits, batch.sampled, self._generators_for(batch.sampled))
        sampled = [SampledToken(seq.request_id, token, logprob)
                   for seq, token, logprob in zip(batch.sampled, result.token_ids, result.logprobs)]
        return RunnerOutput(sampled=sampled, model_seconds=model_seconds)

    def _generators_for(self, seqs: list[ScheduledSequence]) -> dict[str, torch.Generator]:
        for seq in seqs:
            seed = seq.seed if seq.seed is not None else seq.sampling.seed
            if seed is not None and seq.request_id not in self._generators:
                self._generators[seq.request_id] = torch.Generator(self.device).manual_seed(seed)
        return self._generators

    def _prepare(self, seqs: list[ScheduledSequence]) -> StepBatch:
        """Flatten the step into index tensors built once and shared by all layers."""
        bs = self.block_size
        max_len = self.model_info.max_model_len
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        sampled: list[ScheduledSequence] = []

        # a leading run of single-token sequences is attended as one batch
        num_decodes = 0
        while num_decodes < len(seqs) and seqs[num_decodes].num_tokens == 1:
            num_decodes += 1

        decode_blocks: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        for index, seq in enumerate(seqs):
            n, start = seq.num_tokens, seq.start_position
            end = start + n
            if n == 0:
                raise SchedulingError(f"request {seq.request_id}: no tokens scheduled")
            if start < 0 or end > max_len:
                raise SchedulingError(f"request {seq.request_id}: positions {start}..{end - 1} outside 0..{max_len - 1}")
            needed = -(-end // bs)
            if len(seq.block_table) < needed:
                raise SchedulingError(
                    f"request {seq.request_id}: {len(seq.block_table)} blocks cannot hold {end} tokens")
            table = seq.block_table[:needed]
            offset = len(input_ids)
            input_ids.extend(seq.token_ids)
            if n == 1:
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                positions.extend(range(start, end))
                slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if index < num_decodes:
                decode_blocks.append(table)
                decode_lens.append(end)
            else:
                prefills.append(self._prefill_chunk(offset, n, start, table))
            if seq.sample:
                sample_rows.append(offset + n - 1)
                sampled.append(seq)

        device = self.device
        meta = AttentionMetadata(slot_mapping=torch.tensor(slots, device=device), prefills=prefills)
        if num_decodes:
            width = max(len(t) for t in decode_blocks)
            # padding points at block 0 (any valid block); the mask hides it
            flat = [b for t in decode_blocks for b in (t + [0] * (width - len(t)))]
            lens = torch.tensor(decode_lens, device=device)
            columns = torch.arange(width * bs, device=device)
            meta.num_decodes = num_decodes
            meta.decode_blocks = width
            meta.decode_block_ids = torch.tensor(flat, device=device)
            meta.decode_mask = (columns.unsqueeze(0) < lens.unsqueeze(1)).view(num_decodes, 1, 1, -1)
        return StepBatch(
            input_ids=torch.tensor(input_ids, device=device),
            positions=torch.tensor(positions, device=device),
            meta=meta,
            sample_rows=torch.tensor(sample_rows, device=device, dtype=torch.long),
            sampled=sampled,
        )

    def _prefill_chunk(self, offset: int, n: int, start: int, table: list[int]) -> PrefillChunk:
        chunk = PrefillChunk(token_offset=offset, num_tokens=n, context_len=start + n)
        if start > 0:
            rows = torch.arange(start, start + n, device=self.device).unsqueeze(1)
            columns = torch.arange(start + n, device=self.device).unsqueeze(0)
            chunk.block_ids = torch.tensor(table, device=self.device)
            chunk.mask = columns <= rows
        return chunk
