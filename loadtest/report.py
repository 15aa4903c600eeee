"""Summary and SLO verdict from Locust's CSV output (the `*_stats.csv` file)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

Row = dict[str, str]


@dataclass(frozen=True)
class TypeSummary:
    request_type: str
    requests: int  # finished streams (e2e entries), errors included
    errors: int
    cancelled: int
    output_tokens: int
    tokens_per_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    tpot_p50_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class SloSpec:
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    error_rate: float | None = None


@dataclass(frozen=True)
class SloCheck:
    request_type: str
    metric: str
    limit: float
    actual: float | None
    ok: bool


def read_stats(path: str | Path) -> dict[tuple[str, str], Row]:
    with open(path, newline="", encoding="utf-8") as handle:
        return {(row["Type"], row["Name"]): row for row in csv.DictReader(handle) if row["Name"] != "Aggregated"}


def run_duration_s(history_path: str | Path) -> float | None:
    """Seconds between the first and last history sample with users running."""
    try:
        with open(history_path, newline="", encoding="utf-8") as handle:
            stamps = [int(row["Timestamp"]) for row in csv.DictReader(handle) if int(row["User Count"] or 0) > 0]
    except FileNotFoundError:
        return None
    return float(max(stamps) - min(stamps)) if len(stamps) > 1 else None


def _count(row: Row | None, column: str = "Request Count") -> int:
    return int(row[column]) if row else 0


def _percentile(row: Row | None, column: str) -> float | None:
    if not row or _count(row) == 0 or row.get(column) in (None, "", "N/A"):
        return None
    return float(row[column])


def summarize(stats: dict[tuple[str, str], Row], duration_s: float | None) -> list[TypeSummary]:
    summaries = []
    for request_type in sorted({kind for kind, _ in stats}):

        def row(name: str) -> Row | None:
            return stats.get((request_type, name))  # noqa: B023

        e2e, cancelled = row("e2e"), row("cancelled")
        tokens = round(sum(_count(r) * float(r["Average Content Size"]) for r in (e2e, cancelled) if r))
        summaries.append(
            TypeSummary(
                request_type=request_type,
                requests=_count(e2e),
                errors=_count(e2e, "Failure Count"),
                cancelled=_count(cancelled),
                output_tokens=tokens,
                tokens_per_s=tokens / duration_s if duration_s else None,
                ttft_p50_ms=_percentile(row("ttft"), "50%"),
                ttft_p99_ms=_percentile(row("ttft"), "99%"),
                itl_p50_ms=_percentile(row("itl"), "50%"),
                itl_p99_ms=_percentile(row("itl"), "99%"),
                tpot_p50_ms=_percentile(row("tpot"), "50%"),
                e2e_p50_ms=_percentile(e2e, "50%"),
                e2e_p99_ms=_percentile(e2e, "99%"),
            )
        )
    return summaries


def evaluate_slos(summaries: list[TypeSummary], spec: SloSpec) -> list[SloCheck]:
    """One check per request type and given SLO; a metric with no samples fails
    its SLO (a run that produced no tokens has not met a latency target)."""
    checks = []
    for summary in summaries:
        for metric, limit, actual in (
            ("ttft_p99_ms", spec.ttft_p99_ms, summary.ttft_p99_ms),
            ("itl_p99_ms", spec.itl_p99_ms, summary.itl_p99_ms),
            ("error_rate", spec.error_rate, summary.error_rate),
        ):
            if limit is None:
                continue
            checks.append(SloCheck(summary.request_type, metric, limit, actual, actual is not None and actual <= limit))
    return checks


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(summaries: list[TypeSummary], checks: list[SloCheck], console: Console | None = None) -> None:
    # A wide fixed width keeps the table readable in CI logs (no terminal).
    console = console or Console(width=None if Console().is_terminal else 160)
    table = Table(title="LLM load test summary (client side; ms)")
    for column in (
        "type",
        "streams",
        "errors",
        "err %",
        "cancelled",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "TPOT p50",
        "e2e p50",
        "e2e p99",
        "out tok/s",
    ):
        table.add_column(column, justify="right")
    for s in summaries:
        table.add_row(
            s.request_type,
            str(s.requests),
            str(s.errors),
            f"{100 * s.error_rate:.1f}",
            str(s.cancelled),
            _fmt(s.ttft_p50_ms),
            _fmt(s.ttft_p99_ms),
            _fmt(s.itl_p50_ms),
            _fmt(s.itl_p99_ms),
            _fmt(s.tpot_p50_ms),
            _fmt(s.e2e_p50_ms),
            _fmt(s.e2e_p99_ms),
            _fmt(s.tokens_per_s, 1),
        )
    console.print(table)
    for check in checks:
        verdict = "[green]met[/green]" if check.ok else "[red]MISSED[/red]"
        console.print(f"SLO {check.request_type} {check.metric} <= {check.limit:g}: {_fmt(check.actual, 3)} {verdict}")
