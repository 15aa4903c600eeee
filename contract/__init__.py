"""The wire contract (docs/interface.md) that the text stages, the LLM step,
the gateway, the client library and the deployment share, defined once:

- `public_tensors`: the public inputs and outputs (names, types, dims) and the
  public -> LLM-step name map;
- `public_bounds`: the value rules of the public inputs;
- `request_key`: the secret that identifies a request for `stop` (mint, parse);
- `stop_inputs`: the `stop` request to the LLM step;
- `metric_names`: the names of the engine's metrics that others read;
- `errors`: the refusal form (`<field>: <what>`) and the overload marker.

Imports nothing of the project (stdlib, and numpy for the stop tensors), so
every side can depend on it. The package root re-exports nothing."""
