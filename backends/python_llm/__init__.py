"""python_llm: the project's Python-based Triton backend and its engine.

`model.py` is the thin Triton adapter; everything else lives in `engine/` and
is importable and testable without Triton.
"""
