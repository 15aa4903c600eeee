"""The inference probe's golden answer: one fixed short greedy request and the
answer the packaged weights give it, recorded offline by the project's own
engine (the one Triton runs) and written as JSON for the gateway.

Why: a replica whose weights or engine are broken still answers readiness;
only a real generation compared with a known answer shows it. The answer is
never learnt from a replica being probed, so a fleet that is wrong from its
start is caught too. The gateway has no model: everything it needs to send
the probe and judge the answer is in the file.

`<BUILD_DIR>/probe/<model folder name>.json`:

    {"version": 1, "model": "ensemble", "prompt": "1, 2, 3, 4, 5,", "max_tokens": 8,
     "temperature": 0.0, "ignore_eos": true,
     "request": {<the public inputs to send besides text_input>},
     "num_input_tokens": 14, "output_ids": [...], "text": " 6, 7, 8",
     "model_dir": "/abs/model", "dtype": "float32", "weights_fingerprint": "sha256:..."}

It is recomputed when the weights (size and mtime of the weight, config and
tokenizer files), the dtype or the probe request itself change; otherwise
`ensure_golden` only reads it (cheap: no torch import).

This module is the one source of truth for the probe's request: nothing else
spells out the prompt or its settings.
"""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from python_llm.engine.config import EngineConfig

from .paths import BUILD_DIR

# The probe request. Plain text (no chat template: fewer moving parts between
# the file and the engine), greedy, and ignore_eos so the answer always has
# exactly max_tokens ids whatever the model says. Counting, because every
# greedy choice wins by a wide margin (SmolLM2-135M: top-1 over top-2 by >= 3
# logits at each of the 8 steps; "The capital of France is" has a step at
# 0.2), so batching, thread counts or kernel paths on a healthy replica never
# flip a token, while broken weights cannot keep all eight.
PROBE_PROMPT = "1, 2, 3, 4, 5,"
PROBE_MAX_TOKENS = 8
PROBE_MODEL = "ensemble"  # the public entry point the probe goes through
# the format of the file; a change forces a recompute
GOLDEN_VERSION = 1
# files whose change changes the answer
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
_ANSWER_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")

Progress = Callable[[str], None]


class GoldenError(ValueError):
    """A golden file that cannot be read or does not hold a usable answer."""


@dataclass(frozen=True)
class Golden:
    prompt: str
    max_tokens: int
    output_ids: tuple[int, ...]
    text: str
    model_dir: str
    weights_fingerprint: str
    dtype: str  # the engine's, as served: another dtype may pick other tokens
    model: str = PROBE_MODEL
    temperature: float = 0.0
    ignore_eos: bool = True
    num_input_tokens: int = 0
    version: int = GOLDEN_VERSION

    @property
    def request(self) -> dict[str, Any]:
        """The public inputs besides `text_input` (client.GenerationOptions field
        names): greedy, a fixed length, the ids returned for an exact comparison."""
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "return_output_ids": True,
        }

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["output_ids"] = list(self.output_ids)
        data["request"] = self.request
        return data


def probe_request() -> tuple[str, int]:
    """(prompt, max_tokens) of the probe."""
    return PROBE_PROMPT, PROBE_MAX_TOKENS


def golden_path(model_dir: str | os.PathLike[str], build_dir: Path | None = None) -> Path:
    """Where the golden of `model_dir` lives: <BUILD_DIR>/probe/<folder name>.json."""
    return (build_dir or BUILD_DIR) / "probe" / f"{Path(model_dir).expanduser().resolve().name}.json"


def weights_fingerprint(model_dir: str | os.PathLike[str]) -> str:
    """Size and mtime of every file that decides the answer: cheap (no
    hashing of gigabytes) and changes whenever a file is rewritten."""
    folder = Path(model_dir).expanduser().resolve()
    files = sorted(
        p for p in folder.iterdir() if p.is_file() and (p.suffix in _WEIGHT_SUFFIXES or p.name in _ANSWER_FILES)
    )
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in files):
        raise FileNotFoundError(f"{folder}: no weight files ({', '.join(_WEIGHT_SUFFIXES)})")
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return f"sha256:{digest.hexdigest()}"


def load_golden(path: str | os.PathLike[str]) -> Golden:
    """Read a golden file; GoldenError names what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GoldenError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise GoldenError(f"{path}: not a JSON object")
    try:
        golden = Golden(
            prompt=str(data["prompt"]),
            max_tokens=int(data["max_tokens"]),
            output_ids=tuple(int(i) for i in data["output_ids"]),
            text=str(data["text"]),
            model_dir=str(data["model_dir"]),
            weights_fingerprint=str(data["weights_fingerprint"]),
            dtype=str(data["dtype"]),
            model=str(data.get("model", PROBE_MODEL)),
            temperature=float(data.get("temperature", 0.0)),
            ignore_eos=bool(data.get("ignore_eos", True)),
            num_input_tokens=int(data.get("num_input_tokens", 0)),
            version=int(data.get("version", 0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise GoldenError(f"{path}: missing or malformed field {exc}") from None
    if not golden.prompt or golden.max_tokens < 1 or len(golden.output_ids) != golden.max_tokens:
        raise GoldenError(
            f"{path}: expected {golden.max_tokens} output ids for a non-empty prompt, got {len(golden.output_ids)}"
        )
    return golden


def _is_current(golden: Golden, model_dir: Path, dtype: str) -> bool:
    prompt, max_tokens = probe_request()
    return (
        golden.version == GOLDEN_VERSION
        and golden.prompt == prompt
        and golden.max_tokens == max_tokens
        and golden.model_dir == str(model_dir)
        and golden.dtype == dtype
        and golden.weights_fingerprint == weights_fingerprint(model_dir)
    )


def _print(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _served_dtype(served: EngineConfig | None, folder: Path) -> str:
    """The dtype the replicas run in: the served settings', else the engine's default."""
    return (served or EngineConfig(model_dir=str(folder))).dtype


def compute_golden(
    model_dir: str | os.PathLike[str], served: EngineConfig | None = None, progress: Progress = _print
) -> Golden:
    """Run the probe request through the engine offline, in this process,
    and turn its ids into text as the served path does (the same prompt
    builder before, the same output pipeline after). A few seconds on a CPU.

    Of the served settings only the dtype is taken: the rest sizes a server
    (KV budget, batch) or injects test faults, and the CPU's greedy answer in
    a dtype is the device's too for a prompt whose every choice wins widely."""
    from ensemble.inbound.prompt import PromptBuilder
    from ensemble.outbound.output_pipeline import OutputPipeline
    from ensemble.tokenizer_info import load_tokenizer_info
    from python_llm.engine.core.sampling_params import SamplingParams
    from python_llm.engine.engine import LLMEngine

    folder = Path(model_dir).expanduser().resolve()
    dtype = _served_dtype(served, folder)
    prompt, max_tokens = probe_request()
    fingerprint = weights_fingerprint(folder)  # before loading: a file rewritten meanwhile reads as stale later
    info = load_tokenizer_info(folder)
    prompt_ids = PromptBuilder(info).build(prompt, None, max_tokens).input_ids
    t0 = time.monotonic()
    progress(f"probe golden: loading {folder.name} ({dtype}) for the reference answer...")
    # a KV cache for this one request only (the served default would allocate 16k tokens)
    block_size = EngineConfig(model_dir=str(folder)).block_size
    blocks = -(-(len(prompt_ids) + max_tokens) // block_size) + 1
    engine = LLMEngine(
        EngineConfig(
            model_dir=str(folder),
            dtype=dtype,
            max_tokens_in_paged_kv_cache=block_size * blocks,
            max_num_seqs=1,
            max_num_batched_tokens=max(len(prompt_ids), 1),
            max_queue_size=0,
        )
    )
    progress(f"probe golden: model loaded in {time.monotonic() - t0:.1f} s; generating {max_tokens} tokens")
    try:
        (result,) = engine.generate_results(
            [(prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))]
        )
    finally:
        del engine
        gc.collect()  # the weights go now, not whenever the serving process next collects
    if result.error is not None or len(result.token_ids) != max_tokens:
        raise RuntimeError(
            f"probe golden: the engine answered {len(result.token_ids)} of {max_tokens} tokens "
            f"({result.finish_reason}: {result.error})"
        )
    # token by token, as a streamed answer is detokenized
    pipeline = OutputPipeline(info.tokenizer)
    text = "".join(pipeline.push([token]).text for token in result.token_ids)
    text += pipeline.finish("length").text
    return Golden(
        prompt=prompt,
        max_tokens=max_tokens,
        output_ids=tuple(result.token_ids),
        text=text,
        model_dir=str(folder),
        weights_fingerprint=fingerprint,
        dtype=dtype,
        num_input_tokens=len(prompt_ids),
    )


def write_golden(golden: Golden, path: Path) -> None:
    """Whole or not at all: a reader (the gateway) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(golden.to_json(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def ensure_golden(
    model_dir: str | os.PathLike[str],
    served: EngineConfig | None = None,
    *,
    build_dir: Path | None = None,
    progress: Progress = _print,
    isolated: bool = False,
) -> Path:
    """The golden file of `model_dir` for the engine settings `served` (their
    dtype; None: the defaults), computed when missing or stale (weights, dtype
    or probe request changed); its path.

    `isolated`: compute in a child process, for a long-lived caller (`serve`),
    which would otherwise keep torch and the freed weights' pages (~0.5 GB for
    SmolLM2-135M) for its whole life."""
    folder = Path(model_dir).expanduser().resolve()
    dtype = _served_dtype(served, folder)
    path = golden_path(folder, build_dir)
    if path.is_file():
        try:
            if _is_current(load_golden(path), folder, dtype):
                return path
            progress(f"probe golden: {path} is stale (weights, dtype or probe changed); recomputing")
        except GoldenError as exc:
            progress(f"probe golden: {exc}; recomputing")
    if isolated:
        # spawn, not fork: the caller may hold threads and signal handlers
        child = multiprocessing.get_context("spawn").Process(
            target=_compute_and_write, args=(folder, served, path), name="probe-golden"
        )
        child.start()
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"probe golden: computing it failed (exit code {child.exitcode}); see above")
        return path
    _compute_and_write(folder, served, path, progress)
    return path


def _compute_and_write(folder: Path, served: EngineConfig | None, path: Path, progress: Progress = _print) -> None:
    t0 = time.monotonic()
    golden = compute_golden(folder, served, progress)
    write_golden(golden, path)
    progress(
        f"probe golden: {golden.text!r} ({len(golden.output_ids)} ids) written to {path} "
        f"in {time.monotonic() - t0:.1f} s"
    )


__all__ = [
    "Golden",
    "GoldenError",
    "PROBE_MAX_TOKENS",
    "PROBE_MODEL",
    "PROBE_PROMPT",
    "compute_golden",
    "ensure_golden",
    "golden_path",
    "load_golden",
    "probe_request",
    "weights_fingerprint",
    "write_golden",
]
