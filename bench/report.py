"""The benchmark's output: the console table, a Markdown table for
docs/benchmarks.md, the issue's targets, and the JSON record."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .result import MethodResult

# the engine's speed targets (docs/benchmarks.md)
ENGINE_OVER_HF_BATCH = 2.0  # engine offline fp32 >= 2x best static-batch HF
ENSEMBLE_OVER_OFFLINE = 0.85  # through the ensemble, 64 gRPC streams, >= 0.85x offline (issue 18)
MAX_OVERHEAD_MS = 1.0  # per step at 64 sequences
ENGINE_OVER_VLLM = 1.2  # engine offline >= 1.2x vLLM's CPU build, same harness, same run
COLUMNS = ("method", "dtype", "tokens/s", "vs best static HF", "load before / cores used", "note")


@dataclass
class MachineInfo:
    nproc: int
    cpu_model: str
    load_average: tuple[float, float, float]
    torch_threads: int
    python: str
    date: str
    accelerator: str = ""  # the GPU the rows ran on, where --device named one

    @classmethod
    def collect(cls, torch_threads: int, device: str = "cpu") -> MachineInfo:
        model = "unknown"
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        accelerator = ""
        if device != "cpu":
            import torch

            accelerator = f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
        return cls(
            nproc=len(os.sched_getaffinity(0)),
            cpu_model=model,
            load_average=os.getloadavg(),
            torch_threads=torch_threads,
            python=platform.python_version(),
            date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            accelerator=accelerator,
        )

    def line(self) -> str:
        load = ", ".join(f"{x:.2f}" for x in self.load_average)
        gpu = f", rows on {self.accelerator}" if self.accelerator else ""
        return (
            f"{self.nproc} CPUs ({self.cpu_model}){gpu}, load average at start {load}, "
            f"torch threads {self.torch_threads}, Python {self.python}, {self.date}"
        )


@dataclass
class Report:
    machine: MachineInfo
    workload: dict[str, Any]
    results: list[MethodResult] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # not run, and why (not a failure)
    vllm: dict[str, Any] | None = None  # bench.vllm_cpu's comparison
    hf_agreement: dict[str, Any] | None = None  # the engine's outputs against hf-single's

    def best_static_hf(self) -> MethodResult | None:
        static = [r for r in self.results if r.method.startswith("hf-batch-")]
        return max(static, key=lambda r: r.tokens_per_s) if static else None

    def find(self, method: str) -> MethodResult | None:
        return next((r for r in self.results if r.method == method), None)

    def overhead(self, dtype: str) -> dict[str, float] | None:
        result = self.find(f"engine-{dtype}")
        return result.extra.get("overhead_at_full_batch") if result else None

    def rows(self) -> list[tuple[str, ...]]:
        best = self.best_static_hf()
        rows: list[tuple[str, ...]] = []
        for r in self.results:
            ratio = f"{r.tokens_per_s / best.tokens_per_s:.2f}x" if best and best.tokens_per_s else "-"
            mark = " (best)" if best is r else ""
            load = r.extra.get("load_1min_before")
            cores = r.extra.get("cores_used_avg")
            contention = f"{load:.1f} / {cores:.2f}" if load is not None and cores is not None else "-"
            rows.append((r.label + mark, r.dtype, f"{r.tokens_per_s:.1f}", ratio, contention, r.note))
        return rows

    def targets(self, dtype: str) -> list[str]:
        lines = []
        engine, best, triton = self.find(f"engine-{dtype}"), self.best_static_hf(), self.find(f"triton-{dtype}")
        if engine and best:
            ratio = engine.tokens_per_s / best.tokens_per_s
            lines.append(
                f"engine offline / best static-batch HF ({dtype}): {ratio:.2f}x "
                f"(target >= {ENGINE_OVER_HF_BATCH}x): "
                f"{'met' if ratio >= ENGINE_OVER_HF_BATCH else 'NOT met'}"
            )
        paired = triton.extra.get("paired") if triton else None
        if paired:
            ratio = paired["ratio_median"]
            each = ", ".join(f"{r['ratio']:.2f}x" for r in paired["rounds"])
            lines.append(
                f"ensemble / engine offline ({dtype}, median of {len(paired['rounds'])} paired rounds: "
                f"{each}): {ratio:.2f}x (target >= {ENSEMBLE_OVER_OFFLINE}x): "
                f"{'met' if ratio >= ENSEMBLE_OVER_OFFLINE else 'NOT met'}"
            )
        elif engine and triton:
            ratio = triton.tokens_per_s / engine.tokens_per_s
            lines.append(
                f"ensemble / engine offline ({dtype}): {ratio:.2f}x "
                f"(target >= {ENSEMBLE_OVER_OFFLINE}x): "
                f"{'met' if ratio >= ENSEMBLE_OVER_OFFLINE else 'NOT met'}"
            )
        if self.hf_agreement:
            lines.append(self.hf_agreement["line"])
        lines += self.vllm_lines(dtype)
        overhead = self.overhead(dtype)
        if overhead and overhead.get("steps"):
            ms = overhead["overhead_ms_mean"]
            lines.append(
                f"engine overhead per step at {overhead['batch']} seqs ({dtype}): {ms:.2f} ms mean, "
                f"{overhead['overhead_ms_median']:.2f} ms median of {overhead['steps']} pure-decode steps "
                f"(step {overhead['step_ms_mean']:.1f} ms, model {overhead['model_ms_mean']:.1f} ms) "
                f"(target <= {MAX_OVERHEAD_MS} ms): {'met' if ms <= MAX_OVERHEAD_MS else 'NOT met'}"
            )
        return lines

    def vllm_lines(self, dtype: str) -> list[str]:
        """The engine against vLLM's CPU build: throughput through the same
        harness in the same run, single-request TTFT, token agreement."""
        ours, theirs = self.find(f"engine-harness-{dtype}"), self.find(f"vllm-cpu-{dtype}")
        if not (ours and theirs and self.vllm):
            return []
        ratio = ours.tokens_per_s / theirs.tokens_per_s
        lines = [
            f"engine / vLLM CPU offline ({dtype}, same harness): {ours.tokens_per_s:.1f} / "
            f"{theirs.tokens_per_s:.1f} tok/s = {ratio:.2f}x "
            f"(target >= {ENGINE_OVER_VLLM}x): {'met' if ratio >= ENGINE_OVER_VLLM else 'NOT met'}"
        ]
        ttft = self.vllm.get("ttft_ms_median")
        single_ours, single_theirs = ours.extra.get("single"), theirs.extra.get("single")
        if ttft and single_ours and single_theirs:
            lines.append(
                f"single-request TTFT ({dtype}, median of {single_ours['runs']} fresh prompts alone): "
                f"engine {ttft['engine']:.0f} ms, vLLM {ttft['vllm']:.0f} ms "
                f"(target <= vLLM's): {'met' if ttft['engine'] <= ttft['vllm'] else 'NOT met'}; "
                f"one request's decode: engine {single_ours['decode_tok_s_median']:.1f}, "
                f"vLLM {single_theirs['decode_tok_s_median']:.1f} tok/s"
            )
        if self.vllm.get("agreement"):
            lines.append(self.vllm["agreement"]["line"])
        for name, error in (self.vllm.get("errors") or {}).items():
            lines.append(f"vLLM comparison, {name}: not measured ({error.splitlines()[0][:200]})")
        return lines

    def print(self, console: Console, dtype: str) -> None:
        table = Table(title="Output tokens/s (useful tokens / wall time)")
        for column in COLUMNS:
            table.add_column(column, justify="right" if column in ("tokens/s", "vs best static HF") else "left")
        for row in self.rows():
            table.add_row(*row)
        console.print(table)
        for name, error in self.failures.items():
            console.print(f"[red]{name} failed:[/red] {error}")
        for name, why in self.skipped.items():
            console.print(f"[yellow]{name} skipped:[/yellow] {why}")
        for line in self.targets(dtype):
            console.print(line)

    def markdown(self) -> str:
        lines = [f"| {' | '.join(COLUMNS)} |", "|---|---|---:|---:|---|---|"]
        lines += [f"| {' | '.join(row)} |" for row in self.rows()]
        return "\n".join(lines)

    def as_dict(self, dtype: str) -> dict[str, Any]:
        return {
            "machine": vars(self.machine),
            "workload": self.workload,
            "results": [r.as_dict() for r in self.results],
            "failures": self.failures,
            "skipped": self.skipped,
            "vllm_comparison": self.vllm,
            "hf_agreement": self.hf_agreement,
            "targets": self.targets(dtype),
        }

    def write_json(self, path: str | Path, dtype: str) -> None:
        Path(path).write_text(json.dumps(self.as_dict(dtype), indent=2) + "\n")
