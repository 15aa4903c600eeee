"""Who the caller is, for every HTTP route (OpenAI, Responses, Triton HTTP,
streams): the API key in `Authorization` through the app's access policy,
recorded in the request's log context. (The gRPC door reads its metadata
itself: gateway/triton/grpc_door.py.)"""

from __future__ import annotations

from fastapi import Request

from ..ops import logs
from .policy import Caller, Policy


async def authenticated(request: Request) -> Caller:
    """A FastAPI dependency: the caller, or the policy's 401."""
    policy: Policy = request.app.state.policy
    caller = await policy.authenticate(request.headers.get("authorization"))
    context = logs.current()
    if context is not None:
        context.tier, context.key_id = caller.tier_name, caller.key_id
    return caller
