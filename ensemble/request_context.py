"""What the text stages after the LLM step need to know about a request.

Triton's ensemble only lets a step after a decoupled model take inputs that
come out of that model, so `preprocessing` packs these settings into one
STRING tensor that the LLM step echoes on every response (`request_context`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from contract.errors import InvalidInputError

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
    # output ids a previous replica generated (a migrated stream): the text
    # stages are primed with them so the first new delta continues cleanly
    continuation_ids: list[int] = field(default_factory=list)
    # exclude_input_in_output false: the LLM step's first response leads with
    # its input ids, continuation included, so nothing is primed
    echo_input: bool = False

    def __post_init__(self) -> None:
        SegmentMode.parse(self.segment)  # raises InvalidInputError naming `segment`

    @property
    def primed_ids(self) -> list[int]:
        """What the output pipeline runs over, discarding its text, before the
        LLM step's first response: the continuation, unless that response
        repeats it anyway (the input echo)."""
        return [] if self.echo_input else self.continuation_ids

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> RequestContext:
        if not text:
            return cls(key="")
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise InvalidInputError("request_context", f"malformed ({exc})") from None
