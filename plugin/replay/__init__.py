"""Replay: one bounded seq log and a shared byte budget (``seqlog``), and the
realtime session's journal and outbox built on it. The resumable text streams
(``vllm_duplex.text.streams``) use the same log.

Sans-I/O bookkeeping of what a reconnecting client may still get back, so it
sits low in the layering (core only) and both sessions and text build on it.
"""
