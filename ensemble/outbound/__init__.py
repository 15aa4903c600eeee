"""The way out: the LLM step's token deltas → clean text deltas (detokenizer, stop
strings, content filter, segmentation) and the public output tensors."""
