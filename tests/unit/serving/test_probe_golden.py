"""The inference probe's golden answer: computed by the engine offline from the
packaged weights (deterministic, and what Hugging Face's own greedy decoding of
the same weights says), written where the gateway looks, read back whole, and
recomputed only when the weights, the dtype or the probe request change."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import serving.probe_golden as pg
from python_llm.engine.config import EngineConfig
from serving.probe_golden import Golden, GoldenError, ensure_golden, golden_path, load_golden, weights_fingerprint


def _quiet(message: str) -> None:
    pass


@pytest.fixture(scope="module")
def real_golden(model_dir: Path) -> Golden:
    t0 = time.monotonic()
    golden = pg.compute_golden(model_dir, progress=_quiet)
    print(f"\n[golden computed in {time.monotonic() - t0:.1f} s]")
    return golden


# -- the real engine -------------------------------------------------------------


def test_golden_is_the_fixed_greedy_request_and_deterministic(model_dir: Path, real_golden: Golden):
    prompt, max_tokens = pg.probe_request()
    assert (real_golden.prompt, real_golden.max_tokens) == (prompt, max_tokens)
    assert len(real_golden.output_ids) == max_tokens  # ignore_eos: always the full length
    assert real_golden.temperature == 0.0 and real_golden.ignore_eos and real_golden.model == "ensemble"
    assert real_golden.model_dir == str(model_dir.resolve())
    assert real_golden.dtype == EngineConfig(model_dir=str(model_dir)).dtype == "float32"
    assert real_golden.weights_fingerprint == weights_fingerprint(model_dir)
    again = pg.compute_golden(model_dir, progress=_quiet)
    assert again.output_ids == real_golden.output_ids and again.text == real_golden.text


def test_golden_agrees_with_hugging_face_greedy_decoding(model_dir: Path, real_golden: Golden):
    """An oracle outside the engine: transformers' own greedy loop on the same
    weights and the tokenizer's plain decode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tokenizer(real_golden.prompt, return_tensors="pt").input_ids
    assert ids.shape[1] == real_golden.num_input_tokens
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=real_golden.max_tokens, do_sample=False, min_new_tokens=real_golden.max_tokens
        )
    expected = [int(t) for t in out[0, ids.shape[1] :]]
    assert list(real_golden.output_ids) == expected
    assert real_golden.text == tokenizer.decode(expected, skip_special_tokens=True)


def test_ensure_golden_writes_the_file_the_gateway_reads(
    model_dir: Path, real_golden: Golden, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(pg, "compute_golden", lambda folder, served, progress: real_golden)
    path = ensure_golden(model_dir, build_dir=tmp_path, progress=_quiet)
    assert path == tmp_path / "probe" / f"{model_dir.resolve().name}.json" == golden_path(model_dir, tmp_path)
    data = json.loads(path.read_text())
    assert {"prompt", "max_tokens", "output_ids", "text", "model_dir", "weights_fingerprint"} <= set(data)
    assert data["output_ids"] == list(real_golden.output_ids)
    assert data["request"] == {
        "max_tokens": real_golden.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_output_ids": True,
    }
    assert load_golden(path) == real_golden
    assert not list(path.parent.glob(".*.tmp"))


def test_isolated_computes_in_a_child_the_same_answer(model_dir: Path, real_golden: Golden, tmp_path: Path):
    """What `serve` uses, so that it does not keep torch and the weights' pages."""
    t0 = time.monotonic()
    path = ensure_golden(model_dir, build_dir=tmp_path, progress=_quiet, isolated=True)
    print(f"\n[golden computed in a child in {time.monotonic() - t0:.1f} s]")
    assert load_golden(path) == real_golden


def test_isolated_failure_is_an_error_not_a_hang(fake_model: Path, tmp_path: Path):
    with pytest.raises(RuntimeError, match="computing it failed"):
        ensure_golden(fake_model, build_dir=tmp_path, progress=_quiet, isolated=True)
    assert not golden_path(fake_model, tmp_path).exists()


def test_golden_path_defaults_to_the_build_dir(model_dir: Path):
    assert golden_path(model_dir) == pg.BUILD_DIR / "probe" / f"{model_dir.resolve().name}.json"


# -- staleness, on a fake model folder (no engine: compute_golden is counted) ----


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    (folder / "config.json").write_text("{}")
    (folder / "README.md").write_text("not part of the answer")
    return folder


class CountingCompute:
    def __init__(self) -> None:
        self.calls: list[tuple[Path, str]] = []

    def __call__(self, folder: Path, served: EngineConfig | None, progress: pg.Progress) -> Golden:
        dtype = served.dtype if served is not None else "float32"
        self.calls.append((folder, dtype))
        prompt, max_tokens = pg.probe_request()
        return Golden(
            prompt=prompt,
            max_tokens=max_tokens,
            output_ids=tuple(range(max_tokens)),
            text="x",
            model_dir=str(folder),
            weights_fingerprint=weights_fingerprint(folder),
            dtype=dtype,
        )


@pytest.fixture
def compute(monkeypatch: pytest.MonkeyPatch) -> CountingCompute:
    counting = CountingCompute()
    monkeypatch.setattr(pg, "compute_golden", counting)
    return counting


def _bump(path: Path, data: bytes | None = None) -> None:
    """Rewrite a file so its mtime surely moves (coarse file system clocks)."""
    stat = path.stat()
    if data is not None:
        path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_present_and_current_is_not_recomputed(fake_model: Path, tmp_path: Path, compute: CountingCompute):
    first = ensure_golden(fake_model, build_dir=tmp_path, progress=_quiet)
    assert ensure_golden(fake_model, build_dir=tmp_path, progress=_quiet) == first
    assert len(compute.calls) == 1


@pytest.mark.parametrize("change", ["weights_rewritten", "weights_touched", "config_touched"])
def test_a_weights_change_recomputes(fake_model: Path, tmp_path: Path, compute: CountingCompute, change: str):
    ensure_golden(fake_model, build_dir=tmp_path, progress=_quiet)
    before = weights_fingerprint(fake_model)
    if change == "weights_rewritten":
        (fake_model / "model.safetensors").write_bytes(b"\1" * 65)  # another size
    elif change == "weights_touched":
        _bump(fake_model / "model.safetensors")
    else:
        _bump(fake_model / "config.json")
    assert weights_fingerprint(fake_model) != before
    path = ensure_golden(fake_model, build_dir=tmp_path, progress=_quiet)
    assert len(compute.calls) == 2
    assert load_golden(path).weights_fingerprint == weights_fingerprint(fake_model)


def test_unrelated_files_do_not_change_the_fingerprint(fake_model: Path):
    before = weights_fingerprint(fake_model)
    _bump(fake_model / "README.md", b"edited")
    assert weights_fingerprint(fake_model) == before


def test_another_dtype_or_probe_request_recomputes(
    fake_model: Path, tmp_path: Path, compute: CountingCompute, monkeypatch: pytest.MonkeyPatch
):
    ensure_golden(fake_model, build_dir=tmp_path, progress=_quiet)
    bf16 = EngineConfig(model_dir=str(fake_model), dtype="bfloat16")
    ensure_golden(fake_model, bf16, build_dir=tmp_path, progress=_quiet)
    ensure_golden(fake_model, bf16, build_dir=tmp_path, progress=_quiet)
    assert [dtype for _, dtype in compute.calls] == ["float32", "bfloat16"]
    monkeypatch.setattr(pg, "PROBE_PROMPT", "a, b, c,")
    path = ensure_golden(fake_model, bf16, build_dir=tmp_path, progress=_quiet)
    assert len(compute.calls) == 3 and load_golden(path).prompt == "a, b, c,"


def test_a_corrupt_file_is_recomputed(fake_model: Path, tmp_path: Path, compute: CountingCompute):
    path = golden_path(fake_model, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    messages: list[str] = []
    assert ensure_golden(fake_model, build_dir=tmp_path, progress=messages.append) == path
    assert len(compute.calls) == 1 and any("recomputing" in m for m in messages)
    assert load_golden(path).output_ids == tuple(range(pg.PROBE_MAX_TOKENS))


def test_no_weights_is_an_error(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no weight files"):
        weights_fingerprint(tmp_path)


# -- reading -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, problem",
    [
        ("[]", "not a JSON object"),
        (
            '{"prompt": "p", "max_tokens": 2, "output_ids": [1, 2], "text": "t", "model_dir": "m"}',
            "weights_fingerprint",
        ),
        (
            '{"prompt": "p", "max_tokens": 3, "output_ids": [1, 2], "text": "t", "model_dir": "m", '
            '"weights_fingerprint": "f", "dtype": "float32"}',
            "expected 3 output ids",
        ),
        (
            '{"prompt": "p", "max_tokens": 2, "output_ids": ["a", 2], "text": "t", "model_dir": "m", '
            '"weights_fingerprint": "f", "dtype": "float32"}',
            "malformed",
        ),
    ],
)
def test_load_golden_refuses_a_bad_file(tmp_path: Path, content: str, problem: str):
    path = tmp_path / "golden.json"
    path.write_text(content)
    with pytest.raises(GoldenError, match=problem):
        load_golden(path)


def test_load_golden_of_a_missing_file_names_it(tmp_path: Path):
    with pytest.raises(GoldenError, match="missing.json"):
        load_golden(tmp_path / "missing.json")
