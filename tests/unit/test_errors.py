"""The error kinds: ``DuplexError(code)`` is an instance of the code's kind, so
server code branches with ``except <Kind>``; the wire shape is unchanged."""

from __future__ import annotations

import copy
import pickle

import pytest
from vllm_duplex.domain.errors import (
    ERRORS,
    AccessDenied,
    Capacity,
    Closed,
    Conflict,
    DuplexError,
    EngineDead,
    EngineError,
    Expired,
    FramingError,
    Gone,
    InvalidMedia,
    InvalidRequest,
    NotFound,
    ResyncRequired,
    Unsupported,
)


@pytest.mark.parametrize("code", sorted(ERRORS))
def test_every_code_constructs_its_kind(code: str) -> None:
    err = DuplexError(code, "m", param="p", event_id="c1", details={"extra": 1})
    assert type(err) is ERRORS[code].kind
    assert isinstance(err, DuplexError)
    assert (err.code, err.message, err.param, err.event_id, err.details) == (code, "m", "p", "c1",
                                                                             {"extra": 1})
    assert str(err) == "m"
    wire = err.to_wire()
    assert wire["code"] == code and wire["retryable"] is ERRORS[code].retryable
    assert wire["type"] == ERRORS[code].type and wire["extra"] == 1


def test_kinds_group_the_codes_that_code_branches_on() -> None:
    def codes(kind: type[DuplexError]) -> set[str]:
        return {c for c, s in ERRORS.items() if issubclass(s.kind, kind)}

    assert codes(FramingError) == {"invalid_json", "invalid_event", "unknown_event", "event_too_large"}
    assert codes(InvalidMedia) == {"invalid_audio", "invalid_image"}
    assert codes(Expired) == {"session_expired", "stream_expired"}
    assert codes(Closed) == {"session_closed", "generation_finished"}
    assert codes(ResyncRequired) == {"resync_required"}
    assert codes(Gone) == codes(Expired) | codes(Closed) | codes(ResyncRequired)
    assert codes(Capacity) == {"resource_exhausted", "rate_limited", "deadline_exceeded", "at_capacity"}
    assert codes(NotFound) == {"session_not_found", "stream_not_found", "item_not_found",
                               "model_not_found", "request_not_found", "call_not_found"}
    assert codes(AccessDenied) == {"unauthorized", "invalid_resume_token", "client_secret_expired",
                                   "client_secret_used", "client_secret_mismatch",
                                   "invalid_signature"}
    assert codes(EngineDead) == {"engine_dead"}
    assert codes(EngineError) == {"stage_failed", "engine_dead", "internal_error", "mcp_server_error",
                                  "backend_error",
                                  "store_unavailable"}
    assert codes(Unsupported) <= codes(InvalidRequest)
    # every code has exactly one kind, and only engine_dead ends the session
    assert {c for c, s in ERRORS.items() if s.terminal} == {"engine_dead"}
    assert DuplexError("engine_dead", "x").spec.terminal and not DuplexError("stage_failed", "x").spec.terminal


def test_a_kind_is_caught_by_its_own_except_clause() -> None:
    with pytest.raises(Expired):
        raise DuplexError("session_expired", "gone")
    with pytest.raises(Gone):
        raise DuplexError("stream_expired", "gone")
    try:
        raise DuplexError("session_not_found", "unknown")
    except Expired:  # pragma: no cover - the test fails if this catches it
        pytest.fail("not_found is not expired")
    except NotFound as err:
        assert err.code == "session_not_found"


def test_a_kind_constructs_only_its_own_codes() -> None:
    assert type(Gone("session_expired", "x")) is Expired
    assert type(Expired("stream_expired", "x")) is Expired
    with pytest.raises(TypeError, match="session_closed.*Closed, not a Expired"):
        Expired("session_closed", "x")
    with pytest.raises(KeyError, match="add it to ERRORS"):
        DuplexError("no_such_code", "x")


def test_errors_survive_pickle_and_copy_with_their_kind_and_fields() -> None:
    err = DuplexError("wrong_instance", "elsewhere", param="session_id",
                      details={"owner_instance_id": "i-2"}).with_event_id("c9")
    for clone in (pickle.loads(pickle.dumps(err)), copy.copy(err)):
        assert type(clone) is Conflict
        assert clone.to_wire() == err.to_wire()
    assert repr(err) == "Conflict('wrong_instance', 'elsewhere', param='session_id')"
