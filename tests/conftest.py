"""Shared fixtures. Every async test fails if it leaves asyncio tasks behind."""

from __future__ import annotations

import asyncio

import pytest


@pytest.fixture(autouse=True)
async def no_leaked_tasks():
    before = set(asyncio.all_tasks())
    yield
    # Give cancelled tasks a moment to finish unwinding before we judge.
    for _ in range(20):
        leaked = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
        if not leaked:
            return
        await asyncio.sleep(0.01)
    names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in leaked))
    pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {names}")
