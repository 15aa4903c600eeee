"""Graceful degradation under sustained overload: signals over a window
(signals.py), the level with hysteresis and dwell times (controller.py),
what each level does (levels.py), applied at the access-control seam
(degraded_policy.py) and the fleet's model choice (degradation.py)."""

from .degradation import Degradation, build_degradation
from .degraded_policy import DegradingPolicy

__all__ = ["Degradation", "DegradingPolicy", "build_degradation"]
