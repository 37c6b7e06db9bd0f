"""The wire codec, sans-I/O: JSON frames to typed commands and typed events to
JSON, field parsing with typed errors, and the beta event aliases.

No sockets and no session state, so it is tested byte for byte; the bottom of
``realtime``: the server and the clients build on it.
"""
