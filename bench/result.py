"""One measured row of the benchmark."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MethodResult:
    method: str  # machine key, e.g. "hf-batch-16"
    label: str  # what the table prints
    dtype: str
    useful_output_tokens: int  # requested output tokens only (padding excluded)
    seconds: float  # wall time of the measured part
    num_requests: int
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # each request's generated tokens, in workload order, where the row kept
    # them (for the output agreement; not written to the JSON)
    outputs: list[list[int]] | None = field(default=None, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.useful_output_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "label": self.label,
            "dtype": self.dtype,
            "useful_output_tokens": self.useful_output_tokens,
            "seconds": self.seconds,
            "num_requests": self.num_requests,
            "tokens_per_s": self.tokens_per_s,
            "note": self.note,
            "extra": self.extra,
        }
