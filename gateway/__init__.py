"""The public front door: the OpenAI API (and later Triton's own protocols)
behind API keys, tiers and QPS + tokens/s limits, in front of Triton on
loopback. FastAPI / pydantic / uvicorn; upstream only through `client/`."""
