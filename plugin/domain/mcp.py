"""Remote MCP tools as OpenAI Realtime GA declares them: the definition, and
the two filters it carries.

A session or response tool ``{"type": "mcp", "server_label", "server_url",
"headers"?, "authorization"?, "allowed_tools"?, "require_approval"?,
"server_description"?, "allowed_callers"?, "defer_loading"?}`` names a
server the *engine* calls (``session/mcp_calls.py`` decides, the runner's
``session/mcp_client.py`` talks to it with the official ``mcp`` SDK). It is
kept as the dict the client sent, validated: ``session.updated`` echoes it,
less its secrets (``headers``, ``authorization``: a browser holding an
ephemeral key must not read the server's credentials).

Refused by name (``unsupported_option``): ``connector_id`` and
``tunnel_id`` (OpenAI-hosted connectors and tunnels), an
``allowed_callers`` other than ``["direct"]`` (no code interpreter calls
tools here) and ``defer_loading: true`` (a server's tools are listed when it
is configured).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from vllm_duplex.domain.errors import DuplexError

LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")
SECRET_KEYS = ("headers", "authorization")
_FILTER_KEYS = ("tool_names", "read_only")


def _bad(param: str, message: str) -> DuplexError:
    return DuplexError("invalid_value", message, param=param)


def _refused(param: str, why: str) -> DuplexError:
    return DuplexError("unsupported_option", f"{param} is not supported: {why}", param=param)


def _filter(raw: Any, p: str) -> dict[str, Any]:
    """``{"tool_names"?: [str], "read_only"?: bool}``."""
    if not isinstance(raw, Mapping):
        raise _bad(p, f"{p} must be an object with tool_names and/or read_only")
    out: dict[str, Any] = {}
    names = raw.get("tool_names")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _bad(f"{p}.tool_names", f"{p}.tool_names must be a list of strings")
        out["tool_names"] = list(names)
    read_only = raw.get("read_only")
    if read_only is not None:
        if not isinstance(read_only, bool):
            raise _bad(f"{p}.read_only", f"{p}.read_only must be a boolean")
        out["read_only"] = read_only
    return out


def parse_mcp_tool(t: Mapping[str, Any], p: str) -> dict[str, Any]:
    """One ``{"type": "mcp", ...}`` tool, validated (``p``: its path)."""
    for key in ("connector_id", "tunnel_id"):
        if t.get(key) is not None:
            raise _refused(f"{p}.{key}", "only a server_url is reached from this engine "
                           "(OpenAI's connectors and tunnels are not)")
    label = t.get("server_label")
    if not isinstance(label, str) or not LABEL.fullmatch(label):
        raise _bad(f"{p}.server_label", f"{p}.server_label must be 1-64 characters of [A-Za-z0-9_-]")
    url = t.get("server_url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") \
            or not urlsplit(url).netloc:
        raise _bad(f"{p}.server_url", f"{p}.server_url must be an http(s) URL")
    tool: dict[str, Any] = {"type": "mcp", "server_label": label, "server_url": url}
    headers = t.get("headers")
    if headers is not None:
        if not isinstance(headers, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise _bad(f"{p}.headers", f"{p}.headers must map header names to strings")
        tool["headers"] = dict(headers)
    for key in ("authorization", "server_description"):
        value = t.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise _bad(f"{p}.{key}", f"{p}.{key} must be a string")
            tool[key] = value
    allowed = t.get("allowed_tools")
    if allowed is not None:
        if isinstance(allowed, list):
            if not all(isinstance(n, str) for n in allowed):
                raise _bad(f"{p}.allowed_tools", f"{p}.allowed_tools must be a list of names "
                           "or a filter object")
            tool["allowed_tools"] = list(allowed)
        else:
            tool["allowed_tools"] = _filter(allowed, f"{p}.allowed_tools")
    approval = t.get("require_approval")
    if approval is not None:
        if isinstance(approval, str):
            if approval not in ("always", "never"):
                raise _bad(f"{p}.require_approval",
                           f'{p}.require_approval must be "always", "never" or a filter object')
            tool["require_approval"] = approval
        elif isinstance(approval, Mapping):
            tool["require_approval"] = {k: _filter(approval[k], f"{p}.require_approval.{k}")
                                        for k in ("always", "never") if approval.get(k) is not None}
        else:
            raise _bad(f"{p}.require_approval",
                       f'{p}.require_approval must be "always", "never" or a filter object')
    callers = t.get("allowed_callers")
    if callers is not None:
        if not isinstance(callers, list) or not all(c in ("direct", "programmatic") for c in callers):
            raise _bad(f"{p}.allowed_callers", f'{p}.allowed_callers must list "direct" '
                       'and/or "programmatic"')
        if "programmatic" in callers:
            raise _refused(f"{p}.allowed_callers", "only the model calls tools here "
                           '("direct"); nothing calls them from code')
        tool["allowed_callers"] = list(callers)
    defer = t.get("defer_loading")
    if defer is not None:
        if not isinstance(defer, bool):
            raise _bad(f"{p}.defer_loading", f"{p}.defer_loading must be a boolean")
        if defer:
            raise _refused(f"{p}.defer_loading", "a server's tools are listed when it is "
                           "configured (defer_loading false)")
        tool["defer_loading"] = False
    return tool


def redacted(tool: Mapping[str, Any]) -> dict[str, Any]:
    """What ``session.updated`` shows of a tool: an MCP tool without its secrets."""
    if tool.get("type") != "mcp":
        return dict(tool)
    return {k: v for k, v in tool.items() if k not in SECRET_KEYS}


def request_headers(tool: Mapping[str, Any]) -> dict[str, str]:
    """The HTTP headers every request to the server carries: ``headers``, and
    ``authorization`` as a bearer token (OpenAI's meaning of the field)."""
    out = dict(tool.get("headers") or {})
    token = tool.get("authorization")
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def listing_key(tool: Mapping[str, Any]) -> tuple:
    """What decides the server's tool list: a change of any of it lists again
    (a change of ``require_approval`` or ``server_description`` does not)."""
    allowed = tool.get("allowed_tools")
    return (tool["server_label"], tool["server_url"], tuple(sorted(request_headers(tool).items())),
            repr(allowed))


def _matches(flt: Mapping[str, Any], name: str, annotations: Mapping[str, Any] | None) -> bool:
    """A filter matches a tool when every criterion it gives does; an empty
    filter matches none."""
    if not any(k in flt for k in _FILTER_KEYS):
        return False
    if "tool_names" in flt and name not in flt["tool_names"]:
        return False
    if "read_only" in flt and bool((annotations or {}).get("readOnlyHint")) != flt["read_only"]:
        return False
    return True


def allowed(tool: Mapping[str, Any], name: str, annotations: Mapping[str, Any] | None) -> bool:
    """Whether the server's tool ``name`` is offered to the model."""
    rule = tool.get("allowed_tools")
    if rule is None:
        return True
    if isinstance(rule, list):
        return name in rule
    return _matches(rule, name, annotations)


def needs_approval(tool: Mapping[str, Any], name: str,
                   annotations: Mapping[str, Any] | None) -> bool:
    """OpenAI's default is to ask: only ``"never"``, or a ``never`` filter
    that matches (and no ``always`` one that does), runs a call unasked."""
    rule = tool.get("require_approval", "always")
    if isinstance(rule, str):
        return rule != "never"
    if "always" in rule and _matches(rule["always"], name, annotations):
        return True
    return not ("never" in rule and _matches(rule["never"], name, annotations))


def http_error(code: int, message: str) -> dict[str, Any]:
    return {"type": "http_error", "code": code, "message": message}


def protocol_error(code: int, message: str) -> dict[str, Any]:
    return {"type": "protocol_error", "code": code, "message": message}


def execution_error(message: str) -> dict[str, Any]:
    return {"type": "tool_execution_error", "message": message}
