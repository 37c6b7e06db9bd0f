"""A GPT-Live delegation whose backend is an external Responses endpoint:
what to ask it and what its stream means. Sans-I/O; the shell
(``realtime/server/live/backend.py``) makes the HTTP calls.

Under ``responses`` delegation whose ``responses.model`` names a configured
backend (``domain/backends.py``), the voice (this engine's LLM) keeps the
session's function tools, and a reply of it that calls one *is* the
delegation, as with the engine's own backend; but the call is not the
client's to answer. The user's turn is run on the backend instead
(``RemoteRun``): the conversation as the client heard it, the backend prompt
(``responses.instructions``), the function tools and the tool choice. Its
stream goes to the client as GPT-Live says, ``session.delegation.created``
(``response_id``: the remote's) then each of the remote's own Responses
events in a ``response.event``. A function call of the backend goes to the
client as today; ``response.item.create`` (``function_call_output``) and
``response.create`` continue the run on the same backend with the full input
(the earlier input, the backend's output items, the outputs), which a server
without storage accepts as well as one with it. The backend's final words
are the output of the voice's call, and the voice speaks them (``Finished``).

A backend that fails (refused, an HTTP error, a stream that is not one) or
takes longer than its ``timeout_s`` is the client's typed ``error``
(``backend_error``, ``deadline_exceeded``; the backend named, never its key)
and ends the delegation: the voice's call gets that as its output and the
conversation goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vllm_duplex.domain.backends import ResponsesBackend
from vllm_duplex.domain.errors import DuplexError

MAX_OUTPUT_TOKENS = 256  # a delegated turn's answer is spoken: a few sentences
_TERMINAL = {"response.completed": "completed", "response.incomplete": "incomplete",
             "response.failed": "failed"}
_FUNCTION_FIELDS = ("type", "name", "description", "parameters", "strict")


@dataclass(frozen=True)
class RemoteRun:
    """One run for the shell to make: ``body`` POSTed to ``backend.url``,
    streamed. ``event_id``: the client's ``response.create`` that asked, if any."""

    delegation_id: str
    backend: ResponsesBackend
    body: dict[str, Any]
    event_id: str | None = None


@dataclass
class RemoteDelegation:
    """A delegation running on a backend: what its next run's input is."""

    id: str
    backend: ResponsesBackend
    voice_call: str  # the voice's call it answers (its output is the backend's words)
    input: list[dict[str, Any]]
    calls: dict[str, bool] = field(default_factory=dict)  # the backend's call_id -> answered
    announced: bool = False  # session.delegation.created sent
    running: bool = True


def request_body(backend: ResponsesBackend, config: dict[str, Any],
                 input_items: list[dict[str, Any]], *, continuation: bool) -> dict[str, Any]:
    """The Responses request a run makes. A continuation under a forced tool
    choice answers in words: the choice was the delegating turn's (forced
    again, it would call again forever)."""
    tools = [{k: t[k] for k in _FUNCTION_FIELDS if k in t} for t in config.get("tools") or ()]
    body: dict[str, Any] = {"model": backend.model, "input": input_items, "stream": True,
                            "store": False,
                            "max_output_tokens": config.get("max_output_tokens")
                            or MAX_OUTPUT_TOKENS}
    if tools:
        choice = config.get("tool_choice") or "auto"
        forced = choice == "required" or isinstance(choice, dict)
        body["tools"] = tools
        body["tool_choice"] = "none" if continuation and forced else choice
    if config.get("instructions"):
        body["instructions"] = config["instructions"]
    return body


def conversation_input(conversation: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The conversation the client heard, as Responses input messages."""
    return [{"type": "message", "role": role, "content": text}
            for role, text in conversation if text]


@dataclass
class Outcome:
    """What one run came to: its status, the function calls it made (the
    client answers them) and its words."""

    status: str
    calls: list[dict[str, Any]]
    output: list[dict[str, Any]]  # its output items, for the next run's input
    text: str
    response_id: str | None


class RemoteStream:
    """One run's server-sent events, line by line: each event the client is
    sent, and at the end what the run came to. A stream that is not a
    Responses stream (an event that is not JSON, no type, no end) is a
    ``backend_error``."""

    def __init__(self, delegation: RemoteDelegation) -> None:
        self.delegation = delegation
        self._data: list[str] = []
        self._end: Outcome | None = None

    def feed(self, line: str) -> list[dict[str, Any]]:
        """One line of the body; the GPT-Live events (with ``type``, without
        ``event_id``) to send for it."""
        if line.startswith("data:"):
            self._data.append(line[5:].lstrip(" "))
            return []
        if line.strip() or not self._data:
            return []  # event:, id:, comments; a blank line ends an event
        data, self._data = "\n".join(self._data), []
        if data.strip() == "[DONE]":
            return []
        try:
            event = json.loads(data)
        except ValueError:
            raise self.error("sent an event that is not JSON") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise self.error("sent an event without a type")
        return self._event(event)

    def finish(self) -> Outcome:
        """The body ended: what the run came to."""
        if self._data:
            self.feed("")
        if self._end is None:
            raise self.error("ended its stream before the response did")
        return self._end

    def error(self, what: str) -> DuplexError:
        return DuplexError("backend_error", f"the Responses backend "
                           f"{self.delegation.backend.name!r} {what}")

    def _event(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        if self._end is not None:
            return []  # nothing after the end belongs to the run
        kind = event["type"]
        out: list[dict[str, Any]] = []
        delegation = self.delegation
        if not delegation.announced:
            response = event.get("response") if kind == "response.created" else None
            rid = response.get("id") if isinstance(response, dict) else None
            out.append(created(delegation, rid))
        if kind == "error":  # a stream error event: the run failed
            raise self.error(f"failed the run: {_said(event)}")
        if kind in _TERMINAL:
            response = event.get("response")
            if not isinstance(response, dict):
                raise self.error(f"sent {kind} without its response")
            self._end = _outcome(response, _TERMINAL[kind])
        out.append({"type": "response.event", "event": responses_shape(event),
                    "delegation_id": delegation.id})
        return out


def created(delegation: RemoteDelegation, response_id: str | None) -> dict[str, Any]:
    """``session.delegation.created`` for a delegation's first run (``offset_ms``
    is the codec's to add)."""
    delegation.announced = True
    body = {"id": delegation.id, "type": "delegation", "target": "responses"}
    if response_id:
        body["response_id"] = response_id
    return {"type": "session.delegation.created", "delegation": body}


def _outcome(response: dict[str, Any], status: str) -> Outcome:
    output = [o for o in response.get("output") or () if isinstance(o, dict)]
    calls = [o for o in output if o.get("type") == "function_call"
             and isinstance(o.get("call_id"), str)]
    words = [p.get("text") or "" for o in output if o.get("type") == "message"
             for p in o.get("content") or () if isinstance(p, dict)
             and p.get("type") == "output_text"]
    rid = response.get("id")
    return Outcome(status, calls, output, " ".join(w.strip() for w in words if w.strip()),
                   rid if isinstance(rid, str) else None)


def _said(event: dict[str, Any]) -> str:
    err = event.get("error") if isinstance(event.get("error"), dict) else event
    return str(err.get("message") or err.get("code") or "no reason given")[:200]


def next_input(delegation: RemoteDelegation, outcome: Outcome) -> None:
    """After a run: its output items join the input the next run is given."""
    for item in outcome.output:
        if item.get("type") == "function_call":
            delegation.input.append({k: item[k] for k in ("type", "call_id", "name", "arguments")
                                     if k in item})
        elif item.get("type") == "message":
            text = " ".join(p.get("text") or "" for p in item.get("content") or ()
                            if isinstance(p, dict)).strip()
            if text:
                delegation.input.append({"type": "message", "role": "assistant",
                                         "content": text})
    for call in outcome.calls:
        delegation.calls[call["call_id"]] = False


def failed_status(outcome: Outcome, name: str) -> DuplexError | None:
    """A run that ended failed: the client's typed error."""
    if outcome.status == "failed":
        return DuplexError("backend_error", f"the Responses backend {name!r} failed the run")
    return None


# ---- the remote's events in the SDK's shapes ------------------------------------------
# A server adds fields of its own (vLLM: kv_transfer_params, input_messages,
# an item's caller...); the client is sent the Responses API's fields only,
# and the response snapshots small, as on the engine's own backend (no
# input, instructions or tools: the client knows them; output: in the items).

_EVENT_FIELDS = {"type", "sequence_number", "item_id", "output_index", "content_index",
                 "delta", "text", "arguments", "part", "item", "response", "logprobs",
                 "refusal", "summary_index", "code", "message", "param"}
_RESPONSE_FIELDS = {"id", "object", "created_at", "model", "status", "error",
                    "incomplete_details", "parallel_tool_calls", "tool_choice", "usage"}
_ITEM_FIELDS = {"function_call": ("type", "id", "call_id", "name", "arguments", "status"),
                "message": ("type", "id", "role", "status", "content")}
_PART_FIELDS = {"output_text": ("type", "text", "annotations"), "refusal": ("type", "refusal")}
_USAGE = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}


def responses_shape(event: dict[str, Any]) -> dict[str, Any]:
    """A remote Responses stream event with only the Responses API's fields."""
    out = {k: v for k, v in event.items() if k in _EVENT_FIELDS}
    if isinstance(out.get("response"), dict):
        out["response"] = _response(out["response"])
    if isinstance(out.get("item"), dict):
        out["item"] = _item(out["item"])
    if isinstance(out.get("part"), dict):
        out["part"] = _part(out["part"])
    if "logprobs" in out and not isinstance(out["logprobs"], list):
        out["logprobs"] = []
    return out


def _response(raw: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in raw.items() if k in _RESPONSE_FIELDS}
    out.update(output=[], tools=[], instructions=None)
    out.setdefault("object", "response")
    out.setdefault("error", None)
    out.setdefault("incomplete_details", None)
    out.setdefault("parallel_tool_calls", False)
    out.setdefault("tool_choice", "auto")
    usage = raw.get("usage")
    if isinstance(usage, dict):
        base = {k: int(usage.get(k) or 0) for k in _USAGE}
        inputs = usage.get("input_tokens_details") or {}
        reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
        out["usage"] = {**base, "input_tokens_details": {
            "cached_tokens": int(inputs.get("cached_tokens") or 0),
            "cache_write_tokens": int(inputs.get("cache_write_tokens") or 0)},
            "output_tokens_details": {"reasoning_tokens": int(reasoning)}}
    else:
        out.pop("usage", None)
    return out


def _item(raw: dict[str, Any]) -> dict[str, Any]:
    keys = _ITEM_FIELDS.get(raw.get("type") or "")
    if keys is None:
        return raw
    out = {k: raw[k] for k in keys if k in raw}
    if "content" in out:
        out["content"] = [_part(p) for p in out["content"] or () if isinstance(p, dict)]
    return out


def _part(raw: dict[str, Any]) -> dict[str, Any]:
    keys = _PART_FIELDS.get(raw.get("type") or "")
    out = {k: raw[k] for k in keys if k in raw} if keys else raw
    if out.get("type") == "output_text":
        out.setdefault("annotations", [])
        out["annotations"] = []  # a remote's citations are not this voice's
    return out
