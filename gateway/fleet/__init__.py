"""Several replicas behind the gateway: routing (load, prefix and session
affinity), health (readiness, the inference probe, passive outlier
detection, ejection and re-admission), failover before the first token,
draining."""

from .fleet import Fleet, build_fleet

__all__ = ["Fleet", "build_fleet"]
