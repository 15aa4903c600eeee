"""The OpenAI API: request schemas, translation to the public tensors, SSE
chunks and the routes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`)."""
