"""Remote MCP tools without I/O: the definition as the codec parses it, the
two filters, and the session core's side of a listing, a call, an approval
and their failures (session/mcp_calls.py), driven by messages -- what the
runner's MCP client would hand back -- and read as the exact events."""

from __future__ import annotations

import json

import pytest
from support.session_core import create_response, manual, output
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import mcp
from vllm_duplex.domain.conversation import ConversationItem, ItemType
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import GenerateRequest, GenerationDone, ToolCall
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.domain.tools import parse_tools
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.session.effects import Emit, Submit
from vllm_duplex.session.mcp_calls import CallMcpTool, ListMcpTools, McpToolCalled, McpToolsListed

URL = "http://127.0.0.1:9/mcp"
ADD = {"name": "add", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
       "description": "Add.", "annotations": {"readOnlyHint": True}}
SHOUT = {"name": "shout", "input_schema": {"type": "object"}}


def parse(doc):
    return RealtimeCodec().parse(json.dumps(doc))


def server(**kw):
    return {"type": "mcp", "server_label": "demo", "server_url": URL, **kw}


def events(effects):
    return [e.envelope.event for e in effects if isinstance(e, Emit)]


def names(effects):
    return [e.envelope.event.type if isinstance(e, Emit) else type(e).__name__ for e in effects]


# ---- the definition ---------------------------------------------------------------


def test_an_mcp_server_is_a_session_tool_and_its_secrets_are_not_echoed():
    tool = server(headers={"X-Tenant": "acme"}, authorization="tok", allowed_tools=["add"],
                  require_approval={"never": {"tool_names": ["add"]}})
    command = parse({"type": "session.update", "session": {"tools": [tool]}})
    assert command.patch.tools == (tool,)
    core = manual()
    core.handle(command, 0.0)
    [echoed] = core.session_object()["tools"]
    assert "headers" not in echoed and "authorization" not in echoed
    assert echoed["allowed_tools"] == ["add"] and echoed["server_url"] == URL
    assert mcp.request_headers(tool) == {"X-Tenant": "acme", "Authorization": "Bearer tok"}


@pytest.mark.parametrize(("extra", "code", "param"), [
    ({"connector_id": "connector_gmail"}, "unsupported_option", "session.tools[0].connector_id"),
    ({"tunnel_id": "t"}, "unsupported_option", "session.tools[0].tunnel_id"),
    ({"defer_loading": True}, "unsupported_option", "session.tools[0].defer_loading"),
    ({"allowed_callers": ["programmatic"]}, "unsupported_option", "session.tools[0].allowed_callers"),
    ({"server_url": "ftp://x"}, "invalid_value", "session.tools[0].server_url"),
    ({"server_label": "a b"}, "invalid_value", "session.tools[0].server_label"),
    ({"headers": {"X": 1}}, "invalid_value", "session.tools[0].headers"),
    ({"require_approval": "sometimes"}, "invalid_value", "session.tools[0].require_approval"),
    ({"allowed_tools": {"read_only": "yes"}}, "invalid_value",
     "session.tools[0].allowed_tools.read_only"),
])
def test_a_bad_or_unsupported_mcp_field_is_named(extra, code, param):
    with pytest.raises(DuplexError) as ei:
        parse({"type": "session.update", "session": {"tools": [server(**extra)]}})
    assert (ei.value.code, ei.value.param) == (code, param)


def test_two_servers_with_one_label_are_refused_and_text_surfaces_take_none():
    with pytest.raises(DuplexError) as ei:
        parse({"type": "session.update", "session": {"tools": [server(), server()]}})
    assert (ei.value.code, ei.value.param) == ("invalid_value", "session.tools[1].server_label")
    with pytest.raises(DuplexError) as ei:
        parse_tools([server()])  # the generate surfaces call no server
    assert ei.value.code == "unsupported_option"
    options = parse({"type": "response.create", "response": {"tools": [server()]}}).options
    assert options.tools == (server(),)  # a response's own server (test_a_response_s_own_server...)


def test_the_filters():
    ro, rw = {"readOnlyHint": True}, None
    assert mcp.allowed(server(), "x", rw)
    assert mcp.allowed(server(allowed_tools=["add"]), "add", rw)
    assert not mcp.allowed(server(allowed_tools=["add"]), "shout", rw)
    assert mcp.allowed(server(allowed_tools={"read_only": True}), "add", ro)
    assert not mcp.allowed(server(allowed_tools={"read_only": True}), "shout", rw)
    # OpenAI's default: ask before every call
    assert mcp.needs_approval(server(), "add", ro)
    assert not mcp.needs_approval(server(require_approval="never"), "add", ro)
    never_ro = server(require_approval={"never": {"read_only": True}})
    assert not mcp.needs_approval(never_ro, "add", ro) and mcp.needs_approval(never_ro, "shout", rw)
    both = server(require_approval={"never": {"read_only": True}, "always": {"tool_names": ["add"]}})
    assert mcp.needs_approval(both, "add", ro)


# ---- the session core: listing ----------------------------------------------------------


def listed(core, tools=(ADD, SHOUT), **tool):
    effects = core.handle(cmd.SessionUpdate(SessionPatch(tools=(server(**tool),))), 0.0)
    [ask] = [e for e in effects if isinstance(e, ListMcpTools)]
    return effects, ask, core.handle(McpToolsListed(ask.item_id, tuple(tools)), 0.1)


def test_a_server_is_listed_when_configured_and_its_allowed_tools_are_offered():
    core = manual(output_modalities=("text",))
    asked, ask, back = listed(core, allowed_tools=["add"])
    assert names(asked) == ["session.updated", "conversation.item.added",
                            "mcp_list_tools.in_progress", "ListMcpTools"]
    assert ask.server["server_url"] == URL
    assert names(back) == ["mcp_list_tools.completed", "conversation.item.done"]
    item = events(back)[1].item
    assert (item["type"], item["server_label"], [t["name"] for t in item["tools"]]) == \
        ("mcp_list_tools", "demo", ["add"])
    effects = core.handle(cmd.ResponseCreate(), 0.2)
    [submit] = [e for e in effects if isinstance(e, Submit)]
    request: GenerateRequest = submit.payload
    assert request.tools == ({"type": "function", "name": "add", "description": "Add.",
                              "parameters": ADD["input_schema"]},)
    # the same server again (every session.update of some clients repeats the tools): no new listing
    again = core.handle(cmd.SessionUpdate(SessionPatch(tools=(server(allowed_tools=["add"]),))), 0.3)
    assert names(again) == ["session.updated"]


def test_a_listing_that_fails_is_an_error_and_offers_nothing():
    core = manual(output_modalities=("text",))
    effects = core.handle(cmd.SessionUpdate(SessionPatch(tools=(server(),))), 0.0)
    [ask] = [e for e in effects if isinstance(e, ListMcpTools)]
    back = core.handle(McpToolsListed(ask.item_id, error=mcp.http_error(401, "no")), 0.1)
    assert names(back) == ["mcp_list_tools.failed", "error", "conversation.item.done"]
    err = events(back)[1].error
    assert (err.code, err.details["server_label"], err.details["mcp_error"]["code"]) == \
        ("mcp_server_error", "demo", 401)
    assert core.config.mcp_tools == ()


# ---- a call ---------------------------------------------------------------------------------


def test_a_call_runs_holds_the_response_and_the_model_answers_after():
    core = manual(output_modalities=("text",))
    listed(core, require_approval="never")
    rid = create_response(core)
    called = output(core, ToolCall(rid, "call_1", "add", '{"a": 2}'))
    assert names(called) == ["response.output_item.added", "conversation.item.added",
                             "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done",
                             "response.mcp_call.in_progress", "CallMcpTool"]
    [call] = [e for e in called if isinstance(e, CallMcpTool)]
    assert (call.name, call.arguments) == ("add", '{"a": 2}')
    # the generation ends, the call still runs: no response.done yet
    assert "response.done" not in names(output(core, GenerationDone(rid, "tool_calls")))
    back = core.handle(McpToolCalled(call.item_id, output="5"), 1.0)
    assert names(back)[:5] == ["response.mcp_call.completed", "response.output_item.done",
                               "conversation.item.done", "response.done", "response.created"]
    done = events(back)[3].response
    assert [(i["type"], i["output"]) for i in done["output"]] == [("mcp_call", "5")]
    [follow] = [e for e in back if isinstance(e, Submit)]
    assert follow.payload.context[-2:][-1].role == "tool" and follow.payload.context[-1].text == "5"
    assert core.shown is not None and core.shown.id != rid


def test_a_failed_call_carries_its_error_and_the_model_still_answers():
    core = manual(output_modalities=("text",))
    listed(core, require_approval="never")
    rid = create_response(core)
    [call] = [e for e in output(core, ToolCall(rid, "c", "add", "{}")) if isinstance(e, CallMcpTool)]
    output(core, GenerationDone(rid, "tool_calls"))
    error = mcp.http_error(504, "the MCP server did not answer within 2 s")
    back = core.handle(McpToolCalled(call.item_id, error=error), 1.0)
    assert names(back)[0] == "response.mcp_call.failed"
    item = next(i for i in core.conversation if i.type is ItemType.MCP_CALL)
    assert item.error == error and item.output is None
    assert "response.created" in names(back)


# ---- approval ---------------------------------------------------------------------------------


def approval_asked(core):
    listed(core)  # require_approval: OpenAI's default, always
    rid = create_response(core)
    asked = output(core, ToolCall(rid, "c", "shout", '{"text": "hi"}'))
    assert names(asked) == ["response.output_item.added", "conversation.item.added",
                            "response.output_item.done", "conversation.item.done"]
    request = events(asked)[0].item
    assert (request["type"], request["name"], request["arguments"]) == \
        ("mcp_approval_request", "shout", '{"text": "hi"}')
    done = output(core, GenerationDone(rid, "tool_calls"))
    assert "response.done" in names(done)  # nothing runs: the response ends
    return request["id"]


def answer(core, request_id, approve, item_id="ap_1"):
    item = ConversationItem(id=item_id, type=ItemType.MCP_APPROVAL_RESPONSE,
                            approval_request_id=request_id, approve=approve)
    return core.handle(cmd.ItemCreate(item=item, event_id="e1"), 2.0)


def test_an_approved_call_runs_and_the_model_answers():
    core = manual(output_modalities=("text",))
    request_id = approval_asked(core)
    effects = answer(core, request_id, True)
    assert names(effects) == ["conversation.item.added", "conversation.item.done",
                              "conversation.item.added", "response.mcp_call.in_progress",
                              "CallMcpTool"]
    call_item = events(effects)[2].item
    assert (call_item["type"], call_item["approval_request_id"]) == ("mcp_call", request_id)
    [call] = [e for e in effects if isinstance(e, CallMcpTool)]
    back = core.handle(McpToolCalled(call.item_id, output="HI"), 3.0)
    assert names(back)[:3] == ["response.mcp_call.completed", "conversation.item.done",
                               "response.created"]


def test_a_denied_call_runs_nothing_and_an_unknown_request_is_named():
    core = manual(output_modalities=("text",))
    request_id = approval_asked(core)
    assert names(answer(core, request_id, False)) == ["conversation.item.added",
                                                      "conversation.item.done"]
    again = answer(core, request_id, True, item_id="ap_2")  # answered already
    err = events(again)[-1].error
    assert (err.code, err.param, err.event_id) == ("item_not_found", "item.approval_request_id", "e1")


def test_an_mcp_tool_choice_names_a_listed_tool():
    choice = parse({"type": "session.update", "session": {"tool_choice": {
        "type": "mcp", "server_label": "demo", "name": "shout"}}}).patch.tool_choice
    assert choice == {"type": "mcp", "server_label": "demo", "name": "shout"}
    core = manual(output_modalities=("text",))
    listed(core, require_approval="never")
    effects = core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(tool_choice=choice)), 0.2)
    [submit] = [e for e in effects if isinstance(e, Submit)]
    assert submit.payload.tool_choice == {"type": "function", "name": "shout"}
    assert [t["name"] for t in submit.payload.tools] == ["add", "shout"]
    core.handle(cmd.ResponseCancel(), 0.3)
    # no name: one of that server's tools, the model must call
    effects = core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(
        tool_choice={"type": "mcp", "server_label": "demo"})), 0.4)
    [submit] = [e for e in effects if isinstance(e, Submit)]
    assert submit.payload.tool_choice == "required"
    core.handle(cmd.ResponseCancel(), 0.5)
    # a server that listed nothing (or no such tool) cannot be chosen
    effects = core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(
        tool_choice={"type": "mcp", "server_label": "other"}), event_id="e9"), 0.6)
    err = events(effects)[-1].error
    assert (err.code, err.param, err.event_id) == ("invalid_value", "response.tool_choice", "e9")


def test_a_response_s_own_server_is_listed_first_and_then_the_response_runs():
    core = manual(output_modalities=("text",))
    own = server(server_label="own", require_approval="never", allowed_tools=["add"])
    fn = {"type": "function", "name": "weather"}
    effects = core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(tools=(own, fn)),
                                             event_id="e1"), 0.0)
    assert names(effects) == ["conversation.item.added", "mcp_list_tools.in_progress",
                              "ListMcpTools"]  # no response yet: it waits for the listing
    [ask] = [e for e in effects if isinstance(e, ListMcpTools)]
    back = core.handle(McpToolsListed(ask.item_id, (ADD, SHOUT)), 0.1)
    assert names(back)[:3] == ["mcp_list_tools.completed", "conversation.item.done",
                               "response.created"]
    [submit] = [e for e in back if isinstance(e, Submit)]
    assert [t["name"] for t in submit.payload.tools] == ["weather", "add"]
    rid = core.shown.id
    called = output(core, ToolCall(rid, "c", "add", '{"a": 2}'))
    [call] = [e for e in called if isinstance(e, CallMcpTool)]
    assert call.server["server_label"] == "own"
    # the same server again: listed already, the response starts at once
    output(core, GenerationDone(rid, "tool_calls"))
    core.handle(McpToolCalled(call.item_id, output="5"), 1.0)  # the follow-up starts
    core.handle(cmd.ResponseCancel(), 1.1)
    again = core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(tools=(own,))), 1.2)
    assert "ListMcpTools" not in names(again) and "response.created" in names(again)


def test_a_session_rebuilt_with_its_listing_lists_nothing_again():
    """A session adopted from a store (plugin/durable/) starts with its
    conversation: its servers' listings are taken from it, as the client saw them."""
    core = manual(output_modalities=("text",), tools=(server(require_approval="never"),))
    core.conversation.append(ConversationItem(id="mcpl_old", type=ItemType.MCP_LIST_TOOLS,
                                              server_label="demo", tools=[ADD]))
    effects = core.start("token", 0.0)
    assert not [e for e in effects if isinstance(e, ListMcpTools)]
    assert [t["name"] for _, t in core.config.mcp_tools] == ["add"]
    rid = create_response(core)
    assert [e for e in output(core, ToolCall(rid, "c", "add", "{}")) if isinstance(e, CallMcpTool)]


def test_a_new_session_lists_its_servers_at_the_start():
    core = manual(output_modalities=("text",), tools=(server(),))
    effects = core.start("token", 0.0)
    assert names(effects)[:4] == ["session.created", "conversation.item.added",
                                  "mcp_list_tools.in_progress", "ListMcpTools"]


def test_a_response_waiting_for_its_servers_can_be_cancelled():
    core = manual(output_modalities=("text",))
    own = server(server_label="own", require_approval="never")
    effects = core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(tools=(own,))), 0.0)
    [ask] = [e for e in effects if isinstance(e, ListMcpTools)]
    assert names(core.handle(cmd.ResponseCancel(), 0.1)) == []  # not an error: it is dropped
    back = core.handle(McpToolsListed(ask.item_id, (ADD,)), 0.2)
    assert "response.created" not in names(back) and core.shown is None
