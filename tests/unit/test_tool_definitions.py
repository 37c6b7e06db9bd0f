"""Tool definitions are read by one parser (``vllm_duplex.domain.tools``) on
every surface: a realtime ``session.update`` and a text ``generate`` accept
the same tools and refuse the same mistakes with the same code, naming the
same field under their own prefix."""

from __future__ import annotations

import json

import pytest
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.tools import parse_tools
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.text.requests import parse_generate

WEATHER = {"type": "function", "name": "get_weather-2", "description": "Weather now.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def realtime_tools(tools):
    """``session.tools`` as the codec parses it, or the error event's (code, param)."""
    codec = RealtimeCodec()
    try:
        update = codec.parse(json.dumps({"type": "session.update", "session": {"tools": tools}}))
    except DuplexError as err:
        return err.code, err.param
    return update.patch.tools


def text_tools(tools):
    """``tools`` of a generate request as parsed, or the error's (code, param)."""
    try:
        spec = parse_generate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                               "tools": tools}, served_model="m", max_tokens_cap=16)
    except DuplexError as err:
        return err.code, err.param
    return spec.tools


@pytest.mark.parametrize("tools, field", [
    ([{"name": "get weather"}], "[0].name"),  # a space: off OpenAI's pattern
    ([{"name": "a.b"}], "[0].name"),
    ([{"name": "x" * 65}], "[0].name"),
    ([{"name": ""}], "[0].name"),
    ([{"description": "no name"}], "[0].name"),
    ([{"name": "a"}, {"name": "a"}], "[1].name"),
    ([{"type": "function", "function": {"name": "a"}}, {"name": "a"}], "[1].name"),
    ([{"name": "a", "parameters": "{}"}], "[0].parameters"),
    ([{"name": "a", "description": 3}], "[0].description"),
    ([5], "[0]"),
    ({"name": "a"}, ""),
])
def test_both_surfaces_refuse_the_same_tool_with_invalid_value(tools, field):
    assert realtime_tools(tools) == ("invalid_value", f"session.tools{field}")
    assert text_tools(tools) == ("invalid_value", f"tools{field}")


@pytest.mark.parametrize("tools", [[{"type": "code_interpreter"}]])
def test_both_surfaces_refuse_a_tool_of_another_type_by_name(tools):
    """A valid tool this engine lacks is ``unsupported_option``, not a typo."""
    assert realtime_tools(tools) == ("unsupported_option", "session.tools[0].type")
    assert text_tools(tools) == ("unsupported_option", "tools[0].type")


def test_an_mcp_server_is_a_realtime_session_s_tool_only():
    """The realtime session's runner calls MCP servers (test_mcp_tools_core.py);
    the text surfaces have no one to call them."""
    mcp = [{"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:9/mcp"}]
    assert realtime_tools(mcp) == tuple(mcp)
    assert text_tools(mcp) == ("unsupported_option", "tools[0].type")


def test_both_surfaces_accept_both_shapes_and_the_same_names():
    nested = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    for shape in (WEATHER, nested):
        assert realtime_tools([shape]) == (WEATHER,)
        assert text_tools([shape]) == (WEATHER,)


def test_a_tool_keeps_only_what_was_given_and_text_fills_the_template_defaults():
    assert parse_tools([{"name": "ping"}]) == ({"type": "function", "name": "ping"},)
    assert realtime_tools([{"name": "ping"}]) == ({"type": "function", "name": "ping"},)
    assert text_tools([{"name": "ping"}]) == ({"type": "function", "name": "ping", "description": "",
                                               "parameters": {"type": "object"}},)
