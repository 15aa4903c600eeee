"""vLLM's CPU build on the benchmark workload: run by build/vllm-venv/bin/python
(never imported into the project's venv), driven by `bench.vllm_cpu`.

    build/vllm-venv/bin/python bench/vllm_cpu_runner.py JOB.json

JOB.json (written by bench.vllm_cpu): the model folder and dtype, vLLM's
settings and the workload's requests (prompt ids, forced output length).
The runner loads vLLM once (its torch.compile warm-up takes minutes), answers
`{"ready": ...}` and then serves commands, one JSON object a line on stdin,
one answer a line on stdout, so the parent can interleave this engine's
measured runs with its own on an otherwise idle machine:

  {"cmd": "offline"}                       the whole workload at once
  {"cmd": "singles", "prompts": [...], "max_tokens": n[, "prefix": p]}   one request at a time
  {"cmd": "logprobs", "items": [{"context": [...], "candidates": [a, b]}]}
  {"cmd": "quit"}

Everything else vLLM prints goes to stderr (the parent keeps it in a log).
Thread binding and the KV cache size are environment variables that vLLM
reads at start (VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_KVCACHE_SPACE); the parent
sets them and records them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict

import step_harness  # bench/ is sys.path[0] when this file is run as a script


class VllmStepper:
    """vLLM's LLMEngine behind the harness: the same add / step loop that
    `LLM.generate` runs (`LLM._run_engine`), with DELTA outputs so each step
    returns only its new tokens."""

    def __init__(self, llm) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._engine = llm.llm_engine
        self._params = SamplingParams
        self._delta = RequestOutputKind.DELTA
        self._serial = 0

    def sampling(self, max_tokens: int, **extra):
        # greedy, EOS ignored (the same forcing as this project's engine), ids only:
        # this project's engine does not detokenize in the offline run either
        return self._params(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False, output_kind=self._delta, **extra
        )

    def add(self, request_id: str, prompt_ids: list[int], max_tokens: int) -> None:
        self._engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, self.sampling(max_tokens))

    def step(self) -> list[tuple[str, list[int], bool]]:
        return [(out.request_id, list(out.outputs[0].token_ids), out.finished) for out in self._engine.step()]

    def logprobs_at(self, context: list[int], candidates: list[int]) -> dict:
        """One greedy token after `context`, with vLLM's log-probs of the
        `candidates` (log-softmax of the raw logits: vLLM's default logprobs_mode)."""
        self._serial += 1
        request_id = f"logprobs-{self._serial}"
        self._engine.add_request(
            request_id,
            {"prompt_token_ids": context},
            self.sampling(1, logprobs=len(candidates), logprob_token_ids=list(candidates)),
        )
        while True:
            for out in self._engine.step():
                if out.request_id == request_id and out.finished:
                    completion = out.outputs[0]
                    table = completion.logprobs[0]
                    return {
                        "token": completion.token_ids[0],
                        "logprobs": [float(table[t].logprob) if t in table else None for t in candidates],
                    }


class CpuClock:
    """CPU seconds of this process and its live children (vLLM's engine core
    and worker are processes of their own), to say how many cores a measured
    run actually got."""

    def __init__(self) -> None:
        import psutil  # a dependency of vllm

        self._me = psutil.Process()

    def seconds(self) -> float:
        total = 0.0
        for proc in [self._me] + self._me.children(recursive=True):
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except Exception:  # noqa: BLE001 -- a process that just ended
                pass
        return total


def measured(clock: CpuClock, run):
    load = os.getloadavg()[0]
    cpu, wall = clock.seconds(), time.perf_counter()
    value = run()
    cores = (clock.seconds() - cpu) / max(1e-9, time.perf_counter() - wall)
    return value, {"load_1min_before": load, "cores_used_avg": round(cores, 2)}


def main(argv: list[str]) -> int:
    # answers go to the real stdout; everything else (vLLM's logs, its
    # processes' output) to stderr
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(obj: dict) -> None:
        answers.write(json.dumps(obj) + "\n")

    with open(argv[1]) as f:
        job = json.load(f)
    import vllm
    from vllm import LLM

    settings = job["settings"]
    started = time.perf_counter()
    llm = LLM(
        model=job["model_dir"],
        dtype=job["dtype"],
        max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        enable_prefix_caching=settings["enable_prefix_caching"],
        seed=0,
    )
    engine = VllmStepper(llm)
    requests = [(r["prompt_ids"], r["max_tokens"]) for r in job["requests"]]
    # warm-up, outside the timed part (the same request as this project's engine gets)
    step_harness.run_all_at_once(engine, [(step_harness.warm_up_prompt(requests), 4)], prefix="warmup")
    load_s = time.perf_counter() - started

    config = llm.llm_engine.vllm_config
    cache = config.cache_config
    clock = CpuClock()
    answer(
        {
            "ready": True,
            "vllm_version": vllm.__version__,
            "load_s": load_s,
            "config": {
                "max_num_seqs": config.scheduler_config.max_num_seqs,
                "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
                "enable_chunked_prefill": config.scheduler_config.enable_chunked_prefill,
                "enable_prefix_caching": cache.enable_prefix_caching,
                "block_size": cache.block_size,
                "num_kv_blocks": cache.num_gpu_blocks,
                "kv_tokens": (cache.num_gpu_blocks or 0) * cache.block_size,
                "compilation_mode": str(config.compilation_config.mode),
                "compilation_backend": config.compilation_config.backend,
                "dtype": str(config.model_config.dtype),
                "env": {
                    k: os.environ.get(k)
                    for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU")
                },
            },
        }
    )

    rounds = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        cmd = command["cmd"]
        if cmd == "quit":
            break
        if cmd == "offline":
            rounds += 1
            # every round starts cold: the previous round's prompts are not served from the cache
            llm.llm_engine.reset_prefix_cache()
            run, cpu = measured(clock, lambda: step_harness.run_all_at_once(engine, requests, prefix=f"bench{rounds}"))  # noqa: B023
            answer(
                {
                    "tokens": run.tokens,
                    "seconds": run.seconds,
                    "steps": run.steps,
                    "output_tokens": run.output_tokens,
                    **cpu,
                }
            )
        elif cmd == "singles":
            summary, cpu = measured(
                clock,
                lambda: step_harness.run_singles(  # noqa: B023 -- called within this iteration
                    engine,
                    command["prompts"],  # noqa: B023
                    command["max_tokens"],  # noqa: B023
                    prefix=command.get("prefix", f"single{rounds}"),  # noqa: B023
                ),
            )
            answer({"summary": summary.as_dict(), "runs": [asdict(r) for r in summary.runs], **cpu})
        elif cmd == "logprobs":
            answer({"items": [engine.logprobs_at(item["context"], item["candidates"]) for item in command["items"]]})
        else:
            answer({"error": f"unknown command {cmd!r}"})
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv))
