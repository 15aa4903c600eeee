"""The official `openai` SDK through a pause longer than the DEFAULT
keep-alive interval (15 s), mid-stream: a real tritonserver frozen (SIGSTOP
of its process group) once every stream has sent its first content, and
thawed (SIGCONT) a few seconds past the interval; the gateway is its own
process with its default `keepalive_interval_s`.

Every stream reads on through the keep-alive comment the gateway sends in
the pause and ends with exactly the text of the same greedy request
unpaused: chat, completions and the Responses API, each with `OpenAI` and
`AsyncOpenAI`. Before issue 48 the keep-alive was a comment block, which the
SDK's decoder (it keeps the last `id:`) dispatched as an empty event and
failed on with JSONDecodeError. A raw reader of the same stream shows the
keep-alive bytes on the wire during the pause, and every reader runs under a
read timeout shorter than the pause but longer than the interval, as a proxy
would: bytes flowed every interval.

All streams share one pause; each reader's timings are printed."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import openai
import pytest

from gateway.config import StreamsConfig
from serving.launcher import TritonServer
from tests.e2e.fleet_helpers import SIGCONT, SIGSTOP, kill_group, wait_until
from tests.e2e.test_gateway_openai import Gateway, start_gateway

pytestmark = pytest.mark.e2e

KEEPALIVE_S = StreamsConfig().keepalive_interval_s  # the default: never set below
PAUSE_S = KEEPALIVE_S + 4.0
# a proxy's read timeout: longer than the interval, shorter than the pause
READ_TIMEOUT_S = KEEPALIVE_S + 2.5
# the default stall timeout (20 s) would end a one-replica stream paused this
# long (nowhere to migrate to): it is not what this file is about
STALL_TIMEOUT_S = 90.0
TOKENS = 40
# a floor under each engine step, so that no stream ends before the freeze
# however fast the machine: 40 steps take >= 3.2 s after the first token
STEP_DELAY_MS = 80
PROMPT = "Write a long story about a lighthouse keeper and the sea."
KINDS = ["chat", "completions", "responses"]


@pytest.fixture(scope="module")
def triton(start_triton) -> TritonServer:
    return start_triton(debug_step_delay_ms=STEP_DELAY_MS)


@pytest.fixture(scope="module")
def gateway(triton: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    assert KEEPALIVE_S == 15.0, "the test is about the default interval"
    started = start_gateway(
        triton, tmp_path_factory.mktemp("keepalive_sdk"), f"gateway.fleet.stall_timeout_s={STALL_TIMEOUT_S}"
    )
    yield started
    assert started.process.stop() == 0


@dataclass
class Read:
    """One stream as a reader saw it."""

    name: str
    pieces: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, text) per content piece
    keepalives: list[float] = field(default_factory=list)  # raw reader only: when each comment came
    last_type: str = ""  # Responses: the last event's type
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(piece for _, piece in self.pieces)

    def longest_pause(self) -> tuple[float, int]:
        """The longest wait between two content pieces, and how many came before it."""
        gaps = [(b[0] - a[0], i + 1) for i, (a, b) in enumerate(zip(self.pieces, self.pieces[1:]))]
        return max(gaps, default=(0.0, 0))


def request(kind: str) -> dict:
    if kind == "responses":  # no ignore_eos in the Responses API: the prompt asks for a long answer
        return {"model": "ensemble", "input": PROMPT, "max_output_tokens": TOKENS, "temperature": 0}
    text = {"messages": [{"role": "user", "content": PROMPT}]} if kind == "chat" else {"prompt": PROMPT}
    return {"model": "ensemble", **text, "max_tokens": TOKENS, "temperature": 0, "extra_body": {"ignore_eos": True}}


def create(client: openai.OpenAI | openai.AsyncOpenAI, kind: str) -> Callable[..., object]:
    return {
        "chat": client.chat.completions.create,
        "completions": client.completions.create,
        "responses": client.responses.create,
    }[kind]


def note(read: Read, kind: str, item: object) -> None:
    if kind == "chat":
        piece = "".join(c.delta.content or "" for c in item.choices)  # type: ignore[attr-defined]
    elif kind == "completions":
        piece = "".join(c.text for c in item.choices)  # type: ignore[attr-defined]
    else:
        read.last_type = item.type  # type: ignore[attr-defined]
        piece = item.delta if item.type == "response.output_text.delta" else ""  # type: ignore[attr-defined]
    if piece:
        read.pieces.append((time.monotonic(), piece))


def timeout() -> openai.Timeout:
    return openai.Timeout(30.0, read=READ_TIMEOUT_S)


def read_sync(gateway: Gateway, kind: str, read: Read) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key=gateway.key, max_retries=0, timeout=timeout())
    try:
        for item in create(client, kind)(stream=True, **request(kind)):  # type: ignore[attr-defined]
            note(read, kind, item)
    except Exception as exc:  # the failure is the finding: kept for the assertion's message
        read.error = repr(exc)
    finally:
        client.close()


async def read_async(gateway: Gateway, kind: str, read: Read) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.key, max_retries=0, timeout=timeout())
    try:
        async for item in await create(client, kind)(stream=True, **request(kind)):  # type: ignore[misc]
            note(read, kind, item)
    except Exception as exc:
        read.error = repr(exc)
    finally:
        await client.close()


def read_raw(gateway: Gateway, read: Read) -> None:
    """The chat stream line by line, keep-alive comments included."""
    fields = request("chat")
    body = {**{k: v for k, v in fields.items() if k != "extra_body"}, **fields["extra_body"], "stream": True}
    try:
        with httpx.Client(timeout=httpx.Timeout(30.0, read=READ_TIMEOUT_S)) as client:
            with client.stream(
                "POST",
                f"{gateway.base_url}/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {gateway.key}"},
            ) as response:
                for line in response.iter_lines():
                    if line.startswith(":"):
                        read.keepalives.append(time.monotonic())
                    elif line.startswith("data: {"):
                        chunk = json.loads(line[len("data: ") :])
                        piece = "".join(c["delta"].get("content") or "" for c in chunk["choices"])
                        if piece:
                            read.pieces.append((time.monotonic(), piece))
    except httpx.HTTPError as exc:
        read.error = repr(exc)


def run_all(gateway: Gateway, triton: TritonServer | None = None) -> dict[str, Read]:
    """Every reader at once; with `triton`, frozen for PAUSE_S once each has its first content."""
    reads = {f"{kind}/{client}": Read(f"{kind}/{client}") for kind in KINDS for client in ("OpenAI", "AsyncOpenAI")}
    reads["chat/raw"] = Read("chat/raw")

    async def async_readers() -> None:
        await asyncio.gather(*(read_async(gateway, kind, reads[f"{kind}/AsyncOpenAI"]) for kind in KINDS))

    threads = [
        threading.Thread(target=read_sync, args=(gateway, kind, reads[f"{kind}/OpenAI"]), daemon=True) for kind in KINDS
    ]
    threads += [
        threading.Thread(target=lambda: asyncio.run(async_readers()), daemon=True),
        threading.Thread(target=read_raw, args=(gateway, reads["chat/raw"]), daemon=True),
    ]
    for thread in threads:
        thread.start()
    if triton is not None:
        under_way = wait_until(lambda: all(r.pieces or r.error for r in reads.values()), 90, "every stream under way")
        kill_group(triton, SIGSTOP)
        frozen = time.monotonic()
        try:
            time.sleep(PAUSE_S)
        finally:
            kill_group(triton, SIGCONT)
        print(
            f"\n[all {len(reads)} streams under way {under_way:.1f} s after the start; triton frozen for "
            f"{time.monotonic() - frozen:.1f} s]"
        )
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a reader did not end within 120 s"
    return reads


@pytest.fixture(scope="module")
def unpaused(gateway: Gateway) -> dict[str, Read]:
    started = time.monotonic()
    reads = run_all(gateway)
    print(f"\n[unpaused: {len(reads)} streams in {time.monotonic() - started:.1f} s]")
    assert all(r.error is None for r in reads.values()), {n: r.error for n, r in reads.items() if r.error}
    return reads


def test_sdk_streams_paused_past_the_default_keepalive_interval_complete_with_the_same_text(gateway, triton, unpaused):
    started = time.monotonic()
    reads = run_all(gateway, triton)
    print(
        f"[paused run: {time.monotonic() - started:.1f} s, keep-alive interval {KEEPALIVE_S:.0f} s, "
        f"read timeout {READ_TIMEOUT_S} s]"
    )
    for name, read in reads.items():
        pause, before = read.longest_pause()
        print(
            f"[{name}: {len(read.pieces)} pieces, longest pause {pause:.1f} s after piece {before}, "
            f"{len(read.text)} chars, same text: {read.text == unpaused[name].text}, error: {read.error}]"
        )
    assert all(r.error is None for r in reads.values()), {n: r.error for n, r in reads.items() if r.error}
    for name, read in reads.items():
        pause, before = read.longest_pause()
        # the pause fell mid-stream and outlasted the interval: a keep-alive went out in it
        assert pause > KEEPALIVE_S + 1.0 and 0 < before < len(read.pieces), f"{name}: no mid-stream pause"
        assert read.text == unpaused[name].text, name
        assert read.text, name
    for name in ("responses/OpenAI", "responses/AsyncOpenAI"):
        assert reads[name].last_type in ("response.completed", "response.incomplete"), reads[name].last_type
    raw = reads["chat/raw"]
    pause, before = raw.longest_pause()
    pause_from = raw.pieces[before - 1][0]
    in_pause = [t for t in raw.keepalives if pause_from < t < pause_from + pause]
    wire = sorted([t for t, _ in raw.pieces] + raw.keepalives)
    silence = max(b - a for a, b in zip(wire, wire[1:]))
    print(
        f"[raw chat: {len(in_pause)} keep-alive(s) in its {pause:.1f} s pause, the first "
        f"{in_pause[0] - pause_from if in_pause else float('nan'):.1f} s into it; longest silence on the "
        f"wire {silence:.1f} s]"
    )
    assert in_pause, "no keep-alive on the wire during the pause"
    assert silence < READ_TIMEOUT_S
