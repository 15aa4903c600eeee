"""Access control behind the core's `Policy` interface: API keys (`keys`, the
`python -m gateway keys` CLI in `keys_cli`), tiers, per-key rate limits
(`limits`) and concurrency slots (`slots`), composed by `access.AccessPolicy`."""
