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
run (`prefill_pacer.py`): their chunks are cut so that a step's prefill
takes at most `prefill_time_ratio` x a decode-only step.
"""
from __future__ import annotations

import bisect
import logging
import time
from typing import Iterable

from ..config import EngineConfig
from . import metrics as m
from .kv_cache_manager import KVCacheManager
from .metrics import MetricsSink
from .outputs import RequestOutput
from .prefill_pacer import PrefillPacer
from .request import FINISHED_STATUS, FinishReason, Request, RequestStatus
from .scheduler_output import RunnerOutput, ScheduledSequence, SchedulerOutput
from .waiting_queue import WaitingQueue

log = logging.getLogger(__name__)
RUNNING = RequestStatus.RUNNING


def _running_key(request: Request) -> tuple[int, int]:
    return (-request.priority, request.admit_seq)


class Scheduler:
    def __init__(self, config: EngineConfig, num_blocks: int, max_model_len: int,
                 metrics: MetricsSink | None = None, attention_context: float = 0.0) -> None:
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
        self._finished_ids: list[str] = []       # runner state to drop, sent with the next step
        self._admissions = 0
        # what the metrics count too, kept for LLMEngine.stats()
        self.num_preemptions = 0
        self.num_prefix_cache_hit_tokens = 0
        self._num_with_timeout = 0
        self._last_output: SchedulerOutput | None = None
        self._last_requests: list[Request] = []   # parallel to _last_output.sequences
        # pacing of long prefills: this step's decodes, prefill units (all
        # chunks), units left for paced chunks (None = no limit), and when
        # the step left the scheduler
        self.pacer = PrefillPacer(config.prefill_time_ratio if self.chunked else 0.0, attention_context)
        self.clock = time.perf_counter
        self._step_decodes = 0
        self._step_units = 0.0
        self._units_left: float | None = None
        self._scheduled_at = 0.0

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
        decodes: list[ScheduledSequence] = []
        decode_reqs: list[Request] = []
        prefills: list[ScheduledSequence] = []
        prefill_reqs: list[Request] = []
        prefilling: list[Request] = []
        preempted = False

        # 1. decodes; a decode that finds no block preempts from the back.
        # This loop runs for every running sequence every step: the common
        # case (room left in the last block) is checked here, inline.
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
            table = tables.get(req.request_id)
            if table is None or computed >= len(table) * block_size:
                while not kv.allocate_slots(req, 1):
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        break
                if req.status is not RUNNING:
                    break
                table = tables[req.request_id]
            # one object per running request, updated in place: a new one per
            # sequence per step costs more than the rest of this loop
            scheduled_decode = req.scheduled_decode
            if scheduled_decode is None or scheduled_decode.block_table is not table:
                scheduled_decode = req.scheduled_decode = self._scheduled(req, 1)
            else:
                scheduled_decode.token_ids[0] = req.all_token_ids[computed]
                scheduled_decode.start_position = computed
            decodes.append(scheduled_decode)
            decode_reqs.append(req)
            budget -= 1
            i += 1

        pacer = self.pacer
        self._step_decodes = len(decodes)
        self._step_units = 0.0
        self._units_left = pacer.budget(len(decodes)) if pacer.enabled else None

        # 2. chunks of running prefills; they may only preempt prefills not yet
        # scheduled this step (a decode victim would have to be unscheduled)
        chunked_ids: set[str] = set()
        for req in prefilling:
            if budget <= 0:
                break
            if req.status is not RUNNING:
                continue
            num_new = self._paced(req, req.num_computed_tokens,
                                  min(req.num_tokens - req.num_computed_tokens, budget), bool(prefills))
            if num_new <= 0:
                continue   # paced out of this step
            while not kv.allocate_slots(req, num_new):
                victim = running[-1]
                if victim is not req and (victim.num_tokens - victim.num_computed_tokens == 1
                                          or victim.request_id in chunked_ids):
                    break
                running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                prefills.append(self._scheduled(req, num_new))
                prefill_reqs.append(req)
                chunked_ids.add(req.request_id)
                budget -= num_new
                self._charge(req.num_computed_tokens, num_new)

        # 3. admissions
        if not preempted:
            budget = self._admit(budget, prefills, prefill_reqs)

        sequences = decodes + prefills
        out = SchedulerOutput(sequences=sequences, num_batched_tokens=self.max_num_batched_tokens - budget)
        if sequences and self._finished_ids:
            out.finished_request_ids = self._finished_ids
            self._finished_ids = []
        self._last_output = out
        self._last_requests = decode_reqs + prefill_reqs
        self._scheduled_at = self.clock()
        return out

    def _paced(self, req: Request, start: int, num_new: int, scheduled_any: bool) -> int:
        """`num_new` cut to what pacing allows for this request's chunk from
        `start`: only long prompts (more than a step's token budget) are
        paced, and the step's first prefill always gets MIN_CHUNK tokens."""
        units = self._units_left
        if units is None or req.num_tokens <= self.max_num_batched_tokens:
            return num_new
        allowed = self.pacer.max_tokens(start, max(units, 0.0))
        if not scheduled_any:
            allowed = max(allowed, self.pacer.min_tokens)
        return min(num_new, allowed)

    def _charge(self, start: int, num_new: int) -> None:
        cost = self.pacer.cost(start, num_new)
        self._step_units += cost
        if self._units_left is not None:
            self._units_left -= cost

    def _admit(self, budget: int, prefills: list[ScheduledSequence], prefill_reqs: list[Request]) -> int:
        waiting = self.waiting
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
            num_new = self._paced(req, num_cached, num_new, bool(prefills))
            if num_new <= 0:
                break
            if not kv.allocate_slots(req, num_new, hits):
                break   # strict order: nobody overtakes the head of the queue
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
            prefills.append(self._scheduled(req, num_new))
            prefill_reqs.append(req)
            budget -= num_new
            self._charge(num_cached, num_new)
        return budget

    def _scheduled(self, req: Request, num_new: int) -> ScheduledSequence:
        start = req.num_computed_tokens
        return ScheduledSequence(
            request_id=req.request_id, token_ids=req.all_token_ids[start:start + num_new], start_position=start,
            block_table=self.kv.block_ids(req.request_id), sample=start + num_new == req.num_tokens,
            sampling=req.sampling, output_token_ids=req.output_token_ids,
            prompt_token_ids=req.prompt_token_ids, seed=req.sampling.seed,
            greedy_after=req.sampling.plain_greedy_after)

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        self.waiting.appendleft(req)
        self.num_preemptions += 1
        self.metrics.counter_add(m.PREEMPTIONS, 1)
        log.debug("preempted request_id=%s output_tokens=%d", req.request_id, req.num_output_tokens)

    # -- results ---------------------------------------------------------------
    def update_from_output(self, scheduled: SchedulerOutput, runner_output: RunnerOutput) -> list[RequestOutput]:
        if scheduled is not self._last_output:
            raise RuntimeError("update_from_output: not the output of the last schedule() call")
        if self.pacer.enabled:
            self.pacer.observe(self.clock() - self._scheduled_at, self._step_decodes, self._step_units)
        token_ids = runner_output.token_ids
        logprobs = runner_output.logprobs
        num_sampled = sum(1 for seq in scheduled.sequences if seq.sample)
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
        output_for = self._output
        add_gap = gaps.append
        index = -1   # into token_ids: one per sampled sequence
        for seq, req in zip(scheduled.sequences, self._last_requests):
            if seq.sample:
                index += 1
            if req.status is not RUNNING:
                continue   # ended between execute and update (timeout)
            num_new = len(seq.token_ids)
            req.num_computed_tokens += num_new
            # a decode fills its last block only at a block boundary
            if num_new > 1 or req.num_computed_tokens % block_size == 0:
                kv.cache_computed_blocks(req)
            if not seq.sample:
                continue
            token = token_ids[index]
            req.append_output_token(token, None if logprobs is None else logprobs[index])
            num_applied += 1
            if req.first_token_time_ns is None:
                req.first_token_time_ns = now
                self.metrics.histogram_observe(m.TIME_TO_FIRST_TOKEN, (now - req.arrival_time_ns) / 1e9)
            else:
                add_gap((now - req.last_token_time_ns) / 1e9)  # type: ignore[operator]
            req.last_token_time_ns = now
            if req.token_timeout_ns:
                req.deadline_mono_ns = now_mono + req.token_timeout_ns
            if (token in req.stop_token_ids or req.has_stop_words or len(req.output_token_ids) >= req.max_tokens
                    or len(req.all_token_ids) >= max_model_len):
                reason, returned = self._check_stop(req, token)
            else:   # none of _check_stop's rules can fire: the common step, without the call
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

    def _check_stop(self, req: Request, token_id: int) -> tuple[FinishReason | None, bool]:
        """(finish reason or None, whether `token_id` is returned to the client)."""
        sp = req.sampling
        n = len(req.output_token_ids)
        # the EOS itself is not returned, so `n > min_tokens` leaves min_tokens returned
        if not sp.ignore_eos and token_id in req.stop_token_ids and n > sp.min_tokens:
            return FinishReason.STOP, False
        if sp.stop_words_ids and n >= sp.min_tokens:
            out = req.output_token_ids
            for word in sp.stop_words_ids:
                if word and word[-1] == token_id and len(word) <= n and out[n - len(word):] == word:
                    return FinishReason.STOP, True
        if n >= sp.max_tokens or req.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH, True
        return None, True

    # -- endings ---------------------------------------------------------------
    def abort(self, request_ids: Iterable[str], reason: FinishReason = FinishReason.CANCELLED,
              error: str | None = None) -> list[RequestOutput]:
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

    def _finish(self, req: Request, reason: FinishReason, error: str | None,
                new_ids: list[int], new_lps: list[float] | None, remove: bool = True) -> RequestOutput:
        if remove:
            if req.status is RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
        req.status = FINISHED_STATUS[reason]
        req.finish_reason = reason
        req.error = error
        self.kv.free(req)
        del self.requests[req.request_id]
        self._finished_ids.append(req.request_id)
        if req.token_timeout_ns:
            self._num_with_timeout -= 1
        self._record_finish(req, reason)
        if new_lps is None and req.output_logprobs is not None:
            new_lps = []
        return self._output(req, new_ids, new_lps, True)

    def _record_finish(self, req: Request, reason: FinishReason) -> None:
        metrics = self.metrics
        if reason is FinishReason.CANCELLED:
            metrics.counter_add(m.REQUESTS_CANCELLED, 1)
        elif reason is FinishReason.TIMEOUT:
            metrics.counter_add(m.REQUESTS_TIMED_OUT, 1)
        end = req.last_token_time_ns if reason in (FinishReason.STOP, FinishReason.LENGTH) else time.time_ns()
        metrics.histogram_observe(m.E2E_REQUEST_LATENCY, ((end or 0) - req.arrival_time_ns) / 1e9)
        n = req.num_new_output_tokens   # the time measured covers this request's own tokens only
        if req.first_token_time_ns is not None and n > 1 and req.last_token_time_ns is not None:
            metrics.histogram_observe(m.TIME_PER_OUTPUT_TOKEN,
                                      (req.last_token_time_ns - req.first_token_time_ns) / 1e9 / (n - 1))
        log.debug("request finished request_id=%s reason=%s prompt_tokens=%d output_tokens=%d cached_tokens=%d",
                 req.request_id, reason.value, req.num_prompt_tokens, n, req.num_cached_tokens)

    @staticmethod
    def _output(req: Request, new_ids: list[int], new_lps: list[float] | None, finished: bool) -> RequestOutput:
        # positional: built for every running sequence at every step
        reason = req.finish_reason
        return RequestOutput(req.request_id, new_ids, new_lps, finished,
                             reason.value if finished and reason is not None else None,
                             req.error if finished else None, len(req.prompt_token_ids), req.num_returned_tokens,
                             req.num_cached_tokens, req.cum_log_prob, req.arrival_time_ns,
                             req.first_token_time_ns, req.last_token_time_ns)
