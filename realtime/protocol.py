"""The OpenAI Realtime wire codec: JSON frames ⇄ typed commands / events.

Sans-I/O: ``RealtimeCodec.parse`` turns one client frame into a typed
``Command`` (or raises ``DuplexError``); ``render`` turns one journaled
``Envelope`` into one JSON text frame. Nothing here awaits or touches a
socket, so every rule is unit-tested byte for byte.

Shapes follow Realtime GA. The beta shapes are accepted as aliases in both
dialects (clients mix them freely); the beta *dialect* additionally renames
server events and reshapes the session/response/item documents. All GA↔beta
alias tables live in the "aliases" section below, and serve both directions.

Parse rules: size is checked before anything else (a 2 MiB frame is never
JSON-parsed); bad UTF-8 or JSON → ``invalid_json``; a non-object or a
missing/non-string ``type`` → ``invalid_event``; unknown type →
``unknown_event``; a bad field → ``invalid_value`` with ``param`` set to the
field path (``session.audio.input.turn_detection.threshold``,
``item.content[0].type``); undecodable base64 → ``invalid_audio``. Unknown
fields are ignored, as OpenAI does; ``null`` for an optional field means
"not given" unless null has a meaning (``turn_detection``, ``transcription``).
Every error carries the client's ``event_id`` when it could be read.
"""

from __future__ import annotations

import base64
import binascii
import enum
import itertools
import json
import secrets
import typing
from collections.abc import Callable
from dataclasses import fields as dc_fields
from typing import Any

from vllm_duplex.commands import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    Command,
    DuplexInput,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    ResponseCancel,
    ResponseCreate,
    ResponseOptions,
    SessionClose,
    SessionUpdate,
)
from vllm_duplex.contracts import InputMode
from vllm_duplex.conversation import ContentPart, ConversationItem, ItemType, Role
from vllm_duplex.errors import DuplexError
from vllm_duplex.events import Envelope, ServerEvent
from vllm_duplex.session_config import (
    AudioEncoding,
    AudioFormat,
    SessionPatch,
    Transcription,
    TurnDetection,
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


# ---- aliases (the one place for GA <-> beta) ----------------------------------

# Server event names that differ in beta; ``None``: no beta equivalent (not sent).
BETA_EVENT_TYPES: dict[str, str | None] = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
    "conversation.item.done": None,
}

# Beta session key -> GA session path. Parsing reads either; rendering in the
# beta dialect moves GA paths back to these keys.
SESSION_BETA_TO_GA: dict[str, tuple[str, ...]] = {
    "modalities": ("output_modalities",),
    "max_response_output_tokens": ("max_output_tokens",),
    "input_audio_format": ("audio", "input", "format"),
    "input_audio_transcription": ("audio", "input", "transcription"),
    "turn_detection": ("audio", "input", "turn_detection"),
    "input_audio_noise_reduction": ("audio", "input", "noise_reduction"),
    "output_audio_format": ("audio", "output", "format"),
    "voice": ("audio", "output", "voice"),
    "speed": ("audio", "output", "speed"),
}

# response.create options: beta key -> GA key.
RESPONSE_BETA_TO_GA: dict[str, str] = {
    "modalities": "output_modalities",
    "max_response_output_tokens": "max_output_tokens",
}

# Beta audio format strings. Beta "pcm16" is PCM16 at 24 kHz; a GA PCM format
# at another rate has no beta name and is rendered as "pcm16" (the closest).
BETA_AUDIO_FORMATS: dict[str, AudioFormat] = {
    "pcm16": AudioFormat(AudioEncoding.PCM16, 24000),
    "g711_ulaw": AudioFormat(AudioEncoding.PCMU, 8000),
    "g711_alaw": AudioFormat(AudioEncoding.PCMA, 8000),
}
_GA_FORMAT_TO_BETA = {f.encoding.value: name for name, f in BETA_AUDIO_FORMATS.items()}

# Assistant content part types: GA -> beta.
CONTENT_GA_TO_BETA: dict[str, str] = {"output_text": "text", "output_audio": "audio"}

# ---- field validation --------------------------------------------------------

_MISSING: Any = object()
_MIN_PCM_RATE, _MAX_PCM_RATE = 8000, 48000


def _bad(param: str, message: str, code: str = "invalid_value") -> DuplexError:
    return DuplexError(code, message, param=param)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _str(v: Any, p: str) -> Any:
    if v is None:
        return _MISSING
    if not isinstance(v, str):
        raise _bad(p, f"{p} must be a string")
    return v


def _opt_str(v: Any, p: str) -> str | None:
    return None if v is None else _str(v, p)


def _req_str(obj: dict[str, Any], key: str, p: str) -> str:
    v = obj.get(key)
    if v is None:
        raise _bad(p, f"missing required field {p}")
    return _str(v, p)


def _int(v: Any, p: str, lo: int = 0) -> Any:
    if v is None:
        return _MISSING
    if not _is_int(v) or v < lo:
        raise _bad(p, f"{p} must be an integer >= {lo}")
    return v


def _req_int(obj: dict[str, Any], key: str, p: str) -> int:
    v = _int(obj.get(key), p)
    if v is _MISSING:
        raise _bad(p, f"missing required field {p}")
    return v


def _ranged(lo: float, hi: float) -> Callable[[Any, str], Any]:
    def parse(v: Any, p: str) -> Any:
        if v is None:
            return _MISSING
        if not _is_num(v) or not lo <= v <= hi:
            raise _bad(p, f"{p} must be a number in [{lo}, {hi}]")
        return float(v)

    return parse


def _bool(v: Any, p: str) -> Any:
    if v is None:
        return _MISSING
    if not isinstance(v, bool):
        raise _bad(p, f"{p} must be a boolean")
    return v


def _obj(v: Any, p: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _bad(p, f"{p} must be an object")
    return v


def _b64(v: Any, p: str) -> bytes:
    if not isinstance(v, str):
        raise _bad(p, f"{p} must be a base64 string")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _bad(p, f"{p} is not valid base64", "invalid_audio") from exc


def _modalities(v: Any, p: str) -> Any:
    if v is None:
        return _MISSING
    if not isinstance(v, list) or not v or any(m not in ("text", "audio") for m in v):
        raise _bad(p, f'{p} must be a non-empty list of "text" and/or "audio"')
    return tuple(dict.fromkeys(v))  # de-duplicated, order kept


def _max_tokens(v: Any, p: str) -> Any:
    if v is None:
        return _MISSING
    if v == "inf" and isinstance(v, str):
        return None  # None means "inf" in SessionConfig
    if not _is_int(v) or v < 1:
        raise _bad(p, f'{p} must be a positive integer or "inf"')
    return v


def _audio_format(v: Any, p: str) -> Any:
    if v is None:
        return _MISSING
    if isinstance(v, str):  # beta name (accepted in the GA position too)
        if v not in BETA_AUDIO_FORMATS:
            raise _bad(p, f"unsupported audio format {v!r}", "unsupported_audio_format")
        return BETA_AUDIO_FORMATS[v]
    fmt = _obj(v, p)
    kind = fmt.get("type", AudioEncoding.PCM16.value)
    try:
        enc = AudioEncoding(kind)
    except (ValueError, TypeError):
        raise _bad(f"{p}.type", f"unsupported audio format {kind!r}", "unsupported_audio_format") from None
    default_rate = 24000 if enc is AudioEncoding.PCM16 else 8000
    rate = fmt.get("rate", default_rate)
    if rate is None:
        rate = default_rate
    if not _is_int(rate):
        raise _bad(f"{p}.rate", f"{p}.rate must be an integer")
    ok = _MIN_PCM_RATE <= rate <= _MAX_PCM_RATE if enc is AudioEncoding.PCM16 else rate == 8000
    if not ok:
        raise _bad(f"{p}.rate", f"unsupported rate {rate} for {enc.value}", "unsupported_audio_format")
    return AudioFormat(enc, rate)


def _transcription(v: Any, p: str) -> Transcription | None:
    if v is None:
        return None
    t = _obj(v, p)
    kw: dict[str, Any] = {
        "language": _opt_str(t.get("language"), f"{p}.language"),
        "prompt": _opt_str(t.get("prompt"), f"{p}.prompt"),
    }
    model = _str(t.get("model"), f"{p}.model")
    if model is not _MISSING:
        kw["model"] = model
    return Transcription(**kw)


_TD_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "threshold": _ranged(0.0, 1.0),
    "prefix_padding_ms": _int,
    "silence_duration_ms": _int,
    "create_response": _bool,
    "interrupt_response": _bool,
}


def _turn_detection(v: Any, p: str) -> TurnDetection | None:
    if v is None:
        return None  # manual commits
    td = _obj(v, p)
    kind = td.get("type", "server_vad")
    if not isinstance(kind, str):
        raise _bad(f"{p}.type", f"{p}.type must be a string")
    if kind != "server_vad":
        raise _bad(f"{p}.type", f"turn detection {kind!r} is not supported", "unsupported_turn_detection")
    kw: dict[str, Any] = {}
    for key, parse in _TD_FIELDS.items():
        val = parse(td.get(key), f"{p}.{key}")
        if val is not _MISSING:
            kw[key] = val
    if "idle_timeout_ms" in td:  # null is meaningful: no idle timeout
        val = _int(td["idle_timeout_ms"], f"{p}.idle_timeout_ms")
        kw["idle_timeout_ms"] = None if val is _MISSING else val
    return TurnDetection(**kw)


def _voice(v: Any, p: str) -> Any:
    if isinstance(v, dict):  # GA custom voice {"id": ...}
        return _req_str(v, "id", f"{p}.id")
    return _str(v, p)


def _tools(v: Any, p: str) -> Any:
    if v is None:
        return _MISSING
    if not isinstance(v, list):
        raise _bad(p, f"{p} must be a list")
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, raw in enumerate(v):
        tp = f"{p}[{i}]"
        t = _obj(raw, tp)
        if t.get("type", "function") != "function":
            raise _bad(f"{tp}.type", "only function tools are supported")
        name = _req_str(t, "name", f"{tp}.name")
        if not name or name in names:
            raise _bad(f"{tp}.name", f"{tp}.name must be non-empty and unique")
        names.add(name)
        tool: dict[str, Any] = {"type": "function", "name": name}
        desc = _opt_str(t.get("description"), f"{tp}.description")
        if desc is not None:
            tool["description"] = desc
        if t.get("parameters") is not None:
            tool["parameters"] = _obj(t["parameters"], f"{tp}.parameters")
        out.append(tool)
    return tuple(out)


def _tool_choice(v: Any, p: str) -> Any:
    if v is None:
        return _MISSING
    if v in ("auto", "none", "required") and isinstance(v, str):
        return v
    if isinstance(v, dict) and v.get("type") == "function":
        return {"type": "function", "name": _req_str(v, "name", f"{p}.name")}
    raise _bad(p, f'{p} must be "auto", "none", "required" or {{"type":"function","name":...}}')


def _ignored(v: Any, p: str) -> Any:
    return _MISSING


# GA session path -> (SessionPatch field or None, value parser).
_SESSION_FIELDS: dict[tuple[str, ...], tuple[str | None, Callable[[Any, str], Any]]] = {
    ("model",): ("model", _str),
    ("policy",): ("policy", _str),  # duplex extension
    ("instructions",): ("instructions", _str),
    ("output_modalities",): ("output_modalities", _modalities),
    ("audio", "input", "format"): ("input_format", _audio_format),
    ("audio", "input", "transcription"): ("transcription", _transcription),
    ("audio", "input", "turn_detection"): ("turn_detection", _turn_detection),
    ("audio", "input", "noise_reduction"): (None, _ignored),
    ("audio", "output", "format"): ("output_format", _audio_format),
    ("audio", "output", "voice"): ("voice", _voice),
    ("audio", "output", "speed"): ("speed", _ranged(0.25, 1.5)),
    ("tools",): ("tools", _tools),
    ("tool_choice",): ("tool_choice", _tool_choice),
    ("max_output_tokens",): ("max_output_tokens", _max_tokens),
    ("temperature",): ("temperature", _ranged(0.0, 2.0)),
}


def _dig(obj: dict[str, Any], path: tuple[str, ...], prefix: str | None) -> Any:
    """``obj[path[0]][path[1]]...`` or ``_MISSING``; with ``prefix``, an
    intermediate that is neither an object nor null is an ``invalid_value``."""
    cur: Any = obj
    for depth, key in enumerate(path):
        if key not in cur:
            return _MISSING
        cur = cur[key]
        if depth < len(path) - 1:
            if cur is None:
                return _MISSING
            if not isinstance(cur, dict):
                if prefix is None:
                    return _MISSING
                raise _bad(".".join((prefix, *path[: depth + 1])), "must be an object")
    return cur


def _session_patch(raw: Any) -> SessionPatch:
    s = _obj(raw, "session")
    kind = s.get("type")
    if kind is not None and kind != "realtime":
        raise _bad("session.type", 'only "realtime" sessions are supported')
    found: dict[tuple[str, ...], tuple[Any, str]] = {}
    # Beta aliases first so that the GA shape wins when a client sends both.
    for beta_key, path in SESSION_BETA_TO_GA.items():
        if beta_key in s:
            found[path] = (s[beta_key], f"session.{beta_key}")
    for path in _SESSION_FIELDS:
        v = _dig(s, path, "session")
        if v is not _MISSING:
            found[path] = (v, "session." + ".".join(path))
    patch: dict[str, Any] = {}
    for path, (value, param) in found.items():
        name, parse = _SESSION_FIELDS[path]
        parsed = parse(value, param)
        if name is not None and parsed is not _MISSING:
            patch[name] = parsed
    return SessionPatch(**patch)


# ---- conversation items ------------------------------------------------------

# Content part types each role may send, mapped to the stored (GA) type.
_PART_TYPES: dict[Role, dict[str, str]] = {
    Role.USER: {"input_text": "input_text", "input_audio": "input_audio"},
    Role.SYSTEM: {"input_text": "input_text"},
    Role.ASSISTANT: {
        "output_text": "output_text",
        "output_audio": "output_audio",
        **{beta: ga for ga, beta in CONTENT_GA_TO_BETA.items()},
    },
}


def _content_part(raw: Any, role: Role, p: str) -> ContentPart:
    part = _obj(raw, p)
    wire_type = part.get("type")
    kind = _PART_TYPES[role].get(wire_type) if isinstance(wire_type, str) else None
    if kind is None:
        raise _bad(f"{p}.type", f"content type {part.get('type')!r} is not valid for role {role.value!r}")
    if kind in ("input_text", "output_text"):
        text = _str(part.get("text"), f"{p}.text")
        return ContentPart(kind, text="" if text is _MISSING else text)
    if part.get("audio") is not None:
        _b64(part["audio"], f"{p}.audio")  # validated; the session keeps transcripts
    return ContentPart(kind, transcript=_opt_str(part.get("transcript"), f"{p}.transcript"))


def _item(raw: Any, p: str = "item") -> ConversationItem:
    item = _obj(raw, p)
    item_id = _opt_str(item.get("id"), f"{p}.id") or ""
    try:
        kind = ItemType(item.get("type", "message"))
    except (ValueError, TypeError):
        raise _bad(f"{p}.type", f"unsupported item type {item.get('type')!r}") from None
    if kind is ItemType.MESSAGE:
        try:
            role = Role(item.get("role"))
        except (ValueError, TypeError):
            raise _bad(f"{p}.role", 'role must be "user", "assistant" or "system"') from None
        content = item.get("content")
        if content is None:
            content = []
        if not isinstance(content, list):
            raise _bad(f"{p}.content", f"{p}.content must be a list")
        parts = [_content_part(c, role, f"{p}.content[{i}]") for i, c in enumerate(content)]
        return ConversationItem(id=item_id, type=kind, role=role, content=parts)
    if kind is ItemType.FUNCTION_CALL:
        args = _str(item.get("arguments"), f"{p}.arguments")
        return ConversationItem(
            id=item_id,
            type=kind,
            call_id=_opt_str(item.get("call_id"), f"{p}.call_id"),
            name=_req_str(item, "name", f"{p}.name"),
            arguments="" if args is _MISSING else args,
        )
    return ConversationItem(
        id=item_id,
        type=kind,
        call_id=_req_str(item, "call_id", f"{p}.call_id"),
        output=_req_str(item, "output", f"{p}.output"),
    )


# ---- client events -------------------------------------------------------------


def _on_session_update(o: dict[str, Any], eid: str | None) -> Command:
    return SessionUpdate(patch=_session_patch(o.get("session")), event_id=eid)


def _on_append(o: dict[str, Any], eid: str | None) -> Command:
    if o.get("audio") is None:
        raise _bad("audio", "missing required field audio")
    audio = _b64(o["audio"], "audio")
    seq = _int(o.get("seq"), "seq")
    return AudioAppend(audio=audio, seq=None if seq is _MISSING else seq, event_id=eid)


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
        if conv not in ("auto", "none") or not isinstance(conv, str):
            raise _bad("response.conversation", 'conversation must be "auto" or "none"')
        kw["conversation"] = conv
    return ResponseCreate(options=ResponseOptions(**kw), event_id=eid)


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
}
CLIENT_EVENT_TYPES: frozenset[str] = frozenset(_HANDLERS)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")  # Python's json accepts NaN/Infinity


# ---- beta documents ------------------------------------------------------------


def _format_to_beta(fmt: Any) -> Any:
    if isinstance(fmt, dict):
        return _GA_FORMAT_TO_BETA.get(fmt.get("type"), fmt)  # type: ignore[arg-type]
    return fmt


_GA_ONLY_SESSION_KEYS = frozenset({"type", *(path[0] for path in SESSION_BETA_TO_GA.values())})


def session_to_beta(ga: dict[str, Any]) -> dict[str, Any]:
    """A GA ``realtime`` session object (``session_wire``) in beta shape."""
    out = {k: v for k, v in ga.items() if k not in _GA_ONLY_SESSION_KEYS}
    for beta_key, path in SESSION_BETA_TO_GA.items():
        v = _dig(ga, path, None)
        if v is not _MISSING:
            out[beta_key] = _format_to_beta(v) if beta_key.endswith("_format") else v
    return out


def _part_to_beta(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") in CONTENT_GA_TO_BETA:
        return {**part, "type": CONTENT_GA_TO_BETA[part["type"]]}
    return part


def item_to_beta(item: dict[str, Any]) -> dict[str, Any]:
    content = item.get("content")
    if isinstance(content, list):
        return {**item, "content": [_part_to_beta(c) for c in content]}
    return item


def response_to_beta(resp: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in resp.items() if k not in ("output_modalities", "audio", "output")}
    if "output_modalities" in resp:
        out["modalities"] = resp["output_modalities"]
    audio_out = _dig(resp, ("audio", "output"), None)
    if isinstance(audio_out, dict):
        if "format" in audio_out:
            out["output_audio_format"] = _format_to_beta(audio_out["format"])
        if "voice" in audio_out:
            out["voice"] = audio_out["voice"]
    if isinstance(resp.get("output"), list):
        out["output"] = [item_to_beta(i) if isinstance(i, dict) else i for i in resp["output"]]
    return out


# Beta reshaping per GA event type: (field, converter).
_BETA_DOCS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "session.created": ("session", session_to_beta),
    "session.updated": ("session", session_to_beta),
    "response.created": ("response", response_to_beta),
    "response.done": ("response", response_to_beta),
    "conversation.item.added": ("item", item_to_beta),
    "conversation.item.retrieved": ("item", item_to_beta),
    "response.output_item.added": ("item", item_to_beta),
    "response.output_item.done": ("item", item_to_beta),
    "response.content_part.added": ("part", _part_to_beta),
    "response.content_part.done": ("part", _part_to_beta),
}

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
        self.fields = tuple((f.name, _kind(hints.get(f.name))) for f in dc_fields(cls))


def _kind(hint: Any) -> int:
    args = typing.get_args(hint) or (hint,)
    if bytes in args:
        return _BYTES
    if any(isinstance(a, type) and issubclass(a, DuplexError) for a in args):
        return _ERROR
    return _PLAIN


class RealtimeCodec:
    """Parses client frames into ``Command``s and renders ``Envelope``s.

    One codec per connection: event ids are minted from a random per-codec
    prefix and a counter, so they are unique per connection and cheap.
    """

    def __init__(self, *, max_event_bytes: int = 1 << 20, dialect: Dialect = Dialect.GA) -> None:
        self.max_event_bytes = max_event_bytes
        self.dialect = dialect
        self._prefix = "event_" + secrets.token_hex(4)
        self._counter = itertools.count(1)
        self._plans: dict[type, _Plan] = {}

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
            return handler(obj, eid)
        except DuplexError as err:
            raise err.with_event_id(eid) from None

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

    def render_error(self, err: DuplexError) -> str:
        """An unjournaled ``error`` event (framing errors): no seq, no fence."""
        return _encode({"type": "error", "event_id": self.next_event_id(), "error": err.to_wire()})
