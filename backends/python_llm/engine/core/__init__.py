"""The engine's deciding half (steps 3 and 7 of docs/architecture.md's request
lifecycle): requests and their sampling settings, the waiting queue, the
scheduler and the one `SchedulerOutput` it hands the worker each step, the KV
block bookkeeping (block pool, per-request block tables), what a step reports
(outputs, metrics) and the errors clients see. No torch, no weights."""
