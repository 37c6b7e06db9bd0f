"""A DuplexError as a gRPC status (sans-I/O): the code from the one error
table, the rich details a router or client reads."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from vllm_duplex.domain.errors import ERRORS, DuplexError
from vllm_duplex.realtime.server.openengine import convert
from vllm_duplex.realtime.server.openengine.status import to_status
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2 as e
from vllm_duplex.realtime.wire.openengine.v1 import types_pb2 as t


def details(status):
    out = {}
    for d in status.details:
        for cls in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.RetryInfo):
            if d.Is(cls.DESCRIPTOR):
                msg = cls()
                d.Unpack(msg)
                out[cls.__name__] = msg
    return out


def test_the_issue_rules_map_to_their_statuses():
    expect = {"session_not_found": "NOT_FOUND", "session_expired": "NOT_FOUND",
              "wrong_instance": "FAILED_PRECONDITION", "duplicate_id": "ALREADY_EXISTS",
              "resource_exhausted": "RESOURCE_EXHAUSTED", "invalid_value": "INVALID_ARGUMENT",
              "capability_unsupported": "UNIMPLEMENTED", "unsupported_option": "UNIMPLEMENTED",
              "deadline_exceeded": "DEADLINE_EXCEEDED", "unauthorized": "UNAUTHENTICATED"}
    assert {c: ERRORS[c].grpc_status for c in expect} == expect
    assert all(spec.grpc_status in grpc.StatusCode.__members__ for spec in ERRORS.values())


def test_owner_mismatch_carries_the_owner_and_says_retry():
    err = DuplexError("wrong_instance", "elsewhere", param="session_id",
                      details={"owner_instance_id": "m2w1"})
    code, message, status = to_status(err)
    got = details(status)
    assert code is grpc.StatusCode.FAILED_PRECONDITION and status.code == code.value[0]
    info = got["ErrorInfo"]
    assert (info.reason, info.domain) == ("WRONG_INSTANCE", "openengine.v1")
    assert info.metadata["owner_instance_id"] == "m2w1" and info.metadata["retryable"] == "true"
    assert "RetryInfo" in got and "BadRequest" not in got


def test_bad_input_names_the_field_and_expired_is_told_apart():
    _, _, status = to_status(DuplexError("invalid_value", "too hot", param="options.temperature"))
    got = details(status)
    assert got["BadRequest"].field_violations[0].field == "options.temperature"
    assert got["ErrorInfo"].metadata["retryable"] == "false" and "RetryInfo" not in got
    _, _, expired = to_status(DuplexError("session_expired", "gone", param="session_id"))
    _, _, unknown = to_status(DuplexError("session_not_found", "no", param="session_id"))
    assert expired.code == unknown.code
    assert details(expired)["ErrorInfo"].reason != details(unknown)["ErrorInfo"].reason


def test_messages_become_the_http_bodies():
    req = e.GenerateRequest(model="m", messages=[t.Message(role="user", content="hi")],
                            options=t.GenerationOptions(max_tokens=5, temperature=0.0),
                            tool_choice=t.ToolChoice(function="f"), tools=[t.Tool(name="f")],
                            session=t.GenerationSessionRef(session_id="s1", owner_instance_id="w1"),
                            mode=e.CONTINUATION_MODE_REPLACE, replace_from=0)
    body, sid, owner = convert.generate_body(req)
    assert (sid, owner) == ("s1", "w1")
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"name": "f", "type": "function"}],
                    "tool_choice": {"type": "function", "name": "f"},
                    "options": {"max_tokens": 5, "temperature": 0.0}, "mode": "replace",
                    "replace_from": 0}
    unknown_mode = e.GenerateRequest(mode=9)  # open enums: the parser refuses the number
    assert convert.generate_body(unknown_mode)[0] == {"mode": 9}
    assert convert.stream_frame(e.GenerateStreamRequest()) == ({"type": None}, None)
