"""The leak check behind every ``no_leaked_tasks`` fixture (per-function loop
in conftest, the module loop of realtime tests, the session loop of vLLM tests)."""

from __future__ import annotations

import asyncio

import pytest


async def fail_on_leaked_tasks(before: set[asyncio.Task], *, tries: int) -> None:
    """Fail the test if tasks it created are still running; cancelled tasks
    get ``tries`` x 10 ms to finish unwinding first."""
    leaked: list[asyncio.Task] = []
    for _ in range(tries):
        leaked = [t for t in asyncio.all_tasks() - before
                  if not t.done() and t is not asyncio.current_task()]
        if not leaked:
            return
        await asyncio.sleep(0.01)
    names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in leaked))
    pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {names}")
