"""How every admitted generation ends, whatever the route (OpenAI, Responses,
Triton HTTP or gRPC): engine requests still running are stopped, the
admission is released, the usage is counted per key and logged."""

from __future__ import annotations

from ..ops import logs
from ..ops.metrics import KEY_COMPLETION_TOKENS, KEY_PROMPT_TOKENS, KEY_REQUESTS
from .generation import Generation
from .policy import Admission, Caller


async def settle(generation: Generation, admission: Admission, caller: Caller, outcome: str) -> None:
    try:
        await generation.aclose()
    finally:
        await admission.release()
    prompt, completion = generation.prompt_tokens, generation.completion_tokens
    labels = {"key_id": caller.key_id, "tier": caller.tier_name}
    KEY_REQUESTS.labels(**labels).inc()
    KEY_PROMPT_TOKENS.labels(**labels).inc(prompt)
    KEY_COMPLETION_TOKENS.labels(**labels).inc(completion)
    context = logs.current()
    if context is not None:
        context.fields.update(
            prompt_tokens=prompt,
            completion_tokens=completion,
            outcome=outcome,
            finish_reasons=[c.engine_finish for c in generation.choices],
        )
