"""Model implementations the engine can run, chosen by config.json's
`architectures`."""

from __future__ import annotations

from pathlib import Path

import torch

from ..kernels import CpuKernels
from ..model_info import ModelFolderError, read_json
from .greedy_head import verified_greedy_precision
from .llama import LlamaForCausalLM, LlamaSpec
from .loader import load_weights
from .packed_linear import packed_linears_available, projection_makers

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


def build_model(
    model_dir: str | Path,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    linear_backend: str,
    kernels: CpuKernels | None,
    greedy_lm_head: str,
) -> LlamaForCausalLM:
    """Instantiate the model named by the folder's config.json and load its
    weights. Projections (CPU, fp32): linear_backend "auto" packs them for
    AMX tiles where the CPU has AMX-BF16 (with oneDNN for few rows), else for
    FMA lanes where the kernels build them, AVX2 or AVX-512 (on AVX-512
    with oneDNN for many rows), else for oneDNN; "fma" and "onednn" for those alone (see
    packed_linear.projection_makers); "torch" keeps `F.linear` (the
    reference), as does every other device or dtype. With native kernels,
    an fp32 CPU model runs its elementwise steps on them and, as
    greedy_lm_head asks (EngineConfig), its greedy rows on an LM head in
    lower precision with the exact argmax: bf16 where the CPU has bf16 dot
    products (greedy_head.py), else int16 on AVX2 (int16_greedy_head.py)."""
    config = read_json(Path(model_dir) / "config.json")
    architectures = config.get("architectures") or []
    if not any(arch in SUPPORTED_ARCHITECTURES for arch in architectures):
        raise ModelFolderError(
            f"architectures: {architectures} not supported; this engine runs {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    spec = LlamaSpec.from_hf_config(config)
    model = LlamaForCausalLM(spec, max_positions, dtype, device)
    load_weights(model, model_dir)
    if linear_backend != "torch" and packed_linears_available(device, dtype):
        model.pack_linears(*projection_makers(linear_backend, kernels))
    if kernels is not None and device.type == "cpu" and dtype == torch.float32:
        model.use_kernels(kernels)
        precision = verified_greedy_precision(kernels, device, dtype) if greedy_lm_head == "auto" else None
        if precision is not None:
            model.use_verified_greedy(precision)
    return model.eval()


__all__ = ["SUPPORTED_ARCHITECTURES", "LlamaForCausalLM", "LlamaSpec", "build_model", "load_weights"]
