"""Which replica serves a request: policies to compare, one default.

`prefix_aware` (the default) scores every routable replica, higher is better:
  weight_queue    × (1 − its requests / the most any candidate has)
  weight_kv_cache × (1 − its KV utilisation)
  weight_prefix   × (leading prompt blocks it likely holds / prompt blocks)
  weight_session  × (1 if this session's last request went there)
Stale metrics score 0 on queue and KV (a saturated replica), so affinity
alone cannot pin traffic to a replica that stopped reporting. `least_load`
is the same without prefix and session; `round_robin` ignores load."""

from __future__ import annotations

import itertools
import random
import time
from collections import OrderedDict
from dataclasses import dataclass

from ..config import ROUTING_POLICIES, GatewayConfig
from .prefix import block_hashes
from .replica import Replica

_SESSIONS_KEPT = 100_000


@dataclass(frozen=True)
class RouteRequest:
    prompt: str  # the text the prefix cache keys on (chat: the rendered messages' text)
    session: str | None = None  # a caller's session (hashed `user`), for affinity


@dataclass(frozen=True)
class Decision:
    replica: Replica
    score: float
    prefix_blocks: int
    reason: str


class Router:
    def __init__(self, config: GatewayConfig, rng: random.Random | None = None) -> None:
        if config.fleet.routing_policy not in ROUTING_POLICIES:
            raise ValueError(
                f"gateway.fleet.routing_policy: one of {', '.join(ROUTING_POLICIES)} "
                f"(got {config.fleet.routing_policy!r})"
            )
        self.config = config
        self.policy = config.fleet.routing_policy
        self._turn = itertools.count()
        self._rng = rng or random.Random()
        self._sessions: OrderedDict[str, str] = OrderedDict()

    def pick(self, candidates: list[Replica], request: RouteRequest) -> Decision:
        if not candidates:
            raise ValueError("no replica to pick from")
        hashes = block_hashes(request.prompt) if self.policy == "prefix_aware" else []
        if self.policy == "round_robin":
            chosen = candidates[next(self._turn) % len(candidates)]
            decision = Decision(chosen, 0.0, 0, "round_robin")
        else:
            decision = self._best(candidates, request, hashes)
        if hashes:
            decision.replica.prefix.record(hashes)
        if request.session:
            self._sessions[request.session] = decision.replica.name
            self._sessions.move_to_end(request.session)
            if len(self._sessions) > _SESSIONS_KEPT:
                self._sessions.popitem(last=False)
        return decision

    def _best(self, candidates: list[Replica], request: RouteRequest, hashes: list[bytes]) -> Decision:
        config, now = self.config, time.monotonic()
        most_busy = max(r.busy() for r in candidates)
        session_home = self._sessions.get(request.session) if request.session else None
        best: tuple[float, float, Decision] | None = None
        for replica in candidates:
            fresh = not replica.load.stale(config.fleet.metrics_stale_s, now)
            queue = (1.0 - replica.busy() / most_busy if most_busy > 0 else 1.0) if fresh else 0.0
            kv = (1.0 - min(replica.load.kv_utilisation, 1.0)) if fresh else 0.0
            score = config.fleet.weight_queue * queue + config.fleet.weight_kv_cache * kv
            matched, reason = 0, "load"
            if self.policy == "prefix_aware":
                matched = replica.prefix.matched(hashes)
                if hashes:
                    score += config.fleet.weight_prefix * matched / len(hashes)
                if session_home == replica.name:
                    score += config.fleet.weight_session
                reason = "prefix" if matched else ("session" if session_home == replica.name else "load")
            # ties: fewer in flight, then chance (not always the first replica)
            key = (score, -replica.in_flight + self._rng.random() * 1e-3)
            if best is None or key > best[:2]:
                best = (*key, Decision(replica, score, matched, reason))
        # type-ignored below: best is set: the caller passes at least one routable replica
        return best[2]  # type: ignore[index]
