"""The python_llm adapter's Triton-free parts: parameters, input tensors,
stream bookkeeping."""

from __future__ import annotations

import time

import numpy as np
import pytest

from python_llm.config_params import engine_config_from_parameters
from python_llm.engine.config import ConfigError
from python_llm.engine.core.errors import DuplicateRequestError
from python_llm.engine.core.sampling_params import InvalidRequestError
from python_llm.live_streams import (
    CANCEL_CHECK_INTERVAL_S,
    CANCEL_CHECK_MAX_INTERVAL_S,
    CANCEL_CHECK_SHARE,
    LiveStream,
    LiveStreamTable,
)
from python_llm.request_inputs import parse_llm_request
from python_llm.stream_assembly import StreamAssembly

KEY_1 = "k" * 32
KEY_2 = "Zz_-" * 8
OUTPUTS = frozenset({"output_ids", "sequence_length"})


def test_parameters_become_a_validated_engine_config():
    config = engine_config_from_parameters(
        {
            "model_dir": "/m",
            "max_queue_size": "3",
            "enable_kv_cache_reuse": "false",
            "dtype": "bfloat16",
            "gpt_model_type": "inflight_fused_batching",
            "kv_cache_free_gpu_mem_fraction": "0.5",
        }
    )
    assert (config.max_queue_size, config.enable_kv_cache_reuse, config.dtype) == (3, False, "bfloat16")
    assert config.kv_cache_free_gpu_mem_fraction == 0.5
    with pytest.raises(ConfigError, match="model_dir"):
        engine_config_from_parameters({})
    with pytest.raises(ConfigError, match="enable_kv_cache_reuse"):
        engine_config_from_parameters({"model_dir": "/m", "enable_kv_cache_reuse": "maybe"})


def test_word_lists_in_tensorrt_llm_layout_reach_the_sampling_params():
    # the LLM step reads them with the text stages' parser (ensemble/inbound/word_lists.py)
    words = {
        "input_ids": np.array([[1, 2]], dtype=np.int32),
        "stop_words_list": np.array([[[5, 6, 7, 0], [2, 3, -1, -1]]], dtype=np.int32),
        "bad_words_list": np.zeros((1, 2, 0), dtype=np.int32),
    }
    request = parse_llm_request(words)
    assert request.sampling.stop_words_ids == [[5, 6], [7]] and request.sampling.bad_words_ids == []
    with pytest.raises(InvalidRequestError, match=r"^stop_words_list: offsets must increase"):
        parse_llm_request({**words, "stop_words_list": np.array([[1, 2], [3, -1]], dtype=np.int32)})


def test_inputs_become_an_engine_request():
    tensors = {
        "input_ids": np.array([[1, 2, 3, 4]], dtype=np.int32),
        "input_lengths": np.array([[3]]),
        "request_output_len": np.array([[9]]),
        "temperature": np.array([[0.0]], dtype=np.float32),
        "end_id": np.array([[-1]]),
        "streaming": np.array([[True]]),
        "request_key": np.array([[KEY_1.encode()]], dtype=object),
    }
    request = parse_llm_request(tensors)
    assert request.prompt_token_ids == [1, 2, 3]
    assert request.sampling.max_tokens == 9 and request.sampling.greedy
    assert request.sampling.stop_token_ids is None  # -1: all of the model's EOS ids
    assert parse_llm_request({**tensors, "end_id": np.array([[5]])}).sampling.stop_token_ids == [5]
    assert request.streaming and request.request_key == KEY_1
    # absent request_output_len: None, the engine's default_max_tokens
    without_len = {k: v for k, v in tensors.items() if k != "request_output_len"}
    assert parse_llm_request(without_len).sampling.max_tokens is None
    # it only converts: the engine validates each value once, at intake
    unchecked = parse_llm_request(
        {**tensors, "request_output_len": np.array([[101]]), "temperature": np.array([[-1.0]])}
    )
    assert (unchecked.sampling.max_tokens, unchecked.sampling.temperature) == (101, -1.0)
    with pytest.raises(InvalidRequestError, match="input_ids"):
        parse_llm_request({})
    stop = parse_llm_request({"stop": np.array([[True]]), "request_key": np.array([[KEY_1.encode()]], dtype=object)})
    assert stop.stop and stop.request_key == KEY_1
    assert parse_llm_request({"stop": np.array([[True]])}).request_key is None


@pytest.mark.parametrize(
    "key", [b"k1", b"x" * 31, b"x" * 129, b"spaces are not allowed in a key ok", "é".encode() * 32]
)
def test_a_malformed_request_key_is_refused_naming_it(key):
    tensors = {"input_ids": np.array([[1, 2]], dtype=np.int32), "request_key": np.array([[key]], dtype=object)}
    with pytest.raises(InvalidRequestError, match="^request_key: must be 32 to 128 characters"):
        parse_llm_request(tensors)
    with pytest.raises(InvalidRequestError, match="^request_key: "):
        parse_llm_request({**tensors, "stop": np.array([[True]])})


class FakeSender:
    def __init__(self, check_seconds: float = 0.0) -> None:
        self.cancelled = False
        self.cancel_checks = 0
        self.check_seconds = check_seconds  # how long a check's round trip takes
        self.sent: list[tuple[object, int]] = []

    def is_cancelled(self) -> bool:
        self.cancel_checks += 1
        if self.check_seconds:
            time.sleep(self.check_seconds)
        return self.cancelled

    def send(self, response=None, flags: int = 0) -> None:
        self.sent.append((response, flags))


def live(engine_id: str, key: str, client_id: str | None, sender) -> LiveStream:
    assembly = StreamAssembly(streaming=True, prompt_ids=[1], exclude_input=True)
    return LiveStream(engine_id, key, client_id, sender, assembly, requested_outputs=OUTPUTS)


def test_registry_names_cancels_and_closes_streams():
    registry = LiveStreamTable()
    sender = FakeSender()
    stream = live("engine-1", KEY_1, "client-1", sender)
    registry.register(stream)
    with pytest.raises(DuplicateRequestError, match="^request id: 'client-1' is already running"):
        registry.register(live("engine-2", KEY_2, "client-1", FakeSender()))
    with pytest.raises(DuplicateRequestError, match="^request_key: already used") as refused:
        registry.register(live("engine-3", KEY_1, "client-3", FakeSender()))
    assert KEY_1 not in str(refused.value)  # a refusal never echoes a key
    assert registry.engine_id_for_key(KEY_1) == "engine-1"
    # the request id and the engine id are not credentials
    assert registry.engine_id_for_key("client-1") is None and registry.engine_id_for_key("engine-1") is None
    assert not registry.is_newly_cancelled(stream, now=100.0)
    sender.cancelled = True
    asked = sender.cancel_checks
    # a round trip to tritonserver: asked at most every CANCEL_CHECK_INTERVAL_S
    assert not registry.is_newly_cancelled(stream, now=100.0 + CANCEL_CHECK_INTERVAL_S / 2)
    assert sender.cancel_checks == asked
    assert registry.is_newly_cancelled(stream, now=100.0 + CANCEL_CHECK_INTERVAL_S)
    assert not registry.is_newly_cancelled(stream, now=200.0)  # reported once
    stream.send("last", 1, final=True)
    stream.send("after", 0, final=False)  # never touches a closed sender
    assert sender.sent == [("last", 1)]
    registry.remove("engine-1")
    assert registry.engine_id_for_key(KEY_1) is None and len(registry) == 0
    registry.register(live("engine-4", KEY_1, "client-1", FakeSender()))  # both free again


def test_cancel_checks_of_many_streams_are_spaced_to_their_share_of_the_callers_time():
    registry = LiveStreamTable()
    slow = 0.002  # a round trip of 2 ms: sleep() lasts at least that
    streams = [live(f"engine-{i}", f"{KEY_1[:-2]}{i:02d}", None, FakeSender(slow)) for i in range(5)]
    for stream in streams:
        registry.register(stream)
    assert registry.cancel_check_interval() == CANCEL_CHECK_INTERVAL_S  # nothing measured yet
    first = streams[0]
    assert not registry.is_newly_cancelled(first, now=100.0)
    assert registry.cancel_check_seconds >= slow
    # 5 streams x >= 2 ms / share: at least a second between a stream's checks
    spaced = min(CANCEL_CHECK_MAX_INTERVAL_S, 5 * slow / CANCEL_CHECK_SHARE)
    assert spaced > 2 * CANCEL_CHECK_INTERVAL_S
    assert registry.cancel_check_interval() >= spaced
    first.sender.cancelled = True
    assert not registry.is_newly_cancelled(first, now=100.0 + spaced / 2)
    assert first.sender.cancel_checks == 1
    # never longer than the cap, however many streams and however slow
    assert registry.is_newly_cancelled(first, now=100.0 + CANCEL_CHECK_MAX_INTERVAL_S)
    registry.cancel_check_seconds = 1.0
    assert registry.cancel_check_interval() == CANCEL_CHECK_MAX_INTERVAL_S
    # few streams, fast checks: every CANCEL_CHECK_INTERVAL_S, as before
    for stream in streams[1:]:
        registry.remove(stream.engine_id)
    registry.cancel_check_seconds = 0.0002
    assert registry.cancel_check_interval() == CANCEL_CHECK_INTERVAL_S


def test_a_length_penalty_other_than_neutral_is_refused():
    base = {"input_ids": np.array([[1, 2]], dtype=np.int32)}
    assert parse_llm_request({**base, "len_penalty": np.array([[1.0]], dtype=np.float32)}).prompt_token_ids == [1, 2]
    with pytest.raises(InvalidRequestError, match=r"^length_penalty \(len_penalty\): 0.5 applies to beam search"):
        parse_llm_request({**base, "len_penalty": np.array([[0.5]], dtype=np.float32)})


def test_a_request_whose_answer_failed_leaves_the_registry_and_its_client_gets_a_final_error():
    registry = LiveStreamTable()
    answered, closed, broken = FakeSender(), FakeSender(), FakeSender()
    registry.register(live("e-1", KEY_1, "c-1", answered))
    assert registry.end_failed("e-1", "error", 1)
    assert answered.sent == [("error", 1)] and registry.engine_id_for_key(KEY_1) is None and len(registry) == 0
    assert not registry.end_failed("e-1", "error", 1), "once only"
    stream = live("e-2", KEY_2, "c-2", closed)
    registry.register(stream)
    stream.send("last", 1, final=True)
    assert not registry.end_failed("e-2", "error", 1) and closed.sent == [("last", 1)], "never after a final"

    def refuse(response=None, flags=0):
        raise RuntimeError("the client is gone")

    broken.send = refuse
    registry.register(live("e-3", KEY_1, "c-3", broken))
    assert not registry.end_failed("e-3", "error", 1) and len(registry) == 0
