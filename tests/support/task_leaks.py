"""The leak check behind every ``no_leaked_tasks`` fixture: one definition for
the three event loops tests run in (per function in conftest, per module in
the realtime tests, per session in the vLLM tests)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import pytest_asyncio


# The grpc.aio server keeps one task per registered method waiting for its next
# call; serving a call replaces it with a new one. That is its accept loop, not
# work a test left behind (a handler still running would be a different task).
_SERVER_LOOPS = ("AioServer._request_registered_call", "AioServer._request_call")


def _server_loop(task: asyncio.Task) -> bool:
    return getattr(task.get_coro(), "__qualname__", None) in _SERVER_LOOPS


async def fail_on_leaked_tasks(before: set[asyncio.Task], *, tries: int) -> None:
    """Fail the test if tasks it created are still running; cancelled tasks
    get ``tries`` x 10 ms to finish unwinding first."""
    leaked: list[asyncio.Task] = []
    for _ in range(tries):
        leaked = [t for t in asyncio.all_tasks() - before
                  if not t.done() and t is not asyncio.current_task() and not _server_loop(t)]
        if not leaked:
            return
        await asyncio.sleep(0.01)
    names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in leaked))
    pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {names}")


def leak_check(*, loop_scope: str | None = None, tries: int) -> Any:
    """An autouse ``no_leaked_tasks`` fixture for tests in the ``loop_scope``
    loop. A module that imports one overrides the conftest fixture of the same
    name, which runs in a per-function loop and would not see that loop's
    tasks. Tasks that existed before the test (a module's server, the vLLM
    engine's output handler) are not counted; every task the test caused must
    be gone after it."""

    @pytest_asyncio.fixture(loop_scope=loop_scope, autouse=True, name="no_leaked_tasks")
    async def no_leaked_tasks():
        """Fails the test if it leaves asyncio tasks running."""
        before = set(asyncio.all_tasks())
        yield
        await fail_on_leaked_tasks(before, tries=tries)

    return no_leaked_tasks
