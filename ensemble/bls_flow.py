"""`llm_bls`: the ensemble's three steps orchestrated in Python for one
request. Triton-free: the adapter passes in how to call the LLM step, how to
stop it and how to answer, so tests drive it with fakes.

Unlike the ensemble, this flow sees its own client's cancellation (SSE
disconnect, gRPC cancel) and turns it into a `stop` of its engine request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from contract.errors import InvalidInputError

from .inbound.llm_request import Getter, LLMRequestBuilder, llm_inputs, scalar
from .outbound.public_outputs import LLMResponse, ReturnFlags, public_output_arrays
from .outbound.stream_postprocessor import StreamPostprocessor
from .request_context import RequestContext

Arrays = dict[str, np.ndarray]


class LLMStepError(RuntimeError):
    """The LLM step answered with an error; its message goes to the client."""


@dataclass
class BLSCallbacks:
    call_llm: Callable[[Arrays], Iterator[LLMResponse]]  # raises LLMStepError
    stop_llm: Callable[[str], None]  # stop by request key
    send: Callable[[Arrays, bool], None]  # (public arrays, final)
    send_error: Callable[[str], None]  # final error response
    is_cancelled: Callable[[], bool]


def run_bls_request(get: Getter, builder: LLMRequestBuilder, post: StreamPostprocessor, io: BLSCallbacks) -> str:
    """Serve one request to the end; returns how it ended (a finish reason)."""
    try:
        pre = builder.build(get)
    except InvalidInputError as exc:
        io.send_error(str(exc))
        return "error"
    # The text-stage fields as the builder validated and packed them for
    # `postprocessing`: read from there, so each is parsed once.
    context = RequestContext.from_json(scalar(pre.get, "request_context"))
    key = context.key
    pipeline = post.new_pipeline(context.stop_words, context.segment, context.primed_ids)
    flags = ReturnFlags.of(context)
    stopped_engine = False
    sent_any = False
    try:
        for response in io.call_llm(llm_inputs(pre, get)):
            if io.is_cancelled():
                if not stopped_engine:
                    io.stop_llm(key)
                    stopped_engine = True
                if response.finish_reason:  # the engine freed it; close the request
                    io.send(public_output_arrays("", "cancelled", response, flags, key), True)
                    return "cancelled"
                continue  # drain until the engine's final response
            emission = pipeline.push(response.token_ids)
            if pipeline.finish_reason is not None and not stopped_engine and not response.finish_reason:
                io.stop_llm(key)  # a stop string / filter ended it: free the KV now
                stopped_engine = True
            if response.finish_reason:
                final = pipeline.finish(response.finish_reason)
                io.send(
                    public_output_arrays(emission.text + final.text, final.finish_reason, response, flags, key), True
                )
                return final.finish_reason or response.finish_reason
            if emission.text or not stopped_engine:
                io.send(public_output_arrays(emission.text, None, response, flags, key), False)
                sent_any = True
    except LLMStepError as exc:
        io.send_error(str(exc))
        return "error"
    if io.is_cancelled():
        return "cancelled"
    # the LLM step ended without a final response: say so rather than hang up silently
    io.send_error(
        "llm_bls: the LLM step ended the stream without a final response"
        if sent_any
        else "llm_bls: the LLM step returned nothing"
    )
    return "error"
