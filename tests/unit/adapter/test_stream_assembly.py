"""The LLM step's answers to engine outputs (stream_assembly.py): streamed
deltas, non-streamed accumulation, prompt echo, errors, final flags."""

from __future__ import annotations

import numpy as np

from python_llm.engine.core.outputs import RequestOutput
from python_llm.response_tensors import output_arrays
from python_llm.stream_assembly import Reply, StreamAssembly

PROMPT = [1, 2, 3]


def out(
    ids: list[int],
    finished: bool = False,
    reason: str | None = None,
    error: str | None = None,
    logprobs: list[float] | None = None,
    returned: int = 0,
) -> RequestOutput:
    return RequestOutput(
        "r",
        ids,
        logprobs,
        finished,
        reason,
        error,
        len(PROMPT),
        returned,
        0,
        None if logprobs is None else sum(logprobs),
        1,
        2,
        3,
    )


def replies(assembly: StreamAssembly, outputs: list[RequestOutput]) -> list[Reply | None]:
    return [assembly.respond(o) for o in outputs]


def test_streaming_sends_each_delta_and_marks_only_the_last_final() -> None:
    assembly = StreamAssembly(streaming=True, prompt_ids=PROMPT, exclude_input=True)
    got = replies(assembly, [out([5]), out([6]), out([], True, "stop")])
    assert got == [Reply([5], None, False), Reply([6], None, False), Reply([], None, True)]


def test_streaming_step_without_tokens_sends_nothing_until_the_end() -> None:
    assembly = StreamAssembly(streaming=True, prompt_ids=PROMPT, exclude_input=True)
    assert assembly.respond(out([])) is None and not assembly.replied
    assert assembly.respond(out([], True, "timeout")) == Reply([], None, True)


def test_streaming_echoes_the_prompt_once_before_the_first_delta() -> None:
    assembly = StreamAssembly(streaming=True, prompt_ids=PROMPT, exclude_input=False)
    got = replies(assembly, [out([5], logprobs=[-0.5]), out([6], True, "length", logprobs=[-0.25])])
    assert got == [Reply([1, 2, 3, 5], [-0.5], False), Reply([6], [-0.25], True)]


def test_non_streaming_accumulates_into_one_final_response() -> None:
    assembly = StreamAssembly(streaming=False, prompt_ids=PROMPT, exclude_input=True)
    got = replies(
        assembly, [out([5], logprobs=[-0.5]), out([6], logprobs=[-0.25]), out([7], True, "length", logprobs=[-1.0])]
    )
    assert got == [None, None, Reply([5, 6, 7], [-0.5, -0.25, -1.0], True)]


def test_non_streaming_echo_leads_with_the_prompt_and_no_logprobs_mean_none() -> None:
    assembly = StreamAssembly(streaming=False, prompt_ids=PROMPT, exclude_input=False)
    got = replies(assembly, [out([5]), out([], True, "stop")])
    assert got == [None, Reply([1, 2, 3, 5], None, True)]


def test_an_error_before_the_first_response_is_an_error_response() -> None:
    for streaming in (True, False):
        assembly = StreamAssembly(streaming=streaming, prompt_ids=PROMPT, exclude_input=False)
        assert assembly.respond(out([], True, "error", "engine failed: boom")) == Reply(
            [], None, True, "engine failed: boom"
        )
    # non-streaming: tokens were made but nothing was answered yet
    assembly = StreamAssembly(streaming=False, prompt_ids=PROMPT, exclude_input=True)
    assert assembly.respond(out([5])) is None
    assert assembly.respond(out([], True, "cancelled", "output callback failed")) == Reply(
        [], None, True, "output callback failed"
    )


def test_an_error_after_the_first_response_ends_with_an_error_only_when_the_request_failed() -> None:
    assembly = StreamAssembly(streaming=True, prompt_ids=PROMPT, exclude_input=True)
    assert assembly.respond(out([5])) == Reply([5], None, False)
    assert assembly.respond(out([], True, "error", "engine failed: boom")) == Reply(
        [], None, True, "engine failed: boom"
    )
    # any other ending keeps its finish_reason and sends the usual final response
    assembly = StreamAssembly(streaming=True, prompt_ids=PROMPT, exclude_input=True)
    assert assembly.respond(out([5])) == Reply([5], None, False)
    assert assembly.respond(out([], True, "cancelled", "stopped")) == Reply([], None, True)


def test_a_reply_becomes_the_steps_output_arrays() -> None:
    assembly = StreamAssembly(streaming=True, prompt_ids=PROMPT, exclude_input=False)
    last = out([5], returned=1, logprobs=[-0.5])
    reply = assembly.respond(last)
    assert reply is not None
    arrays = output_arrays(last, reply.token_ids, reply.logprobs, b"ctx", "k" * 32)
    assert arrays["output_ids"].tolist() == [[[1, 2, 3, 5]]] and arrays["output_ids"].dtype == np.int32
    assert arrays["output_log_probs"].tolist() == [[[-0.5]]]
    assert arrays["sequence_length"].tolist() == [[1]] and arrays["num_input_tokens"].tolist() == [[3]]
    assert arrays["request_context"].tolist() == [[b"ctx"]]
    assert arrays["request_key"].tolist() == [[b"k" * 32]]


def at(ids: list[int], t_ns: int, finished: bool = False, logprobs: list[float] | None = None) -> RequestOutput:
    o = out(ids, finished, "length" if finished else None, logprobs=logprobs)
    o.last_token_time_ns = t_ns
    return o


def test_under_load_a_streams_tokens_are_held_and_sent_together_but_never_its_first_or_its_end() -> None:
    assembly = StreamAssembly(streaming=True, prompt_ids=PROMPT, exclude_input=True)
    hold = 100
    got = [
        assembly.respond(o, hold)
        for o in (
            at([5], 10, logprobs=[-1.0]),
            at([6], 40, logprobs=[-2.0]),
            at([7], 80, logprobs=[-3.0]),
            at([8], 110, logprobs=[-4.0]),
            at([9], 130, logprobs=[-5.0]),
            at([], 140, True),
        )
    ]
    assert got == [
        Reply([5], [-1.0], False),
        None,
        None,
        Reply([6, 7, 8], [-2.0, -3.0, -4.0], False),
        None,
        Reply([9], [-5.0], True),
    ]


def test_held_tokens_follow_the_prompt_echo_and_no_hold_means_every_step() -> None:
    echo = StreamAssembly(streaming=True, prompt_ids=PROMPT, exclude_input=False)
    assert echo.respond(at([5], 10), 100) == Reply([1, 2, 3, 5], None, False)
    assert echo.respond(at([6], 20), 100) is None
    assert echo.respond(at([7], 200), 100) == Reply([6, 7], None, False)
    plain = StreamAssembly(streaming=True, prompt_ids=PROMPT, exclude_input=True)
    assert [plain.respond(at([i], i), 0) for i in (1, 2, 3)] == [Reply([i], None, False) for i in (1, 2, 3)]


def test_the_pacing_holds_streams_x_answer_time_over_the_share_at_most_the_max_hold() -> None:
    from python_llm.response_pacing import ResponsePacing

    pacing = ResponsePacing(share=0.1, max_hold_s=0.3)
    pacing.record_response(0.0004)
    step_1 = [pacing.hold_ns(at([1], 1000)) for _ in range(8)]
    assert step_1[-1] == int(8 * 0.0004 / 0.1 * 1e9), "8 streams answered in this step"
    assert pacing.hold_ns(at([1], 2000)) == step_1[-1], "the last step's streams count until this one has more"
    assert pacing.hold_ns(at([], 2000, True)) == 0, "an end is never held"
    for _ in range(200):
        pacing.record_response(0.05)  # one stream x 50 ms / 0.1 = 0.5 s
    assert pacing.hold_ns(at([1], 3000)) == int(0.3 * 1e9)
    off = ResponsePacing(share=0.0, max_hold_s=0.3)
    off.record_response(0.01)
    assert off.hold_ns(at([1], 1000)) == 0
