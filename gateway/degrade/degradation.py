"""The degradation controller at work: fed by the fleet's hooks (a load
listener per metrics scrape round, an outcome listener per engine request),
evaluated once per round (off the request path), its level published as a
metric and every change logged with its cause. The doors read the level per
request in O(1): `apply` at authentication (the capped tier, one piece),
`refusal` at admission (the shed tier), `model_for` in the fleet (the
fallback model)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..admission.limits import retry_headers
from ..config import GatewayConfig
from ..core.errors import GatewayError
from ..core.policy import Caller
from ..fleet import Fleet
from ..fleet.replica import Replica
from ..ops.metrics import DEGRADATION_CHANGES, DEGRADATION_LEVEL, DEGRADATION_SHED, DEGRADATION_SIGNAL
from .controller import Change, Controller, Threshold
from .levels import CAP_MAX_TOKENS, FALLBACK_MODEL, ONE_PIECE, SHED_LOWEST_TIER, TierRoles, capped, effective_max_level
from .signals import ERROR_RATE, KV_USE, PREEMPTIONS, QUEUE_TIME, SIGNALS, Signals, SignalValues

log = logging.getLogger("gateway.degrade")


def thresholds_of(config: GatewayConfig) -> list[Threshold]:
    d = config.degradation
    return [
        Threshold(QUEUE_TIME, d.queue_time_enter_s, d.queue_time_exit_s),
        Threshold(KV_USE, d.kv_enter, d.kv_exit),
        Threshold(PREEMPTIONS, d.preemptions_enter_per_s, d.preemptions_exit_per_s),
        Threshold(ERROR_RATE, d.error_rate_enter, d.error_rate_exit),
    ]


class Degradation:
    def __init__(self, config: GatewayConfig, clock: Callable[[], float] = time.monotonic) -> None:
        max_level, d = effective_max_level(config), config.degradation
        if max_level >= CAP_MAX_TOKENS and d.max_tokens_cap <= 0:
            raise ValueError(
                f"gateway.degradation.max_tokens_cap: the cap of level 1 must be positive (got {d.max_tokens_cap})"
            )
        if d.window_s <= 0:
            raise ValueError(f"gateway.degradation.window_s must be positive (got {d.window_s})")
        if d.enter_dwell_s < d.window_s:
            # one extreme sample (a burst of preemptions or failures) holds a
            # window's value up for one whole window: only a dwell at least that
            # long tells a spike from sustained overload
            raise ValueError(
                f"gateway.degradation.enter_dwell_s ({d.enter_dwell_s} s) must be at least "
                f"gateway.degradation.window_s ({d.window_s} s), or a single spike could "
                f"raise the degradation level"
            )
        self.config = config
        self._clock = clock
        self.signals = Signals(d.window_s, config.fleet.metrics_stale_s)
        self.controller = Controller(thresholds_of(config), max_level, d.enter_dwell_s, d.exit_dwell_s, clock())
        self.roles = TierRoles.of(config.tiers)
        self.values: SignalValues = dict.fromkeys(SIGNALS)
        self._thresholds = {t.signal: t for t in self.controller.thresholds}
        DEGRADATION_LEVEL.set(0)

    @property
    def level(self) -> int:
        return self.controller.level

    def attach(self, fleet: Fleet) -> None:
        fleet.load_listeners.append(self.on_load)
        fleet.outcome_listeners.append(self.signals.outcome)
        fleet.model_for = self.model_for
        if not self.config.fleet.discovery_dns and not any(r.config.metrics_url for r in fleet.replicas):
            log.warning(
                "degradation is on but no replica's metrics are scraped (no metrics_url): "
                "without scrape rounds it is never evaluated and stays at level 0"
            )

    # fed by the fleet

    def on_load(self, replicas: list[Replica]) -> None:
        """One scrape round. Never raises: the fleet's scrape loop calls it."""
        try:
            now = self._clock()
            self.signals.observe(replicas, now)
            self.values = self.signals.values(now)
            for signal, value in self.values.items():
                DEGRADATION_SIGNAL.labels(signal=signal).set(math.nan if value is None else value)
            change = self.controller.evaluate(self.values, now)
            if change is not None:
                self._publish(change)
        except Exception:
            log.exception("evaluating the degradation signals failed; the level stays %d", self.level)

    def _publish(self, change: Change) -> None:
        DEGRADATION_LEVEL.set(change.after)
        DEGRADATION_CHANGES.labels(direction=change.direction, cause=change.cause).inc()
        signals = {name: None if value is None else round(value, 4) for name, value in change.values.items()}
        fields: dict[str, Any] = {
            "event": "degradation_level",
            "direction": change.direction,
            "to_level": change.after,
            "from_level": change.before,
            "cause": change.cause,
            "held_s": round(change.held_s, 1),
            "signals": signals,
        }
        if change.direction == "up":
            threshold = self._thresholds[change.cause]
            fields.update(value=signals[change.cause], threshold=threshold.enter)
            log.warning(
                "degradation level %d -> %d: %s %.4g above %.4g for %.1f s",
                change.before,
                change.after,
                change.cause,
                change.values[change.cause],
                threshold.enter,
                change.held_s,
                extra={"fields": fields},
            )
        else:
            fields["exit_thresholds"] = {t.signal: t.exit for t in self.controller.thresholds}
            log.info(
                "degradation level %d -> %d: every signal at or below its exit threshold for %.1f s",
                change.before,
                change.after,
                change.held_s,
                extra={"fields": fields},
            )

    # read by the doors, per request

    def apply(self, caller: Caller) -> Caller:
        """The caller as the current level serves it: its tier's max_tokens
        capped (level 1), its streams in one piece (level 3, the lowest tier
        still served)."""
        level = self.controller.level
        if level < CAP_MAX_TOKENS:
            return caller
        one_piece = level >= ONE_PIECE and caller.tier_name in self.roles.one_piece
        return replace(
            caller,
            tier=capped(caller.tier, self.config.degradation.max_tokens_cap),
            one_piece=one_piece or caller.one_piece,
        )

    def refusal(self, caller: Caller) -> GatewayError | None:
        """The 429 of a shed tier (level 2), None for everyone else."""
        if self.controller.level < SHED_LOWEST_TIER or caller.tier_name not in self.roles.shed:
            return None
        DEGRADATION_SHED.labels(tier=caller.tier_name).inc()
        wait_s = self.controller.seconds_until_below(SHED_LOWEST_TIER, self._clock())
        return GatewayError(
            429,
            f"The service is degraded under sustained overload: tier '{caller.tier_name}' "
            f"is not served until it recovers; retry after the delay in Retry-After.",
            code="degraded_overload",
            headers=retry_headers(max(1.0, wait_s)),
        )

    def model_for(self, model: str) -> str:
        if self.controller.level >= FALLBACK_MODEL:
            return self.config.degradation.fallback_model
        return model

    def describe(self) -> dict[str, Any]:
        """For GET /admin/degradation."""
        controller = self.controller
        return {
            "level": controller.level,
            "max_level": controller.max_level,
            "changed_s_ago": round(self._clock() - controller.changed_at, 1),
            "signals": {
                t.signal: {"value": self.values.get(t.signal), "enter": t.enter, "exit": t.exit}
                for t in controller.thresholds
            },
            "window_s": self.signals.window_s,
            "enter_dwell_s": controller.enter_dwell_s,
            "exit_dwell_s": controller.exit_dwell_s,
            "shed_tiers": sorted(self.roles.shed),
            "one_piece_tiers": sorted(self.roles.one_piece),
            "fallback_model": self.config.degradation.fallback_model or None,
        }


def build_degradation(config: GatewayConfig, clock: Callable[[], float] = time.monotonic) -> Degradation | None:
    """The deployment's controller; None when `gateway.degradation.max_level` is 0 (off)."""
    if effective_max_level(config) == 0:
        return None
    return Degradation(config, clock)
