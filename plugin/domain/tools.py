"""Function tools as the OpenAI APIs declare them, parsed once for every surface.

The realtime session (``session.tools``, ``response.tools``) and the text
surfaces (``tools`` of a generate request) take the same definitions, in the
Realtime / Responses shape ``{"type": "function", "name", "description"?,
"parameters"?}`` or the Chat Completions shape ``{"type": "function",
"function": {"name", ...}}``, and get them back in the first, with
``description`` and ``parameters`` only where the client gave them.

One rule for a name, OpenAI's: 1-64 characters of ``[A-Za-z0-9_-]``, unique
in the list. Every mistake is ``invalid_value`` naming the field, as OpenAI
answers a name off the pattern; a tool of another type is ``unsupported_option``
naming its ``type``: it may be valid, this engine lacks it. ``mcp`` tools
(``domain/mcp.py``) are taken where the caller says so (``mcp=True``: the
realtime session, whose runner calls the servers); the text surfaces refuse them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.mcp import parse_mcp_tool

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _bad(param: str, message: str) -> DuplexError:
    return DuplexError("invalid_value", message, param=param)


def tool_name(tool: Mapping[str, Any]) -> Any:
    """The name a tool (or a named ``tool_choice``) gives, in either shape;
    None when it gives none."""
    fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
    return fn.get("name")


def parse_tools(raw: Any, param: str = "tools", *, mcp: bool = False) -> tuple[dict[str, Any], ...]:
    """``raw`` (None: no tools) as flat function tools (and, with ``mcp``,
    MCP servers); ``param`` is the path the errors name (``session.tools``, ``tools``)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad(param, f"{param} must be a list")
    tools: list[dict[str, Any]] = []
    names: set[str] = set()
    labels: set[str] = set()
    for i, t in enumerate(raw):
        p = f"{param}[{i}]"
        if not isinstance(t, Mapping):
            raise _bad(p, f"{p} must be an object")
        kind = t.get("type", "function")
        if kind == "mcp" and mcp:
            server = parse_mcp_tool(t, p)
            if server["server_label"] in labels:
                raise _bad(f"{p}.server_label", f"duplicate server_label {server['server_label']!r}")
            labels.add(server["server_label"])
            tools.append(server)
            continue
        if kind != "function":  # a valid tool of another kind (mcp, ...): refused by name
            raise DuplexError("unsupported_option", f"{p}.type {kind!r} is not supported: "
                              "only function tools are", param=f"{p}.type")
        fn = t.get("function") if isinstance(t.get("function"), Mapping) else t
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise _bad(f"{p}.name", f"{p}.name must be 1-64 characters of [A-Za-z0-9_-]")
        if name in names:
            raise _bad(f"{p}.name", f"duplicate tool name {name!r}")
        names.add(name)
        tool: dict[str, Any] = {"type": "function", "name": name}
        description = fn.get("description")
        if description is not None:
            if not isinstance(description, str) or not _is_text(description):
                raise _bad(f"{p}.description", f"{p}.description must be a string")
            tool["description"] = description
        parameters = fn.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, Mapping):
                raise _bad(f"{p}.parameters", f"{p}.parameters must be a JSON schema object")
            tool["parameters"] = dict(parameters)
        tools.append(tool)
    return tuple(tools)


def _is_text(value: str) -> bool:
    """Valid Unicode (JSON can carry a lone surrogate, which no tokenizer takes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
