"""``session.delegation`` of a GPT-Live session: who handles the tasks the
Live model delegates (``openai/types/live/session_config.py``).

This engine's voice model is its own LLM stage, and it does not hand work off
yet (issue 45 item 4: ``session.delegation.created``, ``response.event``): it
answers every turn itself. So a delegation config is accepted where that is
what it would mean with no tools to call -- ``client`` (the application would
be handed tasks: none is ever handed), and ``responses`` without tools or a
backend prompt (the backend model is this engine's own LLM) -- and refused by
name where it asks for what is not built: backend tools, a backend prompt.
LiveKit's GPT-Live model sends ``responses`` by default, which is
why it is accepted rather than refused whole. ``decisions`` is accepted: its
questions are what ``decision.create`` evaluates, on this engine's own LLM
(``decisions.py``).
"""

from __future__ import annotations

from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.live.decisions import check_decisions

_NOT_YET = "is not supported by this engine yet (docs/live-conformance.md)"


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
    if responses.get("tools"):
        raise DuplexError("unsupported_option", f"delegated tool calls {_NOT_YET}",
                          param=f"{param}.responses.tools")
    if responses.get("instructions"):
        raise DuplexError("unsupported_option", f"a backend prompt {_NOT_YET}",
                          param=f"{param}.responses.instructions")
    return {k: v for k, v in raw.items() if k in ("type", "acknowledgement_delay_ms", "responses")}
