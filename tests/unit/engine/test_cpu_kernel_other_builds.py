"""The attention kernels as other CPUs build them: the library compiled here
for a plain x86-64 (the decode's plain loops, as on CPUs without AVX2,
aarch64 among them) and for Haswell (the AVX2 paths of the Zen machines),
checked against the PyTorch references like the native build in
test_cpu_kernel.py and test_prefill_attention.py. The native build on an
AVX-512 CPU runs none of those paths."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from python_llm.engine.worker.kernels import CpuKernels, library
from python_llm.engine.worker.kernels.reference import decode_attention_reference, prefill_attention_reference
from tests.unit.engine.decode_cases import CASES, random_case
from tests.unit.engine.test_prefill_attention import SHAPES, chunk_case

ARCHES = ["x86-64", "haswell"]
HAS_AVX2 = {"x86-64": False, "haswell": True}


@pytest.fixture(scope="module", params=ARCHES)
def arch(request) -> str:
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 builds: this is not an x86 CPU")
    if HAS_AVX2[request.param] and " avx2" not in library.cpu_features():
        pytest.skip("this CPU cannot run an AVX2 build")
    return request.param


@pytest.fixture(scope="module")
def built_for(arch: str, tmp_path_factory) -> CpuKernels:
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler is not None, "no C++ compiler: the native kernels cannot build here either"
    flags = [f"-march={arch}" if flag == "-march=native" else flag for flag in library.FLAGS]
    target = tmp_path_factory.mktemp(arch) / "kernels.so"
    result = subprocess.run(
        [compiler, *flags, "-o", str(target), *map(str, library.SOURCES)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return CpuKernels(Path(target))


@pytest.mark.parametrize("case", list(CASES))
def test_matches_sdpa_fp32(built_for: CpuKernels, case: str) -> None:
    heads, kv_heads, head_dim = CASES[case]
    lens = [1, 16, 17, 31, 32, 5, 250, 3]
    query, keys, values, tables, padded, context = random_case(11, heads, kv_heads, head_dim, lens)
    out = torch.empty(len(lens), heads * head_dim)
    built_for.paged_decode_attention(out, query, keys, values, padded, context, head_dim**-0.5)
    expected = decode_attention_reference(query, keys, values, tables, lens, head_dim**-0.5)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("block_size", [8, 32])
def test_other_block_sizes(built_for: CpuKernels, block_size: int) -> None:
    lens = [1, 9, 33, 100]
    query, keys, values, tables, padded, context = random_case(12, 9, 3, 64, lens, block_size=block_size)
    out = torch.empty(len(lens), 9 * 64)
    built_for.paged_decode_attention(out, query, keys, values, padded, context, 0.125)
    expected = decode_attention_reference(query, keys, values, tables, lens, 0.125)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


def test_bf16_cache(built_for: CpuKernels) -> None:
    lens = [7, 40, 129]
    query, keys, values, tables, padded, context = random_case(13, 9, 3, 64, lens, dtype=torch.bfloat16)
    out = torch.empty(len(lens), 9 * 64, dtype=torch.bfloat16)
    built_for.paged_decode_attention(out, query, keys, values, padded, context, 0.125)
    expected = decode_attention_reference(query, keys, values, tables, lens, 0.125)
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


def test_prefill_on_avx2_only(built_for: CpuKernels, arch: str) -> None:
    """Without AVX2 continued chunks take the PyTorch path; with it, the ymm
    kernel matches that path."""
    assert built_for.prefill_attention_supported(64) == HAS_AVX2[arch]
    if not HAS_AVX2[arch]:
        return
    for i, (tokens, start) in enumerate(SHAPES):
        query, keys, values, table = chunk_case(i, 9, 3, 64, tokens, start)
        out = torch.empty(tokens, 9 * 64)
        built_for.paged_prefill_attention(
            out, query, keys, values, torch.tensor(table, dtype=torch.int32), start, 0.125
        )
        expected = prefill_attention_reference(query, keys, values, table, start, 0.125)
        torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5, msg=f"{tokens} tokens from {start}")
