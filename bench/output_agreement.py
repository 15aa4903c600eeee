"""Do two engines' greedy outputs agree? Token for token, and at a request's
first difference, whether the two candidates were a near-tie under the HF
fp32 reference (then either token is a correct fp32 answer) or a real
mismatch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from . import step_harness

if TYPE_CHECKING:
    from .vllm_cpu import EngineStepper, VllmProcess

# Two candidates whose log-probs differ by less than this (under the HF fp32
# reference, one sequence) are a near-tie. Two correct fp32 implementations
# give the same token in the same context log-probs ~1e-5 nats apart (this
# engine against HF: ~1e-5); other kernels, batch shapes and prefill chunking
# move a logit by up to ~1e-4. A flip between two candidates needs their gap
# to be within that noise: 1e-3 nats leaves 10x room over the widest of it,
# and is far below the gap a real bug leaves (a wrong token is typically
# nats behind). The noise is measured again at every divergence (each
# engine's view against HF's) and printed beside the verdict, so the bound
# can be checked against the run itself.
NEAR_TIE_NATS = 1e-3
NEAR_TIE_WHY = (
    "near-tie: the two candidates' log-probs differ by < {bound} nats under the HF fp32 reference "
    "(one sequence, no cache); each engine's own view of both candidates is recorded beside it"
)


class HFReference:
    """HF transformers fp32, one sequence, no cache: the reference the
    engine's equality tests use, here to judge the two candidates."""

    def __init__(self, model_dir: str, device: str = "cpu") -> None:
        from .hf_baselines import HFBenchSettings, load_model

        self.model = load_model(HFBenchSettings(model_dir=model_dir, dtype="float32", device=device))

    def logprobs_at(self, context: list[int], candidates: list[int]) -> list[float]:
        with torch.inference_mode():
            ids = torch.tensor([context], dtype=torch.long, device=self.model.device)
            logits = self.model(input_ids=ids).logits[0, -1]
        logprobs = torch.log_softmax(logits.to(torch.float64), dim=-1)
        return [float(logprobs[t]) for t in candidates]


@dataclass
class Agreement:
    identical: int = 0
    near_ties: int = 0
    mismatches: int = 0
    bound_nats: float = NEAR_TIE_NATS
    divergences: list[dict[str, Any]] = field(default_factory=list)
    against: str = "vLLM"

    def noise(self) -> dict[str, float]:
        """How far each engine's view of the candidates is from HF's, at the divergences."""
        result = {}
        for view in ("engine", "vllm"):
            gaps = [
                abs(_finite(x) - h)
                for d in self.divergences
                if f"{view}_logprobs" in d
                for x, h in zip(d[f"{view}_logprobs"], d["hf_logprobs"])
            ]
            gaps = [g for g in gaps if math.isfinite(g)]
            if gaps:
                result[f"{view}_vs_hf_max_nats"] = max(gaps)
        return result

    def line(self) -> str:
        total = self.identical + self.near_ties + self.mismatches
        text = (
            f"outputs vs {self.against}: {self.identical}/{total} identical token for token, "
            f"{self.near_ties} differing only from a near-tie "
            f"(|Δ log-prob| < {self.bound_nats:g} nats under HF fp32), "
            f"{self.mismatches} real mismatches"
        )
        noise = self.noise()
        if noise:
            text += "; views vs HF at the divergences: " + ", ".join(
                f"{name.split('_')[0]} max {value:.1e} nats" for name, value in noise.items()
            )
        return text


def compare_outputs(
    ours: list[list[int]],
    theirs: list[list[int]],
    prompts: list[list[int]],
    engine: EngineStepper,
    vllm: VllmProcess,
    reference: HFReference,
    bound: float = NEAR_TIE_NATS,
) -> Agreement:
    """Token for token; at each request's first difference, every view of
    the two candidates (this engine's, vLLM's, HF's) for the same context."""
    agreement = Agreement(bound_nats=bound)
    items: list[dict[str, Any]] = []
    for i, (a, b) in enumerate(zip(ours, theirs)):
        k = step_harness.first_difference(a, b)
        if k is None:
            agreement.identical += 1
            continue
        items.append(
            {"request": i, "position": k, "of": len(a), "context": list(prompts[i]) + a[:k], "candidates": [a[k], b[k]]}
        )
    if not items:
        return agreement
    vllm_views = vllm.command(
        "logprobs", items=[{"context": it["context"], "candidates": it["candidates"]} for it in items]
    )["items"]
    for n, (item, vllm_view) in enumerate(zip(items, vllm_views)):
        ours_view = engine.logprobs_at(item["context"], item["candidates"], f"rescore-{n}")
        hf = reference.logprobs_at(item["context"], item["candidates"])
        gap = hf[0] - hf[1]
        near_tie = abs(gap) < bound
        agreement.near_ties += near_tie
        agreement.mismatches += not near_tie
        agreement.divergences.append(
            {
                "request": item["request"],
                "position": item["position"],
                "output_tokens": item["of"],
                "engine_token": item["candidates"][0],
                "vllm_token": item["candidates"][1],
                "hf_logprobs": hf,
                "hf_gap": gap,
                "engine_logprobs": ours_view["logprobs"],
                "engine_alone_token": ours_view["token"],
                "vllm_logprobs": vllm_view["logprobs"],
                "vllm_alone_token": vllm_view["token"],
                "near_tie": near_tie,
            }
        )
    return agreement


def compare_to_reference(
    ours: list[list[int]],
    hf_runs: list[list[int]],
    prompts: list[list[int]],
    reference: HFReference,
    bound: float = NEAR_TIE_NATS,
) -> Agreement:
    """This engine's greedy outputs against HF generate's, one request at a
    time, on the same model and device; at each first difference, whether
    HF fp32 (one sequence, no cache) sees the two candidates as a near-tie."""
    agreement = Agreement(bound_nats=bound, against="HF fp32 (one at a time)")
    for i, (a, b) in enumerate(zip(ours, hf_runs)):
        k = step_harness.first_difference(a, b)
        if k is None:
            agreement.identical += 1
            continue
        if k >= min(len(a), len(b)):
            raise ValueError(f"request {i}: outputs of different lengths ({len(a)} and {len(b)} tokens)")
        hf = reference.logprobs_at(list(prompts[i]) + a[:k], [a[k], b[k]])
        near_tie = abs(hf[0] - hf[1]) < bound
        agreement.near_ties += near_tie
        agreement.mismatches += not near_tie
        agreement.divergences.append(
            {
                "request": i,
                "position": k,
                "output_tokens": len(a),
                "engine_token": a[k],
                "hf_token": b[k],
                "hf_logprobs": hf,
                "hf_gap": hf[0] - hf[1],
                "near_tie": near_tie,
            }
        )
    return agreement


def _finite(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) else float("nan")
