"""Iteration-level scheduling (Orca, vLLM v1): each `schedule()` call picks
the work of one engine step under a token budget and a sequence limit.

Order of service each step:
  1. running requests that decode (one token each), so streams never stall;
  2. running requests still prefilling, a chunk each from what budget is left;
  3. waiting requests by (priority desc, arrival), only if nothing was
     preempted this step and their blocks can be allocated.
`running` stays sorted by (priority desc, admission order), so the last one
is always the preemption victim: the latest admitted of the lowest priority.
Preemption is by recompute: its blocks are freed and it re-prefills prompt +
generated tokens later (the prefix cache usually serves most of them).
Long prompts (more tokens than one step's budget) are paced while decodes
run (`prefill_pacer.py`): their chunks are cut so that a step takes at
most (1 + `prefill_time_ratio`) x a decode-only step at its p99; a chunk that
cannot finish the prompt then runs a few layers a step (`LayerSlice`).
What the runner learns is a message (`scheduler_output.py`): a request whole
when it is admitted, then per step only its new blocks and progress.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable

from contract import metric_names as m

from ..config import EngineConfig
from .kv_cache_manager import KVCacheManager
from .layer_slices import LayerSlicer
from .metrics import MetricsSink
from .outputs import RequestOutput
from .prefill_pacer import PrefillPacer
from .request import FINISHED_STATUS, FinishReason, Request, RequestStatus
from .request_end import check_stop, record_finish, request_output
from .scheduler_output import CachedRequestData, NewRequestData, RunnerOutput, SchedulerOutput
from .step_pacing import StepPacing
from .waiting_queue import WaitingQueue

log = logging.getLogger(__name__)
RUNNING = RequestStatus.RUNNING


def _running_key(request: Request) -> tuple[int, int]:
    return (-request.priority, request.admit_seq)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        num_blocks: int,
        max_model_len: int,
        metrics: MetricsSink | None = None,
        attention_context: float = 0.0,
        num_layers: int = 0,
    ) -> None:
        """`num_layers`: the model's decoder layers, when the runner runs
        layer slices (0: every chunk runs all layers)."""
        self.block_size = config.block_size
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked = config.enable_chunked_context
        self.max_model_len = max_model_len
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_kv_cache_reuse)
        self.metrics = metrics if metrics is not None else MetricsSink()
        self.waiting = WaitingQueue()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        # runner state to drop, sent with the next step that runs
        self._finished_ids: list[str] = []
        self._preempted_ids: list[str] = []
        self._admissions = 0
        # what the metrics count too, kept for LLMEngine.stats()
        self.num_preemptions = 0
        self.num_prefix_cache_hit_tokens = 0
        self._num_with_timeout = 0
        self._last_output: SchedulerOutput | None = None
        self._last_requests: list[Request] = []  # the last output's requests, in batch order
        self._last_num_sampled = 0
        # pacing of long prefills, a step at a time
        self.pacer = PrefillPacer(config.prefill_time_ratio if self.chunked else 0.0, attention_context)
        self.slicer = LayerSlicer(self.pacer, num_layers)
        self.pacing = StepPacing(self.pacer, self.slicer, self.max_num_batched_tokens)

    @property
    def clock(self) -> Callable[[], float]:
        """What steps are timed with (a test sets a fake one)."""
        return self.pacing.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.pacing.clock = clock

    # -- state -----------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id: {request.request_id!r} is already scheduled")
        self.requests[request.request_id] = request
        self.waiting.append(request)
        if request.token_timeout_ns:
            self._num_with_timeout += 1

    # -- scheduling ------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        running = self.running
        kv = self.kv
        cached = CachedRequestData()
        cached_ids, cached_blocks, cached_computed = cached.req_ids, cached.new_block_ids, cached.num_computed_tokens
        num_scheduled: list[int] = []  # batch order: cached requests, then new ones
        scheduled_reqs: list[Request] = []
        new_reqs: list[NewRequestData] = []
        prefilling: list[Request] = []
        preempted = False

        # 1. decodes; a decode that finds no block preempts from the back.
        # This loop runs for every running sequence every step: the common
        # case (room left in the last block, nothing new for the runner but
        # the position) is checked here, inline, and builds no object.
        tables = kv.tables
        block_size = self.block_size
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            if len(req.all_token_ids) - computed != 1:
                prefilling.append(req)
                i += 1
                continue
            rid = req.request_id
            table = tables.get(rid)
            new_blocks = None
            if table is None or computed >= len(table) * block_size:
                held = 0 if table is None else len(table)
                while not kv.allocate_slots(req, 1):
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        break
                if req.status is not RUNNING:
                    break
                new_blocks = tuple(tables[rid][held:])
            cached_ids.append(rid)
            cached_blocks.append(new_blocks)
            cached_computed.append(computed)
            num_scheduled.append(1)
            scheduled_reqs.append(req)
            budget -= 1
            i += 1
        num_decodes = len(scheduled_reqs)
        num_sampled = num_decodes

        pacing = self.pacing
        pacing.begin(num_decodes)

        # 2. chunks of running prefills; they may only preempt prefills not yet
        # scheduled this step (a decode victim would have to be unscheduled)
        chunked_ids: set[str] = set()
        for req in prefilling:
            if budget <= 0:
                break
            if req.status is not RUNNING:
                continue
            start = req.num_computed_tokens
            available = min(req.num_tokens - start, budget)
            layer_slice, num_new = pacing.chunk(req, start, available, bool(chunked_ids))
            if num_new <= 0:
                continue  # paced out of this step
            held = len(kv.block_ids(req.request_id))
            # a chunk in layer slices has its blocks from its first slice on
            needs_blocks = layer_slice is None or layer_slice.first_layer == 0
            while needs_blocks and not kv.allocate_slots(req, num_new):
                victim = running[-1]
                if victim is not req and (
                    victim.num_tokens - victim.num_computed_tokens == 1 or victim.request_id in chunked_ids
                ):
                    break
                running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                table = kv.block_ids(req.request_id)
                cached_ids.append(req.request_id)
                cached_blocks.append(tuple(table[held:]) if len(table) > held else None)
                cached_computed.append(start)
                num_scheduled.append(num_new)
                scheduled_reqs.append(req)
                chunked_ids.add(req.request_id)
                budget = max(budget - num_new, 0)
                num_sampled += pacing.charge(req, start, num_new, layer_slice)

        # 3. admissions: new to the runner (again, after a preemption)
        if not preempted:
            budget, num_sampled_new = self._admit(budget, bool(chunked_ids), new_reqs, num_scheduled, scheduled_reqs)
            num_sampled += num_sampled_new

        out = SchedulerOutput(
            new_reqs, cached, num_scheduled, self.max_num_batched_tokens - budget, layer_slice=pacing.layer_slice
        )
        if num_scheduled and (self._finished_ids or self._preempted_ids):
            out.finished_req_ids, self._finished_ids = self._finished_ids, []
            out.preempted_req_ids, self._preempted_ids = self._preempted_ids, []
        self._last_output = out
        self._last_requests = scheduled_reqs
        self._last_num_sampled = num_sampled
        pacing.sent()
        return out

    def _admit(
        self,
        budget: int,
        scheduled_any: bool,
        new_reqs: list[NewRequestData],
        num_scheduled: list[int],
        scheduled_reqs: list[Request],
    ) -> tuple[int, int]:
        """Admissions in queue order; (budget left, how many will be sampled)."""
        waiting = self.waiting
        num_sampled = 0
        running = self.running
        kv = self.kv
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            req = waiting.peek()
            hits, num_cached = kv.get_computed_blocks(req)
            num_new = req.num_tokens - num_cached
            if num_new > budget:
                # without chunking a prefill must fit whole, unless it never
                # could (a resumed request whose prompt + output grew past it)
                if not self.chunked and num_new <= self.max_num_batched_tokens:
                    break
                num_new = budget
            num_new = self.pacing.paced(req, num_cached, num_new, scheduled_any or bool(new_reqs))
            if num_new <= 0:
                break
            if not kv.allocate_slots(req, num_new, hits):
                break  # strict order: nobody overtakes the head of the queue
            waiting.popleft()
            req.num_computed_tokens = num_cached
            if req.status is RequestStatus.WAITING:
                now = time.time_ns()
                # the prompt's share: a continuation's blocks may be cached too
                req.num_cached_tokens = min(num_cached, req.num_prompt_tokens)
                self.metrics.counter_add(m.PROMPT_TOKENS, req.num_prompt_tokens)
                self.metrics.histogram_observe(m.REQUEST_QUEUE_TIME, (now - req.arrival_time_ns) / 1e9)
            if num_cached:
                self.num_prefix_cache_hit_tokens += num_cached
                self.metrics.counter_add(m.PREFIX_CACHE_HIT_TOKENS, num_cached)
            req.status = RUNNING
            self._admissions += 1
            req.admit_seq = self._admissions
            bisect.insort(running, req, key=_running_key)
            # copies: the scheduler appends to both lists at later steps
            new_reqs.append(
                NewRequestData(
                    req.request_id,
                    tuple(req.all_token_ids),
                    req.num_prompt_tokens,
                    req.sampling,
                    tuple(kv.block_ids(req.request_id)),
                    num_cached,
                )
            )
            num_scheduled.append(num_new)
            scheduled_reqs.append(req)
            num_sampled += self.pacing.charge(req, num_cached, num_new)
            budget -= num_new
        return budget, num_sampled

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        self.slicer.drop(req)
        self.waiting.appendleft(req)
        self._preempted_ids.append(req.request_id)
        self.num_preemptions += 1
        self.metrics.counter_add(m.PREEMPTIONS, 1)
        log.debug("preempted request_id=%s output_tokens=%d", req.request_id, req.num_output_tokens)

    # -- results ---------------------------------------------------------------
    def update_from_output(self, scheduled: SchedulerOutput, runner_output: RunnerOutput) -> list[RequestOutput]:
        if scheduled is not self._last_output:
            raise RuntimeError("update_from_output: not the output of the last schedule() call")
        self.pacing.observe(runner_output, self.requests)
        token_ids = runner_output.token_ids
        logprobs = runner_output.logprobs
        num_sampled = self._last_num_sampled
        if len(token_ids) != num_sampled or (logprobs is not None and len(logprobs) != num_sampled):
            raise RuntimeError(f"runner returned {len(token_ids)} tokens for {num_sampled} sampled sequences")
        now = time.time_ns()
        now_mono = time.monotonic_ns()
        outputs: list[RequestOutput] = []
        gaps: list[float] = []
        finished_running = False
        num_applied = 0
        kv = self.kv
        block_size = self.block_size
        max_model_len = self.max_model_len
        output_for = request_output
        add_gap = gaps.append
        index = -1  # into token_ids: one per sampled request
        layer_slice = scheduled.layer_slice
        for req, num_new in zip(self._last_requests, scheduled.num_scheduled_tokens):
            # a chunk's tokens are computed after its last layer
            if (
                layer_slice is not None
                and req.request_id == layer_slice.request_id
                and not self.slicer.ran(req, layer_slice)
            ):
                continue
            # sampled when the chunk reached the end of the request's tokens
            # (an ending between execute and update changes neither)
            computed = req.num_computed_tokens + num_new
            sampled = computed == len(req.all_token_ids)
            if sampled:
                index += 1
            if req.status is not RUNNING:
                continue  # ended between execute and update (timeout)
            req.num_computed_tokens = computed
            # a decode fills its last block only at a block boundary
            if num_new > 1 or computed % block_size == 0:
                kv.cache_computed_blocks(req)
            if not sampled:
                continue
            token = token_ids[index]
            req.append_output_token(token, None if logprobs is None else logprobs[index])
            num_applied += 1
            last_token_ns = req.last_token_time_ns  # set with the first token
            if last_token_ns is None:
                req.first_token_time_ns = now
                self.metrics.histogram_observe(m.TIME_TO_FIRST_TOKEN, (now - req.arrival_time_ns) / 1e9)
            else:
                add_gap((now - last_token_ns) / 1e9)
            req.last_token_time_ns = now
            if req.token_timeout_ns:
                req.deadline_mono_ns = now_mono + req.token_timeout_ns
            if (
                token in req.stop_token_ids
                or req.has_stop_words
                or len(req.output_token_ids) >= req.max_tokens
                or len(req.all_token_ids) >= max_model_len
            ):
                reason, returned = check_stop(req, token, max_model_len)
            else:  # none of _check_stop's rules can fire: the common step, without the call
                reason, returned = None, True
            if returned:
                new_ids = [token]
                new_lps = None if req.output_logprobs is None else [req.output_logprobs[-1]]
                req.num_returned_tokens += 1
            else:
                new_ids, new_lps = [], ([] if req.output_logprobs is not None else None)
            if reason is None:
                outputs.append(output_for(req, new_ids, new_lps, False))
            else:
                outputs.append(self._finish(req, reason, None, new_ids, new_lps, remove=False))
                finished_running = True
        if finished_running:
            self.running = [r for r in self.running if r.status is RUNNING]
        if num_applied:
            self.metrics.counter_add(m.GENERATION_TOKENS, num_applied)
        if gaps:
            self.metrics.histogram_observe_many(m.INTER_TOKEN_LATENCY, gaps)
        return outputs

    # -- endings ---------------------------------------------------------------
    def abort(
        self, request_ids: Iterable[str], reason: FinishReason = FinishReason.CANCELLED, error: str | None = None
    ) -> list[RequestOutput]:
        """End live requests between steps; unknown or finished ids are skipped."""
        outputs = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None:
                outputs.append(self._finish(req, reason, error, [], None))
        return outputs

    def abort_all(self, reason: FinishReason, error: str | None = None) -> list[RequestOutput]:
        return self.abort(list(self.requests), reason, error)

    def expire_timeouts(self, now_mono_ns: int | None = None) -> list[RequestOutput]:
        """End requests whose next token is overdue (the first one counted
        from arrival). Costs nothing when no live request has a timeout."""
        if not self._num_with_timeout:
            return []
        now = time.monotonic_ns() if now_mono_ns is None else now_mono_ns
        expired = [r.request_id for r in self.requests.values() if r.deadline_mono_ns and now >= r.deadline_mono_ns]
        return self.abort(expired, FinishReason.TIMEOUT) if expired else []

    def next_deadline_mono_ns(self) -> int | None:
        if not self._num_with_timeout:
            return None
        return min((r.deadline_mono_ns for r in self.requests.values() if r.deadline_mono_ns), default=None)

    def _finish(
        self,
        req: Request,
        reason: FinishReason,
        error: str | None,
        new_ids: list[int],
        new_lps: list[float] | None,
        remove: bool = True,
    ) -> RequestOutput:
        if remove:
            if req.status is RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
        self.slicer.drop(req)
        req.status = FINISHED_STATUS[reason]
        req.finish_reason = reason
        req.error = error
        self.kv.free(req)
        del self.requests[req.request_id]
        self._finished_ids.append(req.request_id)
        if req.token_timeout_ns:
            self._num_with_timeout -= 1
        record_finish(self.metrics, req, reason)
        if new_lps is None and req.output_logprobs is not None:
            new_lps = []
        return request_output(req, new_ids, new_lps, True)
