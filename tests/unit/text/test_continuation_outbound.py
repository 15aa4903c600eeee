"""A migrated stream's text stages: the pipeline is primed with the
continuation's ids, so what the new replica emits is exactly what the dead
one had not emitted yet (an incomplete character, a possible stop string, an
unfinished segment), and the two together equal an uninterrupted stream."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from ensemble.bls_flow import run_bls_request
from ensemble.inbound.llm_request import EngineMaxTokens, LLMRequestBuilder
from ensemble.inbound.prompt import PromptBuilder
from ensemble.outbound.content_filter import ContentFilterRules
from ensemble.outbound.output_pipeline import OutputConfig, OutputPipeline
from ensemble.outbound.segmenter import SegmentMode
from ensemble.outbound.shared_state import InProcessStateStore, SqliteStateStore
from ensemble.outbound.stream_postprocessor import LLMDelta, StreamPostprocessor
from ensemble.tokenizer_info import TokenizerInfo
from tests.unit.text.test_bls_flow import KEY, FakeLLM

PARROT = "Paris 🦜 ok"


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def _run(pipeline: OutputPipeline, ids: list[int], finish: str | None) -> list[str]:
    """Deltas of one replica, a token per step; `finish` None: it died."""
    texts = []
    for token in ids:
        emission = pipeline.push([token])
        texts.append(emission.text)
        if emission.finished:
            break
    if finish is not None:
        texts.append(pipeline.finish(finish).text)
    return texts


def _migrated(tokenizer: Tokenizer, config: OutputConfig, ids: list[int], switch: int) -> tuple[list[str], list[str]]:
    """(what the first replica emitted before dying, what the second one emits)."""
    first = _run(OutputPipeline(tokenizer, config), ids[:switch], None)
    second = OutputPipeline(tokenizer, config)
    second.prime(ids[:switch])
    return first, _run(second, ids[switch:], "length")


CONFIGS = {
    "plain": OutputConfig(),
    "stop": OutputConfig(stop_strings=("STOP", "🦜 o")),
    "sentence": OutputConfig(segment=SegmentMode.SENTENCE),
    "filter": OutputConfig(content_filter=ContentFilterRules.from_dicts([{"pattern": "secret"}])),
}
TEXTS = ("你好，世界！ Paris. 🦜 ok", "The end. STOP here", "a secret word. Then 鳄 more", PARROT)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("text", TEXTS)
def test_any_switch_point_reproduces_the_uninterrupted_text(tokenizer: Tokenizer, config: str, text: str) -> None:
    ids = _ids(tokenizer, text)
    whole = "".join(_run(OutputPipeline(tokenizer, CONFIGS[config]), ids, "length"))
    for switch in range(1, len(ids)):
        first, second = _migrated(tokenizer, CONFIGS[config], ids, switch)
        assert "".join(first + second) == whole, switch
        assert not any("\ufffd" in t for t in first + second)


def test_a_character_split_across_the_switch_comes_whole(tokenizer: Tokenizer) -> None:
    ids = _ids(tokenizer, PARROT)  # "Paris", " \xf0\x9f", "\xa6", "\x9c", " ok"
    first, second = _migrated(tokenizer, OutputConfig(), ids, 2)
    assert "".join(first) == "Paris "  # the half character was held back
    assert second[:2] == ["", "🦜"] and "".join(second) == "🦜 ok"


def test_a_stop_string_spanning_the_switch_stops_with_nothing_of_it_emitted(tokenizer: Tokenizer) -> None:
    ids = _ids(tokenizer, "The end. STOP here")  # ..., " ST", "OP", " here"
    switch = [tokenizer.decode([t]) for t in ids].index(" ST") + 1
    config = OutputConfig(stop_strings=("STOP",))
    first, _ = _migrated(tokenizer, config, ids, switch)
    assert "".join(first) == "The end. "
    second = OutputPipeline(tokenizer, config)
    second.prime(ids[:switch])
    emission = second.push(ids[switch : switch + 1])
    assert emission.text == "" and emission.finish_reason == "stop"


def test_a_held_prefix_is_released_when_the_stop_does_not_match(tokenizer: Tokenizer) -> None:
    prefix = _ids(tokenizer, "The end. ST")
    pipeline = OutputPipeline(tokenizer, OutputConfig(stop_strings=("STOP",)))
    pipeline.prime(prefix)
    emission = pipeline.push(_ids(tokenizer, "ING"))
    assert emission.text == "STING" and emission.finish_reason is None


def test_an_unfinished_sentence_is_emitted_whole_by_the_new_replica(tokenizer: Tokenizer) -> None:
    ids = _ids(tokenizer, "One. Two three. Four")
    switch = len(_ids(tokenizer, "One. Two"))
    first, second = _migrated(tokenizer, OutputConfig(segment=SegmentMode.SENTENCE), ids, switch)
    assert "".join(first) == "One."
    assert [t for t in second if t] == [" Two three.", " Four"]


@pytest.mark.parametrize("store", ["in_process", "sqlite"])
def test_the_streaming_step_primes_a_new_stream_once(tokenizer: Tokenizer, tmp_path: Path, store: str) -> None:
    states = InProcessStateStore() if store == "in_process" else SqliteStateStore(str(tmp_path / "s.sqlite"))
    post = StreamPostprocessor(tokenizer, states)
    ids = _ids(tokenizer, PARROT)
    primed, new = ids[:2], ids[2:]
    texts = []
    for index, token in enumerate(new):  # sequence_length counts the new tokens only
        reason = "length" if index == len(new) - 1 else None
        result = post.process(LLMDelta(KEY, [token], index + 1, reason, streaming=True), primed_ids=primed)
        texts.append(result.text)
    assert texts == ["", "🦜", " ok"] and result.finish_reason == "length"


def test_the_streaming_step_stops_the_engine_on_a_stop_spanning_the_switch(tokenizer: Tokenizer) -> None:
    post = StreamPostprocessor(tokenizer, InProcessStateStore())
    ids = _ids(tokenizer, "The end. STOP here")
    switch = [tokenizer.decode([t]) for t in ids].index(" ST") + 1
    result = post.process(
        LLMDelta(KEY, ids[switch : switch + 1], 1, None, streaming=True), stop_strings=["STOP"], primed_ids=ids[:switch]
    )
    assert result.text == "" and result.stop_engine
    final = post.process(LLMDelta(KEY, [], 1, "cancelled", streaming=True), stop_strings=["STOP"])
    assert final.finish_reason == "stop"


def test_a_whole_answer_carries_only_the_new_text(tokenizer: Tokenizer) -> None:
    post = StreamPostprocessor(tokenizer, InProcessStateStore())
    ids = _ids(tokenizer, PARROT)
    result = post.process(LLMDelta(KEY, ids[2:], 3, "length", streaming=False), primed_ids=ids[:2])
    assert result.text == "🦜 ok" and result.finish_reason == "length"


def test_llm_bls_primes_its_pipeline_and_stops_the_engine_on_a_spanning_stop(
    tokenizer_info: TokenizerInfo, tokenizer: Tokenizer
) -> None:
    builder = LLMRequestBuilder(
        tokenizer_info, PromptBuilder(tokenizer_info), EngineMaxTokens(default_max_tokens=128, max_tokens_limit=4096)
    )
    post = StreamPostprocessor(tokenizer, InProcessStateStore())
    ids = _ids(tokenizer, "The end. STOP here")
    switch = [tokenizer.decode([t]) for t in ids].index(" ST") + 1
    llm = FakeLLM([([token], None) for token in ids[switch:]] + [([], "cancelled")])
    inputs = {
        "text_input": np.asarray([[b"Q"]], dtype=np.object_),
        "stream": np.asarray([[True]]),
        "stop_words": np.asarray([[b"STOP"]], dtype=np.object_),
        "request_key": np.asarray([[KEY.encode()]], dtype=np.object_),
        "continuation_ids": np.asarray([ids[:switch]], dtype=np.int32),
    }
    assert run_bls_request(inputs.get, builder, post, llm.callbacks()) == "stop"
    assert llm.calls[0]["continuation_length"].tolist() == [[switch]]
    assert "".join(llm.texts()) == "" and llm.stops == [KEY]
