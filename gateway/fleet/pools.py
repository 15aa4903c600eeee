"""Tier pools: which replicas a tier's requests may go to.

A replica dedicated to some tiers (`ReplicaConfig.dedicated_to`) serves only
them; the others are the shared pool. A tier with dedicated replicas uses
them, and spills over to the shared pool by its `spill_over` rule: "never",
"when_down" (none of its own is routable) or "when_busy" (also while every
one of its own has requests waiting, or has stopped reporting its load).
A tier without dedicated replicas uses the shared pool only: free keys never
reach a replica bought for paid traffic."""

from __future__ import annotations

from ..config import SPILL_OVER_RULES, GatewayConfig
from .replica import Replica


def check_pools(config: GatewayConfig, replicas: list[Replica]) -> None:
    """Refuse settings that name a tier that does not exist or a rule that does not."""
    for name, tier in config.tiers.items():
        if tier.spill_over not in SPILL_OVER_RULES:
            raise ValueError(
                f"gateway.tiers.{name}.spill_over: one of {', '.join(SPILL_OVER_RULES)} (got {tier.spill_over!r})"
            )
    for replica in replicas:
        unknown = [t for t in replica.config.dedicated_to if t not in config.tiers]
        if unknown:
            raise ValueError(
                f"gateway.fleet.replicas.{replica.name}.dedicated_to: no tier named {', '.join(unknown)} "
                f"(tiers: {', '.join(config.tiers)})"
            )


def pool_for(
    tier: str | None, routable: list[Replica], replicas: list[Replica], config: GatewayConfig, now: float
) -> tuple[list[Replica], bool]:
    """The routable replicas a request of `tier` may go to, and whether that
    is a spill-over. No tier (a request the gateway makes for itself): the
    shared pool, or every replica where all are dedicated."""
    shared = [r for r in routable if not r.config.dedicated_to]
    if tier is None or tier not in config.tiers:
        return (shared or routable), False
    if not any(tier in r.config.dedicated_to for r in replicas):
        return shared, False
    own = [r for r in routable if tier in r.config.dedicated_to]
    rule = config.tiers[tier].spill_over
    if rule == "never" or not shared:
        return own, False
    if not own:
        return shared, True
    if rule == "when_busy" and all(_busy(r, config.fleet.metrics_stale_s, now) for r in own):
        return own + shared, True
    return own, False


def _busy(replica: Replica, stale_s: float, now: float) -> bool:
    if not replica.config.metrics_url:  # its load is not known: only an outage spills over
        return False
    return replica.load.stale(stale_s, now) or replica.load.waiting > 0
