"""The ASGI server: the Starlette app, one realtime socket's connection loop,
the HTTP text routes and SSE, the streaming-input generate socket, API-key
auth, a background server for tests, and the ``vllm serve`` plugin.

Thin I/O shells around the sans-I/O codec (``wire``) and the host's runtime;
clients may import it (to serve in-process), it never imports them.
"""
