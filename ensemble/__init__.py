"""Text stages of the LLM pipeline, free of Triton: prompt building and
tokenization on the way in; detokenization, stop strings, content filtering
and segmentation on the way out. The Triton models in model_repository/ are
thin adapters over this package."""
from __future__ import annotations

from .content_filter import ContentFilter, ContentFilterRules, FilterAction, FilterResult, FilterRule
from .detokenizer import IncrementalDetokenizer
from .errors import InvalidInputError, decode_utf8_field
from .output_pipeline import FINISH_CONTENT_FILTER, FINISH_STOP, Emission, OutputConfig, OutputPipeline
from .prompt import BuiltPrompt, PromptBuilder, PromptConfig, parse_messages
from .request_state import RequestStateStore
from .segmenter import Segmenter, SegmentMode
from .stop_strings import StopResult, StopStringMatcher
from .tokenizer_info import TokenizerInfo, load_tokenizer_info
from .word_lists import encode_word_list, parse_word_list, to_word_list, validate_words, word_spellings

__all__ = [
    "BuiltPrompt", "ContentFilter", "ContentFilterRules", "Emission", "FINISH_CONTENT_FILTER", "FINISH_STOP",
    "FilterAction", "FilterResult", "FilterRule", "IncrementalDetokenizer", "InvalidInputError",
    "OutputConfig", "OutputPipeline", "PromptBuilder", "PromptConfig", "RequestStateStore", "SegmentMode",
    "Segmenter", "StopResult", "StopStringMatcher", "TokenizerInfo", "decode_utf8_field", "encode_word_list",
    "load_tokenizer_info", "parse_messages", "parse_word_list", "to_word_list", "validate_words",
    "word_spellings",
]
