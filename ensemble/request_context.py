"""What the text stages after the LLM step need to know about a request.

Triton's ensemble only lets a step after a decoupled model take inputs that
come out of that model, so `preprocessing` packs these settings into one
STRING tensor that the LLM step echoes on every response (`request_context`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .errors import InvalidInputError
from .outbound.segmenter import SegmentMode


@dataclass(frozen=True)
class RequestContext:
    key: str
    stream: bool = False
    stop_words: list[str] = field(default_factory=list)
    segment: str = SegmentMode.TOKEN.value
    return_log_probs: bool = False
    return_perf_metrics: bool = False
    return_output_ids: bool = False

    def __post_init__(self) -> None:
        SegmentMode.parse(self.segment)   # raises InvalidInputError naming `segment`

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> "RequestContext":
        if not text:
            return cls(key="")
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise InvalidInputError("request_context", f"malformed ({exc})") from None
