"""OpenAI requests → the public tensors of `ensemble` / `llm_bls` (as the client
library's `GenerationOptions`), and the engine's finish reasons → OpenAI's.

The tier's values win over the caller's: `priority` comes from the tier alone
and `max_tokens` is capped by `tier.max_tokens_cap`."""

from __future__ import annotations

from client import GenerationOptions

from ..config import TierConfig
from ..core.engine_request import UpstreamRequest, capped_max_tokens
from ..core.errors import GatewayError
from .schemas import ChatCompletionRequest, CompletionRequest, _Sampling

# engine finish reasons that are an answer; the rest (cancelled, timeout, error)
# mean the answer was cut short by a failure and are reported as errors
FINISH_REASONS = {"stop": "stop", "length": "length", "content_filter": "content_filter"}
# roles the chat template knows; `developer` is OpenAI's newer name for `system`
_ROLES = {"developer": "system"}


def check_n(request: _Sampling, max_n: int, prompts: int = 1) -> int:
    n = request.n or 1
    if n * prompts > max_n:
        what = "n" if prompts == 1 else "n × number of prompts"
        raise GatewayError(400, f"{what} must be at most {max_n} (got {n * prompts})", param="n")
    return n


def choice_seed(seed: int | None, choice: int) -> int | None:
    """The seed of a prompt's choice `choice`: one seed for all n choices would
    sample n identical answers; seed + choice keeps the whole answer reproducible."""
    return None if seed is None else (seed + choice) % 2**64


def _options(
    request: _Sampling,
    tier: TierConfig,
    max_tokens: int | None,
    *,
    logprobs: bool,
    messages: list[dict[str, str]] | None,
    request_id: str,
    choice: int,
) -> GenerationOptions:
    return GenerationOptions(
        max_tokens=capped_max_tokens(max_tokens, tier),
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        seed=choice_seed(request.seed, choice),
        min_tokens=request.min_tokens,
        repetition_penalty=request.repetition_penalty,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        stop_words=request.stop_words(),
        ignore_eos=request.ignore_eos,
        messages=messages,
        token_timeout_ms=request.token_timeout_ms,
        priority=tier.priority,
        # completion tokens are counted from the ids (exact usage), and the
        # prompt's from num_input_tokens (asked for by default)
        return_output_ids=True,
        return_log_probs=logprobs or None,
        request_id=request_id,
    )


def chat_messages(request: ChatCompletionRequest) -> list[dict[str, str]]:
    return [{"role": _ROLES.get(m.role, m.role), "content": m.text()} for m in request.messages]


def chat_upstream(
    request: ChatCompletionRequest, tier: TierConfig, max_n: int, request_id: str
) -> list[UpstreamRequest]:
    n = check_n(request, max_n)
    messages = chat_messages(request)
    return [
        UpstreamRequest(
            i,
            "",
            _options(
                request,
                tier,
                request.output_limit(),
                logprobs=bool(request.logprobs),
                messages=messages,
                request_id=f"{request_id}-{i}",
                choice=i,
            ),
        )
        for i in range(n)
    ]


def completion_upstream(
    request: CompletionRequest, tier: TierConfig, max_n: int, request_id: str
) -> list[UpstreamRequest]:
    prompts = request.prompts()
    n = check_n(request, max_n, len(prompts))
    if request.best_of is not None and request.best_of != n:
        raise GatewayError(
            400, f"best_of must equal n ({n}) on this server: it does not rank candidates", param="best_of"
        )
    # OpenAI's order: the choices of prompt 0, then of prompt 1, ...
    return [
        UpstreamRequest(
            p * n + i,
            prompt,
            _options(
                request,
                tier,
                request.output_limit(),
                logprobs=request.wants_logprobs,
                messages=None,
                request_id=f"{request_id}-{p * n + i}",
                choice=i,
            ),
            prompt_index=p,
        )
        for p, prompt in enumerate(prompts)
        for i in range(n)
    ]


def prompt_bytes(upstream: list[UpstreamRequest]) -> int:
    """The text a request brings, each distinct prompt once (the n choices of
    one prompt share it), for the admission estimate."""
    distinct = {item.text_input: item.options.messages or [] for item in upstream}
    return sum(
        len(text.encode()) + sum(len(m["content"].encode()) for m in messages) for text, messages in distinct.items()
    )


def finish_reason(engine_reason: str | None) -> str | None:
    """OpenAI's finish reason, or None when the engine's is a failure."""
    return FINISH_REASONS.get(engine_reason or "")
