from __future__ import annotations

import pytest

from client import AsyncLLMClient, ClientConfig, RetryConfig, TimeoutConfig  # noqa: E402
from client.sse_transport import SseTransport  # noqa: E402
from tests.unit.client.sse_fakes import FakeTriton  # noqa: E402


class RecordingSleep:
    """Stands in for asyncio.sleep in the retry loop: records, never waits."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
def fake() -> FakeTriton:
    return FakeTriton()


@pytest.fixture
def sleeps() -> RecordingSleep:
    return RecordingSleep()


@pytest.fixture
def make_client(fake: FakeTriton, sleeps: RecordingSleep):
    def build(
        model: str = "ensemble", timeouts: TimeoutConfig | None = None, retry: RetryConfig | None = None, **kwargs
    ) -> AsyncLLMClient:
        config = ClientConfig(
            url="http://triton.test",
            model=model,
            timeouts=timeouts or TimeoutConfig(),
            retry=retry or RetryConfig(backoff_base_s=0.1, backoff_max_s=1.0),
        )
        transport = SseTransport(config.url, config.timeouts, http_transport=fake.transport())
        return AsyncLLMClient(config, transport=transport, sleep=sleeps, **kwargs)

    return build
