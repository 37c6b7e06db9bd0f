"""OpenAI-Realtime-compatible wire protocol, ASGI server, client and CLI."""
