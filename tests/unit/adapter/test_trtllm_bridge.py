"""The thin `tensorrt_llm` step's logic (backends/python_llm/trtllm_bridge.py), without
Triton: this project's LLM-step inputs -> TensorRT-LLM's, and TensorRT-LLM's
responses -> the LLM step's replies (finish reasons, continuation counting,
the input echo), with python_llm's output names and shapes."""

from __future__ import annotations

import numpy as np
import pytest

from contract.errors import OVERLOADED_MARKER
from python_llm.engine.config import EngineConfig
from python_llm.engine.core.outputs import RequestOutput
from python_llm.engine.core.sampling_params import InvalidRequestError
from python_llm.engine.worker.model_info import ModelInfo
from python_llm.request_inputs import LLMRequest
from python_llm.response_tensors import output_arrays
from python_llm.trtllm_bridge import (
    BridgeSettings,
    Deadlines,
    EngineCall,
    EngineStream,
    engine_log_probs,
    engine_stop_inputs,
    engine_token_ids,
    prepare,
    reply_arrays,
)
from serving.trtllm.engine_config import ENGINE_INPUTS

KEY = "k" * 32
EOS = [2, 7]


def _settings(**engine: object) -> BridgeSettings:
    model = ModelInfo(model_dir="/m", max_model_len=64, vocab_size=100, num_layers=1, num_kv_heads=1, head_dim=8)
    model.__dict__["eos_token_ids"] = list(EOS)  # what the tokenizer folder would say
    return BridgeSettings(
        engine=EngineConfig(model_dir="/m", **engine),
        model=model,
        engine_model="tensorrt_llm_engine",
        max_live_requests=4,
    )


def _inputs(**extra: object) -> dict[str, np.ndarray]:
    tensors = {
        "input_ids": np.array([[11, 12, 13, 14, 15]], dtype=np.int32),
        "input_lengths": np.array([[5]], dtype=np.int32),
        "request_output_len": np.array([[10]], dtype=np.int32),
        "end_id": np.array([[-1]], dtype=np.int32),
        "streaming": np.array([[True]]),
        "temperature": np.array([[0.0]], dtype=np.float32),
        "request_key": np.array([[KEY.encode()]], dtype=object),
        "request_context": np.array([[b'{"key":"x"}']], dtype=object),
    }
    tensors.update({k: np.asarray(v) for k, v in extra.items()})
    return tensors


def _call(**extra: object) -> EngineCall:
    call = prepare(_inputs(**extra), _settings())
    assert isinstance(call, EngineCall)
    return call


def _scalar(call: EngineCall, name: str):
    return call.inputs[name].reshape(-1)[0].item()


def test_inputs_are_tensorrt_llms_names_with_the_declared_dims():
    call = _call(seed=np.array([[9]], dtype=np.uint64), min_tokens=np.array([[2]]), runtime_top_k=np.array([[5]]))
    declared = {t.name: t for t in ENGINE_INPUTS}
    assert set(call.inputs) <= set(declared)
    assert {"input_ids", "input_lengths", "request_output_len"} <= set(call.inputs)  # the template's required
    for name, array in call.inputs.items():
        assert array.shape[0] == 1 and array.ndim == len(declared[name].dims) + 1, name
    assert call.inputs["input_ids"].tolist() == [[11, 12, 13, 14, 15]]
    assert (_scalar(call, "request_output_len"), _scalar(call, "min_length"), _scalar(call, "random_seed")) == (
        10,
        2,
        9,
    )
    # greedy is TensorRT-LLM's top-1; the echo is the step's own, so the engine sends new tokens only
    assert _scalar(call, "runtime_top_k") == 1 and "temperature" not in call.inputs
    assert _scalar(call, "exclude_input_in_output") is True and _scalar(call, "streaming") is True
    assert call.key == KEY and call.request.context == b'{"key":"x"}'


def test_every_eos_id_stops_one_as_the_end_id_the_others_as_stop_words():
    call = _call(stop_words_list=np.array([[[40, 41, 0], [2, -1, -1]]], dtype=np.int32))
    assert _scalar(call, "end_id") == EOS[0]
    ids, offsets = call.inputs["stop_words_list"][0]
    assert ids[:3].tolist() == [40, 41, 7] and offsets[:2].tolist() == [2, 3]
    chosen = _call(end_id=np.array([[5]], dtype=np.int32))
    assert _scalar(chosen, "end_id") == 5 and "stop_words_list" not in chosen.inputs


def test_sampling_and_ignore_eos():
    call = _call(
        temperature=np.array([[0.7]], dtype=np.float32),
        runtime_top_p=np.array([[0.9]], dtype=np.float32),
        runtime_top_k=np.array([[40]]),
        ignore_eos=np.array([[True]]),
        presence_penalty=np.array([[0.5]], dtype=np.float32),
    )
    assert _scalar(call, "temperature") == pytest.approx(0.7) and _scalar(call, "runtime_top_p") == pytest.approx(0.9)
    assert _scalar(call, "runtime_top_k") == 40 and _scalar(call, "presence_penalty") == pytest.approx(0.5)
    # neutral penalties are left to TensorRT-LLM's defaults
    assert "repetition_penalty" not in call.inputs and "frequency_penalty" not in call.inputs
    # no EOS before max_tokens: TensorRT-LLM masks the end id below min_length
    assert _scalar(call, "min_length") == 10


def test_a_continuation_goes_in_as_input_and_counts_as_output():
    call = _call(continuation_length=np.array([[2]], dtype=np.int32), min_tokens=np.array([[3]]))
    assert call.inputs["input_ids"].tolist() == [[11, 12, 13, 14, 15]]  # prompt 11..13, continuation 14, 15
    assert _scalar(call, "request_output_len") == 8 and _scalar(call, "min_length") == 1
    stream = EngineStream(call, clock=lambda: 5)
    assert stream.num_input_tokens == 3
    first = stream.on_response([21, 22], None, None)
    assert (first.token_ids, first.sequence_length, first.final) == ([21, 22], 2, False)
    # 2 continued + 8 new = max_tokens 10: length, on the response that reaches it
    last = stream.on_response([23, 24, 25, 26, 27, 28], None, None)
    assert (last.final, last.finish_reason, last.sequence_length) == (True, "length", 8)
    assert stream.on_end() is None  # nothing after the final reply


def test_refusals_are_python_llms():
    settings = _settings()
    with pytest.raises(InvalidRequestError, match="^continuation_ids: 10 ids leave nothing"):
        prepare(
            _inputs(
                input_ids=np.array([[1] * 12], dtype=np.int32),
                input_lengths=np.array([[12]]),
                continuation_length=np.array([[10]]),
            ),
            settings,
        )
    with pytest.raises(InvalidRequestError, match=r"^input_ids: token ids must be in \[0, 100\)"):
        prepare(_inputs(input_ids=np.array([[1, 100]], dtype=np.int32), input_lengths=np.array([[2]])), settings)
    with pytest.raises(InvalidRequestError, match="^max_tokens: prompt"):
        prepare(_inputs(request_output_len=np.array([[60]])), settings)
    with pytest.raises(InvalidRequestError, match="^temperature: must be >= 0"):
        prepare(_inputs(temperature=np.array([[-1.0]], dtype=np.float32)), settings)
    with pytest.raises(InvalidRequestError, match="^length_penalty"):
        prepare(_inputs(len_penalty=np.array([[1.5]], dtype=np.float32)), settings)
    with pytest.raises(InvalidRequestError, match="^max_tokens: must be <= 4096"):
        prepare(_inputs(request_output_len=np.array([[5000]])), _settings(max_model_len=None))


def test_a_stop_is_parsed_not_sent():
    stop = prepare(
        {
            "stop": np.array([[True]]),
            "request_key": np.array([[KEY.encode()]], dtype=object),
            "input_ids": np.zeros((1, 1), dtype=np.int32),
        },
        _settings(),
    )
    assert isinstance(stop, LLMRequest) and stop.stop and stop.request_key == KEY
    assert engine_stop_inputs()["stop"].tolist() == [[True]]
    assert set(engine_stop_inputs()) <= {t.name for t in ENGINE_INPUTS}


def test_streaming_replies_end_with_the_reason():
    stream = EngineStream(_call())
    assert stream.on_response([], None, None) is None  # nothing new, nothing sent
    reply = stream.on_response([30, 31], -0.5, [-0.2, -0.3])
    assert (reply.token_ids, reply.sequence_length, reply.cum_log_probs, reply.output_log_probs) == (
        [30, 31],
        2,
        -0.5,
        [-0.2, -0.3],
    )
    final = stream.on_end()  # EOS or a stop word
    assert (final.token_ids, final.final, final.finish_reason, final.sequence_length) == ([], True, "stop", 2)


@pytest.mark.parametrize("reason", ["cancelled", "timeout"])
def test_a_stop_of_this_steps_own_ends_with_its_reason(reason: str):
    stream = EngineStream(_call())
    stream.on_response([30], None, None)
    assert stream.request_stop(reason) and not stream.request_stop("cancelled")  # the first reason holds
    assert stream.on_end().finish_reason == reason


def test_whole_answers_and_the_input_echo():
    call = _call(
        streaming=np.array([[False]]), exclude_input_in_output=np.array([[False]]), continuation_length=np.array([[1]])
    )
    stream = EngineStream(call)
    assert stream.on_response([40, 41], None, None) is None  # one response, at the end
    final = stream.on_end()
    # the ids as sent (prompt, then continuation) lead, as python_llm echoes them
    assert final.token_ids == [11, 12, 13, 14, 15, 40, 41] and final.finish_reason == "stop"
    echo = EngineStream(_call(exclude_input_in_output=np.array([[False]])))
    assert echo.on_response([40], None, None).token_ids == [11, 12, 13, 14, 15, 40]
    assert echo.on_response([41], None, None).token_ids == [41]


def test_engine_errors_and_a_full_queue():
    stream = EngineStream(_call())
    full = stream.on_error(
        "Executor failed process requestId 7 due to the following error: "
        "Maximum queue size of 4 has been reached, please try again later"
    )
    assert full.final and full.error.startswith(OVERLOADED_MARKER)
    other = EngineStream(_call()).on_error("boom")
    assert other.error == "tensorrt_llm: boom" and not other.error.startswith(OVERLOADED_MARKER)


def test_reply_arrays_have_python_llms_names_dtypes_and_shapes():
    stream = EngineStream(_call(), clock=lambda: 123)
    reply = stream.on_response([30, 31], -1.0, [-0.5, -0.5])
    ours = reply_arrays(stream, reply, b"ctx", KEY)
    out = RequestOutput(
        request_id="r",
        new_token_ids=[30, 31],
        new_logprobs=[-0.5, -0.5],
        finished=False,
        finish_reason=None,
        error=None,
        num_prompt_tokens=5,
        num_output_tokens=2,
        num_cached_prompt_tokens=0,
        cum_log_prob=-1.0,
        arrival_time_ns=1,
        first_token_time_ns=2,
        last_token_time_ns=3,
    )
    theirs = output_arrays(out, [30, 31], [-0.5, -0.5], b"ctx", KEY)
    assert set(ours) == set(theirs)
    for name in theirs:
        assert (ours[name].dtype, ours[name].shape) == (theirs[name].dtype, theirs[name].shape), name
        assert ours[name].tolist() == theirs[name].tolist() or name.endswith("time_ns"), name
    assert ours["arrival_time_ns"].tolist() == [[123]] and ours["first_token_time_ns"].tolist() == [[123]]


def test_engine_outputs_are_read_beam_by_beam():
    assert engine_token_ids(np.array([[[5, 6, -1]]], dtype=np.int32)) == [5, 6]
    assert engine_token_ids(None) == []
    assert engine_log_probs(np.array([[-1.5]]), np.array([[[-0.5, -1.0]]])) == (-1.5, [-0.5, -1.0])
    assert engine_log_probs(None, None) == (None, [])


def test_deadlines_report_a_silent_request_once():
    now = [0.0]
    deadlines = Deadlines(clock=lambda: now[0])
    deadlines.start("a", 100)
    deadlines.start("b", 0)  # 0: no timeout
    now[0] = 0.05
    deadlines.touch("a")  # a token came
    now[0] = 0.12
    assert deadlines.expired() == []
    now[0] = 0.2
    assert deadlines.expired() == ["a"] and deadlines.expired() == []
