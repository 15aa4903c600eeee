"""The inference probe: a process whose weights are corrupted still answers
`/v2/health/ready`, so readiness is not enough. Each round asks the replica
for readiness and then for a fixed greedy answer whose expected tokens were
recorded from the packaged weights by `serving prepare-model` (the golden
file: never learnt from the replica being probed).

Outcomes: `ok`; `overloaded` (the engine's queue was full: says nothing about
its health, neither good nor bad); failures: `not_ready`, `ready_timeout` (a
hung process accepts connections and never answers), `unreachable`,
`timeout`, `refused`, `error`, `wrong_answer`."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from client import GenerationOptions, RequestError, ServerConnectionError
from contract.errors import OVERLOADED_MARKER

# probes jump every queue: a probe that waits behind a long backlog would
# eject a replica for being busy
PROBE_PRIORITY = 2**30
OK, OVERLOADED, WRONG_ANSWER = "ok", "overloaded", "wrong_answer"


class GoldenAnswer(Protocol):
    """The expected answer (serving/probe_golden.py's `Golden` is one; so is `ProbeAnswer`)."""

    @property
    def prompt(self) -> str: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def output_ids(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class ProbeAnswer:
    """What the probe needs of a golden file: the request to send and the ids to expect."""

    prompt: str
    max_tokens: int
    output_ids: tuple[int, ...]
    model: str
    request: dict[str, Any]


def load_golden_answer(path: str) -> ProbeAnswer:
    """The golden file `serving prepare-model` wrote (its JSON is the contract
    between the two: the gateway reads it, never the code that wrote it);
    ValueError names what is wrong."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        answer = ProbeAnswer(
            prompt=str(data["prompt"]),
            max_tokens=int(data["max_tokens"]),
            output_ids=tuple(int(i) for i in data["output_ids"]),
            model=str(data.get("model", "ensemble")),
            request=dict(
                data.get("request") or {"max_tokens": int(data["max_tokens"]), "temperature": 0.0, "ignore_eos": True}
            ),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"probe golden file {path}: {exc!r}") from None
    if not answer.prompt or len(answer.output_ids) != answer.max_tokens:
        raise ValueError(
            f"probe golden file {path}: expected {answer.max_tokens} output ids for a non-empty prompt, "
            f"got {len(answer.output_ids)}"
        )
    return answer


async def probe_once(
    client: object,
    golden: GoldenAnswer | None,
    *,
    ready_timeout_s: float,
    answer_timeout_s: float,
    model: str = "ensemble",
) -> str:
    try:
        # type-ignored below: a replica's client (fleet/replica_client.py), typed loosely for the fakes
        ready = await asyncio.wait_for(client.ready(), ready_timeout_s)  # type: ignore[attr-defined]
    except TimeoutError:
        return "ready_timeout"
    if not ready:
        return "not_ready"
    if golden is None:
        return OK
    # the inputs the golden answer was recorded with (the file is the one source), else greedy at its length
    recorded = getattr(golden, "request", None) or {
        "max_tokens": golden.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_output_ids": True,
    }
    options = GenerationOptions(
        **{**recorded, "return_output_ids": True}, priority=PROBE_PRIORITY, request_id=f"probe-{uuid.uuid4().hex}"
    )
    try:
        result = await asyncio.wait_for(
            client.generate(  # type: ignore[attr-defined]  # a replica's client (fleet/replica_client.py)
                golden.prompt,
                options,
                model=getattr(golden, "model", model),
            ),
            answer_timeout_s,
        )
    except TimeoutError:
        return "timeout"
    except RequestError as exc:
        return OVERLOADED if OVERLOADED_MARKER in exc.message else "refused"
    except ServerConnectionError:
        return "unreachable"
    if result.error is not None:
        return "error"
    return OK if list(result.output_ids) == list(golden.output_ids) else WRONG_ANSWER
