"""The way in: validation, prompt building, tokenization, word lists → the LLM step's inputs."""
