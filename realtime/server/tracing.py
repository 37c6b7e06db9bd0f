"""A session's turns as OpenTelemetry spans (``session.tracing``), off unless configured.

The session core already measures each turn: ``response.done`` carries its
figures (``duplex_<stage>_ms``) and its critical path (``duplex_critical_path``:
``"vad 120, asr_pause 210, ..."``, the segments the user waited on, in order,
ending when the reply's first audio was sent; ``session/critical_path.py``).
``TurnSpans`` turns what a socket sends into spans, so a trace backend shows
the same path: one span for the session (named by ``tracing.workflow_name``,
``"Realtime Session"`` by default), one per response, and under a response that
answers a spoken turn a ``turn`` span holding one span per segment (``vad``,
``asr_pause``, ``p_end``, ``llm_first``, ``llm_phrase``, ``tts``, ``pacing`` ...)
laid end to end up to the first audio or text sent.

Sans-I/O: ``observe(event, now)`` with the session clock's time; ``to_ns``
maps that clock onto the epoch. Only sessions whose ``tracing`` is set (the
Agents SDKs send ``"auto"``) are traced, and only when the process has an
exporter: the OpenTelemetry environment (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, protocol by
``OTEL_EXPORTER_OTLP_PROTOCOL``; or ``OTEL_TRACES_EXPORTER=console``) turns it on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from vllm_duplex.domain import events as ev

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

SESSION_SPAN = "Realtime Session"  # OpenAI's default workflow name
_FIRST_OUT = (ev.OutputAudioDelta, ev.OutputTextDelta, ev.OutputAudioTranscriptDelta,
              ev.FunctionCallArgumentsDelta)


def critical_path(text: str) -> list[tuple[str, float]]:
    """``"vad 120, asr_pause 210"`` -> ``[("vad", 0.12), ("asr_pause", 0.21)]``."""
    out = []
    for part in text.split(","):
        name, _, ms = part.strip().rpartition(" ")
        if name and ms.isdigit():
            out.append((name, int(ms) / 1000))
    return out


class TurnSpans:
    """The spans of one socket's session, from the events it sends."""

    def __init__(self, tracer: Tracer, to_ns: Callable[[float], int]) -> None:
        from opentelemetry.trace import set_span_in_context  # only where tracing is on

        self._in = set_span_in_context
        self._tracer = tracer
        self._to_ns = to_ns
        self._session: Span | None = None
        self._enabled: bool | None = None  # None: the session's tracing not seen yet
        self._created: dict[str, float] = {}  # response id -> created at
        self._first_out: dict[str, float] = {}  # response id -> its first delta sent

    def observe(self, event: ev.ServerEvent, now: float) -> None:
        if isinstance(event, (ev.SessionCreated, ev.SessionUpdated)):
            self._configure(event.session, now)
        elif not self._session:
            return
        elif isinstance(event, ev.ResponseCreated):
            self._created[event.response["id"]] = now
        elif isinstance(event, _FIRST_OUT):
            self._first_out.setdefault(event.response_id, now)
        elif isinstance(event, ev.ResponseDone):
            self._response(event.response, now)
        elif isinstance(event, ev.SessionClosed):
            self.close(now)

    def close(self, now: float) -> None:
        if self._session is not None:
            self._session.end(self._to_ns(now))
            self._session = None

    def _configure(self, session: Mapping[str, Any], now: float) -> None:
        tracing = session.get("tracing")
        if self._enabled is not None or tracing is None:
            return  # tracing cannot change once enabled (session_config.updated_config)
        self._enabled = True
        named = tracing if isinstance(tracing, dict) else {}
        attrs: dict[str, Any] = {"session.id": session.get("id", ""), "gen_ai.request.model": session.get("model", "")}
        if named.get("group_id"):
            attrs["group_id"] = named["group_id"]
        for key, value in (named.get("metadata") or {}).items():
            attrs[f"metadata.{key}"] = str(value)
        self._session = self._tracer.start_span(named.get("workflow_name") or SESSION_SPAN,
                                                attributes=attrs, start_time=self._to_ns(now))

    def _response(self, response: Mapping[str, Any], now: float) -> None:
        rid = response.get("id", "")
        created = self._created.pop(rid, now)
        first_out = self._first_out.pop(rid, None)
        meta = {k: v for k, v in (response.get("metadata") or {}).items() if k.startswith("duplex_")}
        parent = self._in(self._session)
        attrs: dict[str, Any] = {"response.id": rid, "response.status": response.get("status", "")}
        usage = response.get("usage") or {}
        for key in ("input_tokens", "output_tokens"):
            if isinstance(usage.get(key), int):
                attrs[f"gen_ai.usage.{key}"] = usage[key]
        span = self._tracer.start_span("response", context=parent, attributes=attrs,
                                       start_time=self._to_ns(created))
        path = critical_path(meta.get("duplex_critical_path", ""))
        if path and first_out is not None:
            self._turn(path, first_out, meta, self._in(span))
        span.end(self._to_ns(now))

    def _turn(self, path: list[tuple[str, float]], end: float, meta: Mapping[str, str],
              parent: Any) -> None:
        """The critical path, segment after segment, ending at ``end``."""
        start = end - sum(s for _, s in path)
        figures = {k[len("duplex_"):]: v for k, v in meta.items() if k != "duplex_critical_path"}
        turn = self._tracer.start_span("turn", context=parent, attributes=figures,
                                       start_time=self._to_ns(start))
        inner, at = self._in(turn), start
        for name, seconds in path:
            self._tracer.start_span(name, context=inner, start_time=self._to_ns(at)).end(
                self._to_ns(at + seconds))
            at += seconds
        turn.end(self._to_ns(at))  # ``end``, as its last segment ends (no float drift)


# ---- the process's exporter --------------------------------------------------------

_lock = threading.Lock()
_tracer: Tracer | None = None
_configured = False


def _exporter(environ: Mapping[str, str]) -> SpanExporter | None:
    if environ.get("OTEL_TRACES_EXPORTER", "").strip() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    if not (environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None  # off by default: nothing is exported unless asked for
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip() == "none":
        return None
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    return GrpcExporter()


def _provider_tracer(exporter: SpanExporter, service: str) -> Tracer:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider.get_tracer("vllm_duplex.realtime")


def tracer_from_env(environ: Mapping[str, str] | None = None) -> Tracer | None:
    """The process's tracer, or None when no exporter is configured. Its own
    provider, not the global one (vLLM's tracing keeps its own). The SDK is
    imported only when asked for (``pip install vllm-duplex[tracing]``)."""
    global _tracer, _configured
    env = os.environ if environ is None else environ
    with _lock:
        if not _configured:
            _configured = True
            try:
                exporter = _exporter(env)
                if exporter is not None:
                    _tracer = _provider_tracer(exporter, env.get("OTEL_SERVICE_NAME", "vllm-duplex"))
            except ImportError as exc:  # asked for, not installed: say so once, serve on
                log.warning("OpenTelemetry tracing is configured but not installed "
                            "(pip install 'vllm-duplex[tracing]'): %s", exc)
        return _tracer


def use_tracer(tracer: Tracer | None) -> None:
    """Export through ``tracer`` (an embedding app's own provider; a test's
    in-memory one) instead of the environment's; None: no tracing. Sockets
    opened afterwards use it."""
    global _tracer, _configured
    with _lock:
        _tracer, _configured = tracer, True


def turn_spans(clock_now: Callable[[], float]) -> TurnSpans | None:
    """A socket's ``TurnSpans`` on the session clock, when tracing is on."""
    tracer = tracer_from_env()
    if tracer is None:
        return None

    # The session clock's time on the epoch, fixed once: one offset keeps
    # the spans of a path exactly end to end.
    offset = time.time_ns() - round(clock_now() * 1e9)

    def to_ns(t: float) -> int:
        return offset + round(t * 1e9)

    return TurnSpans(tracer, to_ns)
