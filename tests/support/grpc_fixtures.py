"""Helpers of the gRPC conformance tests: a real ``grpc.aio`` client of the
text server's gRPC port (``text_server`` serves gRPC beside HTTP)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from support.text_fixtures import KEYS
from vllm_duplex.realtime.client.grpc_client import OpenEngineClient, OpenEngineError


def grpc_client(server: Any, key: str | None = KEYS[0], owner: str | None = None) -> OpenEngineClient:
    return OpenEngineClient(server.grpc_target, api_key=key, owner=owner)


async def fails(status: grpc.StatusCode, code: str, awaitable: Any) -> OpenEngineError:
    """``awaitable`` fails with that gRPC status and error-table code (from the rich details)."""
    with pytest.raises(OpenEngineError) as info:
        await awaitable
    err = info.value
    assert (err.status, err.code) == (status, code), (err.status, err.code, err.message)
    assert err.reason == code.upper()
    return err


async def engine_idle(server: Any) -> bool:
    """No vLLM request left beyond the resident sessions' live ones."""
    stage = server.runtime.text.generator.stage
    for _ in range(250):
        if stage.engine.get_num_unfinished_requests() == stage.active_requests == \
                server.runtime.text.sessions.resident():
            return True
        await asyncio.sleep(0.02)
    return False


async def running(server: Any, request_id: str) -> None:
    """Wait until ``request_id`` runs (registered for abort)."""
    for _ in range(500):
        if any(rid == request_id for _, rid in server.runtime.text._running):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{request_id} never ran")
