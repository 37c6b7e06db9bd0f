"""Clients: the realtime SDK (``RealtimeClient``), the Python clients of the
text surfaces (``http``, ``generate_stream``) and ``talk``. The top of
``realtime``: only the CLI (``vllm_duplex.cli``) imports it."""

from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

__all__ = ["RealtimeClient", "RealtimeError"]
