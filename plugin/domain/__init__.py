"""The core: the types every other room speaks — the fence, the error table
and its kinds, the clock, policy contracts, stage payloads, client commands,
server events, the conversation, session config, input sequencing, metrics,
and function tool definitions (one parser for every surface).

At the bottom of the layering: it imports nothing of ours and does no I/O (no
asyncio), so anything above may use it and it can be tested by value alone.
"""
