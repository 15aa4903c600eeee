"""The model runner: one SchedulerOutput in, one sampled token per finished
chunk out. It owns the weights, the paged KV cache and its persistent batch
(each request's tokens, block-table row and RNG: `input_batch.py`); the
scheduler owns everything else (which blocks, which tokens, when) and tells
the runner only what changed."""

from __future__ import annotations

import array
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..config import EngineConfig
from ..core.scheduler_output import LayerSlice, RunnerOutput, SchedulerOutput
from .attention import AttentionMetadata, DecodeBatch, DecodeGroup, LayerSliceRows, PrefillChunk
from .index_buffer import IndexBuffer
from .input_batch import CachedRequestState, InputBatch, SchedulingError
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


@dataclass
class StepBatch:
    """Everything one forward pass needs, as device tensors."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor
    sampled: list[CachedRequestState]
    layer_slice: LayerSliceRows | None = None


class ModelRunner:
    # executes LayerSlice steps (the scheduler cuts long paced prompts in layers)
    runs_layer_slices = True

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
        # native attention, argmax and elementwise steps (None: the PyTorch paths)
        self.kernels: CpuKernels | None = (
            cpu_kernels() if self.device.type == "cpu" and config.attention_backend == "auto" else None
        )
        self.model = build_model(
            config.model_dir,
            self.model_info.max_model_len,
            self.dtype,
            self.device,
            linear_backend=config.linear_backend,
            kernels=self.kernels,
            greedy_lm_head=config.greedy_lm_head,
        )
        self.num_blocks = self._kv_budget_blocks()
        info = self.model_info
        self.kv_cache = PagedKVCache(
            KVCacheShape(info.num_layers, self.num_blocks, self.block_size, info.num_kv_heads, info.head_dim),
            self.dtype,
            self.device,
        )
        # prefill chunks: the native kernel where it runs for this head_dim
        self.prefill_kernels: CpuKernels | None = (
            self.kernels
            if self.kernels is not None and self.kernels.prefill_attention_supported(self.model_info.head_dim)
            else None
        )
        self.sampler = Sampler(self.device, self.kernels)
        self._indices = IndexBuffer()
        # a chunk in layer slices: its states after the layers it has run
        self._slice_hidden: dict[str, torch.Tensor] = {}
        self.input_batch = InputBatch(
            -(-self.model_info.max_model_len // self.block_size), config.max_num_seqs, self.device
        )
        log.info(
            "model runner ready",
            extra={
                "device": str(self.device),
                "dtype": config.dtype,
                "kv_blocks": self.num_blocks,
                "block_size": self.block_size,
                "decode_attention": "native" if self.kernels else "torch",
            },
        )

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
        states = self.input_batch.update(scheduled)
        for request_id in (*scheduled.finished_req_ids, *scheduled.preempted_req_ids):
            self._slice_hidden.pop(request_id, None)
        if not states:
            return RunnerOutput(token_ids=[])
        batch = self._prepare(states, scheduled.num_scheduled_tokens, scheduled.layer_slice)

        greedy_rows = self._greedy_rows(batch.sampled)
        started = time.perf_counter()
        # a step with rows nobody reads (prompt tokens before a prompt's last)
        # computes only the sampled rows' states in its last layer
        pruned = batch.layer_slice is None and len(batch.sampled) < batch.input_ids.shape[0]
        hidden = self.model(
            batch.input_ids,
            batch.positions,
            batch.meta,
            self.kv_cache,
            batch.layer_slice,
            output_rows=batch.sample_rows if pruned else None,
        )
        if scheduled.layer_slice is not None:
            # type-ignored below: a sliced step's batch always carries its layer slice
            self._keep_slice_states(scheduled.layer_slice, hidden, batch.layer_slice)  # type: ignore[arg-type]
        sampled_hidden = hidden if pruned else hidden[batch.sample_rows]
        logits = greedy = None
        other_rows: list[int] = []
        if len(greedy_rows) == len(batch.sampled) > 0:
            greedy = self.model.greedy_tokens(sampled_hidden)
        elif greedy_rows:  # a mixed step: the greedy head for those rows, logits for the others
            greedy_set = set(greedy_rows)
            other_rows = [row for row in range(len(batch.sampled)) if row not in greedy_set]
            greedy = self.model.greedy_tokens(sampled_hidden[greedy_rows])
            logits = self.model.compute_logits(sampled_hidden[other_rows])
        elif batch.sampled:
            logits = self.model.compute_logits(sampled_hidden)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        model_seconds = time.perf_counter() - started
        # the layer timers time kernel launches on CUDA, not the work: the
        # slicer then sizes by the pacer's units alone
        slice_seconds = (
            None
            if batch.layer_slice is None or self.device.type != "cpu"
            else (batch.layer_slice.own_seconds(len(self.model.layers)))
        )
        if logits is None:
            tokens = greedy or []
            self.input_batch.append_sampled(batch.sampled, tokens)
            return RunnerOutput(token_ids=tokens, model_seconds=model_seconds, slice_seconds=slice_seconds)

        if greedy is None:
            result = self.sampler(logits, batch.sampled)
            tokens, logprobs = result.token_ids, result.logprobs
        else:
            tokens, logprobs = self._merge_split(batch.sampled, greedy_rows, greedy, other_rows, logits)
        self.input_batch.append_sampled(batch.sampled, tokens)
        wanted = any(lp is not None for lp in logprobs)
        return RunnerOutput(
            token_ids=tokens,
            logprobs=logprobs if wanted else None,
            model_seconds=model_seconds,
            slice_seconds=slice_seconds,
        )

    def _keep_slice_states(self, layer_slice: LayerSlice, hidden: torch.Tensor, rows: LayerSliceRows) -> None:
        """Keep a sliced chunk's states for its next slice, or drop them after its last."""
        if layer_slice.end_layer < len(self.model.layers):
            self._slice_hidden[layer_slice.request_id] = hidden[hidden.shape[0] - rows.num_rows :].clone()
        else:
            self._slice_hidden.pop(layer_slice.request_id, None)

    def _greedy_rows(self, sampled: list[CachedRequestState]) -> list[int]:
        """The sampled rows whose tokens come from the model's native greedy
        LM head (no logits for the sampler): with the native kernels (fp32 on
        the CPU), every plain greedy row, whatever the other rows of its step
        want, so that a greedy request's tokens do not depend on its batch."""
        if self.model.kernels is None:
            return []
        return [row for row, seq in enumerate(sampled) if Sampler.plain_greedy_row(seq)]

    def _merge_split(
        self,
        sampled: list[CachedRequestState],
        greedy_rows: list[int],
        greedy: list[int],
        other_rows: list[int],
        logits: torch.Tensor,
    ) -> tuple[list[int], list[float | None]]:
        """A split step's tokens and log-probs in row order: the greedy head's
        (no log-prob) for greedy_rows, the sampler's for other_rows."""
        result = self.sampler(logits, [sampled[row] for row in other_rows])
        tokens = [0] * len(sampled)
        logprobs: list[float | None] = [None] * len(sampled)
        for row, token in zip(greedy_rows, greedy, strict=True):
            tokens[row] = token
        for row, token, logprob in zip(other_rows, result.token_ids, result.logprobs, strict=True):
            tokens[row], logprobs[row] = token, logprob
        return tokens, logprobs

    def _prepare(
        self, states: list[CachedRequestState], num_scheduled: list[int], layer_slice: LayerSlice | None = None
    ) -> StepBatch:
        """Flatten the step into index tensors built once and shared by all layers.

        Single-token entries at the head of the batch are decodes, then the
        prefill chunks follow in order. For the PyTorch decode path the
        decodes are laid out sorted by context length (grouped, see
        DecodeGroup); sampled rows stay in batch order. The decode loop runs
        for every running sequence every step, so it stays inline, and all
        int64 indices go through one `array.array` into one tensor.
        """
        bs = self.block_size
        max_len = self.model_info.max_model_len
        num_seqs = len(states)
        native = self.kernels is not None
        num_decodes = 0
        while num_decodes < num_seqs and num_scheduled[num_decodes] == 1:
            num_decodes += 1
        layout: list[int] | range = range(num_decodes)
        if not native:
            layout = sorted(layout, key=lambda i: states[i].num_computed_tokens // bs)

        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        table_rows: list[int] = []
        sampled: list[CachedRequestState] = []
        sample_rows: list[int] = []
        for row, index in enumerate(layout):
            state = states[index]
            start, tokens, blocks = state.num_computed_tokens, state.token_ids, state.block_ids
            block = start // bs
            if start < 0 or start >= max_len or block >= len(blocks) or start >= len(tokens):
                self._checked_table(state, 1)  # raises, naming what is wrong
            input_ids.append(tokens[start])
            positions.append(start)
            slots.append(blocks[block] * bs + start % bs)
            table_rows.append(state.row)
            if start + 1 == len(tokens):
                sampled.append(state)
                sample_rows.append(row)
        if not native and sampled:  # back to batch order
            pairs = sorted(zip(sample_rows, sampled), key=lambda pair: layout[pair[0]])
            sample_rows, sampled = [r for r, _ in pairs], [s for _, s in pairs]
        prefills: list[PrefillChunk] = []
        # a chunk in layer slices goes last (its rows leave the batch in the
        # layers it skips), its sampled row where the batch order puts it
        sliced_index, sliced_sample_at = -1, 0
        chunk_order = list(range(num_decodes, num_seqs))
        if layer_slice is not None:
            sliced_index = self._sliced_index(states, num_decodes, layer_slice)
            chunk_order.remove(sliced_index)
            chunk_order.append(sliced_index)
            sliced_sample_at = len(sampled) + sum(
                num_scheduled[i] + states[i].num_computed_tokens == len(states[i].token_ids)
                for i in range(num_decodes, sliced_index)
            )
        for index in chunk_order:
            state, n = states[index], num_scheduled[index]
            table = self._checked_table(state, n)
            start = state.num_computed_tokens
            offset = len(input_ids)
            input_ids.extend(state.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            prefills.append(self._prefill_chunk(offset, n, start, table))
            if start + n == len(state.token_ids):
                if index != sliced_index:
                    sampled.append(state)
                    sample_rows.append(offset + n - 1)
                # type-ignored below: this branch runs only for the sliced request, whose slice is set
                elif layer_slice.end_layer == len(self.model.layers):  # type: ignore[union-attr]
                    sampled.insert(sliced_sample_at, state)
                    sample_rows.insert(sliced_sample_at, offset + n - 1)

        native_decodes = native and num_decodes > 0
        if not native_decodes:
            table_rows = []
        context_lens = [p + 1 for p in positions[:num_decodes]] if native_decodes else []
        # one conversion (array.array converts Python ints in CPython's own
        # loop, ~5x faster than np.array) and, on the CPU, no torch call in a
        # step shaped like the last one (see IndexBuffer)
        t, d = len(input_ids), len(table_rows)
        values = array.array("q", input_ids + positions + slots + sample_rows + context_lens + table_rows)
        sizes = (t, t, t, len(sample_rows), d, d)
        if self.device.type == "cpu":
            parts = self._indices.load(values, sizes)
        else:
            parts = torch.split(torch.frombuffer(values, dtype=torch.int64).to(self.device), list(sizes))
        ids, positions_t, slot_mapping, rows_t, context_t, table_rows_t = parts
        meta = AttentionMetadata(slot_mapping=slot_mapping, prefills=prefills, kernels=self.prefill_kernels)
        if native_decodes:
            meta.decode_batch = DecodeBatch(
                num_seqs=num_decodes,
                block_tables=self.input_batch.block_rows.tensor,
                table_rows=table_rows_t,
                context_lens=context_t,
                kernel=self.kernels,  # type: ignore[arg-type]  # set whenever the native decode path runs
            )
        elif not native:
            decodes = [states[i] for i in layout]
            meta.decodes = self._decode_groups(decodes, [self._checked_table(state, 1) for state in decodes])
        rows = (
            None
            if layer_slice is None
            else self._slice_rows(layer_slice, states[sliced_index], num_scheduled[sliced_index], meta)
        )
        return StepBatch(
            input_ids=ids, positions=positions_t, meta=meta, sample_rows=rows_t, sampled=sampled, layer_slice=rows
        )

    @staticmethod
    def _sliced_index(states: list[CachedRequestState], num_decodes: int, layer_slice: LayerSlice) -> int:
        for index in range(num_decodes, len(states)):
            if states[index].request_id == layer_slice.request_id:
                return index
        raise SchedulingError(f"request {layer_slice.request_id}: a layer slice of a chunk not in the step")

    def _slice_rows(
        self, layer_slice: LayerSlice, state: CachedRequestState, num_rows: int, meta: AttentionMetadata
    ) -> LayerSliceRows:
        """The step's sliced chunk (its rows last in `meta`'s batch) and the
        metadata of the step without it."""
        first, end = layer_slice.first_layer, layer_slice.end_layer
        if not 0 <= first < end <= len(self.model.layers):
            raise SchedulingError(
                f"request {state.request_id}: layers {first}..{end - 1} of a {len(self.model.layers)}-layer model"
            )
        hidden = None
        if first > 0:
            hidden = self._slice_hidden.get(state.request_id)
            if hidden is None or hidden.shape[0] != num_rows:
                raise SchedulingError(
                    f"request {state.request_id}: a slice from layer {first} of a chunk "
                    f"of {num_rows} tokens the runner did not start"
                )
        main = meta.slot_mapping.shape[0] - num_rows
        main_meta = AttentionMetadata(
            slot_mapping=meta.slot_mapping[:main],
            decode_batch=meta.decode_batch,
            decodes=meta.decodes,
            prefills=meta.prefills[:-1],
            kernels=meta.kernels,
            check_layer=end if first == 0 else 0,
        )
        meta.check_layer = first
        return LayerSliceRows(first, end, num_rows, hidden, main_meta)

    def _checked_table(self, state: CachedRequestState, n: int) -> list[int]:
        """The blocks covering the request's context after a chunk of `n`
        tokens from its `num_computed_tokens`, after checking the schedule."""
        start = state.num_computed_tokens
        end, max_len = start + n, self.model_info.max_model_len
        if n <= 0:
            raise SchedulingError(f"request {state.request_id}: no tokens scheduled")
        if start < 0 or end > max_len:
            raise SchedulingError(f"request {state.request_id}: positions {start}..{end - 1} outside 0..{max_len - 1}")
        if end > len(state.token_ids):
            raise SchedulingError(
                f"request {state.request_id}: positions up to {end - 1} scheduled, {len(state.token_ids)} tokens known"
            )
        needed = -(-end // self.block_size)
        if len(state.block_ids) < needed:
            raise SchedulingError(f"request {state.request_id}: {len(state.block_ids)} blocks cannot hold {end} tokens")
        return state.block_ids[:needed]

    def _decode_groups(self, seqs: list[CachedRequestState], tables: list[list[int]]) -> list[DecodeGroup]:
        """Split decodes (sorted by table length) into groups of similar length."""
        groups: list[DecodeGroup] = []
        first = 0
        for i in range(1, len(seqs) + 1):
            if i < len(seqs) and len(tables[i]) <= DECODE_GROUP_SPREAD * len(tables[first]):
                continue
            width = len(tables[i - 1])
            # padding points at block 0 (any valid block); the mask hides it
            flat = [b for table in tables[first:i] for b in (table + [0] * (width - len(table)))]
            lengths = index_tensor([s.num_computed_tokens + 1 for s in seqs[first:i]], self.device)
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
