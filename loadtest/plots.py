"""PNG plots of a run: TTFT and ITL distributions, throughput and users over time."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on load-test machines
import matplotlib.pyplot as plt  # noqa: E402


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _distribution(samples: list[dict[str, Any]], key: str, title: str, out: Path) -> Path:
    figure, axis = plt.subplots(figsize=(7, 4))
    by_type: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        value = sample.get(key)
        if isinstance(value, list):
            by_type[sample["type"]].extend(value)
        elif value is not None:
            by_type[sample["type"]].append(value)
    for kind, values in sorted(by_type.items()):
        axis.hist(values, bins=50, alpha=0.6, label=f"{kind} (n={len(values)})")
    axis.set_xlabel("ms")
    axis.set_ylabel("count")
    axis.set_title(title)
    if by_type:
        axis.legend()
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
    return out


def token_times_unix_s(sample: dict[str, Any]) -> list[float]:
    """Wall-clock arrival of each token-bearing response of one stream.

    Rebuilt from the sample (end time, e2e, TTFT and the ITL gaps), so the
    throughput plot shows tokens when they streamed, not when streams ended.
    """
    if sample.get("ttft_ms") is None or sample.get("e2e_ms") is None:
        return []
    first = sample["end_unix_s"] - sample["e2e_ms"] / 1000.0 + sample["ttft_ms"] / 1000.0
    times = [first]
    for gap_ms in sample.get("itl_ms") or []:
        times.append(times[-1] + gap_ms / 1000.0)
    return times


def streamed_token_rate(
    samples: list[dict[str, Any]], start_unix_s: float, bin_s: float = 2.0
) -> dict[str, dict[int, float]]:
    """Output tokens per second in `bin_s` windows, per request type: {type: {bin index: tokens/s}}."""
    rates: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for sample in samples:
        times = token_times_unix_s(sample)
        if not times:
            continue
        # Responses usually carry one token; spread re-tokenized counts evenly over them.
        per_response = sample["output_tokens"] / len(times)
        for at in times:
            rates[sample["type"]][int((at - start_unix_s) // bin_s)] += per_response / bin_s
    return rates


def _over_time(samples: list[dict[str, Any]], history_csv: Path, out: Path, bin_s: float = 2.0) -> Path:
    figure, (tokens_axis, users_axis) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    start = None
    users: list[tuple[int, int]] = []
    if history_csv.is_file():
        with open(history_csv, newline="", encoding="utf-8") as handle:
            users = [
                (int(r["Timestamp"]), int(r["User Count"] or 0))
                for r in csv.DictReader(handle)
                if r["Name"] == "Aggregated"
            ]
        start = users[0][0] if users else None
    ends = [s["end_unix_s"] for s in samples]
    start = start if start is not None else (min(ends) if ends else 0)
    rates = streamed_token_rate(samples, start, bin_s)
    last_bin = max((b for by_bin in rates.values() for b in by_bin), default=0)
    bins = list(range(0, last_bin + 1))
    for kind, by_bin in sorted(rates.items()):
        tokens_axis.step([b * bin_s for b in bins], [by_bin.get(b, 0.0) for b in bins], where="post", label=kind)
    if len(rates) > 1:
        total = [sum(by_bin.get(b, 0.0) for by_bin in rates.values()) for b in bins]
        tokens_axis.step([b * bin_s for b in bins], total, where="post", label="all", color="black", linewidth=1)
    tokens_axis.set_ylabel(f"output tokens/s ({bin_s:g} s bins)")
    if rates:
        tokens_axis.legend()
    users_axis.step([t - start for t, _ in users], [n for _, n in users], where="post")
    users_axis.set_ylabel("users")
    users_axis.set_xlabel("seconds since start")
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
    return out


def write_plots(
    out_dir: str | Path, samples_name: str = "samples.jsonl", history_name: str = "locust_stats_history.csv"
) -> list[Path]:
    out_dir = Path(out_dir)
    samples = read_samples(out_dir / samples_name)
    return [
        _distribution(samples, "ttft_ms", "Time to first token", out_dir / "ttft.png"),
        _distribution(samples, "itl_ms", "Inter-token latency", out_dir / "itl.png"),
        _over_time(samples, out_dir / history_name, out_dir / "throughput_users.png"),
    ]
