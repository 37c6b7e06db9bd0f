"""A traced session's turns, as the OpenTelemetry SDK's in-memory exporter
receives them (realtime/server/tracing.py): the critical path that
``response.done`` reports, as spans laid end to end up to the first audio."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.contracts import Capabilities
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.session_config import SessionConfig, session_wire, updated_config
from vllm_duplex.realtime.server.tracing import TurnSpans, _exporter, critical_path
from vllm_duplex.realtime.wire.codec import RealtimeCodec

MS = 1_000_000  # ns


@pytest.fixture
def exported():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider.get_tracer("test")


def session(tracing):
    """The session object session.updated carries after a client's ``tracing``."""
    patch = RealtimeCodec().parse(json.dumps({"type": "session.update",
                                              "session": {"tracing": tracing}})).patch
    return session_wire(SessionConfig(model="m", policy="p").apply(patch), session_id="sess_1")


def a_turn(spans: TurnSpans, tracing, path="vad 120, asr_pause 200, llm_first 300, tts 80, pacing 20"):
    """A session that answers one spoken turn: its first audio goes out at
    t=10.0 s, its response.done at 11.0 s (times on the session clock)."""
    spans.observe(ev.SessionCreated(session=session(None), resume_token="t"), 0.0)
    spans.observe(ev.SessionUpdated(session=session(tracing)), 0.1)
    spans.observe(ev.ResponseCreated(response={"id": "resp_1"}), 9.5)
    spans.observe(ev.OutputAudioDelta(response_id="resp_1", item_id="i", output_index=0,
                                      content_index=0, delta=b"\0\0"), 10.0)
    spans.observe(ev.OutputAudioDelta(response_id="resp_1", item_id="i", output_index=0,
                                      content_index=0, delta=b"\0\0"), 10.5)
    spans.observe(ev.ResponseDone(response={
        "id": "resp_1", "status": "completed", "usage": {"input_tokens": 30, "output_tokens": 9},
        "metadata": {"duplex_turn_gap_ms": "720", "duplex_critical_path": path, "client": "x"}}), 11.0)
    spans.observe(ev.SessionClosed(reason="client"), 12.0)


def to_ns(t: float) -> int:
    return round(t * 1000) * MS


def test_the_critical_path_is_exported_as_spans_ending_at_the_first_audio(exported):
    exporter, tracer = exported
    a_turn(TurnSpans(tracer, to_ns), "auto")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"Realtime Session", "response", "turn", "vad", "asr_pause", "llm_first",
                          "tts", "pacing"}
    path = [spans[n] for n in ("vad", "asr_pause", "llm_first", "tts", "pacing")]
    assert [(s.end_time - s.start_time) // MS for s in path] == [120, 200, 300, 80, 20]
    assert all(a.end_time == b.start_time for a, b in zip(path, path[1:]))  # end to end
    turn = spans["turn"]
    assert (turn.start_time, turn.end_time) == (to_ns(10.0) - 720 * MS, to_ns(10.0))
    assert path[-1].end_time == to_ns(10.0) and path[0].start_time == turn.start_time
    assert turn.attributes["turn_gap_ms"] == "720" and "client" not in turn.attributes
    response, root = spans["response"], spans["Realtime Session"]
    assert (response.start_time, response.end_time) == (to_ns(9.5), to_ns(11.0))
    assert response.attributes["gen_ai.usage.output_tokens"] == 9
    assert (root.start_time, root.end_time) == (to_ns(0.1), to_ns(12.0))
    assert {s.parent.span_id for s in path} == {turn.context.span_id}
    assert turn.parent.span_id == response.context.span_id
    assert response.parent.span_id == root.context.span_id
    assert len({s.context.trace_id for s in spans.values()}) == 1


def test_a_named_trace_carries_its_workflow_group_and_metadata(exported):
    exporter, tracer = exported
    a_turn(TurnSpans(tracer, to_ns), {"workflow_name": "support-line", "group_id": "g-7",
                                      "metadata": {"customer": "acme"}})
    root = next(s for s in exporter.get_finished_spans() if s.parent is None)
    assert root.name == "support-line"
    assert root.attributes["group_id"] == "g-7" and root.attributes["metadata.customer"] == "acme"
    assert root.attributes["session.id"] == "sess_1"


def test_a_session_without_tracing_exports_nothing(exported):
    exporter, tracer = exported
    a_turn(TurnSpans(tracer, to_ns), None)
    assert exporter.get_finished_spans() == ()


def test_a_response_with_no_turn_behind_it_has_no_turn_span(exported):
    """A response.create after a text item: no spoken turn, no critical path."""
    exporter, tracer = exported
    a_turn(TurnSpans(tracer, to_ns), "auto", path="")
    assert {s.name for s in exporter.get_finished_spans()} == {"Realtime Session", "response"}


def test_the_session_echoes_tracing_and_it_cannot_change_once_enabled():
    assert session("auto")["tracing"] == "auto"
    assert session(None)["tracing"] is None
    assert session({"workflow_name": "w"})["tracing"] == {"workflow_name": "w", "group_id": None,
                                                         "metadata": None}
    caps = Capabilities(input_modes=frozenset())
    codec = RealtimeCodec()

    def patch(tracing):
        return codec.parse(json.dumps({"type": "session.update", "session": {"tracing": tracing}})).patch

    on = updated_config(SessionConfig(model="m", policy="p"), patch("auto"), caps, "p")
    assert updated_config(on, patch("auto"), caps, "p") == on  # the same again: fine
    for other in (None, {"workflow_name": "w"}):
        with pytest.raises(DuplexError) as ei:
            updated_config(on, patch(other), caps, "p")
        assert (ei.value.code, ei.value.param) == ("immutable_field", "session.tracing")
    # "auto" over a named trace (the browser Agents SDK sends it after
    # session.created, whatever the session began with) keeps the name
    named = updated_config(SessionConfig(model="m", policy="p"), patch({"workflow_name": "w"}), caps, "p")
    assert updated_config(named, patch("auto"), caps, "p").tracing == named.tracing


def test_off_unless_the_opentelemetry_environment_asks():
    assert _exporter({}) is None
    assert _exporter({"OTEL_TRACES_EXPORTER": "otlp"}) is None  # no endpoint: nowhere to send
    assert _exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
                      "OTEL_TRACES_EXPORTER": "none"}) is None
    assert type(_exporter({"OTEL_TRACES_EXPORTER": "console"})).__name__ == "ConsoleSpanExporter"
    grpc = _exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"})
    http = _exporter({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces",
                      "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    assert "grpc" in type(grpc).__module__ and "http" in type(http).__module__


def test_critical_path_reads_what_response_done_carries():
    assert critical_path("vad 120, asr_pause 0, pacing 7") == [("vad", 0.12), ("asr_pause", 0.0),
                                                               ("pacing", 0.007)]
    assert critical_path("") == []
