"""Capacity planning (`python -m serving plan`): replicas and GPUs from the
peak load, the SLO, redundancy and measured throughput per replica."""
