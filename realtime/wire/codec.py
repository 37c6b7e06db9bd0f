"""The OpenAI Realtime wire codec: JSON frames ⇄ typed commands / events.

Sans-I/O: ``RealtimeCodec.parse`` turns one client frame into a typed
``Command`` (or raises ``DuplexError``); ``render`` turns one journaled
``Envelope`` into one JSON text frame. Nothing here awaits or touches a
socket, so every rule is unit-tested byte for byte.

Shapes follow Realtime GA. The beta shapes are accepted as aliases in both
dialects (clients mix them freely); the beta *dialect* additionally renames
server events and reshapes the session/response/item documents. All GA↔beta
alias tables live in ``aliases.py``, and serve both directions; field
parsing lives in ``fields.py`` (items: ``items.py``), and what is refused
by name in ``refusals.py``.

Parse rules: size is checked before anything else (a 2 MiB frame is never
JSON-parsed); bad UTF-8 or JSON → ``invalid_json``; a non-object or a
missing/non-string ``type`` → ``invalid_event``; unknown type →
``unknown_event``; a bad field → ``invalid_value`` with ``param`` set to the
field path (``session.audio.input.turn_detection.threshold``,
``item.content[0].type``); undecodable base64 → ``invalid_audio``; a valid GA
field this engine cannot honour → ``unsupported_option`` naming it (every field's
status: docs/realtime-conformance.md). Unknown fields are ignored, as OpenAI does; ``null`` for an optional field means
"not given" unless null has a meaning (``turn_detection``, ``transcription``).
Every error carries the client's ``event_id`` when it could be read.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import itertools
import json
import secrets
import typing
from collections.abc import Callable, Mapping
from dataclasses import fields as dc_fields
from typing import Any

from vllm_duplex.domain.commands import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    Command,
    DuplexInput,
    EventAck,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    OutputAudioClear,
    ResponseCancel,
    ResponseCreate,
    ResponseOptions,
    SessionClose,
    SessionResume,
    SessionUpdate,
    VideoChunkIn,
    VideoFrameIn,
)
from vllm_duplex.domain.contracts import InputMode
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope, ServerEvent
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.realtime.wire.aliases import (
    _BETA_DOCS,
    _MISSING,
    _dig,
    BETA_AUDIO_FORMATS,
    BETA_EVENT_TYPES,
    RESPONSE_BETA_TO_GA,
    SESSION_BETA_TO_GA,
    item_to_beta,
    response_to_beta,
    session_to_beta,
)
from vllm_duplex.realtime.wire.fields import (
    _audio_format,
    _max_tokens,
    _modalities,
    _session_patch,
    _tool_choice,
    _tools,
    _voice,
)
from vllm_duplex.realtime.wire.items import _item
from vllm_duplex.realtime.wire.refusals import RESPONSE_REFUSED, refuse_paths, refused
from vllm_duplex.realtime.wire.values import (
    _b64,
    _bad,
    _bool,
    _int,
    _obj,
    _opt_str,
    _req_int,
    _req_str,
    _str,
)

__all__ = [
    "BETA_AUDIO_FORMATS",
    "BETA_EVENT_TYPES",
    "SESSION_BETA_TO_GA",
    "Dialect",
    "RealtimeCodec",
    "item_to_beta",
    "response_to_beta",
    "session_to_beta",
]


class Dialect(enum.Enum):
    GA = "ga"
    BETA = "beta"


# ---- client events -------------------------------------------------------------


def _on_session_update(o: dict[str, Any], eid: str | None) -> Command:
    return SessionUpdate(patch=_session_patch(o.get("session")), event_id=eid)


def _on_append(o: dict[str, Any], eid: str | None) -> Command:
    if o.get("audio") is None:
        raise _bad("audio", "missing required field audio")
    audio = _b64(o["audio"], "audio")
    seq = _int(o.get("seq"), "seq")
    return AudioAppend(audio=audio, seq=None if seq is _MISSING else seq, event_id=eid)


def _seq(o: dict[str, Any], name: str) -> int:
    return _req_int(o, name, name)  # an integer >= 0


def _video_bytes(o: dict[str, Any], name: str, what: str) -> bytes:
    """A required base64 field of a video event; bad base64 is ``invalid_image``."""
    if o.get(name) is None:
        raise _bad(name, f"missing required field {name} ({what})")
    try:
        return _b64(o[name], name)
    except DuplexError as err:
        raise DuplexError("invalid_image", err.message, param=name) from None


def _on_video_frame(o: dict[str, Any], eid: str | None) -> Command:
    image = _video_bytes(o, "image", "base64 JPEG or PNG")
    ts = _int(o.get("timestamp_ms"), "timestamp_ms")
    return VideoFrameIn(image=image, timestamp_ms=None if ts is _MISSING else ts, event_id=eid)


def _on_video_chunk(o: dict[str, Any], eid: str | None) -> Command:
    container = o.get("container")
    if container not in ("webm", "mp4"):
        raise _bad("container", 'container must be "webm" or "mp4"')
    data = _video_bytes(o, "data", "base64 WebM/MP4 bytes")
    return VideoChunkIn(data=data, container=container, event_id=eid)


def _on_resume(o: dict[str, Any], eid: str | None) -> Command:
    generation = _int(o.get("generation"), "generation")
    return SessionResume(session_id=_req_str(o, "session_id", "session_id"),
                         resume_token=_req_str(o, "resume_token", "resume_token"),
                         last_seq=_seq(o, "last_seq"),
                         generation=None if generation is _MISSING else generation, event_id=eid)


def _on_item_create(o: dict[str, Any], eid: str | None) -> Command:
    return ItemCreate(
        item=_item(o.get("item")),
        previous_item_id=_opt_str(o.get("previous_item_id"), "previous_item_id"),
        event_id=eid,
    )


def _on_truncate(o: dict[str, Any], eid: str | None) -> Command:
    return ItemTruncate(
        item_id=_req_str(o, "item_id", "item_id"),
        content_index=_req_int(o, "content_index", "content_index"),
        audio_end_ms=_req_int(o, "audio_end_ms", "audio_end_ms"),
        event_id=eid,
    )


def _on_response_create(o: dict[str, Any], eid: str | None) -> Command:
    raw = o.get("response")
    if raw is None:
        return ResponseCreate(event_id=eid)
    r = _obj(raw, "response")
    refuse_paths(r, RESPONSE_REFUSED, "response")
    found: dict[str, tuple[Any, str]] = {}
    for beta_key, ga_key in RESPONSE_BETA_TO_GA.items():  # GA wins: read last
        if r.get(beta_key) is not None:
            found[ga_key] = (r[beta_key], f"response.{beta_key}")
    for ga_key in RESPONSE_BETA_TO_GA.values():
        if r.get(ga_key) is not None:
            found[ga_key] = (r[ga_key], f"response.{ga_key}")
    kw: dict[str, Any] = {}
    if "output_modalities" in found:
        kw["output_modalities"] = _modalities(*found["output_modalities"])
    if "max_output_tokens" in found:
        kw["max_output_tokens"] = _max_tokens(*found["max_output_tokens"])
    instructions = _str(r.get("instructions"), "response.instructions")
    if instructions is not _MISSING:
        kw["instructions"] = instructions
    if r.get("metadata") is not None:
        meta = _obj(r["metadata"], "response.metadata")
        for k, v in meta.items():
            _str(v, f"response.metadata.{k}")
        kw["metadata"] = dict(meta)
    conv = r.get("conversation")
    if conv is not None:
        if not isinstance(conv, str):
            raise _bad("response.conversation", 'conversation must be "auto" or "none"')
        if conv not in ("auto", "none"):  # a named conversation: GA's type allows it, nothing serves it
            raise refused("response.conversation", 'only "auto" and "none" exist here')
        kw["conversation"] = conv
    kw.update(_response_overrides(r))
    return ResponseCreate(options=ResponseOptions(**kw), event_id=eid)


def _response_overrides(r: dict[str, Any]) -> dict[str, Any]:
    """What a ``response.create`` sets for itself instead of the session's:
    tools, tool choice, the output audio, the context (``input``)."""
    kw: dict[str, Any] = {}
    for key, parse in (("tools", _tools), ("tool_choice", _tool_choice),
                       ("parallel_tool_calls", _bool)):
        val = parse(r.get(key), f"response.{key}")
        if val is not _MISSING:
            kw[key] = val
    for key, beta, parse in (("format", "output_audio_format", _audio_format), ("voice", "voice", _voice)):
        raw, param = _dig(r, ("audio", "output", key), "response"), f"response.audio.output.{key}"
        if raw is _MISSING or raw is None:  # the beta name, flat
            raw, param = r.get(beta), f"response.{beta}"
        if raw is not None:
            kw["output_format" if key == "format" else "voice"] = parse(raw, param)
    if r.get("input") is not None:
        kw["input"] = _input_items(r["input"])
    return kw


def _input_items(raw: Any) -> tuple[Any, ...]:
    if not isinstance(raw, list):
        raise _bad("response.input", "response.input must be a list of items")
    out: list[Any] = []
    for i, entry in enumerate(raw):
        p = f"response.input[{i}]"
        if isinstance(entry, dict) and entry.get("type") == "item_reference":
            out.append(_req_str(entry, "id", f"{p}.id"))
        else:
            out.append(_item(entry, p))
    return tuple(out)


def _on_duplex_input(o: dict[str, Any], eid: str | None) -> Command:
    try:
        mode = InputMode(o.get("mode"))
    except (ValueError, TypeError):
        modes = ", ".join(m.value for m in InputMode)
        raise _bad("mode", f"mode must be one of {modes}") from None
    audio = o.get("audio")
    return DuplexInput(
        mode=mode,
        text=_opt_str(o.get("text"), "text"),
        audio=None if audio is None else _b64(audio, "audio"),
        checkpoint=_opt_str(o.get("checkpoint"), "checkpoint"),
        event_id=eid,
    )


_HANDLERS: dict[str, Callable[[dict[str, Any], str | None], Command]] = {
    "session.update": _on_session_update,
    "input_audio_buffer.append": _on_append,
    "input_audio_buffer.commit": lambda o, eid: AudioCommit(event_id=eid),
    "input_audio_buffer.clear": lambda o, eid: AudioClear(event_id=eid),
    "conversation.item.create": _on_item_create,
    "conversation.item.retrieve": lambda o, eid: ItemRetrieve(
        item_id=_req_str(o, "item_id", "item_id"), event_id=eid
    ),
    "conversation.item.delete": lambda o, eid: ItemDelete(
        item_id=_req_str(o, "item_id", "item_id"), event_id=eid
    ),
    "conversation.item.truncate": _on_truncate,
    "response.create": _on_response_create,
    "response.cancel": lambda o, eid: ResponseCancel(
        response_id=_opt_str(o.get("response_id"), "response_id"), event_id=eid
    ),
    "duplex.input": _on_duplex_input,
    "session.close": lambda o, eid: SessionClose(reason="client", event_id=eid),
    "session.resume": _on_resume,
    "duplex.video.frame": _on_video_frame,
    "duplex.video.chunk": _on_video_chunk,
    "session.event_ack": lambda o, eid: EventAck(seq=_seq(o, "seq"), event_id=eid),
    "output_audio_buffer.clear": lambda o, eid: OutputAudioClear(event_id=eid),  # WebRTC calls
}
CLIENT_EVENT_TYPES: frozenset[str] = frozenset(_HANDLERS)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")  # Python's json accepts NaN/Infinity


# ---- rendering -------------------------------------------------------------------

_PLAIN, _BYTES, _ERROR = 0, 1, 2


def _json_default(v: Any) -> Any:
    """Values the C encoder does not know. Kept off the hot path: event fields
    are plain JSON types except the ones classified in ``_Plan``."""
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, DuplexError):
        return v.to_wire()
    if isinstance(v, (set, frozenset)):
        return sorted(v)
    wire = getattr(v, "wire", None)
    if callable(wire):
        return wire()
    item = getattr(v, "item", None)  # numpy scalars
    if callable(item):
        return item()
    raise TypeError(f"cannot render {type(v).__name__} as JSON")


# ensure_ascii (the default) keeps lone surrogates a client may have sent in
# text from producing a frame that cannot be encoded as UTF-8.
_encode = json.JSONEncoder(separators=(",", ":"), default=_json_default).encode


class _Plan:
    """How to render one event class: computed once per (class, dialect)."""

    __slots__ = ("type", "fields", "doc")

    def __init__(self, cls: type[ServerEvent], dialect: Dialect) -> None:
        ga_type = cls.type
        self.type: str | None = ga_type
        self.doc: tuple[str, Callable[[Any], Any]] | None = None
        if dialect is Dialect.BETA:
            self.type = BETA_EVENT_TYPES.get(ga_type, ga_type)
            self.doc = _BETA_DOCS.get(ga_type)
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # unresolvable annotation: classify at run time
            hints = {}
        self.fields = tuple((f.name, _kind(hints.get(f.name))) for f in dc_fields(cls)
                            if f.metadata.get("wire", True))  # not events.ENGINE_ONLY


def _kind(hint: Any) -> int:
    args = typing.get_args(hint) or (hint,)
    if bytes in args:
        return _BYTES
    if any(isinstance(a, type) and issubclass(a, DuplexError) for a in args):
        return _ERROR
    return _PLAIN


# Render plans, computed once per (event class, dialect) for the process.
_PLANS: dict[Dialect, dict[type, _Plan]] = {d: {} for d in Dialect}


class RealtimeCodec:
    """Parses client frames into ``Command``s and renders ``Envelope``s.

    One codec per connection: event ids are minted from a random per-codec
    prefix and a counter, so they are unique per connection and cheap.
    """

    def __init__(self, *, max_event_bytes: int = 1 << 20, dialect: Dialect = Dialect.GA,
                 model_aliases: Mapping[str, str] | None = None) -> None:
        self.max_event_bytes = max_event_bytes
        self.dialect = dialect
        # Other names of the served model (a deployment's ``served_model_names``:
        # clients send their own default, e.g. ``gpt-realtime``): a session.update
        # naming one means the served model, not a change of an immutable field.
        self.model_aliases = dict(model_aliases or {})
        self._prefix = "event_" + secrets.token_hex(4)
        self._counter = itertools.count(1)
        self._plans = _PLANS[dialect]

    # -- parsing --

    def parse(self, frame: str | bytes | bytearray) -> Command:
        text = self._text(frame)
        try:
            obj = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise DuplexError("invalid_json", f"frame is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise DuplexError("invalid_event", "an event must be a JSON object")
        raw_eid = obj.get("event_id")
        eid = raw_eid if isinstance(raw_eid, str) else None
        kind = obj.get("type")
        if not isinstance(kind, str):
            raise DuplexError("invalid_event", "missing or non-string type", param="type", event_id=eid)
        handler = _HANDLERS.get(kind)
        if handler is None:
            raise DuplexError("unknown_event", f"unknown event type {kind!r}", param="type", event_id=eid)
        if raw_eid is not None and eid is None:
            raise _bad("event_id", "event_id must be a string")
        try:
            command = handler(obj, eid)
        except DuplexError as err:
            raise err.with_event_id(eid) from None
        if isinstance(command, SessionUpdate) and command.patch.model in self.model_aliases:
            patch = dataclasses.replace(command.patch, model=self.model_aliases[command.patch.model])
            command = dataclasses.replace(command, patch=patch)
        return command

    def session_patch(self, raw: Any, param: str = "session") -> SessionPatch:
        """A session object sent outside an event -- a call's ``session`` part,
        a client secret's ``session`` -- as the patch a ``session.update``
        of it would be (the served model's other names mean the model)."""
        try:
            patch = _session_patch(raw)
        except DuplexError as err:
            if param != "session" and err.param and err.param.startswith("session"):
                err.param = param + err.param[len("session"):]
            raise
        if patch.get("model") in self.model_aliases:
            patch = dataclasses.replace(patch, model=self.model_aliases[patch.model])
        return patch

    def _text(self, frame: str | bytes | bytearray) -> str:
        limit = self.max_event_bytes
        if isinstance(frame, str):
            n = len(frame)  # chars <= UTF-8 bytes <= 4 * chars: encode only if it matters
            if n > limit or (4 * n > limit and len(frame.encode("utf-8", "surrogatepass")) > limit):
                raise DuplexError("event_too_large", f"event exceeds {limit} bytes")
            return frame
        if len(frame) > limit:
            raise DuplexError("event_too_large", f"event exceeds {limit} bytes")
        try:
            return bytes(frame).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DuplexError("invalid_json", f"frame is not valid UTF-8: {exc.reason}") from None

    # -- rendering --

    def next_event_id(self) -> str:
        return f"{self._prefix}_{next(self._counter)}"

    def render(self, env: Envelope) -> str | None:
        """One JSON text frame, or ``None`` when the event has no equivalent
        in this codec's dialect (e.g. ``conversation.item.done`` in beta)."""
        ev = env.event
        plan = self._plans.get(type(ev))
        if plan is None:
            plan = self._plans[type(ev)] = _Plan(type(ev), self.dialect)
        if plan.type is None:
            return None
        out: dict[str, Any] = {"type": plan.type, "event_id": self.next_event_id()}
        for name, kind in plan.fields:
            v = getattr(ev, name)
            if kind == _BYTES and v is not None:
                v = base64.b64encode(v).decode("ascii")
            elif kind == _ERROR and v is not None:
                v = v.to_wire()
            out[name] = v
        if plan.doc is not None:
            name, convert = plan.doc
            if isinstance(out.get(name), dict):
                out[name] = convert(out[name])  # copies: the journaled snapshot is untouched
        out["seq"] = env.seq
        out["metadata"] = {"fence": env.fence.wire()}
        return _encode(out)

    def render_notice(self, kind: str, fence: Fence | None = None, **fields: Any) -> str:
        """An unjournaled connection event (``session.resumed``, ``session.replaced``,
        ``session.resync_required``): no seq, it is about this socket."""
        out: dict[str, Any] = {"type": kind, "event_id": self.next_event_id(), **fields}
        if fence is not None:
            out["metadata"] = {"fence": fence.wire()}
        return _encode(out)

    def render_error(self, err: DuplexError, fence: Fence | None = None) -> str:
        """An unjournaled ``error`` event (framing errors): no seq, but the
        session's current fence when there is a session."""
        out: dict[str, Any] = {"type": "error", "event_id": self.next_event_id(),
                               "error": err.to_wire()}
        if fence is not None:
            out["metadata"] = {"fence": fence.wire()}
        return _encode(out)
