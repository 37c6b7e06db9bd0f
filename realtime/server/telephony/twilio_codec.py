"""Twilio Media Streams messages (a bidirectional ``<Connect><Stream>``) as
typed values, both ways. Sans-I/O: text in, a message out; values in, text
out; no sockets, no session.

From Twilio (``parse``): ``connected``, ``start`` (the stream's and the call's
ids, ``customParameters``, ``mediaFormat``), ``media`` (base64 G.711 μ-law at
8 kHz, with ``chunk`` and ``timestamp``), ``dtmf``, ``mark`` (the echo of one
of ours: the audio before it has been played), ``stop``. To Twilio
(``media``, ``mark``, ``clear``): our reply audio, our marks, and "drop what
you have not played yet".

Every field Twilio documents is read where we use it and checked for its
type; fields we do not use are ignored (Twilio adds fields over time, and
Pipecat's serializer, for one, writes ``media`` with only ``payload``). A
frame that is not a message we can read is a typed ``DuplexError``:
``event_too_large``, ``invalid_json``, ``unknown_event`` (also for our own
outgoing events sent back to us), ``invalid_event`` (a field missing or of
the wrong type), ``invalid_audio`` (a payload that is not base64).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from vllm_duplex.domain.errors import DuplexError

# A 20 ms media message is about 300 bytes of JSON and the start message a few
# hundred more with its parameters: a frame this large is not Twilio's.
MAX_FRAME_BYTES = 64 << 10
# Twilio's call audio, and the only format a bidirectional stream carries.
MULAW_8K = ("audio/x-mulaw", 8000, 1)
DTMF_DIGITS = frozenset("0123456789*#ABCD")


@dataclass(frozen=True)
class Connected:
    protocol: str
    version: str


@dataclass(frozen=True)
class MediaFormat:
    encoding: str
    sample_rate: int
    channels: int

    @property
    def is_mulaw_8k(self) -> bool:
        return (self.encoding, self.sample_rate, self.channels) == MULAW_8K


@dataclass(frozen=True)
class Start:
    stream_sid: str
    call_sid: str
    account_sid: str
    media_format: MediaFormat
    tracks: tuple[str, ...] = ("inbound",)
    custom_parameters: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Media:
    stream_sid: str
    audio: bytes  # the payload, decoded: μ-law bytes, one per sample at 8 kHz
    track: str = "inbound"
    chunk: int | None = None  # 1, 2, ... per track
    timestamp_ms: int | None = None  # since the stream started


@dataclass(frozen=True)
class Dtmf:
    stream_sid: str
    digit: str
    track: str = "inbound_track"


@dataclass(frozen=True)
class Mark:
    stream_sid: str
    name: str


@dataclass(frozen=True)
class Stop:
    stream_sid: str
    call_sid: str


Inbound = Connected | Start | Media | Dtmf | Mark | Stop


# ---- from Twilio ------------------------------------------------------------


def parse(frame: str | bytes) -> Inbound:
    """One WebSocket frame from Twilio as its message; a typed error otherwise."""
    if len(frame) > MAX_FRAME_BYTES:
        raise DuplexError("event_too_large", f"a frame of {len(frame)} bytes is larger than "
                          f"any Twilio message ({MAX_FRAME_BYTES})")
    try:
        raw = json.loads(frame)
    except (ValueError, UnicodeDecodeError):
        raise DuplexError("invalid_json", "the frame is not JSON") from None
    if not isinstance(raw, dict):
        raise DuplexError("invalid_json", "the frame is not a JSON object")
    kind = raw.get("event")
    reader = _READERS.get(kind) if isinstance(kind, str) else None
    if reader is None:
        raise DuplexError("unknown_event", f"not a Twilio Media Streams event: {kind!r}",
                          param="event")
    return reader(raw)


def _text(obj: dict[str, Any], key: str, where: str, *, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str) or (default is None and not value):
        raise DuplexError("invalid_event", f"{where}.{key} must be a non-empty string",
                          param=f"{where}.{key}")
    return value


def _part(raw: dict[str, Any], key: str) -> dict[str, Any]:
    part = raw.get(key)
    if not isinstance(part, dict):
        raise DuplexError("invalid_event", f"a {raw['event']} message has a {key!r} object",
                          param=key)
    return part


def _number(obj: dict[str, Any], key: str, where: str) -> int | None:
    """Twilio writes its counters as strings ("chunk": "1"); absent is None."""
    value = obj.get(key)
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise DuplexError("invalid_event", f"{where}.{key} must be a number",
                          param=f"{where}.{key}") from None


def _connected(raw: dict[str, Any]) -> Connected:
    return Connected(protocol=_text(raw, "protocol", "connected", default="Call"),
                     version=_text(raw, "version", "connected", default=""))


def _start(raw: dict[str, Any]) -> Start:
    start = _part(raw, "start")
    fmt = start.get("mediaFormat")
    if not isinstance(fmt, dict):
        raise DuplexError("invalid_event", "start.mediaFormat must be an object",
                          param="start.mediaFormat")
    rate, channels = _number(fmt, "sampleRate", "mediaFormat"), _number(fmt, "channels", "mediaFormat")
    params = start.get("customParameters") or {}
    if not isinstance(params, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
        raise DuplexError("invalid_event", "start.customParameters must map names to strings",
                          param="start.customParameters")
    tracks = start.get("tracks") or ["inbound"]
    if not isinstance(tracks, list) or not all(isinstance(t, str) for t in tracks):
        raise DuplexError("invalid_event", "start.tracks must be a list of names",
                          param="start.tracks")
    return Start(
        stream_sid=_text(start, "streamSid", "start"),
        call_sid=_text(start, "callSid", "start"),
        account_sid=_text(start, "accountSid", "start", default=""),
        media_format=MediaFormat(_text(fmt, "encoding", "mediaFormat"), rate or 0, channels or 1),
        tracks=tuple(tracks), custom_parameters=dict(params))


def _media(raw: dict[str, Any]) -> Media:
    media = _part(raw, "media")
    payload = _text(media, "payload", "media", default="")
    try:
        audio = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise DuplexError("invalid_audio", "media.payload is not base64",
                          param="media.payload") from None
    return Media(stream_sid=_text(raw, "streamSid", "media", default=""), audio=audio,
                 track=_text(media, "track", "media", default="inbound"),
                 chunk=_number(media, "chunk", "media"),
                 timestamp_ms=_number(media, "timestamp", "media"))


def _dtmf(raw: dict[str, Any]) -> Dtmf:
    dtmf = _part(raw, "dtmf")
    digit = _text(dtmf, "digit", "dtmf")
    if digit not in DTMF_DIGITS:
        raise DuplexError("invalid_event", f"dtmf.digit {digit!r} is not a keypad key",
                          param="dtmf.digit")
    return Dtmf(stream_sid=_text(raw, "streamSid", "dtmf", default=""), digit=digit,
                track=_text(dtmf, "track", "dtmf", default="inbound_track"))


def _mark(raw: dict[str, Any]) -> Mark:
    return Mark(stream_sid=_text(raw, "streamSid", "mark", default=""),
                name=_text(_part(raw, "mark"), "name", "mark"))


def _stop(raw: dict[str, Any]) -> Stop:
    stop = raw.get("stop") if isinstance(raw.get("stop"), dict) else {}
    return Stop(stream_sid=_text(raw, "streamSid", "stop", default=""),
                call_sid=_text(stop, "callSid", "stop", default=""))


_READERS = {"connected": _connected, "start": _start, "media": _media, "dtmf": _dtmf,
            "mark": _mark, "stop": _stop}


# ---- to Twilio ----------------------------------------------------------------


def media(stream_sid: str, audio: bytes) -> str:
    """Reply audio for Twilio to play: μ-law bytes at 8 kHz."""
    return json.dumps({"event": "media", "streamSid": stream_sid,
                       "media": {"payload": base64.b64encode(audio).decode("ascii")}})


def mark(stream_sid: str, name: str) -> str:
    """Twilio echoes it once everything sent before it has been played (or cleared)."""
    return json.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear(stream_sid: str) -> str:
    """Drop the audio not played yet; Twilio then echoes the marks still pending."""
    return json.dumps({"event": "clear", "streamSid": stream_sid})
