"""The gateway process's life: draining at SIGTERM (`drain`) and where it keeps
its own files (`state_dir`). Started by `python -m gateway serve`
(gateway/__main__.py); the launcher runs it as a child (serving/gateway_process.py)."""
