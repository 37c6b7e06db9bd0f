"""Shared fixtures. Every async test fails if it leaves asyncio tasks behind.

``vllm_stage`` (the real vLLM engine) and ``text_server`` (a server on it) are
defined here, once: a session-scoped fixture imported into several test
modules would be a separate fixture in each, and start one engine per module.
"""

from __future__ import annotations

import pytest_asyncio
from hypothesis import settings
from support.task_leaks import leak_check

no_leaked_tasks = leak_check(tries=20)  # the per-function loop of most tests

# Property tests check behaviour; speed is bench/'s. Hypothesis's default
# 200 ms per example is a timing assertion a loaded machine misses
# (test_fence's random text failed so once, at load 10-13).
settings.register_profile("duplex", deadline=None)
settings.load_profile("duplex")


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


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def tiny_omni_stage():
    """ONE vLLM engine serving the tiny MiniCPM-o 4.5 (random weights, built
    once into the model cache: ``vllm_duplex.testing.tiny_omni``) with the
    ``vllm_omni`` options of configs/omni-tiny-cpu.yaml."""
    from support.omni_fixtures import tiny_omni_stage as make

    stage = await make()
    yield stage
    await stage.close()
