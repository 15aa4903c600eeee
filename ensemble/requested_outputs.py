"""Only the outputs a request asked for, for the decoupled models' senders on
the Python backend stub of Triton 2.51 (python_backend r24.10).

Why this exists: `InferenceResponseSender.send()` releases the GIL and then
drops the response's tensors that the request did not ask for
(`ResponseSender::Send` → `InferResponse::PruneOutputTensors`). Each dropped
tensor lets go of its numpy array *without the GIL* (`PbTensor::~PbTensor`
takes it only from r24.12, python_backend commit b771f4f "Fix requested
output deleting extra outputs"). When that was the array's last reference it
is freed while another thread runs Python, which corrupts the interpreter's
heap: the ensemble never asks the LLM step for `request_key`, and the thin
`tensorrt_llm` step died with SIGSEGV within seconds at 16 concurrent
streams. So the senders build their responses from these outputs only and
the stub has nothing to drop. (A non-decoupled `execute()` returns its
responses with the GIL held: no need there.)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TypeVar

Array = TypeVar("Array")


def requested_only(arrays: Mapping[str, Array], requested: Collection[str]) -> dict[str, Array]:
    """`arrays` without the outputs the request did not ask for. Triton lists
    every output of the model as requested when a client names none."""
    return {name: value for name, value in arrays.items() if name in requested}
