"""The gateway's one error type, answered in OpenAI's shape
`{"error": {"message", "type", "param", "code"}}` so OpenAI SDKs raise the
right exception class (400 BadRequestError, 401 AuthenticationError, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# OpenAI's `type` per status
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


@dataclass
class GatewayError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a caller's string quoted back may hold lone surrogates (invalid UTF-8
        # in its JSON): the answer must still encode, so they are shown escaped
        self.message = encodable(self.message)
        self.param = None if self.param is None else encodable(self.param)
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "api_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def encodable(text: str) -> str:
    """`text` with each lone surrogate shown as `\\udcXX`, so that it encodes as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
