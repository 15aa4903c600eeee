"""The fairness bench's report (`bench/fairness.py`): its table, its
curve, and the merge of several runs into one sweep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ITL_P99_LIMIT = 3.0  # x the ITL p50 before the long prompt
TTFT_LIMIT = 2.0  # x the TTFT alone
PACING_FIELD = "prefill_time_ratio"  # absent from engines before the pacer


def _control(row: dict[str, Any]) -> str:
    """The control's ITL p99 / p50 before; '-' in results written before it."""
    ratio = row.get("itl_p99_control_over_p50_before")
    return "-" if ratio is None else f"{ratio:.1f}x"


def _margin(row: dict[str, Any]) -> str:
    """The pacer's margin over the long prompt's steps, p50 / max; '-'
    without a pacer or in results written before it was recorded."""
    if row.get("margin_p50") is None:
        return "-"
    return f"{row['margin_p50']:.2f} / {row['margin_max']:.2f}"


def _pacer_decode(row: dict[str, Any]) -> str:
    """The pacer's decode-only step as the long prompt arrived (its aim's
    base) over the streams' ITL p50 before (the bound's); '-' without a
    pacer or in results written before it was recorded."""
    ratio = row.get("pacer_decode_over_p50_before")
    return "-" if ratio is None else f"{ratio:.2f}x"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| point | ITL p50 before | ITL p50 / p99 / max during | p99 / p50 before | control: p99 / p50 before "
        "| TTFT | TTFT alone | TTFT / alone (/ best alone) | steps | margin p50 / max "
        "| pacer's decode / p50 before | load / cores |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        mark_itl = "" if r["meets_itl"] else " ✗"
        mark_ttft = "" if r["meets_ttft"] and r["meets_ttft_best"] else " ✗"
        lines.append(
            f"| {r['label']} | {r['itl_p50_before_ms']:.0f} ms | {r['itl_p50_during_ms']:.0f} / "
            f"{r['itl_p99_during_ms']:.0f} / {r['itl_max_during_ms']:.0f} ms | {r['itl_p99_over_p50_before']:.1f}x"
            f"{mark_itl} | {_control(r)} | {r['ttft_s']:.1f} s | {r['ttft_alone_s']:.1f} s | "
            f"{r['ttft_over_alone']:.2f}x "
            f"({r['ttft_over_best_alone']:.2f}x){mark_ttft} | {r['steps_during']} | {_margin(r)} | "
            f"{_pacer_decode(r)} | {r['load_before']:.1f} / "
            f"{r['cores_used']:.2f} |"
        )
    return "\n".join(lines)


def _num(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def terms_table(rows: list[dict[str, Any]]) -> str:
    """The terms of each point's TTFT / alone = c x s / (s - d)
    (`fairness_terms.py`): s the long prompt's mean step, d the streams'
    part of a step (the mean of its start and end: it grows linearly), c
    the slices' cost against the same tokens alone; and that product
    against the ratio measured. '-' where a point has no paced or sliced
    steps, or for results written before the terms were recorded."""
    head = (
        "| point | ITL p50 before | mean step s | s / aim | streams' part d, start → end | c "
        "| c x s / (s - d) | TTFT / alone |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s_ms = 1e3 * r["ttft_s"] / r["steps_during"] if r.get("steps_during") else None
        start, end, c = r.get("streams_part_start_ms"), r.get("streams_part_end_ms"), r.get("slice_cost")
        d_ms = None if start is None or end is None else (start + end) / 2
        model = None
        if s_ms is not None and d_ms is not None and c is not None and s_ms > d_ms:
            model = c * s_ms / (s_ms - d_ms)
        part = "-" if d_ms is None else f"{start:.0f} → {end:.0f} ms"
        step = "-" if s_ms is None else f"{s_ms:.1f} ms"
        lines.append(
            f"| {r['label']} | {r['itl_p50_before_ms']:.0f} ms | {step} | "
            f"{_num(r.get('fill'), '.2f')} | {part} | {_num(c, '.2f')} | {_num(model, '.2f')} | "
            f"{r['ttft_over_alone']:.2f}x |"
        )
    return "\n".join(lines)


def plot(series: list[tuple[str, list[dict[str, Any]]]], path: Path, title: str) -> None:
    """Two panels against the token budget (max_num_batched_tokens): the
    streams' ITL p99 during the long prefill over their ITL p50 before, and
    the long prompt's TTFT over the fastest TTFT alone of its series (fixed
    budgets are lines, paced points are stars at their budget); a third
    draws every point by both ratios, the targets' box in its lower left."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right, trade) = plt.subplots(1, 3, figsize=(15, 4.4))
    for name, rows in series:
        fixed = sorted(
            (r for r in rows if not r["config"].get(PACING_FIELD)), key=lambda r: r["config"]["max_num_batched_tokens"]
        )
        paced = [r for r in rows if r["config"].get(PACING_FIELD)]
        for ax, key in ((left, "itl_p99_over_p50_before"), (right, "ttft_over_best_alone")):
            (line,) = ax.plot(
                [r["config"]["max_num_batched_tokens"] for r in fixed],
                [r[key] for r in fixed],
                marker="o",
                label=f"{name}: fixed budget",
            )
            for r in paced:
                ax.scatter(
                    [r["config"]["max_num_batched_tokens"]],
                    [r[key]],
                    marker="*",
                    s=140,
                    zorder=3,
                    color=line.get_color(),
                    edgecolors="black",
                    label=f"{name}: paced x{r['config'][PACING_FIELD]:g}",
                )
        # the trade-off itself: every point of the series, both targets at once
        trade.scatter(
            [r["itl_p99_over_p50_before"] for r in rows], [r["ttft_over_alone"] for r in rows], label=name, s=30
        )
        for r in rows:
            trade.annotate(
                r["label"].replace("fixed ", "").replace("paced 512 ", "paced "),
                (r["itl_p99_over_p50_before"], r["ttft_over_alone"]),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
            )
    left.axhline(ITL_P99_LIMIT, color="grey", ls="--", lw=0.8)
    right.axhline(TTFT_LIMIT, color="grey", ls="--", lw=0.8)
    trade.axvline(ITL_P99_LIMIT, color="grey", ls="--", lw=0.8)
    trade.axhline(TTFT_LIMIT, color="grey", ls="--", lw=0.8)
    trade.set_xscale("log")
    trade.set_xlabel("streams' ITL p99 during / ITL p50 before")
    trade.set_ylabel("long prompt's TTFT / its TTFT alone")
    trade.set_title("both targets: the lower left box", fontsize=8)
    trade.legend(fontsize=7)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_num_batched_tokens")
    left.set_yscale("log")
    left.set_ylabel("streams' ITL p99 during / ITL p50 before")
    right.set_ylabel("long prompt's TTFT / fastest TTFT alone")
    right.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def merge(paths: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Points of several result files (runs of single points, say) as one
    sweep: TTFT ratios against the fastest alone among them. Returns the
    first file's header and the points."""
    files = [json.loads(Path(p).read_text()) for p in paths]
    rows = [dict(r) for f in files for r in f["points"]]
    best = min(r["ttft_alone_s"] for r in rows)
    for r in rows:
        r["ttft_over_best_alone"] = r["ttft_s"] / best
        r["meets_ttft_best"] = r["ttft_over_best_alone"] <= TTFT_LIMIT
    return files[0], rows
