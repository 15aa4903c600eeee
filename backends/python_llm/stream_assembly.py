"""What the LLM step answers for each engine output of one request.

The engine reports deltas (`RequestOutput`: this step's new tokens, or the
end). The LLM step answers TensorRT-LLM's way: with `streaming` one response
per step carrying the delta (under load, the deltas of the steps since its
last response: `hold_ns`, see response_pacing.py), without it one response at
the end carrying every token; with `exclude_input_in_output` false the prompt
ids lead the first response's ids. An error ends the request with an error response when
nothing was answered yet or the request failed (`finish_reason: error`).

Importable and testable without Triton: `StreamAssembly.respond` returns a
plain decision (`Reply`), and the adapter (`model.py`) only turns it into a
Triton response (`response_tensors.output_arrays` for the tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

from .engine.core.outputs import RequestOutput


@dataclass(slots=True)
class Reply:
    """One response to send. With `error` set it is an error response (and
    final); otherwise it carries `token_ids` and their `logprobs`."""

    token_ids: list[int]
    logprobs: list[float] | None
    final: bool
    error: str | None = None


class StreamAssembly:
    """Per request: engine deltas in, the responses to send out. Called on the
    engine loop thread only, once per output of the request, in order."""

    __slots__ = ("streaming", "exclude_input", "prompt_ids", "replied", "_ids", "_logprobs", "_last_sent_ns")

    def __init__(self, streaming: bool, prompt_ids: list[int], exclude_input: bool) -> None:
        self.streaming = streaming
        self.exclude_input = exclude_input
        self.prompt_ids = prompt_ids  # echoed when exclude_input_in_output is false
        self.replied = False  # a Reply was returned (the prompt echo went out)
        self._ids: list[int] = []  # not answered yet: stream=false everything, else held tokens
        self._logprobs: list[float] = []
        self._last_sent_ns = 0  # streaming: the last response's last_token_time_ns

    def respond(self, out: RequestOutput, hold_ns: int = 0) -> Reply | None:
        """The response this output calls for; None when it calls for none (a
        streaming step that returned no token and did not finish, one whose
        tokens are held because the last response went out less than
        `hold_ns` before them, or a step of a non-streaming request before its
        end). Runs once per token of a streaming request: kept to one call."""
        if out.error is not None and (not self.replied or out.finish_reason == "error"):
            self.replied = True
            return Reply([], None, True, out.error)
        if self.streaming:
            ids = out.new_token_ids
            logprobs = out.new_logprobs
            if not out.finished:
                if not ids:
                    return None
                if self.replied and (out.last_token_time_ns or 0) - self._last_sent_ns < hold_ns:
                    self._ids.extend(ids)
                    self._logprobs.extend(logprobs or ())
                    return None
            if self._ids:  # held tokens lead
                ids = self._ids + ids
                logprobs = self._logprobs + (logprobs or []) if self._logprobs else logprobs
                self._ids, self._logprobs = [], []
            if not self.exclude_input and not self.replied:
                ids = self.prompt_ids + ids
            self.replied = True
            self._last_sent_ns = out.last_token_time_ns or 0
            return Reply(ids, logprobs, out.finished)
        self._ids.extend(out.new_token_ids)
        if out.new_logprobs:
            self._logprobs.extend(out.new_logprobs)
        if not out.finished:
            return None
        self.replied = True
        ids = self._ids if self.exclude_input else self.prompt_ids + self._ids
        return Reply(ids, self._logprobs or None, True)
