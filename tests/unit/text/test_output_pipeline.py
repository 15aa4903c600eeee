from __future__ import annotations

from tokenizers import Tokenizer

from ensemble.outbound.content_filter import ContentFilterRules
from ensemble.outbound.output_pipeline import Emission, OutputConfig, OutputPipeline
from ensemble.outbound.segmenter import SegmentMode


def _stream(
    tokenizer: Tokenizer, text: str, config: OutputConfig, engine_reason: str = "length", eos: bool = False
) -> list[Emission]:
    ids = tokenizer.encode(text, add_special_tokens=False).ids + ([2] if eos else [])
    pipeline = OutputPipeline(tokenizer, config)
    emissions = []
    for token_id in ids:
        emission = pipeline.push([token_id])
        emissions.append(emission)
        if emission.finished:
            break
    emissions.append(pipeline.finish(engine_reason))
    return emissions


def _text(emissions: list[Emission]) -> str:
    return "".join(e.text for e in emissions)


def test_plain_stream_ends_with_the_engine_reason_and_no_special_tokens(tokenizer: Tokenizer) -> None:
    emissions = _stream(tokenizer, "你好，世界！ Paris.", OutputConfig(), engine_reason="stop", eos=True)
    assert _text(emissions) == "你好，世界！ Paris."
    assert all("\ufffd" not in e.text for e in emissions)
    assert [e.finish_reason for e in emissions[:-1]] == [None] * (len(emissions) - 1)
    assert emissions[-1].finish_reason == "stop"


def test_stop_string_ends_the_stream_early_without_the_stop_string(tokenizer: Tokenizer) -> None:
    emissions = _stream(tokenizer, "The answer is 42.\nUser: and more", OutputConfig(stop_strings=["User:"]))
    ended = next(e for e in emissions if e.finished)
    assert ended.finish_reason == "stop"
    assert _text(emissions) == "The answer is 42.\n"
    assert emissions[-1] == Emission("", "stop")  # finish() after a text stop: nothing more, same reason


def test_held_back_text_is_flushed_at_the_end(tokenizer: Tokenizer) -> None:
    config = OutputConfig(stop_strings=["</answer>"], segment=SegmentMode.SENTENCE)
    emissions = _stream(tokenizer, "One. Two </ans", config)
    assert _text(emissions) == "One. Two </ans"
    assert emissions[-1].finish_reason == "length" and emissions[-1].text.endswith("</ans")


def test_content_filter_stop_reports_content_filter(tokenizer: Tokenizer) -> None:
    rules = ContentFilterRules.from_dicts([{"pattern": "危险", "action": "stop"}, {"pattern": "secret"}])
    emissions = _stream(tokenizer, "a secret: 这很危险 indeed", OutputConfig(content_filter=rules))
    assert _text(emissions) == "a ******: 这很"
    assert next(e for e in emissions if e.finished).finish_reason == "content_filter"
    assert emissions[-1].finish_reason == "content_filter"


def test_filter_hit_before_a_stop_string_in_the_same_chunk_wins(tokenizer: Tokenizer) -> None:
    rules = ContentFilterRules.from_dicts([{"pattern": "bad", "action": "stop"}])
    pipeline = OutputPipeline(tokenizer, OutputConfig(stop_strings=["END"], content_filter=rules))
    emission = pipeline.push(tokenizer.encode("ok bad then END", add_special_tokens=False).ids)
    assert emission == Emission("ok ", "content_filter")


def test_sentence_segments_come_whole(tokenizer: Tokenizer) -> None:
    emissions = _stream(tokenizer, "今天天气很好。我们去公园吧！ OK", OutputConfig(segment=SegmentMode.SENTENCE))
    assert [e.text for e in emissions if e.text] == ["今天天气很好。", "我们去公园吧！", " OK"]


def test_finish_is_idempotent(tokenizer: Tokenizer) -> None:
    pipeline = OutputPipeline(tokenizer)
    pipeline.push(tokenizer.encode("hi", add_special_tokens=False).ids)
    assert pipeline.finish("length") == Emission("", "length")
    assert pipeline.finish("length") == Emission("", "length")


def test_pipeline_state_survives_pickling_mid_stream(tokenizer: Tokenizer) -> None:
    """Postprocessing instances hand a stream's pipeline to each other by
    pickling it, with the shared tokenizer and rules passed by reference."""
    import io
    import pickle

    rules = ContentFilterRules.from_dicts([{"pattern": "危险"}])
    config = OutputConfig(stop_strings=["User:"], content_filter=rules, segment=SegmentMode.SENTENCE)
    shared = {id(tokenizer): "tokenizer", id(rules): "rules"}

    def dumps(pipeline: OutputPipeline) -> bytes:
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.persistent_id = lambda obj: shared.get(id(obj))  # type: ignore[method-assign]
        pickler.dump(pipeline)
        return buffer.getvalue()

    def loads(blob: bytes) -> OutputPipeline:
        unpickler = pickle.Unpickler(io.BytesIO(blob))
        unpickler.persistent_load = {"tokenizer": tokenizer, "rules": rules}.__getitem__  # type: ignore[method-assign]
        return unpickler.load()

    ids = tokenizer.encode("这很危险。 Second sentence.\nUser: gone", add_special_tokens=False).ids
    reference = OutputPipeline(tokenizer, config)
    expected = "".join(reference.push([i]).text for i in ids) + reference.finish("length").text

    pipeline, texts, largest = OutputPipeline(tokenizer, config), [], 0
    for token_id in ids:
        texts.append(pipeline.push([token_id]).text)
        blob = dumps(pipeline)
        largest = max(largest, len(blob))
        pipeline = loads(blob)
    texts.append(pipeline.finish("length").text)
    assert "".join(texts) == expected == "这很**。 Second sentence.\n"
    assert largest < 4096  # the tokenizer never travels by value
