"""Load-test reporting: summary and SLO verdict from a canned Locust CSV, plots,
and the Locust entries fired for one stream."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from loadtest.plots import streamed_token_rate, token_times_unix_s
from loadtest.report import SloSpec, evaluate_slos, read_stats, run_duration_s, summarize
from loadtest.reporting import SampleLog, StreamError, report_outcome
from loadtest.runner import EXIT_LOCUST_FAILED, EXIT_OK, EXIT_SLO_MISSED, report
from loadtest.streams import StreamOutcome
from loadtest.tokens import TokenCounter

DATA = Path(__file__).parent / "data"


def canned_summaries():
    stats = read_stats(DATA / "canned_stats.csv")
    duration = run_duration_s(DATA / "canned_stats_history.csv")
    return {s.request_type: s for s in summarize(stats, duration)}, duration


def test_summary_from_canned_locust_csv():
    by_type, duration = canned_summaries()
    assert duration == 1.0
    sse, grpc = by_type["SSE"], by_type["gRPC"]
    assert (sse.requests, sse.errors, sse.cancelled) == (84, 0, 12)
    assert (grpc.requests, grpc.errors, grpc.cancelled) == (90, 19, 6)
    assert grpc.error_rate == pytest.approx(19 / 90)
    assert sse.ttft_p50_ms == 100 and sse.ttft_p99_ms == 120 and sse.itl_p99_ms == 40
    assert grpc.ttft_p99_ms == 400 and grpc.itl_p99_ms == 89 and grpc.tpot_p50_ms == 30
    assert sse.output_tokens == 84 * 8 + 12 * 3  # e2e and cancelled streams both produced tokens
    assert sse.tokens_per_s == pytest.approx(sse.output_tokens / duration)


def test_slo_checks_per_request_type():
    by_type, _ = canned_summaries()
    checks = evaluate_slos(list(by_type.values()), SloSpec(ttft_p99_ms=150, itl_p99_ms=100, error_rate=0.05))
    verdict = {(c.request_type, c.metric): c.ok for c in checks}
    assert verdict == {
        ("SSE", "ttft_p99_ms"): True,
        ("SSE", "itl_p99_ms"): True,
        ("SSE", "error_rate"): True,
        ("gRPC", "ttft_p99_ms"): False,
        ("gRPC", "itl_p99_ms"): True,
        ("gRPC", "error_rate"): False,
    }
    assert evaluate_slos(list(by_type.values()), SloSpec()) == []


def test_a_metric_without_samples_misses_its_slo():
    stats = read_stats(DATA / "canned_stats.csv")
    no_ttft = {key: row for key, row in stats.items() if key[1] != "ttft"}
    checks = evaluate_slos(summarize(no_ttft, 1.0), SloSpec(ttft_p99_ms=10_000))
    assert checks and not any(c.ok for c in checks)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    shutil.copy(DATA / "canned_stats.csv", tmp_path / "locust_stats.csv")
    shutil.copy(DATA / "canned_stats_history.csv", tmp_path / "locust_stats_history.csv")
    log = SampleLog(tmp_path / "samples.jsonl")
    log.write(
        {
            "type": "SSE",
            "end_unix_s": 1795953501.5,
            "ttft_ms": 100.0,
            "itl_ms": [30.0, 31.0],
            "e2e_ms": 170.0,
            "output_tokens": 3,
        }
    )
    log.close()
    return tmp_path


def test_report_exit_status_follows_the_slos_and_writes_plots(run_dir: Path, capsys):
    assert report(run_dir, SloSpec(ttft_p99_ms=500, error_rate=0.5)) == EXIT_OK
    assert report(run_dir, SloSpec(error_rate=0.01)) == EXIT_SLO_MISSED
    assert "MISSED" in capsys.readouterr().out
    for name in ("ttft.png", "itl.png", "throughput_users.png", "summary.json"):
        assert (run_dir / name).stat().st_size > 0
    assert (run_dir / "ttft.png").read_bytes()[:4] == b"\x89PNG"


def test_throughput_counts_tokens_when_they_streamed_not_when_streams_ended():
    # Stream sent at t=10.0: first token at 10.5, then one every 1.0 s, ends at 13.6.
    sample = {
        "type": "SSE",
        "end_unix_s": 13.6,
        "e2e_ms": 3600.0,
        "ttft_ms": 500.0,
        "itl_ms": [1000.0, 1000.0, 1000.0],
        "output_tokens": 4,
    }
    assert token_times_unix_s(sample) == pytest.approx([10.5, 11.5, 12.5, 13.5])
    rates = streamed_token_rate([sample, {**sample, "type": "gRPC", "output_tokens": 8}], start_unix_s=10.0, bin_s=2.0)
    assert dict(rates["SSE"]) == pytest.approx({0: 1.0, 1: 1.0})  # two tokens in each 2 s bin
    assert dict(rates["gRPC"]) == pytest.approx({0: 2.0, 1: 2.0})  # two tokens per response
    assert token_times_unix_s({**sample, "ttft_ms": None}) == []


def test_report_without_statistics_is_a_locust_failure(tmp_path: Path):
    assert report(tmp_path, SloSpec()) == EXIT_LOCUST_FAILED


class FakeRequestEvent:
    def __init__(self) -> None:
        self.fired: list[dict] = []

    def fire(self, **kwargs) -> None:
        self.fired.append(kwargs)


class FakeEvents:
    def __init__(self) -> None:
        self.request = FakeRequestEvent()


@pytest.fixture
def counter() -> TokenCounter:
    vocab = {"[UNK]": 0, "a": 1, "b": 2, "c": 3, "d": 4}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    return TokenCounter(tokenizer)


def outcome(**kwargs) -> StreamOutcome:
    base = dict(
        request_type="SSE",
        request_id="r",
        sent_s=0.0,
        token_times_s=[0.1, 0.15, 0.3, 0.4],
        text="a b c d",
        end_s=0.5,
        finish_reason="stop",
    )
    return StreamOutcome(**{**base, **kwargs})


def test_completed_stream_fires_ttft_itl_tpot_e2e(counter, tmp_path):
    events = FakeEvents()
    record = report_outcome(events, outcome(), counter, SampleLog(tmp_path / "s.jsonl"))
    fired = [
        (f["name"], round(f["response_time"], 3), f["response_length"], f["exception"]) for f in events.request.fired
    ]
    assert fired == [
        ("ttft", 100.0, 0, None),
        ("itl", 50.0, 0, None),
        ("itl", 150.0, 0, None),
        ("itl", 100.0, 0, None),
        ("tpot", round((0.5 - 0.1) / 3 * 1000, 3), 0, None),
        ("e2e", 500.0, 4, None),
    ]
    assert all(f["request_type"] == "SSE" for f in events.request.fired)
    assert record["output_tokens"] == 4 and len(record["itl_ms"]) == 3
    assert (tmp_path / "s.jsonl").read_text().count("\n") == 1


def test_errors_and_cancellations_are_separate_entries(counter):
    events = FakeEvents()
    report_outcome(events, outcome(error="overloaded: full", token_times_s=[], text=""), counter, SampleLog(None))
    report_outcome(events, outcome(cancelled=True, finish_reason=None), counter, SampleLog(None))
    names = [f["name"] for f in events.request.fired]
    assert names.count("e2e") == 1 and names.count("cancelled") == 1 and "tpot" not in names
    failed = next(f for f in events.request.fired if f["name"] == "e2e")
    assert isinstance(failed["exception"], StreamError) and "overloaded:" in str(failed["exception"])
