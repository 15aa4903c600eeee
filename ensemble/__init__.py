"""Text stages of the LLM pipeline, free of Triton: prompt building and
tokenization on the way in; detokenization, stop strings, content filter and
segmentation on the way out. The Triton models in
model_repository/ are thin adapters over this package. The wire format they
share with the gateway and the client library is `contract/`'s.

Callers import the module they need (``ensemble.outbound.stream_postprocessor``,
``ensemble.inbound.llm_request``, …): the package root re-exports nothing, so loading
one stage (say `postprocessing`) does not import every other one (the chat
template's Jinja sandbox, the prompt builder)."""
