"""What each degradation level does, and to whom. Levels are cumulative
(level 3 also caps and sheds):

1. every tier's `max_tokens` capped at `gateway.degradation.max_tokens_cap`;
2. the lowest tier (the lowest `priority`) refused at admission: 429;
3. the lowest tier still served answered in one piece: a streamed request
   gets one content event with the whole text (the engine request is sent
   with `stream: false`, so the engine and the text stages send one response
   instead of one per step);
4. every engine request sent to `gateway.degradation.fallback_model`.

Which tiers are "lowest" is fixed from the settings once: the tiers sharing
the lowest priority. When every tier shares it there is nobody to shed
without refusing everyone, so level 2 sheds nobody (a degraded service, not
an outage) and level 3 applies to all of them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..config import GatewayConfig, TierConfig

CAP_MAX_TOKENS, SHED_LOWEST_TIER, ONE_PIECE, FALLBACK_MODEL = 1, 2, 3, 4
LEVELS = (0, CAP_MAX_TOKENS, SHED_LOWEST_TIER, ONE_PIECE, FALLBACK_MODEL)


def effective_max_level(config: GatewayConfig) -> int:
    """The highest level this deployment can reach: 4 needs a fallback model."""
    if config.degradation.max_level not in LEVELS:
        raise ValueError(
            f"gateway.degradation.max_level: one of {', '.join(map(str, LEVELS))} (got {config.degradation.max_level})"
        )
    ceiling = FALLBACK_MODEL if config.degradation.fallback_model else ONE_PIECE
    return min(config.degradation.max_level, ceiling)


@dataclass(frozen=True)
class TierRoles:
    shed: frozenset[str]  # refused from level 2
    one_piece: frozenset[str]  # streamed in one piece from level 3

    @classmethod
    def of(cls, tiers: dict[str, TierConfig]) -> TierRoles:
        if not tiers:
            return cls(frozenset(), frozenset())
        lowest = min(t.priority for t in tiers.values())
        shed = frozenset(name for name, t in tiers.items() if t.priority == lowest)
        if len(shed) == len(tiers):
            return cls(frozenset(), shed)
        rest = {name: t for name, t in tiers.items() if name not in shed}
        next_lowest = min(t.priority for t in rest.values())
        return cls(shed, frozenset(name for name, t in rest.items() if t.priority == next_lowest))


@lru_cache(maxsize=256)
def capped(tier: TierConfig, max_tokens: int) -> TierConfig:
    """The tier with its `max_tokens_cap` lowered to `max_tokens` (a tier's own
    lower cap stays). Cached: a handful of tiers, one copy each."""
    if 0 < tier.max_tokens_cap <= max_tokens:
        return tier
    return replace(tier, max_tokens_cap=max_tokens)
