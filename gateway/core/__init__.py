"""The gateway's protocol-neutral core, which every door (the OpenAI and
Responses routes in `openai/`, Triton's HTTP and gRPC protocols in `triton/`,
the resumable streams in `streams/`) calls and none of which it imports:
who the caller is and the access policy's interface (`authentication`,
`policy`), a request as engine requests (`engine_request`), the generation
behind an answer (`generation`), the upstream it runs on (`upstream`), how
it ends (`usage`), the error every refusal is (`errors`)."""
