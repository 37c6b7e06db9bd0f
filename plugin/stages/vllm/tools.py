"""Tool calls in a model's reply text, free of the engine: how a reply is
recognised as a call (``parse_tool_call``, and the starts that make a reply
worth holding back until it ends), how tools are described to a model whose
chat template drops them, and the JSON schema that constrains a reply to a call
(vLLM structured outputs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from vllm_duplex.domain.payloads import ContextMessage

_TOOL_TEXT = re.compile(r"^\s*(?:<tool_call>|```(?:json)?)?\s*(\{.*\})\s*(?:</tool_call>|```)?\s*$", re.S)
# What a reply that ``parse_tool_call`` can turn into a call starts with: a bare
# object, Hermes-style tags, or a fenced block. Not "[": an array is never
# parsed as a call here (parallel calls come only from the constrained
# scanner), so holding a reply that opens with "[" would only delay text.
TOOL_STARTS = ("{", "<tool_call>", "```")


def function_of(tool: dict[str, Any]) -> dict[str, Any]:
    # OpenAI Realtime/Responses shape {"type": "function", "name": ...} or the
    # Chat Completions shape {"type": "function", "function": {"name": ...}}.
    return tool.get("function") or tool


def may_become_tool_call(text: str) -> bool:
    """Whether a reply that starts with ``text`` could still be a tool call."""
    head = text.lstrip()
    return not head or head.startswith(TOOL_STARTS) or any(s.startswith(head) for s in TOOL_STARTS)


def parse_tool_call(text: str, tools: Sequence[dict[str, Any]]) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` when ``text`` is one JSON call of a known tool
    (bare, fenced, or in ``<tool_call>`` tags), else None."""
    m = _TOOL_TEXT.match(text)
    try:
        obj = json.loads(m.group(1)) if m else None
    except ValueError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    if not isinstance(obj, dict) or obj.get("name") not in {function_of(t).get("name") for t in tools}:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return obj["name"], args if isinstance(args, str) else json.dumps(args)


def with_tool_prompt(messages: Sequence[ContextMessage],
                     tools: Sequence[dict[str, Any]]) -> tuple[ContextMessage, ...]:
    """``messages`` with the tools described in the system message (for chat
    templates that do not render tools)."""
    lines = ["You can call these tools. To call one, answer with only a JSON object "
             '{"name": <tool name>, "arguments": {...}}.', "Tools:"]
    for t in tools:
        fn = function_of(t)
        desc = f": {fn['description']}" if fn.get("description") else ""
        lines.append(f"- {fn['name']}{desc} Parameters (JSON schema): "
                     f"{json.dumps(fn.get('parameters') or {'type': 'object'})}")
    prompt = "\n".join(lines)
    if messages and messages[0].role == "system":
        return (ContextMessage("system", f"{messages[0].text}\n\n{prompt}"), *messages[1:])
    return (ContextMessage("system", prompt), *messages)


def tool_call_schema(tools: Sequence[dict[str, Any]], *, parallel: bool = False) -> dict[str, Any]:
    """JSON schema of one call to any of ``tools`` (for constrained decoding);
    ``parallel``: a non-empty array of such calls."""
    one = {"anyOf": [{"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"const": function_of(t)["name"]},
        "arguments": function_of(t).get("parameters") or {"type": "object"}}} for t in tools]}
    return {"type": "array", "items": one, "minItems": 1} if parallel else one
