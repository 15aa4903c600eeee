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


def _over_time(samples: list[dict[str, Any]], history_csv: Path, out: Path) -> Path:
    figure, (tokens_axis, users_axis) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    start = None
    users: list[tuple[int, int]] = []
    if history_csv.is_file():
        with open(history_csv, newline="", encoding="utf-8") as handle:
            users = [(int(r["Timestamp"]), int(r["User Count"] or 0)) for r in csv.DictReader(handle)
                     if r["Name"] == "Aggregated"]
        start = users[0][0] if users else None
    ends = [s["end_unix_s"] for s in samples]
    start = start if start is not None else (min(ends) if ends else 0)
    per_second: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for sample in samples:
        per_second[int(sample["end_unix_s"] - start)][sample["type"]] += sample["output_tokens"]
    for kind in sorted({s["type"] for s in samples}):
        seconds = sorted(per_second)
        tokens_axis.plot(seconds, [per_second[t][kind] for t in seconds], label=kind)
    tokens_axis.set_ylabel("output tokens/s (completed)")
    if samples:
        tokens_axis.legend()
    users_axis.step([t - start for t, _ in users], [n for _, n in users], where="post")
    users_axis.set_ylabel("users")
    users_axis.set_xlabel("seconds since start")
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
    return out


def write_plots(out_dir: str | Path, samples_name: str = "samples.jsonl",
                history_name: str = "locust_stats_history.csv") -> list[Path]:
    out_dir = Path(out_dir)
    samples = read_samples(out_dir / samples_name)
    return [
        _distribution(samples, "ttft_ms", "Time to first token", out_dir / "ttft.png"),
        _distribution(samples, "itl_ms", "Inter-token latency", out_dir / "itl.png"),
        _over_time(samples, out_dir / history_name, out_dir / "throughput_users.png"),
    ]
