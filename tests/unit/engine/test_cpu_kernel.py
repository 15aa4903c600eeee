"""The native CPU decode-attention kernel against PyTorch SDPA on the same
gathered K/V, and the fallback when it cannot be built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_llm.engine.worker import kernels
from python_llm.engine.worker.kernels import cpu_kernels
from python_llm.engine.worker.kernels.reference import decode_attention_reference
from tests.unit.engine.decode_cases import CASES, random_case


@pytest.fixture(scope="module")
def native() -> kernels.CpuKernels:
    built = cpu_kernels()
    assert built is not None, "the CPU kernel did not build on this machine (see the warning log)"
    return built


@pytest.mark.parametrize("case", list(CASES))
def test_matches_sdpa_fp32(native, case: str) -> None:
    heads, kv_heads, head_dim = CASES[case]
    # lengths: a single token, exact block multiples, ragged, one long
    lens = [1, 16, 17, 31, 32, 5, 250, 3]
    query, keys, values, tables, padded, context = random_case(1, heads, kv_heads, head_dim, lens)
    scale = head_dim**-0.5
    out = torch.empty(len(lens), heads * head_dim)
    native.paged_decode_attention(out, query, keys, values, padded, context, scale)
    expected = decode_attention_reference(query, keys, values, tables, lens, scale)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_accumulates_in_fp32(native, dtype: torch.dtype) -> None:
    lens = [7, 40, 129]
    query, keys, values, tables, padded, context = random_case(2, 9, 3, 64, lens, dtype=dtype)
    out = torch.empty(len(lens), 9 * 64, dtype=dtype)
    native.paged_decode_attention(out, query, keys, values, padded, context, 0.125)
    expected = decode_attention_reference(query, keys, values, tables, lens, 0.125)
    # inputs are the same rounded values; the only extra error is rounding the output
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


def test_large_score_range_stays_finite(native) -> None:
    """Scores far apart (one token dominates): the softmax must not overflow
    or produce NaN, and the output is that token's value."""
    query, keys, values, tables, padded, context = random_case(3, 4, 4, 64, [48])
    keys[:, tables[0][1], 3] = query[0].reshape(4, 64) * 50.0  # token 19 dominates every head
    out = torch.empty(1, 4 * 64)
    native.paged_decode_attention(out, query, keys, values, padded, context, 1.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.reshape(4, 64), values[:, tables[0][1], 3], atol=1e-5, rtol=1e-5)


def test_rejects_bad_arguments(native) -> None:
    query, keys, values, _, padded, context = random_case(4, 9, 3, 64, [20, 30])
    out = torch.empty(2, 9 * 64)
    with pytest.raises(ValueError, match="block_tables"):
        native.paged_decode_attention(out, query, keys, values, padded.long(), context, 0.1)
    with pytest.raises(ValueError, match="out"):
        native.paged_decode_attention(torch.empty(3, 9 * 64), query, keys, values, padded, context, 0.1)
    with pytest.raises(ValueError, match="dtype"):
        native.paged_decode_attention(out, query.double(), keys, values, padded, context, 0.1)


def test_no_compiler_falls_back(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with caplog.at_level("WARNING"):
        assert cpu_kernels(tmp_path) is None
    assert "PyTorch attention and argmax paths" in caplog.text
    assert not list((tmp_path / "kernels").glob("*.so"))  # no half-written library left behind


def test_library_name_follows_source_and_cpu(tmp_path: Path, monkeypatch) -> None:
    first = kernels.library_path(tmp_path)
    monkeypatch.setattr(kernels.library, "cpu_features", lambda: "another cpu")
    assert kernels.library_path(tmp_path) != first


def test_rejects_tables_outside_the_cache(native) -> None:
    query, keys, values, _, padded, context = random_case(5, 9, 3, 64, [20, 30])
    out = torch.empty(2, 9 * 64)
    beyond = padded.clone()
    beyond[0, 0] = keys.shape[1]  # one past the last block
    with pytest.raises(ValueError, match="outside the cache"):
        native.paged_decode_attention(out, query, keys, values, beyond, context, 0.1)
    too_long = context.clone()
    too_long[1] = padded.shape[1] * keys.shape[2] + 1
    with pytest.raises(ValueError, match="outside the cache"):
        native.paged_decode_attention(out, query, keys, values, padded, too_long, 0.1)


def test_table_rows_pick_rows_of_a_larger_table(native) -> None:
    """The engine's layout: tables live in rows of a persistent array and each
    decode names its row."""
    query, keys, values, tables, padded, context = random_case(6, 9, 3, 64, [20, 45, 7])
    out_direct = torch.empty(3, 9 * 64)
    native.paged_decode_attention(out_direct, query, keys, values, padded, context, 0.125)
    persistent = torch.zeros(6, padded.shape[1] + 2, dtype=torch.int32)
    rows = torch.tensor([4, 0, 2])
    persistent[rows, : padded.shape[1]] = padded
    out_rows = torch.empty(3, 9 * 64)
    native.paged_decode_attention(out_rows, query, keys, values, persistent, context, 0.125, table_rows=rows)
    assert torch.equal(out_rows, out_direct)
    with pytest.raises(ValueError, match="table_rows outside"):
        native.paged_decode_attention(
            out_rows, query, keys, values, persistent, context, 0.125, table_rows=torch.tensor([4, 0, 6])
        )
    with pytest.raises(ValueError, match="table_rows: contiguous int64"):
        native.paged_decode_attention(out_rows, query, keys, values, persistent, context, 0.125, table_rows=rows.int())
