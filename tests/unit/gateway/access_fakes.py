"""A fake clock for `limits`' memory storage and an AccessPolicy factory.

The memory storage reads `time.time()` through its module's `time` name, so
replacing that name moves its windows; AccessPolicy gets the same clock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import limits.aio.storage.memory as limits_memory
import pytest
from prometheus_client import CollectorRegistry

from gateway.admission.access import AccessPolicy
from gateway.admission.keys import KeyStore
from gateway.config import GatewayConfig, TierConfig


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now  # a multiple of every window used: windows start aligned

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(limits_memory, "time", fake)
    return fake


PolicyFactory = Callable[..., tuple[AccessPolicy, str]]


@pytest.fixture
def make_policy(tmp_path: Path, clock: FakeClock) -> PolicyFactory:
    """make_policy(tier=TierConfig(...), **GatewayConfig fields) → (policy, a key of that tier)."""

    def make(
        tier: TierConfig | None = None,
        tokens_window_s: int = 10,
        registry: CollectorRegistry | None = None,
        **config: object,
    ) -> tuple[AccessPolicy, str]:
        tiers = {"t": tier or TierConfig(), "other": TierConfig()}
        store = KeyStore(tmp_path / "keys.json")
        cfg = GatewayConfig(keys_file=str(store.path), tiers=tiers, **config)  # type: ignore[arg-type]
        policy = AccessPolicy(
            cfg, registry=registry or CollectorRegistry(), tokens_window_s=tokens_window_s, clock=clock.time
        )
        return policy, store.create("t").key

    return make
