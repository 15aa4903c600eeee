"""A/B of the engine rows against an earlier commit, interleaved in one run:
`python -m bench.ab --baseline COMMIT [--rounds 3]`.

A refactor must not cost speed, and this machine drifts by ±20% over minutes
(other tenants), so two separate runs compare nothing. Each round runs
`python -m bench --only engine` once for the baseline (a git worktree of
COMMIT, put first on the path of the same venv) and once for the working
tree, each in a fresh process, alternating which goes first; the table shows
per-version medians of output tokens/s and of the per-step overhead at full
batch, and the ratio of the working tree to the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]


def _worktree(commit: str, parent: Path) -> Path:
    path = parent / f"baseline-{commit[:12]}"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), commit], check=True, capture_output=True
    )
    return path


def _run(tree: Path, out: Path, extra: list[str]) -> dict[str, float]:
    env = dict(os.environ)
    # ahead of the venv's editable install of the working tree (a finder appended
    # to sys.meta_path, so plain path entries win)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "backends")])
    subprocess.run(
        [sys.executable, "-m", "bench", "--only", "engine", "--json", str(out), *extra], cwd=tree, env=env, check=True
    )
    data = json.loads(out.read_text())
    row = next(r for r in data["results"] if r["method"].startswith("engine"))
    overhead = row["extra"]["overhead_at_full_batch"]
    return {
        "tokens_per_s": row["tokens_per_s"],
        "overhead_ms_median": overhead["overhead_ms_median"],
        "overhead_ms_mean": overhead["overhead_ms_mean"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", required=True, help="the commit to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", dest="json_path", help="write every run's numbers here")
    parser.add_argument("bench_args", nargs="*", help="passed to `python -m bench` (after --)")
    args = parser.parse_args(argv)
    console = Console()
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        trees = {"baseline": _worktree(args.baseline, Path(tmp)), "current": REPO}
        try:
            for round_no in range(args.rounds):
                order = ["baseline", "current"] if round_no % 2 == 0 else ["current", "baseline"]
                for name in order:
                    console.print(f"[bold]round {round_no + 1}/{args.rounds}: {name}[/bold]")
                    runs[name].append(_run(trees[name], Path(tmp) / f"{name}-{round_no}.json", args.bench_args))
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(trees["baseline"])],
                check=False,
                capture_output=True,
            )
    table = Table(title=f"engine: working tree vs {args.baseline[:12]} ({args.rounds} interleaved rounds, medians)")
    for column in ("figure", "baseline", "current", "current / baseline"):
        table.add_column(column, justify="right")
    summary = {}
    for key, label in (
        ("tokens_per_s", "output tok/s"),
        ("overhead_ms_median", "overhead ms (median of steps)"),
        ("overhead_ms_mean", "overhead ms (mean of steps)"),
    ):
        base = statistics.median(r[key] for r in runs["baseline"])
        cur = statistics.median(r[key] for r in runs["current"])
        summary[key] = {"baseline": base, "current": cur, "ratio": cur / base}
        table.add_row(label, f"{base:.2f}", f"{cur:.2f}", f"{cur / base:.3f}")
    console.print(table)
    if args.json_path:
        Path(args.json_path).write_text(
            json.dumps({"baseline": args.baseline, "runs": runs, "summary": summary}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
