"""Operating the gateway: the ops listener (`server`: /metrics and the admin
endpoints of `admin`), the Prometheus metrics (`metrics`) and the structured
logs with their per-request context (`logs`)."""
