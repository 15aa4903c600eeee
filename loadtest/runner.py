"""`python -m loadtest run`: Locust headless, then CSV + HTML + PNG + a summary
table, and an exit status that says whether the SLOs were met."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .plots import write_plots
from .report import SloSpec, evaluate_slos, read_stats, render, run_duration_s, summarize
from .settings import LoadSettings

log = logging.getLogger(__name__)
LOCUSTFILE = Path(__file__).with_name("locustfile.py")
CSV_PREFIX = "locust"
# Exit statuses of `run`.
EXIT_OK, EXIT_SLO_MISSED, EXIT_LOCUST_FAILED = 0, 1, 2


def locust_command(out_dir: Path, user_classes: list[str], stop_timeout_s: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--only-summary",
        "--csv",
        str(out_dir / CSV_PREFIX),
        "--csv-full-history",
        "--html",
        str(out_dir / "report.html"),
        "--stop-timeout",
        f"{stop_timeout_s:g}",
        "--loglevel",
        "WARNING",
        *user_classes,
    ]


def run(
    settings: LoadSettings, user_classes: list[str], out_dir: str | Path, slos: SloSpec, stop_timeout_s: float = 30.0
) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    samples = out / "samples.jsonl"
    samples.unlink(missing_ok=True)
    settings = LoadSettings(**{**asdict(settings), "samples_path": str(samples)})
    env = {**os.environ, **settings.to_env()}
    # The project root must be importable from the Locust process.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LOCUSTFILE.parent.parent), env.get("PYTHONPATH")]))
    started = time.monotonic()
    completed = subprocess.run(locust_command(out, user_classes, stop_timeout_s), env=env, check=False)
    wall_s = time.monotonic() - started
    (out / "run.json").write_text(
        json.dumps(
            {
                "settings": asdict(settings),
                "user_classes": user_classes,
                "wall_s": wall_s,
                "locust_exit_code": completed.returncode,
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    return report(out, slos, locust_exit_code=completed.returncode)


def report(out_dir: str | Path, slos: SloSpec, locust_exit_code: int = 0) -> int:
    """Summarize an output folder (also usable on its own for an earlier run)."""
    out = Path(out_dir)
    stats_path = out / f"{CSV_PREFIX}_stats.csv"
    # Locust exits 1 when any request failed; errors are judged by the SLOs instead.
    if locust_exit_code not in (0, 1) or not stats_path.is_file():
        print(f"locust failed (exit code {locust_exit_code}); no statistics in {out}", file=sys.stderr)
        return EXIT_LOCUST_FAILED
    duration = run_duration_s(out / f"{CSV_PREFIX}_stats_history.csv")
    summaries = summarize(read_stats(stats_path), duration)
    checks = evaluate_slos(summaries, slos)
    render(summaries, checks)
    for path in write_plots(out):
        print(f"wrote {path}")
    (out / "summary.json").write_text(
        json.dumps(
            {
                "duration_s": duration,
                "types": [{**asdict(s), "error_rate": s.error_rate} for s in summaries],
                "slo_checks": [asdict(c) for c in checks],
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    return EXIT_OK if all(c.ok for c in checks) else EXIT_SLO_MISSED
