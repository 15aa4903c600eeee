"""Measurement scripts (run with python -m bench.<name>)."""
