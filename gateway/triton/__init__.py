"""Triton's own protocols through the gateway: `generate` / `generate_stream`
and KServe v2 `infer` over HTTP (`http_routes.py`), the KServe v2
`GRPCInferenceService` over gRPC (`grpc_door.py`), for the public models only.

Every request, whatever its wire format, is decoded into the same inputs
(`wire_json.py`, `wire_proto.py`), validated by one validator (`inputs.py`),
admitted like an OpenAI request (`calls.py`) and re-sent to Triton through the
client library; the answer is rendered back in the caller's format
(`outputs.py`)."""
