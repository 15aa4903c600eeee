"""The causes of "timeouts at peak while the accelerator idles", each judged
from the intervals of a trace, with a score in [0, 1] and its evidence:

- not_batched: requests wait while every engine step runs about one sequence;
- long_prefill: inter-token latency spikes that coincide with long prompts
  being admitted (their prefill holds up every running decode);
- kv_pressure: preemptions, or KV use near full while requests wait;
- queue_growth: the waiting queue grows while the KV cache has room and each
  step does little work (admission limits, or too few replicas).

A cause is named when its score reaches REPORT_SCORE; the highest first."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .intervals import Interval

REPORT_SCORE = 0.3
SPIKE_FACTOR = 3.0  # an interval's ITL p99 this many times the window's typical p50
SPIKE_MIN_S = 0.05
BURST_FACTOR = 4.0  # prompt tokens admitted this many times the typical interval's
BURST_MIN_TOKENS = 256
KV_FULL = 0.9


@dataclass(frozen=True)
class Finding:
    cause: str
    title: str
    score: float
    evidence: list[str] = field(default_factory=list)
    advice: str = ""


def _clamp(value: float) -> float:
    return max(0.0, min(1.0, value))


def not_batched(spans: list[Interval]) -> Finding:
    queued = [s for s in spans if s.waiting >= 1 and s.mean_batch is not None]
    if not queued:
        return Finding("not_batched", "requests are not batched", 0.0)
    # `or 0.0` only for the type checker: `queued` holds intervals with a mean batch
    batch = sum((s.mean_batch or 0.0) * s.steps for s in queued) / sum(s.steps for s in queued)
    share = len(queued) / len(spans)
    waiting = statistics.fmean(s.waiting for s in queued)
    return Finding(
        "not_batched",
        "requests are not batched (about one sequence per engine step)",
        _clamp(share * (2.0 - batch) / 1.0) if share >= 0.3 else 0.0,
        [
            f"in {len(queued)} of {len(spans)} intervals requests waited ({waiting:.1f} on average) while each "
            f"engine step ran {batch:.2f} sequences on average"
        ],
        "raise engine.max_num_seqs (sequences per step) and check the step's token budget "
        "(engine.max_num_batched_tokens); a batch of one uses a fraction of the accelerator",
    )


def _episodes(spans: list[Interval], spiky: list[bool]) -> list[tuple[int, int]]:
    """[first, last] index runs of consecutive spiky intervals."""
    runs: list[tuple[int, int]] = []
    for i, flag in enumerate(spiky):
        if flag and runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        elif flag:
            runs.append((i, i))
    return runs


def long_prefill(spans: list[Interval]) -> Finding:
    """Episodes of slow decoding: intervals whose ITL p99 spikes, or in which
    no step finished at all while requests ran (a step longer than the
    interval), each matched against prompt tokens admitted just before or
    during it. (The engine counts a prompt's tokens when it admits them.)"""
    timed = [s for s in spans if s.itl_count > 0 and s.itl_p50_s is not None]
    nothing = Finding("long_prefill", "long prefills block decodes", 0.0)
    if len(timed) < 3:
        return nothing
    typical = statistics.median(s.itl_p50_s or 0.0 for s in timed)  # every one timed: `or` for the type checker
    threshold = max(SPIKE_FACTOR * typical, typical + SPIKE_MIN_S)
    spiky = [
        (s.itl_p99_s is not None and s.itl_p99_s >= threshold)
        or (s.running >= 1 and s.steps == 0 and s.seconds >= threshold)
        for s in spans
    ]
    episodes = _episodes(spans, spiky)
    if not episodes:
        return nothing
    burst_floor = max(BURST_FACTOR * statistics.median(s.prompt_tokens for s in spans), BURST_MIN_TOKENS)
    matched = []
    for first, last in episodes:
        admitted = max(s.prompt_tokens for s in spans[max(0, first - 1) : last + 1])
        if admitted >= burst_floor:
            matched.append((first, last, admitted))
    slow_s = sum(spans[last].end - spans[first].start for first, last, _ in matched)
    score = _clamp(len(matched) / len(episodes) * min(1.0, slow_s / 3.0))
    worst = max((s.itl_p99_s or s.seconds) for s, flag in zip(spans, spiky) if flag)
    return Finding(
        "long_prefill",
        "long prefills block running decodes (inter-token latency spikes at long prompts)",
        score,
        [
            f"{len(episodes)} episodes of slow decoding (ITL p99 >= {threshold:.2f} s, or no engine step finished "
            f"while requests ran), the worst gap {worst:.1f} s; the typical ITL p50 is {typical * 1000:.0f} ms",
            f"{len(matched)} of them coincided with long prompts admitted ({burst_floor:,.0f}+ prompt tokens, "
            f"largest {max((a for *_, a in matched), default=0):,.0f}), {slow_s:.0f} s of slow decoding in all",
        ],
        "chunk long prompts (engine.enable_chunked_context) with a smaller per-step budget "
        "(engine.max_num_batched_tokens) so each step mixes a slice of prefill with the decodes",
    )


def kv_pressure(spans: list[Interval]) -> Finding:
    preemptions = sum(s.preemptions for s in spans)
    full = [s for s in spans if s.kv_use >= KV_FULL and s.waiting >= 1]
    peak = max(s.kv_use for s in spans)
    score = _clamp(max(min(1.0, preemptions / 5), len(full) / len(spans) * 2))
    return Finding(
        "kv_pressure",
        "KV cache pressure leaves no room to admit work",
        score,
        [
            f"{preemptions:.0f} preemptions (requests evicted and recomputed) in the window",
            f"KV use >= {KV_FULL:.0%} with requests waiting in {len(full)} of {len(spans)} intervals (peak {peak:.0%})",
        ],
        "give the KV cache more room (engine.max_tokens_in_paged_kv_cache on CPU, "
        "kv_cache_free_gpu_mem_fraction on GPU), cap max_tokens, or run fewer sequences per replica",
    )


def queue_growth(spans: list[Interval]) -> Finding:
    third = max(1, len(spans) // 3)
    early = statistics.fmean(s.waiting for s in spans[:third])
    late = statistics.fmean(s.waiting for s in spans[-third:])
    stepping = [s for s in spans if s.steps > 0]
    per_step = (sum(s.generated_tokens for s in stepping) / sum(s.steps for s in stepping)) if stepping else 0.0
    kv_room = statistics.fmean(s.kv_use for s in spans) < 0.7
    growth = late - early
    score = _clamp(growth / 8) if growth >= 2 and kv_room else 0.0
    return Finding(
        "queue_growth",
        "the waiting queue grows while each step does little work",
        score,
        [
            f"requests waiting grew from {early:.1f} to {late:.1f} over the window",
            f"{per_step:.1f} tokens generated per engine step, KV use {statistics.fmean(s.kv_use for s in spans):.0%} "
            f"on average",
        ],
        "the admission limits bind before the KV cache does (engine.max_num_seqs), or the load is past this "
        "replica's capacity: add replicas (python -m serving plan)",
    )


CHECKS = (not_batched, long_prefill, kv_pressure, queue_growth)


def diagnose(spans: list[Interval]) -> list[Finding]:
    """Every cause, the likeliest first."""
    if not spans:
        raise ValueError("a trace of at least two scrapes is needed")
    return sorted((check(spans) for check in CHECKS), key=lambda f: f.score, reverse=True)


def idle(spans: list[Interval]) -> bool:
    return all(s.waiting < 0.5 and s.running < 0.5 and s.generated_tokens == 0 for s in spans)
