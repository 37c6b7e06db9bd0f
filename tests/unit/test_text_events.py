"""The typed text events and their one rendering: the JSON objects of the
generate API (``docs/api.md``), ``type`` first, and read back from what a
resumable stream stores."""

from __future__ import annotations

import json

import pytest
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.text.events import (
    ControlEvent,
    ErrorEvent,
    FinishEvent,
    ReasoningDeltaEvent,
    TextDeltaEvent,
    ToolCallDeltaEvent,
    ToolCallEvent,
    Usage,
    from_wire,
    wire,
)

EVENTS = [
    (TextDeltaEvent("The"), {"type": "text-delta", "delta": "The"}),
    (ReasoningDeltaEvent("hm"), {"type": "reasoning-delta", "delta": "hm"}),
    (ToolCallDeltaEvent(0, "call_1", '{"ci', "get_weather"),
     {"type": "tool-call-delta", "index": 0, "id": "call_1", "name": "get_weather",
      "arguments_delta": '{"ci'}),
    (ToolCallDeltaEvent(0, "call_1", 'ty": 1}'),
     {"type": "tool-call-delta", "index": 0, "id": "call_1", "arguments_delta": 'ty": 1}'}),
    (ToolCallEvent(0, "call_1", "get_weather", '{"city": 1}'),
     {"type": "tool-call", "index": 0, "id": "call_1", "name": "get_weather",
      "arguments": '{"city": 1}'}),
    (ControlEvent({"max_tokens": 8}, 3),
     {"type": "control", "applied": {"max_tokens": 8}, "output_tokens": 3}),
    (FinishEvent("gen_1", "stop", Usage(37, 8, 0)),
     {"type": "finish", "request_id": "gen_1", "finish_reason": "stop", "usage": {
         "prompt_tokens": 37, "completion_tokens": 8, "total_tokens": 45,
         "completion_tokens_details": {"reasoning_tokens": 0}}}),
    (FinishEvent("t_1", "cancelled", Usage(0, 0)),  # session turns split no reasoning off
     {"type": "finish", "request_id": "t_1", "finish_reason": "cancelled", "usage": {
         "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}),
]


@pytest.mark.parametrize("event, expected", EVENTS)
def test_each_event_renders_once_and_reads_back(event, expected):
    body = wire(event)
    assert body == expected and next(iter(body)) == "type"
    stored = json.loads(json.dumps(event.data()))  # what a resumable stream keeps
    assert "type" not in stored and from_wire(event.type, stored) == event


def test_an_error_event_carries_the_wire_error():
    err = DuplexError("wrong_instance", "owned elsewhere", param="session_id",
                      details={"owner_instance_id": "i-2"})
    body = wire(ErrorEvent(err))
    assert body == {"type": "error", "error": err.to_wire()}
    back = from_wire("error", json.loads(json.dumps(ErrorEvent(err).data())))
    assert isinstance(back, ErrorEvent) and back.error.to_wire() == err.to_wire()
    with pytest.raises(ValueError):
        from_wire("text-deltas", {})
