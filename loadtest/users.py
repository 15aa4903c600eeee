"""Locust users: one streaming request per task over SSE, gRPC or the
gateway's OpenAI API, a share of
them abandoned mid-way, and "burst-silence" users that send several turns in
quick succession and then go quiet."""

from __future__ import annotations

import functools
import os
import random
from typing import Any

import httpx
from locust import User, task

from .dataset import PromptDataset
from .openai_stream import run_openai
from .reporting import SampleLog, report_outcome
from .settings import LoadSettings
from .streams import StreamOutcome, StreamRequest, new_stream_request, run_grpc, run_sse
from .tokens import TokenCounter


@functools.lru_cache(maxsize=1)
def shared() -> tuple[LoadSettings, PromptDataset, TokenCounter, SampleLog]:
    """Loaded once per Locust process, shared by all its users."""
    settings = LoadSettings.from_env()
    dataset = PromptDataset.from_jsonl(
        settings.dataset, settings.max_tokens, settings.fixed_max_tokens, seed=settings.seed or None
    )
    return (
        settings,
        dataset,
        TokenCounter.from_model_dir(settings.tokenizer_dir or None),
        SampleLog(settings.samples_path or None),
    )


class StreamingUser(User):
    abstract = True

    def on_start(self) -> None:
        self.settings, self.dataset, self.counter, self.samples = shared()
        self.rng = random.Random()

    def wait_time(self) -> float:
        mean = self.settings.think_time_s
        return self.rng.expovariate(1.0 / mean) if mean > 0 else 0.0

    def next_request(self) -> StreamRequest:
        return new_stream_request(self.settings, self.dataset.sample(), self.rng)

    def stream_once(self, request: StreamRequest) -> StreamOutcome:
        raise NotImplementedError

    @task
    def one_stream(self) -> None:
        outcome = self.stream_once(self.next_request())
        report_outcome(self.environment.events, outcome, self.counter, self.samples)


class SseUser(StreamingUser):
    def on_start(self) -> None:
        super().on_start()
        self.http = httpx.Client(base_url=self.settings.http_url)

    def on_stop(self) -> None:
        self.http.close()

    def stream_once(self, request: StreamRequest) -> StreamOutcome:
        return run_sse(self.http, request, self.settings.token_timeout_s)


class GrpcUser(StreamingUser):
    def on_start(self) -> None:
        super().on_start()
        import tritonclient.grpc as grpcclient

        self.grpc: Any = grpcclient.InferenceServerClient(self.settings.grpc_url)

    def on_stop(self) -> None:
        self.grpc.close()

    def stream_once(self, request: StreamRequest) -> StreamOutcome:
        return run_grpc(self.grpc, request, self.settings.token_timeout_s)


class OpenAIUser(StreamingUser):
    """Through the gateway's OpenAI API (`--openai-url`, the key from $OPENAI_API_KEY)."""

    def on_start(self) -> None:
        super().on_start()
        key = os.environ.get(self.settings.api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=self.settings.openai_url, headers=headers)

    def on_stop(self) -> None:
        self.http.close()

    def stream_once(self, request: StreamRequest) -> StreamOutcome:
        return run_openai(self.http, request, self.settings.token_timeout_s)


class BurstSilenceMixin:
    """A chat-like user: 2-5 turns with short pauses, then 10-30x the think time quiet."""

    rng: random.Random
    settings: LoadSettings
    _turns_left = 0

    def wait_time(self) -> float:
        if self._turns_left > 0:
            self._turns_left -= 1
            return self.rng.uniform(0.05, 0.3)
        self._turns_left = self.rng.randint(2, 5)
        return self.rng.uniform(10, 30) * max(self.settings.think_time_s, 0.1)


class SseBurstSilenceUser(BurstSilenceMixin, SseUser):
    pass


class GrpcBurstSilenceUser(BurstSilenceMixin, GrpcUser):
    pass


class OpenAIBurstSilenceUser(BurstSilenceMixin, OpenAIUser):
    pass


USER_CLASSES = {
    cls.__name__: cls
    for cls in (SseUser, GrpcUser, OpenAIUser, SseBurstSilenceUser, GrpcBurstSilenceUser, OpenAIBurstSilenceUser)
}
