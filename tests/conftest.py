"""Shared fixtures. Every async test fails if it leaves asyncio tasks behind.

``vllm_stage`` (the real vLLM engine) and ``text_server`` (a server on it) are
defined here, once: a session-scoped fixture imported into several test
modules would be a separate fixture in each, and start one engine per module.
"""

from __future__ import annotations

import pytest_asyncio
from support.task_leaks import leak_check

no_leaked_tasks = leak_check(tries=20)  # the per-function loop of most tests


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_stage():
    """ONE vLLM engine for the test session (the prepared SmolLM2, float32 +
    eager on CPU); vLLM is imported only by sessions that use it."""
    from vllm_duplex.stages.vllm.llm import VllmLlmStage

    stage = VllmLlmStage()
    await stage.start()
    yield stage
    await stage.shutdown()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def text_server(vllm_stage):
    """A server on that engine for the text-surface tests (see text_fixtures)."""
    from support.text_fixtures import text_runtime
    from vllm_duplex.realtime.server.serving import BackgroundServer

    async with BackgroundServer(text_runtime(vllm_stage, stream_ttl_s=2.0), grpc_port=0) as server:
        yield server
