"""python_llm: the project's Python-based Triton backend and its engine.

`model.py` is the thin Triton adapter. Everything else is importable and
testable without Triton: the engine (`engine/`), and the adapter's logic:
input tensors to an engine request (`request_inputs.py`), live requests by
engine id and request key (`live_streams.py`), engine outputs to the
responses to send (`stream_assembly.py`) and their tensors (`response_tensors.py`).
`trtllm_bridge.py` is the other LLM step's logic: the `tensorrt_llm` variant's
thin step in front of TensorRT-LLM's backend, on the same request parsing.
"""
