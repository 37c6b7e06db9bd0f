"""session.tracing over a real socket: a spoken turn of the scripted pipeline
reaches the OpenTelemetry SDK (its in-memory exporter) as the spans of the
critical path that the turn's response.done reports (realtime/server/tracing.py)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    module_server,
    no_leaked_tasks,
    stream_audio,
    utterance,
)
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.tracing import critical_path, use_tracer

pytestmark = pytest.mark.asyncio(loop_scope="module")

server = module_server()


@pytest.fixture
def exporter():
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    use_tracer(provider.get_tracer("test"))
    yield exported
    use_tracer(None)


async def spoken_turn(server, tracing) -> tuple[str, dict]:
    """A session (with ``tracing``, if given) that answers one spoken turn;
    its id and its response.done."""
    async with await RealtimeClient.connect(server.ws_url) as rt:
        if tracing is not None:
            updated = await rt.update_session({"tracing": tracing})
            assert updated["tracing"] == {"metadata": None, **tracing}  # echoed, in GA's shape
        await stream_audio(rt, utterance())
        result = await rt.collect_response()
        assert result.status == "completed"
        return rt.session["id"], result.done


async def test_a_traced_session_exports_its_turn_s_critical_path(server, exporter):
    session_id, done = await spoken_turn(server, {"workflow_name": "e2e", "group_id": "g"})
    path = critical_path(done["response"]["metadata"]["duplex_critical_path"])
    assert path, done["response"]["metadata"]
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.name == "e2e")
    assert root.attributes["session.id"] == session_id and root.attributes["group_id"] == "g"
    response = next(s for s in spans if s.name == "response")
    assert response.attributes["response.id"] == done["response"]["id"]
    assert response.parent.span_id == root.context.span_id
    turn = next(s for s in spans if s.name == "turn")
    assert turn.parent.span_id == response.context.span_id
    segments = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == turn.context.span_id}
    assert set(segments) == {name for name, _ in path}  # each step is on the path once
    at = turn.start_time
    for name, seconds in path:  # end to end, in the path's order, each as long as reported
        assert segments[name].start_time == at, name
        assert round((segments[name].end_time - at) / 1e6) == round(seconds * 1000), name
        at = segments[name].end_time
    assert at == turn.end_time
    assert turn.attributes["turn_gap_ms"] == done["response"]["metadata"]["duplex_turn_gap_ms"]


async def test_a_session_without_tracing_exports_nothing(server, exporter):
    await spoken_turn(server, None)
    assert exporter.get_finished_spans() == ()
