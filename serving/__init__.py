"""Runs the real Triton Inference Server with this project's model repository."""
