"""Load-test settings. The runner passes them to the Locust process through
environment variables (Locust imports the locustfile in its own process)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

SHAPES = ("steady", "ramp", "burst")
ENV_PREFIX = "LOADTEST_"
DEFAULT_DATASET = Path(__file__).parent / "data" / "prompts.jsonl"


@dataclass(frozen=True)
class LoadSettings:
    http_url: str = "http://127.0.0.1:8000"
    grpc_url: str = "127.0.0.1:8001"
    openai_url: str = "http://127.0.0.1:9000/v1"  # the gateway's OpenAI API (OpenAIUser)
    # the gateway API key; "" = $OPENAI_API_KEY (kept out of LOADTEST_* and the report)
    api_key_env: str = "OPENAI_API_KEY"
    model: str = "ensemble"
    shape: str = "steady"
    users: int = 4
    spawn_rate: float = 4.0
    duration_s: float = 60.0
    burst_factor: float = 10.0  # the spike is this many times the base user count
    cancel_share: float = 0.0  # share of streams a user abandons mid-way
    think_time_s: float = 0.5  # mean pause between a user's requests
    max_tokens: int = 64  # upper end of the long-tailed output length
    fixed_max_tokens: bool = False  # every request asks for exactly max_tokens
    # The dataset holds questions for a chat model: sent as raw text, an
    # instruct model often answers with EOS at once, and the run measures nothing.
    chat: bool = True
    token_timeout_s: float = 30.0
    first_token_timeout_s: float = 120.0
    dataset: str = str(DEFAULT_DATASET)
    tokenizer_dir: str = ""  # "" = the default model's folder
    samples_path: str = ""  # per-stream JSONL written for plots; "" = none
    seed: int = 0

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {SHAPES} (got {self.shape!r})")
        if self.users < 1 or self.spawn_rate <= 0 or self.duration_s <= 0:
            raise ValueError("users >= 1, spawn_rate > 0 and duration_s > 0 are required")
        if not 1 <= self.burst_factor <= 100:
            raise ValueError(f"burst_factor must be in [1, 100] (got {self.burst_factor})")
        if not 0 <= self.cancel_share <= 1:
            raise ValueError(f"cancel_share must be in [0, 1] (got {self.cancel_share})")
        if self.max_tokens < 1 or self.think_time_s < 0:
            raise ValueError("max_tokens >= 1 and think_time_s >= 0 are required")

    def to_env(self) -> dict[str, str]:
        return {ENV_PREFIX + name.upper(): str(value) for name, value in asdict(self).items()}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> LoadSettings:
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is None:
                continue
            kind = type(getattr(cls(), f.name))
            values[f.name] = raw.lower() in ("1", "true", "yes") if kind is bool else kind(raw)
        return cls(**values)
