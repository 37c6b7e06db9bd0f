"""The GPT-Live wire codec: JSON frames ⇄ the session's typed commands and events.

Sans-I/O, like ``RealtimeCodec`` (``realtime/wire/codec.py``), and the port's
``Codec``: ``parse`` turns one client frame into a typed command (or raises
``DuplexError``); ``render`` turns one journaled ``Envelope`` into one GPT-Live
server event, or ``None`` where GPT-Live has no such event. Shapes are the
``openai`` SDK's (``openai/types/live``); every one the tests emit is
validated by the SDK's own models.

What differs from Realtime, and where it is decided:

- The session starts with ``session.start`` (model and config), answered by
  ``session.started``: ``parse`` returns ``LiveStart`` and the shell opens the
  session with its patch (``session_patch``: the GPT-Live config as the
  Realtime session document it means, parsed by the Realtime codec, so every
  field is validated once).
- The engine decides when to speak: the session always has semantic end of
  turn with ``create_response`` and ``interrupt_response``, and adaptive
  interruptions (a backchannel does not stop the reply); there is no
  ``response.create`` to ask for speech.
- ``session.input_audio.mute`` is the codec's own gate, acknowledged at
  once (``LiveAck``): muted audio reaches the session as silence of the same
  length, as GPT-Live specifies ("sends silence to the model"), so the
  session's clock runs on and nothing said while muted is heard.
- Output is one stream of audio and transcript fragments on a session
  timeline: no response, item or buffer events (they render to ``None``).
  The server paces the audio (the shell opens the session played here), so
  a barge-in stops what the client plays within the pacer's lead. A reply's
  end has no event of its own; ``session.usage.updated`` follows each one.
- Appended instructions and thinking are system items of the conversation
  (``appends.py``). A delegation config becomes the session's tools and
  instructions (``delegation.py``): the backend is this engine's own LLM,
  and a reply that calls a tool is the delegation, rendered as GPT-Live's
  delegation events; the client's answers (``response.item.create``,
  ``response.create``, ``session.commentary.append``) are the session's
  items and replies (``delegated.py``: one client event may be several
  commands, ``LiveCommands``, and a reply asked for while another is shown
  is delivered when it ends, ``due``). What each client event gets is one
  table, ``client_events.py``.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.commands import AudioAppend, Command, SessionClose, SessionUpdate
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.realtime.wire.live.appends import APPENDS, Appends
from vllm_duplex.realtime.wire.live.delegated import Delegations, LiveCommands
from vllm_duplex.realtime.wire.live.delegation import check_delegation, realtime_fields
from vllm_duplex.realtime.wire.live.client_events import (
    HANDLED,
    LIVE_MODELS,
    REFUSED,
    REFUSED_FIELDS,
)

# What every GPT-Live session is on this engine (see the module docstring).
_TURN = {"type": "semantic_vad", "create_response": True, "interrupt_response": True}

# Silence in each input encoding: what a muted microphone sends on.
_SILENCE = {"audio/pcm": b"\x00", "audio/pcmu": b"\xff", "audio/pcma": b"\xd5"}

# Our close reasons as GPT-Live's ``session.closed`` reasons.
_CLOSED = {"client": "close_requested", "hangup": "close_requested", "expired": "expired",
           "max_duration": "expired", "disconnect": "connection_lost"}


@dataclass(frozen=True)
class LiveStart:
    """``session.start``: the shell opens the session with ``patch``."""

    patch: SessionPatch
    model: str  # as the client named it (the session resource repeats it)
    event_id: str | None = None


@dataclass(frozen=True)
class LiveAck:
    """A command the codec answers itself, at once (mute, unmute)."""

    type: str
    event_id: str | None = None


class LiveCodec:
    def __init__(self, *, max_event_bytes: int, model_aliases: Mapping[str, str],
                 clock: Callable[[], float], default_instructions: str = "") -> None:
        self.max_event_bytes = max_event_bytes
        served = set(model_aliases.values())
        aliases = dict(model_aliases)
        aliases.update({m: next(iter(served)) for m in LIVE_MODELS if len(served) == 1})
        self._realtime = RealtimeCodec(max_event_bytes=max_event_bytes, model_aliases=aliases)
        self._clock = clock  # seconds; the session timeline starts at ``start``
        self._t0: float | None = None
        self.muted = False
        self.model = LIVE_MODELS[0]
        self._silence = _SILENCE["audio/pcm"]
        self._start_eid: str | None = None
        self._update_eids: list[str | None] = []  # session.update acks, in order
        self._speech: dict[str, int] = {}  # transcript stream -> where its fragment run began
        self._heard: dict[str, str] = {}  # user item -> its input transcript sent so far
        self._prefix = "event_live_" + secrets.token_hex(4)  # unique per connection
        self._counter = 0
        self._last_session: dict[str, Any] | None = None  # for session.closed's snapshot
        # The Live instructions, else the server's (the backend prompt follows them).
        self._instructions: str | None = default_instructions or None
        self._delegations = Delegations(self._realtime, now_ms=self.now_ms,
                                        owe=lambda *owed: self._appends.owe(*owed))
        self._appends = Appends(self._realtime, self._delegations.check_delegation_id)

    @property
    def _delegation(self) -> dict[str, Any] | None:
        """The delegation config as accepted (``delegation.py``)."""
        return self._delegations.config

    @_delegation.setter
    def _delegation(self, value: dict[str, Any] | None) -> None:
        self._delegations.config = value

    # ---- parse -------------------------------------------------------------------------

    def parse(self, frame: str | bytes) -> Command | LiveCommands | LiveStart | LiveAck:
        obj = self._object(frame)
        raw_eid = obj.get("event_id")
        eid = raw_eid if isinstance(raw_eid, str) else None
        kind = obj.get("type")
        if not isinstance(kind, str):
            raise DuplexError("invalid_event", "missing or non-string type", param="type",
                              event_id=eid)
        if kind in REFUSED:
            raise DuplexError("capability_unsupported", f"{kind}: {REFUSED[kind]}", param="type",
                              event_id=eid)
        if kind not in HANDLED:
            raise DuplexError("unknown_event", f"unknown event type {kind!r}", param="type",
                              event_id=eid)
        if raw_eid is not None and eid is None:
            raise DuplexError("invalid_value", "event_id must be a string", param="event_id")
        try:
            return self._command(kind, obj, eid)
        except DuplexError as err:
            raise err.with_event_id(eid) from None

    def _object(self, frame: str | bytes) -> dict[str, Any]:
        if len(frame) > self.max_event_bytes:  # before any parsing: a huge frame is never read
            raise DuplexError("event_too_large", f"event exceeds {self.max_event_bytes} bytes")
        try:
            obj = json.loads(frame)
        except (ValueError, RecursionError) as exc:
            raise DuplexError("invalid_json", f"frame is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise DuplexError("invalid_event", "an event must be a JSON object")
        return obj

    def _command(self, kind: str, obj: dict[str, Any], eid: str | None) -> Any:
        if kind == "session.start":
            model, patch = self.session_patch(obj.get("session"))
            self._start_eid = eid
            return LiveStart(patch=patch, model=model, event_id=eid)
        if kind == "session.update":
            session = obj.get("session")
            if not isinstance(session, dict):
                raise DuplexError("invalid_value", "session must be an object", param="session")
            self._refuse_fields(session, ("triggers",))
            patch = SessionPatch()
            if session.get("delegation") is not None:
                self._update_delegation(session.get("delegation"))
                patch = self._realtime.session_patch(
                    {"type": "realtime", **realtime_fields(self._delegation, self._instructions)})
            self._update_eids.append(eid)
            return SessionUpdate(patch=patch, event_id=eid)
        if kind == "session.input_audio.append":
            audio = obj.get("audio")
            if not isinstance(audio, str):
                raise DuplexError("invalid_value", "audio must be a base64 string", param="audio")
            try:
                pcm = base64.b64decode(audio, validate=True)
            except (binascii.Error, ValueError):
                raise DuplexError("invalid_audio", "audio is not valid base64",
                                  param="audio") from None
            if self.muted:
                pcm = self._silence * len(pcm)
            return AudioAppend(audio=pcm, event_id=eid)
        if kind in ("session.input_audio.mute", "session.input_audio.unmute"):
            self.muted = kind.endswith(".mute")
            return LiveAck(type="session.input_audio.muted" if self.muted
                           else "session.input_audio.unmuted", event_id=eid)
        if kind in APPENDS:
            return self._appends.parse(kind, obj, eid)
        if kind in ("session.commentary.append", "response.create", "response.item.create"):
            return self._delegations.parse(kind, obj, eid)
        assert kind == "session.close"
        return SessionClose(event_id=eid)

    def _update_delegation(self, raw: Any) -> None:
        """A ``session.update``'s delegation: the same type keeps what it
        leaves out; another type replaces it whole."""
        if raw is None:
            return
        current = self._delegation or {}
        same = isinstance(raw, dict) and raw.get("type") == current.get("type")
        delegation = check_delegation(raw, update=same)
        if delegation is not None:
            if same and "responses" in delegation:  # its fields too: the model stays
                delegation["responses"] = {**current.get("responses", {}),
                                           **delegation["responses"]}
            self._delegation = {**current, **delegation} if same else delegation

    def _refuse_fields(self, session: dict[str, Any], names: tuple[str, ...]) -> None:
        for name in names:
            value = session.get(name)
            if name == "store" and value in (None, False):
                continue  # store: false is what this engine does
            if value not in (None, [], {}):
                raise DuplexError("unsupported_option", REFUSED_FIELDS[name],
                                  param=f"session.{name}")

    def session_patch(self, raw: Any) -> tuple[str, SessionPatch]:
        """A ``session.start``'s config as the Realtime session it means
        (validated by the Realtime codec's field parsers)."""
        if not isinstance(raw, dict):
            raise DuplexError("invalid_value", "session must be an object", param="session")
        model = raw.get("model")
        if not isinstance(model, str) or not model:
            raise DuplexError("invalid_value", "session.model is required", param="session.model")
        self._refuse_fields(raw, ("triggers", "input", "client", "store"))
        self._delegation = check_delegation(raw.get("delegation"))
        doc: dict[str, Any] = {"type": "realtime", "model": model}
        instructions = raw.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise DuplexError("invalid_value", "session.instructions must be a string",
                                  param="session.instructions")
            if instructions.strip():  # blank means the server's default, as GPT-Live says
                doc["instructions"] = self._instructions = instructions
        doc.update(realtime_fields(self._delegation, self._instructions))
        audio_in: dict[str, Any] = {"turn_detection": dict(_TURN), "transcription": {}}
        audio_out: dict[str, Any] = {}
        audio = raw.get("audio") or {}
        if not isinstance(audio, dict):
            raise DuplexError("invalid_value", "session.audio must be an object",
                              param="session.audio")
        fmt = audio.get("format")
        if fmt is not None:
            self._check_format(fmt)
            audio_in["format"] = audio_out["format"] = {"type": fmt["type"], "rate": fmt["rate"]}
            self._silence = _SILENCE[fmt["type"]]
        voice = (audio.get("output") or {}).get("voice")
        if isinstance(voice, dict):
            raise DuplexError("unsupported_option", "custom voices are not supported; "
                              "name a built-in voice", param="session.audio.output.voice")
        if voice is not None:
            audio_out["voice"] = voice
        doc["audio"] = {"input": audio_in, "output": audio_out}
        patch = self._realtime.session_patch(doc)
        if patch.get("model") not in self._realtime.model_aliases.values():
            raise DuplexError("model_not_found", f"model {model!r} is not served here",
                              param="session.model")
        self.model = model
        return model, patch

    @staticmethod
    def _check_format(fmt: Any) -> None:
        p = "session.audio.format"
        if not isinstance(fmt, dict) or fmt.get("type") not in _SILENCE:
            raise DuplexError("unsupported_audio_format",
                              "format.type must be audio/pcm, audio/pcmu or audio/pcma",
                              param=f"{p}.type")
        rates = (16000, 24000) if fmt["type"] == "audio/pcm" else (8000,)
        if fmt.get("rate") not in rates:
            raise DuplexError("unsupported_audio_format",
                              f"{fmt['type']} takes a rate of {' or '.join(map(str, rates))}",
                              param=f"{p}.rate")

    # ---- render ------------------------------------------------------------------------

    def next_event_id(self) -> str:
        self._counter += 1
        return f"{self._prefix}_{self._counter}"

    def now_ms(self) -> int:
        """Milliseconds on the session timeline (from ``session.started``)."""
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        return max(0, int((now - self._t0) * 1000))

    def render_all(self, item: Envelope) -> list[str]:
        """Every GPT-Live event one session event means: the delegation's
        (``delegated.py``), then ``render``'s."""
        e = item.event
        if isinstance(e, ev.ErrorEvent) and self._delegations.refused(e.error):
            return []
        frames = [self._frame(f.pop("type"), **f) for f in self._delegations.render(e)]
        one = self.render(item)
        return frames if one is None else [*frames, one]

    def due(self) -> list[Command]:
        """Commands the shell delivers now: replies asked for on the client's
        behalf that waited for the one shown to end (``delegated.py``)."""
        return self._delegations.due()

    def render(self, item: Envelope) -> str | None:
        e = item.event
        if isinstance(e, ev.SessionCreated):
            self.now_ms()  # the timeline starts here
            return self._frame("session.started", session=self.resource(e.session),
                               client_event_id=self._start_eid)
        if isinstance(e, ev.SessionUpdated):
            eid = self._update_eids.pop(0) if self._update_eids else None
            return self._frame("session.updated", session=self.resource(e.session),
                               client_event_id=eid)
        if isinstance(e, ev.OutputAudioDelta):
            if not e.delta:
                return None
            # No event_id: the SDK's shape has none on the primary socket.
            return _encode({"type": "session.output_audio.delta",
                            "delta": base64.b64encode(e.delta).decode("ascii")})
        if isinstance(e, ev.InputTranscriptionDelta):
            self._heard[e.item_id] = self._heard.get(e.item_id, "") + e.delta
            return self._transcript("session.input_transcript.delta", "user", e.delta)
        if isinstance(e, ev.InputTranscriptionCompleted):
            return self._transcript("session.input_transcript.delta", "user",
                                    final_rest(self._heard.pop(e.item_id, ""), e.transcript))
        if isinstance(e, ev.OutputAudioTranscriptDelta):
            return self._transcript("session.output_transcript.delta", "assistant", e.delta)
        if isinstance(e, (ev.SpeechStarted, ev.ResponseCreated)):
            # A new run of fragments: its start is where the speech began.
            self._speech["user" if isinstance(e, ev.SpeechStarted) else "assistant"] = self.now_ms()
            return None
        if isinstance(e, ev.ConversationItemAdded):
            owed = self._appends.added(e.item)
            if owed is None:
                return None
            now = self.now_ms()  # appended context takes no time on the timeline
            return self._frame(owed[0], start_ms=now, end_ms=now, client_event_id=owed[1])
        if isinstance(e, ev.ResponseDone):
            # Usage after each reply: the cumulative session time, as GPT-Live
            # bills it (this engine has no context-window measure to add).
            return self._frame("session.usage.updated", usage=self.usage())
        if isinstance(e, ev.ErrorEvent):
            return self.render_error(e.error)
        if isinstance(e, ev.SessionClosed):
            return self._frame("session.closed", reason=_CLOSED.get(e.reason, "connection_lost"),
                               session=self.resource(self._last_session or {}),
                               usage=self.usage())
        return None  # no GPT-Live equivalent (response, item and buffer events)

    def usage(self) -> dict[str, Any]:
        """GPT-Live's ``SessionUsage``: whole seconds of the session so far."""
        return {"seconds": float(self.now_ms() // 1000)}

    def _transcript(self, kind: str, who: str, delta: str) -> str | None:
        if not delta:
            return None
        end = self.now_ms()
        start = self._speech.get(who, end)
        return self._frame(kind, delta=delta, start_ms=min(start, end), end_ms=end)

    def resource(self, session: dict[str, Any]) -> dict[str, Any]:
        """Our session document as GPT-Live's ``SessionResource``."""
        self._last_session = session
        audio = session.get("audio") or {}
        fmt = dict((audio.get("output") or {}).get("format") or {"type": "audio/pcm",
                                                                 "rate": 24000})
        fmt.setdefault("rate", 8000)
        out: dict[str, Any] = {
            "id": session.get("id", ""),
            "expires_at": int(session.get("expires_at") or 0),
            "model": self.model,
            "status": "active",
            "audio": {"format": fmt,
                      "output": {"voice": (audio.get("output") or {}).get("voice")}},
            "delegation": self._delegation,
            "store": False,
        }
        text = session.get("instructions") or ""
        backend = ((self._delegation or {}).get("responses") or {}).get("instructions")
        if backend and text.endswith(backend):  # the backend prompt is the delegation's
            text = text[:-len(backend)].rstrip()
        if text:
            out["instructions"] = text
        return out

    def render_error(self, err: DuplexError, fence: Fence | None = None) -> str:
        """GPT-Live's ``error`` event: the SDK's ``Error`` (code, message,
        type, param, client_event_id)."""
        return self._frame("error", error={"type": err.spec.type, "code": err.code,
                                           "message": err.message, "param": err.param,
                                           "client_event_id": err.event_id},
                           client_event_id=err.event_id)

    def render_notice(self, kind: str, fence: Fence | None = None, **fields: Any) -> str:
        return self._frame(kind, **fields)

    def render_ack(self, ack: LiveAck) -> str:
        return self._frame(ack.type, client_event_id=ack.event_id)

    def _frame(self, kind: str, **fields: Any) -> str:
        out: dict[str, Any] = {"type": kind, "event_id": self.next_event_id()}
        out.update({k: v for k, v in fields.items() if v is not None})
        return _encode(out)


def final_rest(sent: str, final: str) -> str:
    """What of the final transcript the fragments sent did not say.

    GPT-Live's input transcript is fragments only (no "completed", no
    revision), and ours are the partial decode's stable words: the words the
    final alone hears (the turn's last ones, typically) would never reach the
    client. They follow as one more fragment: the final's text after what was
    sent when it goes on from it, else its words after as many words as were
    sent (a fragment cannot take back a word the final heard otherwise)."""
    if final.startswith(sent):
        return final[len(sent):]
    n = len(sent.split())
    rest = final.split()[n:]
    return (" " if n else "") + " ".join(rest) if rest else ""


def _encode(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
