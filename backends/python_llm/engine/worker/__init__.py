"""The engine's executing half (step 4 of docs/architecture.md's request
lifecycle): the model runner that turns one `SchedulerOutput` into sampled
tokens, the model, paged attention over the K/V tensors, the sampler, the
native CPU kernels and the per-step index buffers the runner keeps."""
