"""Driving a realtime session in-process, without a socket (unit tests)."""

from __future__ import annotations

import asyncio

from vllm_duplex.domain import events as ev


async def next_event(session, *types: str, timeout: float = 10.0) -> ev.Envelope:
    """The next event the session's attachment gets (of one of ``types``, when
    given); fails if the session ends first."""
    async with asyncio.timeout(timeout):
        while True:
            env = await session.attachment.get()
            assert isinstance(env, ev.Envelope), f"session ended ({env})"
            if not types or env.event.type in types:
                return env
