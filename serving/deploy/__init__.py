"""Deployment beyond one machine: Kubernetes manifests rendered from the
deployment settings (`python -m serving render-k8s`), and the commands the
containers run for their probes and shutdown (`python -m serving probe`,
`python -m serving drain`).

One concept per module: `profile` (the cluster-side knobs of the cpu and gpu
profiles, which are not serving settings), `settings_env` (the settings as the
containers' environment: the one source every pod reads), `triton`, `gateway`,
`monitoring`, `inference_pool` (the objects), `render` (all of them, as files),
`probe_command`, `drain`, `cli` (the subcommands)."""
