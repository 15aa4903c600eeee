"""The oneDNN projections (packed weights, fused epilogues) and the native
elementwise kernels against the reference path (`F.linear` and PyTorch
ops): each epilogue alone, then whole tiny models in every combination."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from python_llm.engine.worker.attention import AttentionMetadata, PrefillChunk
from python_llm.engine.worker.kernels import cpu_kernels
from python_llm.engine.worker.kv_cache import KVCacheShape, PagedKVCache
from python_llm.engine.worker.models import build_model
from python_llm.engine.worker.models.llama import LM_HEAD_GEMM_MIN_ROWS
from python_llm.engine.worker.models.packed_linear import AMX_MIN_ROWS, PackedLinear, packed_linears_available
from tests.unit.engine.test_model_tiny import save_tiny

pytestmark = pytest.mark.skipif(
    not packed_linears_available(torch.device("cpu"), torch.float32), reason="torch built without oneDNN"
)
MAX_LEN = AMX_MIN_ROWS + 32  # room for a prefill past AMX_MIN_ROWS


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_and_residual_epilogue_match_unfused_ops(rows: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 48, generator=g)
    bias = torch.randn(96, generator=g) if with_bias else None
    x, other = torch.randn(rows, 48, generator=g), torch.randn(rows, 96, generator=g)
    linear = PackedLinear(weight, bias)
    expected = F.linear(x, weight, bias)
    torch.testing.assert_close(linear(x), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(linear.plus(x, other), expected + other, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kind,overrides", [("llama", {"tie_word_embeddings": True}), ("qwen2", {"tie_word_embeddings": False})]
)
def test_packed_and_native_models_match_reference(tmp_path: Path, kind: str, overrides: dict) -> None:
    folder = save_tiny(tmp_path / kind, kind, **overrides)
    cpu = torch.device("cpu")
    kernels = cpu_kernels()
    assert kernels is not None, "the CPU kernels did not build on this machine"
    reference = build_model(
        folder, MAX_LEN, torch.float32, cpu, linear_backend="torch", kernels=None, greedy_lm_head="fp32"
    )
    variants = {
        "packed": build_model(
            folder, MAX_LEN, torch.float32, cpu, linear_backend="onednn", kernels=None, greedy_lm_head="fp32"
        ),
        "native elementwise": build_model(
            folder, MAX_LEN, torch.float32, cpu, linear_backend="torch", kernels=kernels, greedy_lm_head="fp32"
        ),
        "both": build_model(
            folder, MAX_LEN, torch.float32, cpu, linear_backend="auto", kernels=kernels, greedy_lm_head="auto"
        ),
    }
    if kernels.fma_gemm_supported():
        variants["fma"] = build_model(
            folder, MAX_LEN, torch.float32, cpu, linear_backend="fma", kernels=kernels, greedy_lm_head="fp32"
        )
    assert not reference.layers[0].projections.packed and reference.kernels is None
    assert variants["both"].layers[0].projections.packed and variants["both"].layers[0].kernels is kernels
    # packing moves the weights: the parameters no longer hold a copy
    assert variants["packed"].layers[0].gate_up_weight.numel() == 0

    # past AMX_MIN_ROWS, so an AMX machine runs its tiles here
    num_tokens = AMX_MIN_ROWS + 4
    ids = torch.arange(num_tokens) % 90 + 3  # the tiny vocabulary has 96 ids
    positions = torch.arange(num_tokens)
    spec = reference.spec

    def run(model) -> torch.Tensor:
        cache = PagedKVCache(
            KVCacheShape(spec.num_layers, -(-num_tokens // 16), 16, spec.num_kv_heads, spec.head_dim),
            torch.float32,
            cpu,
        )
        meta = AttentionMetadata(slot_mapping=positions, prefills=[PrefillChunk(0, num_tokens, num_tokens)])
        with torch.inference_mode():
            return model.compute_logits(model(ids, positions, meta, cache))

    expected = run(reference)
    for name, model in variants.items():
        torch.testing.assert_close(run(model), expected, atol=1e-4, rtol=1e-4, msg=name)


def test_greedy_tokens_take_the_packed_lm_head_from_its_row_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy steps of LM_HEAD_GEMM_MIN_ROWS rows or more run the packed LM
    head + the native argmax, fewer rows the fused LM head + argmax; both
    give the reference's argmax."""
    folder = save_tiny(tmp_path / "llama", "llama", tie_word_embeddings=True)
    cpu = torch.device("cpu")
    kernels = cpu_kernels()
    assert kernels is not None, "the CPU kernels did not build on this machine"
    reference = build_model(folder, 64, torch.float32, cpu, linear_backend="torch", kernels=None, greedy_lm_head="fp32")
    model = build_model(folder, 64, torch.float32, cpu, linear_backend="auto", kernels=kernels, greedy_lm_head="fp32")
    assert reference.lm_head_gemm is None and model.lm_head_gemm is not None
    fused = kernels.lm_head_argmax
    fused_rows: list[int] = []
    monkeypatch.setattr(kernels, "lm_head_argmax", lambda h, w: fused_rows.append(h.shape[0]) or fused(h, w))
    g = torch.Generator().manual_seed(7)
    for rows in (1, LM_HEAD_GEMM_MIN_ROWS - 1, LM_HEAD_GEMM_MIN_ROWS, 40):
        hidden = torch.randn(rows, reference.spec.hidden_size, generator=g)
        with torch.inference_mode():
            expected = reference.compute_logits(hidden).argmax(dim=-1).tolist()
            assert model.greedy_tokens(hidden) == expected, f"{rows} rows"
    assert fused_rows == [1, LM_HEAD_GEMM_MIN_ROWS - 1]


def test_native_elementwise_is_fp32_cpu_only(tmp_path: Path) -> None:
    folder = save_tiny(tmp_path / "llama", "llama")
    model = build_model(
        folder,
        64,
        torch.bfloat16,
        torch.device("cpu"),
        linear_backend="auto",
        kernels=cpu_kernels(),
        greedy_lm_head="auto",
    )
    assert model.kernels is None and not model.layers[0].projections.packed
    with pytest.raises(ValueError, match="fp32"):
        model.use_kernels(cpu_kernels())
