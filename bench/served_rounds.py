"""Served against offline in paired rounds (issue 18's served target).

The 2-core VMs drift: the offline engine alone measured 233-317 tok/s on
one machine within two hours, and 223-301 within two minutes, so one offline
row and one served row a minute apart can put a fifth of the machine's own
variation into their ratio. Here one tritonserver and one offline engine are
built once; each round runs a fresh workload (seed + round: no prefix-cache
hit from an earlier round) offline, then through the ensemble, and the ratio
is taken within the round. The verdict is the median of the rounds' ratios.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from rich.console import Console

from .engine_offline import timed_offline_run, warmed_engine
from .result import MethodResult
from .triton_ensemble import TritonBenchSettings, bench_server, prompt_texts, served_result, served_run
from .workload import BenchRequest, Vocabulary, WorkloadSpec, make_workload


@dataclass(frozen=True)
class Round:
    offline: MethodResult
    served: MethodResult

    @property
    def ratio(self) -> float:
        return self.served.tokens_per_s / self.offline.tokens_per_s


def round_workloads(spec: WorkloadSpec, vocab: Vocabulary, rounds: int) -> list[list[BenchRequest]]:
    """Round i's workload: the same shape, seed + i."""
    return [make_workload(dataclasses.replace(spec, seed=spec.seed + i), vocab) for i in range(rounds)]


def median_round(rounds: list[Round]) -> Round:
    """The round whose ratio is the median (the lower middle one for an even count)."""
    ordered = sorted(rounds, key=lambda r: r.ratio)
    return ordered[(len(ordered) - 1) // 2]


def run_served_rounds(
    settings: TritonBenchSettings, spec: WorkloadSpec, vocab: Vocabulary, rounds: int, console: Console
) -> list[MethodResult]:
    """Two rows: the offline and the served half of the median round, each
    carrying every round in `extra["paired"]`."""
    workloads = round_workloads(spec, vocab, rounds)
    engine = warmed_engine(settings, workloads[0])
    measured: list[Round] = []
    with bench_server(settings, len(workloads[0])) as (server, startup_s):
        for i, workload in enumerate(workloads):
            seconds, tokens = timed_offline_run(engine, workload, f"round {i + 1}: offline", prefix=f"round{i}")
            offline = MethodResult(
                method=f"engine-paired-{settings.dtype}",
                label="engine offline (paired with served)",
                dtype=settings.dtype,
                useful_output_tokens=tokens,
                seconds=seconds,
                num_requests=len(workload),
            )
            served_s, tallies = served_run(
                server, prompt_texts(settings.model_dir, workload), workload, settings.request_timeout_s
            )
            served = served_result(
                settings,
                workload,
                served_s,
                tallies,
                "engine via tritonserver ensemble (gRPC), paired",
                {"server_startup_s": startup_s},
            )
            measured.append(Round(offline, served))
            console.print(
                f"  round {i + 1} (seed {spec.seed + i}): offline {offline.tokens_per_s:.1f}, "
                f"served {served.tokens_per_s:.1f} tok/s = {measured[-1].ratio:.2f}x"
            )
    paired = {
        "rounds": [
            {
                "seed": spec.seed + i,
                "offline_tok_s": r.offline.tokens_per_s,
                "served_tok_s": r.served.tokens_per_s,
                "ratio": r.ratio,
            }
            for i, r in enumerate(measured)
        ],
        "ratio_median": statistics.median(r.ratio for r in measured),
    }
    middle = median_round(measured)
    note = f"median ratio of {rounds} paired rounds (fresh seeds: {', '.join(f'{r.ratio:.2f}x' for r in measured)})"
    middle.offline.note = note
    middle.served.note = f"{note}; {middle.served.note}"
    middle.offline.extra["paired"] = middle.served.extra["paired"] = paired
    return [middle.offline, middle.served]
