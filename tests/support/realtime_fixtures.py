"""Shared helpers for the loopback integration tests (``tests/integration/test_realtime_*.py``).

Each integration module runs its tests in one module-scoped event loop so that
a module can share one real server (``BackgroundServer``)::

    pytestmark = pytest.mark.asyncio(loop_scope="module")
    from support.realtime_fixtures import no_leaked_tasks  # noqa: F401  (module-loop leak check)
    server = module_server(scripted_config(...))  # the module's one server (fixture)
    rt = realtime_client()  # a connected RealtimeClient per test (fixture)

``no_leaked_tasks`` here overrides the conftest fixture of the same name: the
conftest one runs in a per-function loop and would not see this loop's tasks.
Tasks that existed before the test (the server itself) are not counted; every
task the test caused (server-side session tasks included) must be gone after it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest_asyncio
from support.audio import b64, chunks, silence, tone, utterance  # noqa: F401  (re-exported)
from support.task_leaks import leak_check
from vllm_duplex.host.deploy import DeployConfig, StageSpec, load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.client.realtime import Event, RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer

SCRIPTED_REPLY = "Hello from the scripted duplex engine. Every turn gets this same answer."
# A reply long enough (~0.5 s of LLM time at 0.02 s per word) that a response is
# still streaming when the test reacts to its first delta.
LONG_REPLY = " ".join(f"Sentence number {i} of a long scripted reply." for i in range(1, 4))

ANY: Any = object()

# Error codes -> (error.type, retryable) as the wire must show them (docs/errors.md).
ERROR_SHAPES: dict[str, tuple[str, bool]] = {
    **{code: ("invalid_request_error", False) for code in (
        "invalid_json", "invalid_event", "unknown_event", "event_too_large", "invalid_audio",
        "invalid_value", "immutable_field", "unsupported_audio_format",
        "unsupported_turn_detection", "capability_unsupported", "input_audio_buffer_empty",
        "response_cancel_not_active", "item_not_found", "session_closed", "model_not_found")},
    "conversation_already_has_active_response": ("invalid_request_error", True),
    "unauthorized": ("authentication_error", False),
    "resource_exhausted": ("server_error", True),
}


no_leaked_tasks = leak_check(loop_scope="module", tries=100)


# ---- servers ------------------------------------------------------------------


def scripted_config(*, reply: str | None = None, api_keys: tuple[str, ...] = (),
                    **limits: Any) -> DeployConfig:
    """``configs/scripted.yaml``, optionally with another LLM reply, API keys or limits.
    A dropped socket ends its session (``resume_grace_s=0``) unless a test asks for
    resume: a detached session would outlive its test (and fail its leak check)."""
    limits = {"resume_grace_s": 0.0, **limits}
    config = load_config("scripted")
    if reply is not None:
        stages = tuple(StageSpec(s.type, {**s.options, "reply": reply})
                       if s.type == "scripted_llm" else s for s in config.stages)
        config = dataclasses.replace(config, stages=stages)
    if limits:
        config = dataclasses.replace(config, limits=dataclasses.replace(config.limits, **limits))
    if api_keys:
        config = dataclasses.replace(config, api_keys=api_keys)
    return config


def recall_config() -> DeployConfig:
    """``scripted_config`` whose LLM says back what its context holds
    (``recall``): a test reads what a session started from in its replies."""
    base = scripted_config()
    stages = tuple(StageSpec(s.type, {**s.options, "recall": True})
                   if s.type == "scripted_llm" else s for s in base.stages)
    return dataclasses.replace(base, stages=stages)


async def calls_ended(server: BackgroundServer) -> None:
    """After a call test: every call, GPT-Live line and session it opened has
    ended (each is given 3 s to finish closing)."""
    app = server._server.config.app.state
    for _ in range(300):
        if not (len(app.calls) or len(app.live_lines) or len(server.runtime.manager)):
            break
        await asyncio.sleep(0.01)
    assert len(app.calls) == 0, "a call outlived its test"
    assert len(app.live_lines) == 0, "a live line outlived its call"
    assert len(server.runtime.manager) == 0, "a session outlived its call"


@asynccontextmanager
async def serve(config: DeployConfig | None = None) -> AsyncIterator[BackgroundServer]:
    async with BackgroundServer(Runtime(config or scripted_config())) as server:
        yield server


def module_server(config: DeployConfig | None = None) -> Any:
    """The ``server`` fixture of a module: one server on ``config`` (default
    ``scripted_config()``) for all its tests, in the module loop."""

    @pytest_asyncio.fixture(scope="module", loop_scope="module", name="server")
    async def server() -> AsyncIterator[BackgroundServer]:
        async with serve(config) as srv:
            yield srv

    return server


def realtime_client(session: dict[str, Any] | None = None) -> Any:
    """The ``rt`` fixture of a module: a ``RealtimeClient`` connected to
    ``server`` for one test (after a ``session.update`` with ``session``, when
    given)."""

    @pytest_asyncio.fixture(loop_scope="module", name="rt")
    async def rt(server: BackgroundServer) -> AsyncIterator[RealtimeClient]:
        async with await RealtimeClient.connect(server.ws_url) as client:
            if session is not None:
                await client.update_session(session)
            yield client

    return rt


# ---- audio --------------------------------------------------------------------


async def stream_audio(rt: RealtimeClient, pcm: bytes, *, rate: int = 24000) -> None:
    """Appends ``pcm`` in 20 ms chunks, as fast as the socket takes them."""
    for chunk in chunks(pcm, rate=rate):
        await rt.append_audio(chunk)


# ---- assertions -----------------------------------------------------------------


def assert_error(event: Event, code: str, *, event_id: str | None = ANY, param: Any = ANY) -> None:
    """The Realtime error event's shape, with error.type/retryable from ``ERROR_SHAPES``."""
    assert event["type"] == "error", event
    assert isinstance(event.get("event_id"), str) and event["event_id"], event
    err = event["error"]
    assert set(err) >= {"type", "code", "message", "param", "event_id", "retryable"}, err
    etype, retryable = ERROR_SHAPES[code]
    assert err["code"] == code, err
    assert err["type"] == etype, err
    assert err["retryable"] is retryable, err
    assert isinstance(err["message"], str) and err["message"], err
    if event_id is not ANY:
        assert err["event_id"] == event_id, err
    if param is not ANY:
        assert err["param"] == param, err


async def expect_error(rt: RealtimeClient, code: str, *, event_id: str | None = ANY,
                       param: Any = ANY, timeout: float = 10.0) -> Event:
    event = await rt.wait_for("error", timeout=timeout)
    assert_error(event, code, event_id=event_id, param=param)
    return event


async def assert_alive(rt: RealtimeClient) -> None:
    """The socket still answers commands: an empty session.update gets session.updated."""
    session = await rt.update_session({}, timeout=10)
    assert session.get("id") == rt.session_id


async def sentinel(rt: RealtimeClient, item_id: str) -> Event:
    """Round-trip a conversation.item.retrieve: everything the server sent before
    its answer has been read when this returns."""
    eid = await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
    event = await rt.wait_for("conversation.item.retrieved", "error", timeout=10)
    assert event["type"] == "conversation.item.retrieved", event
    assert event["item"]["id"] == item_id
    assert eid
    return event


def of_response(events: list[Event], response_id: str) -> list[Event]:
    return [e for e in events
            if e.get("response_id") == response_id or (e.get("response") or {}).get("id") == response_id]


def types(events: list[Event]) -> list[str]:
    return [e["type"] for e in events]
