"""`GET /v1/streams/{id}` (resume with `Last-Event-ID`) and
`DELETE /v1/streams/{id}` (stop now), for every streamed route's streams:
OpenAI chunks and Triton `generate_stream` events alike."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ..core.authentication import authenticated
from ..core.policy import Caller
from . import serve

router = APIRouter()

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "malformed Last-Event-ID"},
    401: {"description": "missing or wrong API key"},
    404: {"description": "no such stream for this key"},
    410: {"description": "the events after Last-Event-ID are no longer buffered"},
}


@router.get("/v1/streams/{stream_id}", responses=_ERRORS)
async def resume_stream(stream_id: str, request: Request, caller: Caller = Depends(authenticated)) -> Response:
    """The events after `Last-Event-ID` (all buffered ones without it), then the live ones."""
    return await serve.resume(request, caller, stream_id)


@router.delete("/v1/streams/{stream_id}", status_code=204, responses=_ERRORS)
async def delete_stream(stream_id: str, request: Request, caller: Caller = Depends(authenticated)) -> Response:
    """Stop the stream's engine request now (its KV blocks are freed before this answers)."""
    return await serve.delete(request, caller, stream_id)
