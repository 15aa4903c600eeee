"""The `tensorrt_llm` variant of the LLM step: TensorRT-LLM's Triton backend
behind the same tensors as `python_llm` (docs/interface.md).

- `versions.py`: the pinned TensorRT-LLM release and where its names come from;
- `engine_config.py`: the `tensorrt_llm_engine` model's config (TensorRT-LLM's
  own `tensorrt_llm` model, its template's tensor and parameter names);
- the thin decoupled step `tensorrt_llm` in front of it (request key, request
  context, continuation, finish reasons) runs inside Triton and lives beside
  `python_llm`'s Triton-side logic: `backends/python_llm/trtllm_bridge.py`;
- `build.py`, `convert_checkpoint.py`: `python -m serving build-trtllm`
  (checkpoint with TP x PP ranks, then `trtllm-build`);
- `launch.py`: `python -m serving launch-trtllm` (one tritonserver per rank under
  mpirun, as TensorRT-LLM's scripts/launch_triton_server.py does);
- `command.py`: the two subcommands.
"""
