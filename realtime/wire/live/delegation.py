"""``session.delegation`` of a GPT-Live session: who handles the tasks the
Live model delegates (``openai/types/live/session_config.py``), and what that
means for the Realtime session underneath.

This engine's voice model is its own LLM stage, so the Responses backend is
that same LLM: a delegation config becomes the session's function tools, its
tool choice and (``responses.instructions``, the backend prompt) words added
to its instructions. A reply of the engine that calls a tool *is* the
delegation (``delegated.py`` renders it as ``session.delegation.created`` and
``response.event``s). Under ``client`` the LLM is offered one tool,
``DELEGATE_TOOL``, whose call hands the task to the application.

Refused by name (``unsupported_option``): tools other than functions (hosted
tools this engine does not run), a tool choice naming one.
``decisions`` is accepted: its questions are what ``decision.create``
evaluates, on this engine's own LLM (``decisions.py``).
"""

from __future__ import annotations

from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.live.decisions import check_decisions

_NOT_YET = "is not supported by this engine yet (docs/live-conformance.md)"

# The one tool of a client delegation: calling it is handing the task over.
DELEGATE_TOOL = "delegate_to_application"
_DELEGATE = {
    "type": "function", "name": DELEGATE_TOOL,
    "description": "Hand a task you cannot do yourself (looking something up, taking an "
                   "action, anything that needs the user's application) to the application. "
                   "Its answer follows.",
    "parameters": {"type": "object", "properties": {"task": {
        "type": "string", "description": "What the application should do"}},
                   "required": ["task"]},
}

_FUNCTION_FIELDS = ("type", "name", "description", "parameters")


def check_delegation(raw: Any, *, update: bool = False,
                     param: str = "session.delegation") -> dict[str, Any] | None:
    """The delegation config as the session resource repeats it, or a typed
    error naming the part that is refused. ``update``: a ``session.update``'s,
    whose ``responses`` may be left out (it keeps the current one)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise DuplexError("invalid_value", f"{param} must be an object or null", param=param)
    kind = raw.get("type")
    delay = raw.get("acknowledgement_delay_ms")
    if delay is not None and (not isinstance(delay, int) or isinstance(delay, bool) or delay < 0):
        raise DuplexError("invalid_value", f"{param}.acknowledgement_delay_ms must be a "
                          "non-negative integer", param=f"{param}.acknowledgement_delay_ms")
    if kind == "client":
        return {k: v for k, v in raw.items() if k in ("type", "acknowledgement_delay_ms")}
    if kind == "decisions":  # questions evaluated on decision.create (decisions.py)
        out = {k: v for k, v in raw.items() if k in ("type", "acknowledgement_delay_ms")}
        if raw.get("decisions") is not None or not update:
            out["decisions"] = check_decisions(raw.get("decisions"), update=update,
                                               param=f"{param}.decisions")
        return out
    if kind != "responses":
        raise DuplexError("invalid_value", f"{param}.type must be client, responses or decisions",
                          param=f"{param}.type")
    responses = raw.get("responses")
    if responses is None and update:  # the backend stays as it is
        return {k: v for k, v in raw.items() if k in ("type", "acknowledgement_delay_ms")}
    if not isinstance(responses, dict) or (not update and not isinstance(responses.get("model"), str)):
        raise DuplexError("invalid_value", f"{param}.responses must be an object with a model",
                          param=f"{param}.responses")
    _check_responses(responses, f"{param}.responses")
    return {k: v for k, v in raw.items() if k in ("type", "acknowledgement_delay_ms", "responses")}


def _check_responses(responses: dict[str, Any], param: str) -> None:
    tools = responses.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise DuplexError("invalid_value", f"{param}.tools must be an array",
                              param=f"{param}.tools")
        for i, tool in enumerate(tools):
            p = f"{param}.tools[{i}]"
            if not isinstance(tool, dict):
                raise DuplexError("invalid_value", f"{p} must be an object", param=p)
            if tool.get("type") != "function":
                raise DuplexError("unsupported_option", f"{p}: {tool.get('type')!r} tools are not "
                                  "run by this engine's backend; only function tools are",
                                  param=f"{p}.type")
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                raise DuplexError("invalid_value", f"{p}.name must be a non-empty string",
                                  param=f"{p}.name")
    choice = responses.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") != "function":
        raise DuplexError("unsupported_option", f"{param}.tool_choice may name a function tool "
                          "only", param=f"{param}.tool_choice")
    instructions = responses.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise DuplexError("invalid_value", f"{param}.instructions must be a string",
                          param=f"{param}.instructions")


def realtime_fields(delegation: dict[str, Any] | None, instructions: str | None) -> dict[str, Any]:
    """What a delegation config means for the Realtime session under it:
    its ``tools``, ``tool_choice`` and ``instructions`` (the Live
    instructions, then the backend prompt: one LLM reads both)."""
    kind = (delegation or {}).get("type")
    responses = (delegation or {}).get("responses") or {}
    if kind == "client":
        tools: list[dict[str, Any]] = [dict(_DELEGATE)]
        choice: Any = "auto"
    elif kind == "responses":
        tools = [{k: t[k] for k in _FUNCTION_FIELDS if k in t} for t in responses.get("tools") or ()]
        choice = responses.get("tool_choice") or "auto"
        if isinstance(choice, dict):
            choice = {"type": "function", "name": choice.get("name")}
    else:
        tools, choice = [], "auto"
    out: dict[str, Any] = {"tools": tools, "tool_choice": choice if tools else "auto"}
    parts = [p for p in (instructions, responses.get("instructions") if kind == "responses"
                         else None) if p and p.strip()]
    if parts:
        out["instructions"] = "\n\n".join(parts)
    return out
