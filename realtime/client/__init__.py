"""Clients: the realtime SDK (``RealtimeClient``), the Python clients of the
text surfaces (``http``, ``generate_stream``), ``talk`` and the ``vllm-duplex``
CLI. The top of the layering: nothing imports it."""

from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

__all__ = ["RealtimeClient", "RealtimeError"]
