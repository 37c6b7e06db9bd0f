"""Remote MCP tools end to end: real MCP servers in a subprocess on loopback
(the SDK's ``MCPServer`` over streamable HTTP and SSE, one behind a header
check, and the published ``mcp-server-time``), the realtime server on the
scripted pipeline whose LLM calls the first tool it is offered
(``call_tools``), and our client on the socket. Every MCP event is checked
against the ``openai`` SDK's own event models.

The model on the default pipeline (SmolLM2 on vLLM) calling one of these
servers is ``test_mcp_vllm.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.realtime import (
    ConversationItemDone,
    McpListToolsCompleted,
    RealtimeMcpApprovalRequest,
    RealtimeMcpToolCall,
    RealtimeServerEvent,
    ResponseDoneEvent,
    ResponseMcpCallCompleted,
)
from pydantic import TypeAdapter
from support.mcp_servers import TENANT, TOKEN, McpServers, free_ports
from support.realtime_fixtures import no_leaked_tasks, scripted_config, serve  # noqa: F401
from support.realtime_fixtures import silence
from vllm_duplex.host.deploy import DeployConfig, StageSpec
from vllm_duplex.realtime.client.realtime import Event, RealtimeClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT_S = 3.0  # limits.mcp_timeout_s of the server for the slow tool (``slow_server``)
SDK_EVENT = TypeAdapter(RealtimeServerEvent)


def calling(arguments: str, **limits: Any) -> DeployConfig:
    """The scripted pipeline, its LLM calling the first tool with ``arguments``."""
    config = scripted_config(**limits)
    stages = tuple(StageSpec(s.type, {**s.options, "call_tools": True, "tool_arguments": arguments})
                   if s.type == "scripted_llm" else s for s in config.stages)
    return dataclasses.replace(config, stages=stages)


@pytest.fixture(scope="module")
def mcp_servers() -> Iterator[McpServers]:
    servers = McpServers().start()
    yield servers
    servers.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[Any]:
    async with serve(calling('{"a": 2, "b": 3}')) as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="module")
async def rt(server) -> AsyncIterator[RealtimeClient]:
    async with await RealtimeClient.connect(server.ws_url) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def slow_server() -> AsyncIterator[Any]:
    """Calls time out after TIMEOUT_S (the others have the default, 30 s)."""
    async with serve(calling('{"a": 2, "b": 3}', mcp_timeout_s=TIMEOUT_S)) as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="module")
async def slow_rt(slow_server) -> AsyncIterator[RealtimeClient]:
    async with await RealtimeClient.connect(slow_server.ws_url) as client:
        yield client


def mcp(url: str, **kw: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "demo", "server_url": url, **kw}


async def configure(rt: RealtimeClient, *tools: dict[str, Any]) -> Event:
    """Text replies, no VAD, ``tools``; returns the listing's conversation.item.done."""
    await rt.update_session({"output_modalities": ["text"], "tools": list(tools),
                             "audio": {"input": {"turn_detection": None}}})
    return await rt.wait_for("conversation.item.done", timeout=30)


async def ask(rt: RealtimeClient, text: str = "What is 2 plus 3?") -> None:
    await rt.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await rt.create_response()


def of(rt: RealtimeClient, *types: str) -> list[Event]:
    return [e for e in rt.events if e["type"] in types]


def sdk_checked(rt: RealtimeClient) -> list[str]:
    """Every MCP event and item the client got, parsed by the openai SDK's models."""
    seen = []
    for e in rt.events:
        item_type = (e.get("item") or {}).get("type", "")
        if "mcp" in e["type"] or item_type.startswith("mcp"):
            SDK_EVENT.validate_python(e)
            seen.append(e["type"])
    return seen


async def test_tools_are_listed_filtered_called_and_the_model_answers(rt, mcp_servers):
    listing = await configure(rt, mcp(mcp_servers.url(0), allowed_tools=["add"],
                                      require_approval="never"))
    item = listing["item"]
    assert item["type"] == "mcp_list_tools" and item["server_label"] == "demo"
    assert [t["name"] for t in item["tools"]] == ["add"]  # multiply, slow, broken filtered out
    assert item["tools"][0]["annotations"] == {"readOnlyHint": True}
    await ask(rt)
    first = await rt.wait_for("response.done", timeout=30)
    answer = await rt.wait_for("response.done", timeout=30)
    [call] = first["response"]["output"]
    assert (call["type"], call["name"], call["arguments"], call["output"], call["error"]) == \
        ("mcp_call", "add", '{"a": 2, "b": 3}', "5", None)
    assert first["response"]["status"] == answer["response"]["status"] == "completed"
    assert [i["type"] for i in answer["response"]["output"]] == ["message"]
    assert sdk_checked(rt) == [
        "conversation.item.added", "mcp_list_tools.in_progress", "mcp_list_tools.completed",
        "conversation.item.done", "response.output_item.added", "conversation.item.added",
        "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress", "response.mcp_call.completed",
        "response.output_item.done", "conversation.item.done"]
    # The follow-up saw the result: its request's context ended with the tool's output.
    created = of(rt, "response.created")
    assert len(created) == 2 and created[1]["response"]["id"] == answer["response"]["id"]


async def test_a_spoken_reply_waits_for_its_call_and_the_answer_is_spoken(rt, mcp_servers):
    """Audio out (the session's default): the reply that called ends when the call
    is back, and the follow-up speaks."""
    await rt.update_session({"tools": [mcp(mcp_servers.url(0), allowed_tools=["add"],
                                           require_approval="never")],
                             "audio": {"input": {"turn_detection": None}}})
    await rt.wait_for("conversation.item.done", timeout=30)
    await ask(rt)
    first = await rt.wait_for("response.done", timeout=30)
    assert [i["type"] for i in first["response"]["output"]] == ["mcp_call"]
    types = [e["type"] for e in rt.events]
    assert types.index("response.mcp_call.completed") < types.index("response.done")
    answer = await rt.wait_for("response.done", timeout=30)
    rid = answer["response"]["id"]
    assert any(e["type"] == "response.output_audio.delta" and e["response_id"] == rid
               for e in rt.events)
    assert answer["response"]["output"][0]["content"][0]["transcript"]


async def test_require_approval_by_filter(rt, mcp_servers):
    """``never`` for read-only tools: ``add`` (readOnlyHint) runs unasked."""
    await configure(rt, mcp(mcp_servers.url(0), allowed_tools=["add"],
                            require_approval={"never": {"read_only": True}}))
    await ask(rt)
    first = await rt.wait_for("response.done", timeout=30)
    assert [(i["type"], i["output"]) for i in first["response"]["output"]] == [("mcp_call", "5")]


async def test_tool_choice_names_the_mcp_tool(rt, mcp_servers):
    """The scripted model calls the first tool it may: "multiply" only when chosen."""
    await configure(rt, mcp(mcp_servers.url(0), allowed_tools=["add", "multiply"],
                            require_approval="never"))
    await rt.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "2 x 3?"}]}})
    await rt.create_response({"tool_choice": {"type": "mcp", "server_label": "demo",
                                              "name": "multiply"}})
    first = await rt.wait_for("response.done", timeout=30)
    assert [(i["name"], i["output"]) for i in first["response"]["output"]] == [("multiply", "6")]


async def test_a_response_s_own_server_is_listed_then_called(rt, mcp_servers):
    """``response.create`` with an MCP server of its own (none in the session)."""
    await rt.update_session({"output_modalities": ["text"],
                             "audio": {"input": {"turn_detection": None}}})
    await rt.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "2+3?"}]}})
    await rt.create_response({"tools": [mcp(mcp_servers.url(0), server_label="own",
                                            allowed_tools=["add"], require_approval="never")]})
    first = await rt.wait_for("response.done", timeout=30)
    types = [e["type"] for e in rt.events]
    assert types.index("mcp_list_tools.completed") < types.index("response.created")
    assert [(i["server_label"], i["output"]) for i in first["response"]["output"]] == [("own", "5")]
    assert (await rt.wait_for("response.done", timeout=30))["response"]["status"] == "completed"
    sdk_checked(rt)


async def test_a_call_waits_for_approval_over_sse(rt, mcp_servers):
    await configure(rt, mcp(mcp_servers.url(2), allowed_tools={"tool_names": ["multiply"]}))
    await ask(rt, "What is 2 times 3?")
    done = await rt.wait_for("response.done", timeout=30)
    [request] = done["response"]["output"]
    assert (request["type"], request["name"]) == ("mcp_approval_request", "multiply")
    assert not of(rt, "response.mcp_call.in_progress")  # nothing ran unasked
    await rt.send({"type": "conversation.item.create", "item": {
        "type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}})
    completed = await rt.wait_for("response.mcp_call.completed", "response.mcp_call.failed",
                                  timeout=30)
    assert completed["type"] == "response.mcp_call.completed"
    call = (await rt.wait_for("conversation.item.done", timeout=10))["item"]
    assert (call["type"], call["approval_request_id"], call["output"]) == \
        ("mcp_call", request["id"], "6")
    answer = await rt.wait_for("response.done", timeout=30)
    assert answer["response"]["status"] == "completed"
    sdk_checked(rt)


async def test_a_denied_call_runs_nothing(rt, mcp_servers):
    await configure(rt, mcp(mcp_servers.url(0), allowed_tools=["multiply"]))
    await ask(rt)
    request = (await rt.wait_for("response.done", timeout=30))["response"]["output"][0]
    await rt.send({"type": "conversation.item.create", "item": {
        "type": "mcp_approval_response", "approval_request_id": request["id"], "approve": False,
        "reason": "not now"}})
    added = await rt.wait_for("conversation.item.done", timeout=10)
    assert added["item"]["approve"] is False and added["item"]["reason"] == "not now"
    await asyncio.sleep(0.5)
    assert not of(rt, "response.mcp_call.in_progress", "response.created")[1:]


async def test_headers_and_authorization_reach_the_server(rt, mcp_servers):
    guarded = mcp(mcp_servers.url(1), headers={"X-Tenant": TENANT}, authorization=TOKEN,
                  allowed_tools=["add"], require_approval="never")
    listing = await configure(rt, guarded)
    assert [t["name"] for t in listing["item"]["tools"]] == ["add"]
    assert "headers" not in rt.session["tools"][0] and "authorization" not in rt.session["tools"][0]
    await ask(rt)
    first = await rt.wait_for("response.done", timeout=30)
    assert first["response"]["output"][0]["output"] == "5"


async def test_a_server_that_refuses_fails_the_listing_and_the_session_goes_on(rt, mcp_servers):
    listing = await configure(rt, mcp(mcp_servers.url(1), headers={"X-Tenant": "other"}))
    assert listing["item"]["tools"] == []
    [failed] = of(rt, "mcp_list_tools.failed")
    assert failed["item_id"] == listing["item"]["id"]
    [error] = of(rt, "error")
    assert (error["error"]["code"], error["error"]["mcp_error"]) == \
        ("mcp_server_error", {"type": "http_error", "code": 401,
                              "message": "the MCP server answered HTTP 401"})
    await ask(rt)  # no tools offered: the model answers in words
    done = await rt.wait_for("response.done", timeout=30)
    assert [i["type"] for i in done["response"]["output"]] == ["message"]
    sdk_checked(rt)


async def test_an_unreachable_server_fails_the_listing(rt):
    [port] = free_ports(1)  # nothing listens there
    await configure(rt, mcp(f"http://127.0.0.1:{port}/mcp"))
    [error] = of(rt, "error")
    assert error["error"]["mcp_error"]["type"] == "http_error"
    assert error["error"]["mcp_error"]["code"] == 502


async def test_a_tool_that_fails_is_a_typed_error_in_the_item(rt, mcp_servers):
    await configure(rt, mcp(mcp_servers.url(0), allowed_tools=["broken"], require_approval="never"))
    await ask(rt)
    first = await rt.wait_for("response.done", timeout=30)
    [call] = first["response"]["output"]
    assert call["output"] is None
    assert call["error"]["type"] == "tool_execution_error"
    assert call["error"]["message"].endswith("the broken tool is broken")  # the server's words
    assert of(rt, "response.mcp_call.failed")
    answer = await rt.wait_for("response.done", timeout=30)  # the model is told, and answers
    assert answer["response"]["status"] == "completed"
    sdk_checked(rt)


async def test_an_output_too_long_is_a_typed_error(rt, mcp_servers):
    await configure(rt, mcp(mcp_servers.url(0), allowed_tools=["big"], require_approval="never"))
    await ask(rt)
    first = await rt.wait_for("response.done", timeout=30)
    [call] = first["response"]["output"]
    assert call["output"] is None and call["error"]["type"] == "tool_execution_error"
    assert "307200 characters" in call["error"]["message"]


async def test_a_slow_server_times_out_and_never_holds_the_session(slow_rt, mcp_servers):
    await configure(slow_rt, mcp(mcp_servers.url(0), allowed_tools=["slow"],
                                 require_approval="never"))
    await ask(slow_rt)
    await slow_rt.wait_for("response.mcp_call.in_progress", timeout=30)
    # While the call runs, audio goes in and the session answers at once.
    loop = asyncio.get_running_loop()
    started = loop.time()
    await slow_rt.append_audio(silence(0.2))
    await slow_rt.commit()
    committed = await slow_rt.wait_for("input_audio_buffer.committed", timeout=5)
    assert committed and loop.time() - started < 1.0
    assert not of(slow_rt, "response.mcp_call.failed", "response.mcp_call.completed")  # still running
    failed = await slow_rt.wait_for("response.mcp_call.failed", timeout=TIMEOUT_S + 10)
    assert loop.time() - started < TIMEOUT_S + 3
    first = await slow_rt.wait_for("response.done", timeout=10)
    [call] = first["response"]["output"]
    assert call["id"] == failed["item_id"]
    assert call["error"] == {"type": "http_error", "code": 504,
                             "message": f"the MCP server did not answer within {TIMEOUT_S:g} s"}


async def test_a_reply_cancelled_mid_call_gets_no_follow_up(slow_rt, mcp_servers):
    await configure(slow_rt, mcp(mcp_servers.url(0), allowed_tools=["slow"],
                                 require_approval="never"))
    await ask(slow_rt)
    started = await slow_rt.wait_for("response.mcp_call.in_progress", timeout=30)
    await slow_rt.cancel_response()
    done = await slow_rt.wait_for("response.done", timeout=5)
    assert done["response"]["status"] == "cancelled"
    failed = await slow_rt.wait_for("response.mcp_call.failed", timeout=TIMEOUT_S + 10)
    assert failed["item_id"] == started["item_id"]
    item = (await slow_rt.wait_for("conversation.item.done", timeout=5))["item"]
    assert item["id"] == started["item_id"] and item["error"]["code"] == 504
    await asyncio.sleep(0.3)
    assert len(of(slow_rt, "response.created")) == 1  # no follow-up to a cancelled reply


async def test_a_session_closed_mid_call_leaves_nothing_running(server, mcp_servers):
    """The call's task (and its MCP session and HTTP connection) ends with the
    session: the module's leak check fails the test otherwise."""
    async with await RealtimeClient.connect(server.ws_url) as rt:
        await configure(rt, mcp(mcp_servers.url(0), allowed_tools=["slow"],
                                require_approval="never"))
        await ask(rt)
        await rt.wait_for("response.mcp_call.in_progress", timeout=30)
    # the client closed its socket (and the session) with the call running


async def test_the_published_time_server_answers(mcp_servers):
    """``mcp-server-time`` (PyPI), its tools as it lists them."""
    async with serve(calling('{"timezone": "Europe/Paris"}')) as srv:
        async with await RealtimeClient.connect(srv.ws_url) as rt:
            listing = await configure(rt, mcp(mcp_servers.url(3), server_label="time",
                                              allowed_tools=["get_current_time"],
                                              require_approval="never"))
            [tool] = listing["item"]["tools"]
            assert tool["name"] == "get_current_time" and "timezone" in json.dumps(tool["input_schema"])
            await ask(rt, "What time is it in Paris?")
            first = await rt.wait_for("response.done", timeout=30)
            await rt.wait_for("response.done", timeout=30)
    [call] = first["response"]["output"]
    assert call["error"] is None, call
    result = json.loads(call["output"])
    assert result["timezone"] == "Europe/Paris" and result["datetime"]


async def test_the_openai_sdk_drives_an_approval(server, mcp_servers):
    """The official ``openai`` SDK's realtime client: it configures the server,
    reads the typed MCP events and items, and approves the call."""
    async with AsyncOpenAI(api_key="sk-local", base_url=server.http_url + "/v1",
                           websocket_base_url=f"ws://127.0.0.1:{server.port}/v1") as client:
        async with client.realtime.connect(model="duplex-scripted") as conn:
            async def until(kind: type) -> Any:
                while not isinstance(event := await conn.recv(), kind):
                    pass
                return event

            await conn.session.update(session={
                "type": "realtime", "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
                "tools": [mcp(mcp_servers.url(0), allowed_tools=["add"])]})
            await until(McpListToolsCompleted)
            await conn.conversation.item.create(item={
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "What is 2 plus 3?"}]})
            await conn.response.create()
            done = await until(ResponseDoneEvent)
            [request] = done.response.output
            assert isinstance(request, RealtimeMcpApprovalRequest) and request.name == "add"
            await conn.conversation.item.create(item={
                "type": "mcp_approval_response", "approval_request_id": request.id,
                "approve": True})
            completed = await until(ResponseMcpCallCompleted)
            call = (await until(ConversationItemDone)).item
            answer = await until(ResponseDoneEvent)
    assert isinstance(call, RealtimeMcpToolCall) and call.id == completed.item_id
    assert (call.approval_request_id, call.output, call.error) == (request.id, "5", None)
    assert answer.response.status == "completed"


async def test_a_client_secret_carries_the_server_s_credentials_to_no_browser(mcp_servers):
    """The backend mints a client secret whose session names the guarded server
    with its credentials; the browser's session lists the server's tools (the
    credentials reached it) and never sees them."""
    key = "sk-backend"
    async with serve(dataclasses.replace(calling("{}"), api_keys=(key,))) as srv:
        guarded = mcp(mcp_servers.url(1), headers={"X-Tenant": TENANT}, authorization=TOKEN,
                      allowed_tools=["add"])
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            minted = await http.post("/v1/realtime/client_secrets",
                                     headers={"Authorization": f"Bearer {key}"},
                                     json={"session": {"type": "realtime", "tools": [guarded]}})
        assert minted.status_code == 200, minted.text
        assert TOKEN not in minted.text and TENANT not in minted.text
        async with await RealtimeClient.connect(srv.ws_url, api_key=minted.json()["value"]) as rt:
            listing = await rt.wait_for("conversation.item.done", timeout=30)
            assert [t["name"] for t in listing["item"]["tools"]] == ["add"]
            frames = json.dumps(rt.events)
    assert TOKEN not in frames and TENANT not in frames
