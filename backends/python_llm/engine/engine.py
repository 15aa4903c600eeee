"""The engine loop: intake, aborts, timeouts, one scheduled step, outputs.

One thread owns every piece of engine state (scheduler, blocks, requests):
the caller of `step()` offline, or the loop thread after `start()`. Other
threads only post to the intake and abort queues, so a cancel is applied
between steps and can never free blocks the running step still writes.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from contract import metric_names as m

from .config import EngineConfig
from .core.errors import DuplicateRequestError, EngineDeadError, OverloadedError
from .core.metrics import MetricsSink
from .core.outputs import GenerateResult, RequestOutput
from .core.request import FinishReason, OutputCallback, Request
from .core.request_end import request_output
from .core.request_limits import RequestLimits
from .core.runner_interface import Runner
from .core.sampling_params import SamplingParams
from .core.scheduler import Scheduler
from .debug_faults import with_debug_faults
from .request_builder import RequestBuilder
from .stats import EngineStats

log = logging.getLogger(__name__)
IDLE_RECHECK_S = 0.05  # cap on a wait while requests exist but nothing was schedulable


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        runner: Runner | None = None,
        metrics: MetricsSink | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
    ) -> None:
        if runner is None:
            from .worker.runner import ModelRunner  # torch and weights only when really serving

            runner = ModelRunner(config)
        self.config = config
        self.runner = with_debug_faults(runner, config)
        self.model_info = info = runner.model_info
        self.metrics = metrics if metrics is not None else MetricsSink()
        self._on_dead = on_dead
        max_len = info.max_model_len if config.max_model_len is None else min(info.max_model_len, config.max_model_len)
        self.limits = RequestLimits(
            max_tokens_limit=config.max_tokens_limit,
            vocab_size=info.vocab_size,
            max_model_len=max_len,
            kv_capacity_tokens=runner.num_blocks * config.block_size,
            prompt_token_budget=None if config.enable_chunked_context else config.max_num_batched_tokens,
        )
        self._requests = RequestBuilder(config, self.limits, info.eos_token_ids)
        self.scheduler = Scheduler(
            config,
            runner.num_blocks,
            max_len,
            self.metrics,
            info.attention_parity_context,
            info.num_layers if runner.runs_layer_slices else 0,
        )

        self._cv = threading.Condition()
        self._intake: deque[Request] = deque()
        self._aborts: deque[tuple[Request, FinishReason]] = deque()
        self._live: dict[str, Request] = {}  # every accepted, unfinished request
        self._dead_error: str | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._heap_frozen = False  # freeze_heap() (launch() calls it) froze the heap; shutdown() thaws it
        self._generate_count = 0
        self._steps = 0
        self._step_seconds = 0.0
        self._model_seconds = 0.0
        self.metrics.gauge_set(m.KV_BLOCKS_CAPACITY, self.scheduler.kv.capacity)

    # -- intake (any thread) ---------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        priority: int = 0,
        on_output: OutputCallback | None = None,
        continuation_ids: Sequence[int] = (),
    ) -> None:
        """Queue a request. Raises InvalidRequestError, OverloadedError,
        DuplicateRequestError or EngineDeadError at once, never later.
        `continuation_ids`: output already generated elsewhere (see Request)."""
        self._submit(
            self._make_request(request_id, prompt_token_ids, sampling, priority, on_output, continuation_ids),
            enforce_queue_limit=True,
        )

    def abort(self, request_id: str, reason: str | FinishReason = FinishReason.CANCELLED) -> bool:
        """Ask the loop to end a live request before its next step. False when
        no live request has this id."""
        finish = FinishReason(reason)
        with self._cv:
            req = self._live.get(request_id)
            if req is None:
                return False
            self._aborts.append((req, finish))
            self._cv.notify()
        return True

    def _make_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        priority: int,
        on_output: OutputCallback | None,
        continuation_ids: Sequence[int] = (),
    ) -> Request:
        if self._dead_error is not None:  # before any complaint about the request
            raise EngineDeadError(self._dead_error)
        return self._requests.build(request_id, prompt_token_ids, sampling, priority, on_output, continuation_ids)

    def _submit(self, req: Request, enforce_queue_limit: bool) -> None:
        limit = self.config.max_queue_size
        with self._cv:
            if self._dead_error is not None:
                raise EngineDeadError(self._dead_error)
            if req.request_id in self._live:
                raise DuplicateRequestError(f"request id: {req.request_id!r} is already running")
            # 0 = unlimited (as TensorRT-LLM treats a non-positive max_queue_size)
            if enforce_queue_limit and limit and len(self._intake) + self.scheduler.num_waiting >= limit:
                self.metrics.counter_add(m.REQUESTS_REJECTED, 1)
                raise OverloadedError(f"waiting queue is full ({limit} requests); retry later")
            self._live[req.request_id] = req
            self._intake.append(req)
            self._cv.notify()

    # -- health and stats ------------------------------------------------------
    def is_healthy(self) -> bool:
        if self._dead_error is not None:
            return False
        return self._thread is None or self._thread.is_alive()

    def stats(self) -> EngineStats:
        kv = self.scheduler.kv
        return EngineStats(
            running=self.scheduler.num_running,
            waiting=self.scheduler.num_waiting + len(self._intake),
            blocks_used=kv.num_used_blocks,
            blocks_free=kv.num_free_blocks,
            blocks_capacity=kv.capacity,
            steps=self._steps,
            preemptions=self.scheduler.num_preemptions,
            prefix_cache_hit_tokens=self.scheduler.num_prefix_cache_hit_tokens,
            step_seconds=self._step_seconds,
            model_seconds=self._model_seconds,
            healthy=self.is_healthy(),
        )

    def num_live_requests(self) -> int:
        return len(self._live)

    # -- offline mode ----------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one iteration on the caller's thread; returns every output it
        produced (callbacks were invoked too)."""
        if self._thread is not None:
            raise RuntimeError("step(): the engine loop thread is running; use add_request callbacks")
        return self._step()[0]

    def generate(self, prompts: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[list[int]]:
        return [result.token_ids for result in self.generate_results(prompts)]

    def generate_results(self, prompts: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[GenerateResult]:
        """Run the prompts to completion (offline, no queue limit). Raises
        EngineDeadError if the engine fails on the way."""
        results: dict[str, GenerateResult] = {}
        for prompt, sampling in prompts:
            self._generate_count += 1
            rid = f"generate-{self._generate_count}"
            self._submit(self._make_request(rid, prompt, sampling, 0, None), enforce_queue_limit=False)
            results[rid] = GenerateResult(rid)
        pending = len(results)
        while pending:
            for out in self.step():
                result = results.get(out.request_id)
                if result is not None:
                    result.add(out)
                    pending -= out.finished
            if self._dead_error is not None and pending:
                raise EngineDeadError(self._dead_error)
        if self._dead_error is not None:
            raise EngineDeadError(self._dead_error)
        return list(results.values())

    # -- served mode (launch.py builds the engine on the thread that runs this) --
    def run_here(self, on_started: Callable[[], None]) -> None:
        """Run the loop on the calling thread until shutdown(), with the heap
        frozen; `on_started` once the engine is this thread's."""
        self._thread = threading.current_thread()
        self.freeze_heap()
        on_started()
        self._run_loop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("start(): already started")
        self._thread = threading.Thread(target=self._run_loop, name="llm-engine-loop", daemon=True)
        self._thread.start()

    def freeze_heap(self) -> None:
        """The process's heap so far (the model, its modules, every import:
        ~174k objects) out of the collector's sight until shutdown(): a full
        collection over it stalled the loop up to ~50 ms, once every few hundred
        requests' worth of survivors (vLLM freezes it too)."""
        gc.collect()
        gc.freeze()
        self._heap_frozen = True

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the loop; requests still live end with finish_reason error."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("engine loop did not stop within %ss", timeout)
        else:
            self._end_everything("engine shut down")
        if self._heap_frozen:  # the engine's objects may be collected again
            gc.unfreeze()
            self._heap_frozen = False

    def _run_loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (
                        self._stopping or self._intake or self._aborts or self.scheduler.has_unfinished_requests()
                    ):
                        self._cv.wait()
                    if self._stopping:
                        break
                outputs, ran_model = self._step()
                if self._dead_error is not None:
                    return
                if not ran_model and not outputs:
                    self._wait_for_work()
        finally:
            if self._dead_error is None:
                self._end_everything("engine shut down")

    def _wait_for_work(self) -> None:
        """Requests exist but none could run: sleep until news or the next
        token deadline instead of spinning."""
        wait_s = IDLE_RECHECK_S
        deadline = self.scheduler.next_deadline_mono_ns()
        if deadline is not None:
            wait_s = min(wait_s, max(0.0, (deadline - time.monotonic_ns()) / 1e9))
        with self._cv:
            if not (self._stopping or self._intake or self._aborts):
                self._cv.wait(wait_s)

    # -- one iteration (owner thread) -----------------------------------------
    def _step(self) -> tuple[list[RequestOutput], bool]:
        if self._dead_error is not None:
            return [], False
        try:
            outputs, ran_model = self._step_inner()
        except Exception as exc:
            return self._die(exc), False
        return self._dispatch(outputs), ran_model

    def _step_inner(self) -> tuple[list[RequestOutput], bool]:
        started = time.perf_counter()
        sched = self.scheduler
        new: list[Request] = []
        aborts: list[tuple[Request, FinishReason]] = []
        # unlocked peek (a deque's length is read atomically): most steps have
        # no news, and the lock is a cold-cache cost at every step
        if self._intake or self._aborts:
            with self._cv:
                new = list(self._intake)
                self._intake.clear()
                aborts = list(self._aborts)
                self._aborts.clear()
        for req in new:
            sched.add_request(req)
        outputs: list[RequestOutput] = []
        for req, reason in aborts:
            if sched.requests.get(req.request_id) is req:
                outputs.extend(sched.abort([req.request_id], reason))
        outputs.extend(sched.expire_timeouts())
        scheduled = sched.schedule()
        ran_model = not scheduled.is_empty
        if ran_model:
            result = self.runner.execute(scheduled)
            # a token that arrives after its deadline does not rescue the request
            outputs.extend(sched.expire_timeouts())
            outputs.extend(sched.update_from_output(scheduled, result))
            self._steps += 1
            self._step_seconds += time.perf_counter() - started
            self._model_seconds += result.model_seconds
            self.metrics.histogram_observe(m.BATCH_SIZE, scheduled.num_scheduled_reqs)
        if ran_model or outputs:
            metrics = self.metrics
            metrics.gauge_set(m.KV_BLOCKS_USED, sched.kv.num_used_blocks)
            metrics.gauge_set(m.REQUESTS_RUNNING, sched.num_running)
            metrics.gauge_set(m.REQUESTS_WAITING, sched.num_waiting)
        return outputs, ran_model

    def _dispatch(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Invoke callbacks; a callback that raises ends only its own request."""
        finished: list[str] = []
        failed: list[tuple[str, str]] = []
        live = self._live
        for out in outputs:
            req = live.get(out.request_id)
            if req is None:
                continue
            if out.finished:
                finished.append(out.request_id)
            callback = req.on_output
            if callback is None:
                continue
            try:
                callback(out)
            except Exception as exc:
                req.on_output = None  # never call a broken callback again
                log.warning(
                    "output callback failed request_id=%s error=%s: %s", out.request_id, type(exc).__name__, exc
                )
                if not out.finished:
                    failed.append((out.request_id, f"output callback failed: {type(exc).__name__}: {exc}"))
        for rid, error in failed:
            ended = self.scheduler.abort([rid], FinishReason.ERROR, error)
            outputs.extend(ended)
            finished.extend(o.request_id for o in ended)
        if finished:
            with self._cv:
                for rid in finished:
                    live.pop(rid, None)
        return outputs

    def _die(self, exc: BaseException) -> list[RequestOutput]:
        text = f"engine failed: {type(exc).__name__}: {exc}"
        log.error("engine step failed, engine is dead: %s", text, exc_info=exc)
        outputs = self._end_everything(text)
        if self._on_dead is not None:
            try:
                self._on_dead(exc)
            except Exception:
                log.exception("on_dead callback failed")
        return outputs

    def _end_everything(self, text: str) -> list[RequestOutput]:
        """Mark the engine dead and give every live request its final output."""
        with self._cv:
            if self._dead_error is None:
                self._dead_error = text
            new = list(self._intake)
            self._intake.clear()
            self._aborts.clear()
        outputs: list[RequestOutput] = []
        try:
            for req in new:
                self.scheduler.add_request(req)
            outputs = self.scheduler.abort_all(FinishReason.ERROR, text)
        except Exception:  # the scheduler may be what broke: answer from our own table
            log.exception("could not release requests through the scheduler")
            ended = {o.request_id for o in outputs}
            for rid, req in list(self._live.items()):
                if rid not in ended:
                    req.finish_reason, req.error = FinishReason.ERROR, text
                    outputs.append(request_output(req, [], None, True))
        return self._dispatch(outputs)
