"""When a request ends and what it reports: the stop rules applied after
each sampled token, the per-step `RequestOutput` delta, and the metrics a
finish records. Pure functions of a Request, kept out of the scheduler,
which decides when to call them."""

from __future__ import annotations

import logging
import time

from contract import metric_names as m

from .metrics import MetricsSink
from .outputs import RequestOutput
from .request import FinishReason, Request

log = logging.getLogger(__name__)


def check_stop(req: Request, token_id: int, max_model_len: int) -> tuple[FinishReason | None, bool]:
    """(finish reason or None, whether `token_id` is returned to the client),
    after `token_id` was appended to the request's output."""
    sp = req.sampling
    n = len(req.output_token_ids)
    # the EOS itself is not returned, so `n > min_tokens` leaves min_tokens returned
    if not sp.ignore_eos and token_id in req.stop_token_ids and n > sp.min_tokens:
        return FinishReason.STOP, False
    if sp.stop_words_ids and n >= sp.min_tokens:
        out = req.output_token_ids
        for word in sp.stop_words_ids:
            if word and word[-1] == token_id and len(word) <= n and out[n - len(word) :] == word:
                return FinishReason.STOP, True
    if n >= req.max_tokens or req.num_tokens >= max_model_len:
        return FinishReason.LENGTH, True
    return None, True


def request_output(req: Request, new_ids: list[int], new_lps: list[float] | None, finished: bool) -> RequestOutput:
    # positional: built for every running sequence at every step
    reason = req.finish_reason
    return RequestOutput(
        req.request_id,
        new_ids,
        new_lps,
        finished,
        reason.value if finished and reason is not None else None,
        req.error if finished else None,
        len(req.prompt_token_ids),
        req.num_returned_tokens,
        req.num_cached_tokens,
        req.cum_log_prob,
        req.arrival_time_ns,
        req.first_token_time_ns,
        req.last_token_time_ns,
    )


def record_finish(metrics: MetricsSink, req: Request, reason: FinishReason) -> None:
    if reason is FinishReason.CANCELLED:
        metrics.counter_add(m.REQUESTS_CANCELLED, 1)
    elif reason is FinishReason.TIMEOUT:
        metrics.counter_add(m.REQUESTS_TIMED_OUT, 1)
    end = req.last_token_time_ns if reason in (FinishReason.STOP, FinishReason.LENGTH) else time.time_ns()
    metrics.histogram_observe(m.E2E_REQUEST_LATENCY, ((end or 0) - req.arrival_time_ns) / 1e9)
    n = req.num_new_output_tokens  # the time measured covers this request's own tokens only
    if req.first_token_time_ns is not None and n > 1 and req.last_token_time_ns is not None:
        metrics.histogram_observe(
            m.TIME_PER_OUTPUT_TOKEN, (req.last_token_time_ns - req.first_token_time_ns) / 1e9 / (n - 1)
        )
    log.debug(
        "request finished request_id=%s reason=%s prompt_tokens=%d output_tokens=%d cached_tokens=%d",
        req.request_id,
        reason.value,
        req.num_prompt_tokens,
        n,
        req.num_cached_tokens,
    )
