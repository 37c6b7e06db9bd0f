"""Protobuf messages to the JSON-shaped bodies the shared parsers of
``vllm_duplex.text`` read, and the wire documents they produce back to
protobuf. No validation here: a field the parsers refuse is refused with its
name, as on HTTP (so the two surfaces cannot drift apart).

Presence: only the fields a client set reach the body (``ListFields``), so
an unset optional is "absent" exactly as an absent JSON field is.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2 as e
from vllm_duplex.realtime.wire.openengine.v1 import sessions_pb2 as s
from vllm_duplex.realtime.wire.openengine.v1 import types_pb2 as t


def to_body(msg: Message) -> dict[str, Any]:
    """The set fields of ``msg`` as a JSON-shaped dict (Struct as JSON)."""
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():
        out[field.name] = _value(field, value)
    return out


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return dict(value)
    if _is_repeated(field):
        return [_one(field, v) for v in value]
    return _one(field, value)


def _is_repeated(field: FieldDescriptor) -> bool:
    return getattr(field, "is_repeated", None) if hasattr(field, "is_repeated") else (
        field.label == FieldDescriptor.LABEL_REPEATED)


def _one(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if isinstance(value, struct_pb2.Struct):
            return json_format.MessageToDict(value)
        return to_body(value)
    if field.type == FieldDescriptor.TYPE_ENUM:  # open enums: an unknown number stays a number
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    return value


_MODES = {"CONTINUATION_MODE_APPEND": "append", "CONTINUATION_MODE_REPLACE": "replace",
          "CONTINUATION_MODE_BRANCH": "branch"}


def generate_body(req: e.GenerateRequest) -> tuple[dict[str, Any], str | None, str | None]:
    """A ``GenerateRequest`` -> (the generate body, the session id it names, its claimed owner)."""
    body = to_body(req)
    ref = body.pop("session", None) or {}
    if "mode" in body:
        body["mode"] = _MODES.get(body["mode"], body["mode"])
    choice = body.get("tool_choice")
    if choice is not None:
        body["tool_choice"] = choice.get("mode") or (
            {"type": "function", "name": choice["function"]} if "function" in choice else None)
    for tool in body.get("tools", ()):
        tool.setdefault("type", "function")
    sid = ref.get("session_id")
    if "session" in [f.name for f, _ in req.ListFields()] and sid is None:
        sid = ""  # a ref without an id: the parser says which field is wrong
    return body, sid, ref.get("owner_instance_id") or None


def stream_frame(req: e.GenerateStreamRequest) -> tuple[dict[str, Any], str | None]:
    """A ``GenerateStreamRequest`` -> (the streaming-input frame, a claimed owner)."""
    kind = req.WhichOneof("frame")
    if kind == "start":
        body, sid, owner = generate_body(req.start)
        if sid is not None:
            body["session_id"] = sid
        return {"type": "start", **body}, owner
    if kind is None:
        return {"type": None}, None
    return {"type": kind, **to_body(getattr(req, kind))}, None


# ---- wire documents -> protobuf ----------------------------------------------------


def message(m: dict[str, Any]) -> t.Message:
    calls = [t.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
             for c in m.get("tool_calls", ())]
    return t.Message(role=m["role"], content=m.get("content") or "", tool_calls=calls,
                     tool_call_id=m.get("tool_call_id"))


def session(doc: dict[str, Any]) -> s.GenerationSession:
    lease = doc["lease"]
    return s.GenerationSession(
        ref=t.GenerationSessionRef(**doc["ref"]), model=doc["model"], adapter=doc.get("adapter") or "",
        state=doc["state"],
        lease=s.Lease(ttl_s=lease["ttl_s"], expires_in_s=lease["expires_in_s"],
                      expires_at=lease["expires_at"], generation=lease["generation"]),
        turns=doc.get("turns", 0), messages=doc.get("messages", 0), resident=doc.get("resident", False),
        generating=doc.get("generating") or "", close_reason=doc.get("close_reason") or "",
        history=[message(m) for m in doc.get("history", ())])


def usage(u: dict[str, Any]) -> t.Usage:
    details = u.get("completion_tokens_details") or {}
    return t.Usage(prompt_tokens=u["prompt_tokens"], completion_tokens=u["completion_tokens"],
                   total_tokens=u["total_tokens"], reasoning_tokens=details.get("reasoning_tokens"))


def result(answer: dict[str, Any], session_id: str | None) -> e.GenerateResult:
    """A collected step (``vllm_duplex.text.events.collect``) that finished."""
    out = answer["output"]
    calls = [t.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
             for c in out["tool_calls"]]
    return e.GenerateResult(request_id=answer["request_id"], session_id=session_id or "",
                            text=out["text"], reasoning=out["reasoning"], tool_calls=calls,
                            finish_reason=answer["finish_reason"], usage=usage(answer["usage"]))


def error(err: dict[str, Any]) -> t.Error:
    known = ("type", "code", "message", "param", "event_id", "retryable")
    extra = struct_pb2.Struct()
    extra.update({k: v for k, v in err.items() if k not in known})
    return t.Error(type=err["type"], code=err["code"], message=err["message"],
                   param=err.get("param") or "", retryable=err["retryable"], details=extra)


def response(frame: dict[str, Any]) -> e.GenerateResponse:
    """A non-terminal-error or event frame of the streaming-input core."""
    kind = frame["type"]
    if kind == "started":
        return e.GenerateResponse(started=e.Started(request_id=frame["request_id"],
                                                    session_id=frame.get("session_id") or "",
                                                    early_output=frame["early_output"]))
    if kind == "ack":
        return e.GenerateResponse(ack=e.Ack(seq=frame["seq"], duplicate=frame["duplicate"]))
    if kind == "text-delta":
        return e.GenerateResponse(text_delta=e.Delta(delta=frame["delta"]))
    if kind == "reasoning-delta":
        return e.GenerateResponse(reasoning_delta=e.Delta(delta=frame["delta"]))
    if kind == "tool-call-delta":
        return e.GenerateResponse(tool_call_delta=e.ToolCallDelta(
            index=frame["index"], id=frame["id"], name=frame.get("name"),
            arguments_delta=frame["arguments_delta"]))
    if kind == "tool-call":
        return e.GenerateResponse(tool_call=e.IndexedToolCall(index=frame["index"], call=t.ToolCall(
            id=frame["id"], name=frame["name"], arguments=frame["arguments"])))
    if kind == "finish":
        return e.GenerateResponse(finish=e.Finish(request_id=frame["request_id"],
                                                  finish_reason=frame["finish_reason"],
                                                  usage=usage(frame["usage"])))
    if kind == "error":
        return e.GenerateResponse(error=error(frame["error"]))
    raise ValueError(f"no GenerateResponse for frame type {kind!r}")


def capabilities(doc: dict[str, Any], model: str) -> e.Capabilities:
    """``GET /v1/capabilities`` (the same document) as typed fields plus the whole."""
    text = doc.get("text") or {}
    sessions = text.get("application_sessions") or {}
    lease = sessions.get("lease") or {}
    streaming = text.get("streaming_input") or {}
    whole = struct_pb2.Struct()
    whole.update(doc)
    return e.Capabilities(
        sessions=bool(sessions),
        continuation_modes=[m for m, ok in (sessions.get("continuation_modes") or {}).items() if ok],
        default_ttl_s=lease.get("default_ttl_s", 0), max_ttl_s=lease.get("max_ttl_s", 0),
        max_sessions=sessions.get("max_sessions", 0),
        owner_affinity_required=(text.get("owner_affinity") or {}).get("required", False),
        instance_id=doc.get("instance_id", ""),
        streaming_input=streaming.get("modalities") or {},
        early_output=streaming.get("early_output", False),
        max_chunk_bytes=streaming.get("max_chunk_bytes", 0),
        max_input_bytes=streaming.get("max_input_bytes", 0),
        max_output_tokens=(text.get("generate") or {}).get("max_output_tokens", 0),
        model=model, document=whole)
