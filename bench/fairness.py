"""Fairness under a long prompt (issue 18): while `--streams` greedy streams
decode, a prompt of the model's whole context arrives. For each prefill
setting (a fixed token budget per step, or the engine's adaptive pacing),
the engine is driven offline in this process (no Triton in the numbers):

  itl_p50_before   the streams' inter-token latency before the long prompt
  itl_p99_during   their inter-token latency p99 while it prefills
  ttft             the long prompt's time to first token among the streams
  ttft_alone       its time to first token on an idle engine, same settings
  itl_p99_control  the streams' ITL p99 over as many steps with no long prompt
                   (their own growth: each step adds a token to every context)
  margin           how far below the bound the pacer planned the long prompt's
                   steps (p50 / max; prefill_pacer.py: the steps' recent spread)
  terms            of TTFT / alone = c x s / (s - d): the prompt's mean step s
                   (and over the pacer's aim), the streams' part d of a slice
                   step (start -> end), the slices' cost c against the same
                   tokens alone (fairness_terms.py)

and the two targets: ITL p99 during <= 3x ITL p50 before, TTFT <= 2x TTFT
alone (against the same settings alone and against the fastest alone of the
sweep). Writes build/bench/fairness.json; `--png` also draws the curve.

    python -m bench.fairness [--points 128,256,512,1024,2048,default]
                             [--long-tokens 0 (= max_model_len - 1)] [--streams 16]
                             [--wait-quiet 40] [--png docs/fairness.png]

A point is a token budget (`max_num_batched_tokens`, pacing off) or
`default` (the engine's EngineConfig defaults) or `paced:<budget>:<ratio>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import statistics
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.engine import LLMEngine

from .bench_model import add_model_arguments, bench_model_dir, check_device, release_memory
from .fairness_measurement import Measurement, percentile
from .fairness_report import ITL_P99_LIMIT, PACING_FIELD, TTFT_LIMIT, merge, plot, table, terms_table
from .report import MachineInfo
from .workload import Vocabulary


class SliceSeconds:
    """The runner's own seconds of each step's layer slice
    (`RunnerOutput.slice_seconds`), read as the engine's runner returns them."""

    def __init__(self, engine: LLMEngine) -> None:
        # patched on the instance, whatever runner the engine (of any version) holds
        runner: Any = engine.runner
        self.runner = runner
        self.execute = self.runner.execute
        self.last: float | None = None
        self.runner.execute = self._execute

    def _execute(self, scheduled: Any) -> Any:
        result = self.execute(scheduled)
        self.last = getattr(result, "slice_seconds", None)  # engines before slices: none
        return result

    def close(self) -> None:
        self.runner.execute = self.execute


@dataclass
class Point:
    label: str
    overrides: dict[str, Any]


def parse_point(text: str) -> Point:
    """`512` (fixed budget, pacing off), `default`, or `paced:<budget>:<ratio>`."""
    pacing = PACING_FIELD in {f.name for f in dataclasses.fields(EngineConfig)}
    if text == "default":
        return Point("default", {})
    if text.startswith("paced:"):
        _, budget, ratio = text.split(":")
        if not pacing:
            raise SystemExit(f"{text}: this engine has no {PACING_FIELD}")
        return Point(f"paced {budget} x{ratio}", {"max_num_batched_tokens": int(budget), PACING_FIELD: float(ratio)})
    overrides: dict[str, Any] = {"max_num_batched_tokens": int(text)}
    if pacing:
        overrides[PACING_FIELD] = 0.0
    return Point(f"fixed {text}", overrides)


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.usable = Vocabulary.from_model_dir(args.model_dir).usable_ids()
        self.rng = random.Random(args.seed)

    def prompt(self, n: int) -> list[int]:
        # fresh random ids every time: no prefix-cache hit between runs
        return [self.rng.choice(self.usable) for _ in range(n)]

    def engine(self, point: Point) -> LLMEngine:
        a = self.args
        config = EngineConfig(
            model_dir=a.model_dir,
            num_threads=a.threads,
            max_tokens_in_paged_kv_cache=a.kv_tokens,
            max_queue_size=0,
            max_tokens_limit=a.stream_tokens,
            device=a.device,
            **point.overrides,
        )
        engine = LLMEngine(config)
        engine.generate_results([(self.prompt(64), _greedy(4))])  # warm-up: allocators, kernels
        engine.freeze_heap()  # as the served engine does: no full collection stalls a step
        return engine

    def long_tokens(self, engine: LLMEngine) -> int:
        return self.args.long_tokens or engine.limits.max_model_len - 1

    @staticmethod
    def _prefill_of(engine: LLMEngine, rid: str) -> tuple[int, int]:
        """(start, tokens) of request `rid` in the step just scheduled, or (-1, 0)."""
        out = engine.scheduler._last_output
        if out is None:
            return -1, 0
        for request_id, start, num_tokens in out.chunks():
            if request_id == rid:
                return start, num_tokens
        return -1, 0

    @staticmethod
    def _layers_of(engine: LLMEngine, rid: str, tokens: int) -> int:
        """Layers request `rid`'s chunk ran in the step just scheduled (0: none)."""
        layers = int(engine.model_info.num_layers)
        layer_slice = getattr(engine.scheduler._last_output, "layer_slice", None)  # engines before slices: none
        if layer_slice is not None and layer_slice.request_id == rid:
            return layer_slice.end_layer - layer_slice.first_layer
        return layers if tokens else 0

    def alone(self, engine: LLMEngine, m: Measurement) -> None:
        n = self.long_tokens(engine)
        engine.add_request("alone", self.prompt(n), _greedy(1))
        started = time.perf_counter()
        while engine.num_live_requests():
            t0 = time.perf_counter()
            outs = engine.step()
            m.alone_steps.append((*self._prefill_of(engine, "alone"), time.perf_counter() - t0))
            if any(o.request_id == "alone" and o.new_token_ids for o in outs):
                m.ttft_alone_s = time.perf_counter() - started
        if any(o.error for o in outs):
            raise RuntimeError(f"alone: {outs}")

    def _start_streams(self, engine: LLMEngine) -> dict[str, float]:
        """The streams, each prefilled and decoding: their last token's time."""
        a = self.args
        streams = [f"stream-{i}" for i in range(a.streams)]
        for rid in streams:
            engine.add_request(
                rid, self.prompt(a.stream_prompt_tokens), _greedy(a.stream_tokens - a.stream_prompt_tokens)
            )
        last: dict[str, float] = {}
        while len(last) < len(streams):
            for out in engine.step():
                if out.new_token_ids:
                    last[out.request_id] = time.perf_counter()
        return last

    @staticmethod
    def _end_streams(engine: LLMEngine, last: dict[str, float]) -> None:
        for rid in last:
            engine.abort(rid)
        while engine.num_live_requests():
            engine.step()

    def contended(self, engine: LLMEngine, m: Measurement) -> None:
        last = self._start_streams(engine)
        for _ in range(self.args.steps_before):
            self._stream_step(engine, last, m.itl_before_s)
        engine.add_request("long", self.prompt(self.long_tokens(engine)), _greedy(1))
        arrived = time.perf_counter()
        for rid in last:
            last[rid] = max(last[rid], arrived)  # gaps from the arrival on belong to "during"
        pacer = getattr(engine.scheduler, "pacer", None)  # engines before the pacer: none
        if pacer is not None and pacer.enabled:
            m.pacer_decode_s = pacer.decode_step_s(len(last))
        slices = SliceSeconds(engine)
        while not m.ttft_s:
            if pacer is not None and pacer.enabled:
                m.margins.append(pacer.margin())  # what this step's plan is divided by
                m.aims.append(pacer.aim_s(len(last)))
            slices.last = None
            t0 = time.perf_counter()
            outs = self._stream_step(engine, last, m.itl_during_s)
            m.slice_own_s.append(slices.last)
            start, tokens = self._prefill_of(engine, "long")
            m.during_steps.append((start, tokens, time.perf_counter() - t0, self._layers_of(engine, "long", tokens)))
            if any(o.request_id == "long" and o.new_token_ids for o in outs):
                m.ttft_s = time.perf_counter() - arrived
            if any(o.finished and o.request_id != "long" for o in outs):
                reached = max((s0 + n for s0, n, _, _ in m.during_steps if n), default=0)
                raise RuntimeError(
                    f"a stream ended before the long prompt's first token ({len(m.during_steps)} "
                    f"steps, the prompt computed to ~{reached}): raise --stream-tokens"
                )
        slices.close()
        self._end_streams(engine, last)

    def control(self, engine: LLMEngine, m: Measurement) -> None:
        """Fresh streams for as many steps as the long prompt took, and no long
        prompt: what the streams' own growth does to their ITL (each step
        lengthens every context by a token, so a decode step costs more the
        longer the prompt takes; on a Zen 5 an 8k prompt took ~900 steps)."""
        last = self._start_streams(engine)
        for _ in range(self.args.steps_before):
            self._stream_step(engine, last, m.itl_control_before_s)
        for _ in range(len(m.during_steps)):
            self._stream_step(engine, last, m.itl_control_s)
        self._end_streams(engine, last)

    @staticmethod
    def _stream_step(engine: LLMEngine, last: dict[str, float], gaps: list[float]) -> list:
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            if out.new_token_ids and out.request_id in last:
                gaps.append(now - last[out.request_id])
                last[out.request_id] = now
        return outs

    def measure(self, point: Point) -> Measurement:
        engine = self.engine(point)
        config = {
            k: getattr(engine.config, k)
            for k in ("max_num_batched_tokens", "enable_chunked_context", PACING_FIELD)
            if hasattr(engine.config, k)
        }
        m = Measurement(
            point.label,
            config,
            os.getloadavg()[0],
            self.long_tokens(engine),
            num_layers=int(engine.model_info.num_layers),
        )
        cpu0, wall0 = _cpu_seconds(), time.perf_counter()
        self.alone(engine, m)
        self.contended(engine, m)
        self.control(engine, m)
        m.cores_used = (_cpu_seconds() - cpu0) / (time.perf_counter() - wall0)
        engine.shutdown()
        del engine
        release_memory()
        return m


def wait_quiet(minutes: float, max_load: float = 0.8) -> str:
    """Poll every 60 s until no tritonserver runs and the 1-minute load
    average is below `max_load`, for at most `minutes`. Says what it found."""
    deadline = time.monotonic() + 60 * minutes
    while True:
        triton = subprocess.run(["pgrep", "-f", "tritonserver"], capture_output=True).returncode == 0
        load = os.getloadavg()[0]
        if not triton and load < max_load:
            return f"quiet (load {load:.2f}, no tritonserver)"
        if time.monotonic() >= deadline:
            state = "running" if triton else "absent"
            return f"NOT quiet after {minutes:g} min (load {load:.2f}, tritonserver {state})"
        print(
            f"waiting for a quiet machine: load {load:.2f}, tritonserver {'running' if triton else 'absent'}",
            flush=True,
        )
        time.sleep(60)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.fairness", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--points", default="128,256,512,1024,2048,default")
    p.add_argument("--long-tokens", type=int, default=0, help="0 = the model's context minus the one output token")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--stream-prompt-tokens", type=int, default=128)
    # room for the streams to keep decoding through the whole long prefill on
    # the fastest machines (a Zen 5 ran past 1,024); they are cut when it ends
    p.add_argument("--stream-tokens", type=int, default=2048, help="prompt + output room of each stream")
    p.add_argument("--steps-before", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-tokens", type=int, default=49152, help="16 streams x 2,048 + the 8k prompt fit")
    p.add_argument("--seed", type=int, default=20241201)
    add_model_arguments(p)
    p.add_argument("--wait-quiet", type=float, default=0.0, help="minutes to wait for a quiet machine first")
    p.add_argument("--json", dest="json_path", default=None, help="default: build/bench/fairness.json")
    p.add_argument("--png", default=None)
    p.add_argument("--tag", default="", help="a note stored with the results (e.g. the commit)")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="no run: merge these result files into --json "
        "(TTFT against the fastest alone among them), print the table, draw --png",
    )
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="JSON",
        default=[],
        help="with --png: also draw these result files, as series named by their tag",
    )
    args = p.parse_args(argv)
    check_device(p, args.device)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.merge:
        header, rows = merge(args.merge)
        print(table(rows))
        print(terms_table(rows))
        result = {**header, "points": rows, "merged_from": args.merge}
        finish(args, result, rows, f"merged {len(args.merge)} runs, tag {header.get('tag') or '-'}")
        return
    with ExitStack() as temporary:
        args.model_dir = bench_model_dir(args.model_dir, args.random_weights, temporary)
        run(args)


def run(args: argparse.Namespace) -> None:
    quiet = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else "not waited for"
    machine = MachineInfo.collect(args.threads, args.device)
    print(f"{machine.line()}; {quiet}", flush=True)
    bench = Bench(args)
    measurements = []
    for text in args.points.split(","):
        point = parse_point(text.strip())
        print(f"-- {point.label}", flush=True)
        m = bench.measure(point)
        measurements.append(m)
        print(
            f"   TTFT alone {m.ttft_alone_s:.1f} s, TTFT {m.ttft_s:.1f} s, ITL p50 before "
            f"{1e3 * statistics.median(m.itl_before_s):.0f} ms, "
            f"p99 during {1e3 * percentile(m.itl_during_s, 99):.0f} ms "
            f"(load {m.load_before:.2f}, cores {m.cores_used:.2f})",
            flush=True,
        )
    best_alone = min(m.ttft_alone_s for m in measurements)
    rows = [m.summary(best_alone) for m in measurements]
    print(table(rows))
    print(terms_table(rows))
    result = {
        "machine": dataclasses.asdict(machine),
        "quiet": quiet,
        "load_after": os.getloadavg(),
        "tag": args.tag,
        "load": {
            "streams": args.streams,
            "stream_prompt_tokens": args.stream_prompt_tokens,
            "long_tokens": measurements[0].long_tokens,
            "threads": args.threads,
            "kv_tokens": args.kv_tokens,
            "steps_before": args.steps_before,
        },
        "limits": {"itl_p99_over_p50_before": ITL_P99_LIMIT, "ttft_over_alone": TTFT_LIMIT},
        "points": rows,
    }
    finish(args, result, rows, f"{machine.nproc} CPUs, load {machine.load_average[0]:.1f}")


def finish(args: argparse.Namespace, result: dict[str, Any], rows: list[dict[str, Any]], note: str) -> None:
    if args.json_path is None:
        from serving.paths import BUILD_DIR

        args.json_path = str(BUILD_DIR / "bench" / "fairness.json")
    Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_path).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json_path}")
    if args.png:
        series = [
            (json.loads(Path(p).read_text()).get("tag") or p, json.loads(Path(p).read_text())["points"])
            for p in args.compare
        ]
        load = result["load"]
        long = load["long_tokens"]
        long = f"{long}-token" if isinstance(long, int) else "full-context"
        plot(
            series + [(result.get("tag") or "this run", rows)],
            Path(args.png),
            f"{load['streams']} streams decoding + one {long} prompt; {note}",
        )
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
