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
- The engine's own backchannels ("Mm-hmm." while the user talks at length;
  the duplex extension ``session.audio.output.backchannels``, which GPT-Live's
  config lacks) are on the same timeline: their audio and transcript
  fragments (``frames``), as a reply's are.
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
- Decisions (``decisions.py``): items are answered at once; ``decision.create``
  and a trigger firing are a ``DecisionRun`` the shell evaluates and renders
  (``render_decision``). The conversation they judge is taken from the
  events rendered here: what the client was sent is what it heard.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.commands import (
    AudioAppend,
    Command,
    SessionClose,
    SessionUpdate,
)
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.realtime.wire.live.appends import APPENDS, Appends
from vllm_duplex.realtime.wire.live.audio_frames import audio_delta
from vllm_duplex.realtime.wire.live.commands import DTMF_KEYS, LiveAck, LiveDtmf, LiveStart
from vllm_duplex.realtime.wire.live.decisions import (
    DECISION_EVENTS,
    DecisionRun,
    Decisions,
    ItemReply,
    decision_event,
)
from vllm_duplex.realtime.wire.live.delegated import Delegations, LiveCommands
from vllm_duplex.realtime.wire.live.delegation import check_delegation, realtime_fields
from vllm_duplex.realtime.wire.live.fixtures import FIXTURE_FRAME_BYTES, FIXTURE_PLAY, Fixtures
from vllm_duplex.realtime.wire.live.fragments import final_rest
from vllm_duplex.realtime.wire.live.history import history_items
from vllm_duplex.realtime.wire.live.remote import RemoteRun
from vllm_duplex.realtime.wire.live.start_config import SILENCE, read_start, refuse_fields
from vllm_duplex.realtime.wire.live.client_events import (
    HANDLED,
    LIVE_MODELS,
    REFUSED,
    REFUSED_FIELDS,
)

# Our close reasons as GPT-Live's ``session.closed`` reasons.
_CLOSED = {"client": "close_requested", "hangup": "close_requested", "expired": "expired",
           "max_duration": "expired", "disconnect": "connection_lost"}


class LiveCodec:
    def __init__(self, *, max_event_bytes: int, model_aliases: Mapping[str, str],
                 clock: Callable[[], float], context_limit: int | None = None,
                 default_instructions: str = "") -> None:
        self.max_event_bytes = max_event_bytes
        self.context_limit = context_limit  # the model's context in tokens (None: unknown)
        served = set(model_aliases.values())
        aliases = dict(model_aliases)
        aliases.update({m: next(iter(served)) for m in LIVE_MODELS if len(served) == 1})
        self._realtime = RealtimeCodec(max_event_bytes=max_event_bytes, model_aliases=aliases)
        self._clock = clock  # seconds; the session timeline starts at ``start``
        self._t0: float | None = None
        self.muted = False
        # The last append's audio as the client sent it, before the mute: a
        # sideband hears the microphone itself (GPT-Live reflects it so).
        self.raw_audio = b""
        self.model = LIVE_MODELS[0]
        # The id the application knows the session by, where it is not the
        # session's own: a call's (its controls and sideband use it).
        self.session_id: str | None = None
        self.silence = SILENCE["audio/pcm"]
        self._start_eid: str | None = None
        self._update_eids: list[str | None] = []  # session.update acks, in order
        self._speech: dict[str, int] = {}  # transcript stream -> where its fragment run began
        self._heard: dict[str, str] = {}  # user item -> its input transcript sent so far
        self._fragments: dict[str, str | None] = {}  # transcript stream -> its last fragment's id
        self._prefix = "event_live_" + secrets.token_hex(4)  # unique per connection
        self._counter = 0
        self._last_session: dict[str, Any] | None = None  # for session.closed's snapshot
        # The Live instructions, else the server's (the backend prompt follows them).
        self._instructions: str | None = default_instructions or None
        self._delegations = Delegations(self._realtime, now_ms=self.now_ms,
                                        owe=lambda *owed: self._appends.owe(*owed),
                                        conversation=lambda: self.decisions.conversation)
        self.remote = self._delegations.remote  # delegations on external backends (the shell's)
        self._appends = Appends(self._realtime, self._delegations.check_delegation_id)
        self.decisions = Decisions()  # items, triggers, the conversation they judge
        self.last_event_id: str | None = None  # the last frame's (a trigger's source)
        self.fixtures = Fixtures()  # audio fixtures (fixtures.py); the shell plays them
        self.store = False  # store: true (forks.py)
        self.started_with: dict[str, Any] = {}  # the session.start config, for a stored session

    @property
    def delegation(self) -> dict[str, Any] | None:
        """The session's delegation config as accepted."""
        return self._delegations.config

    @property
    def _delegation(self) -> dict[str, Any] | None:
        """The delegation config as accepted (``delegation.py``)."""
        return self._delegations.config

    @_delegation.setter
    def _delegation(self, value: dict[str, Any] | None) -> None:
        self._delegations.config = value

    # ---- parse -------------------------------------------------------------------------

    def parse(self, frame: str | bytes) -> (Command | LiveCommands | LiveStart | LiveAck
                                             | LiveDtmf | DecisionRun | ItemReply | RemoteRun):
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
        # A fixture may be 30 s of audio, over the usual event limit: frames up
        # to its bound are read, and only a fixture may be that large.
        if len(frame) > max(self.max_event_bytes, FIXTURE_FRAME_BYTES):
            raise DuplexError("event_too_large", f"event exceeds {self.max_event_bytes} bytes")
        try:
            obj = json.loads(frame)
        except (ValueError, RecursionError) as exc:
            raise DuplexError("invalid_json", f"frame is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise DuplexError("invalid_event", "an event must be a JSON object")
        if len(frame) > self.max_event_bytes and obj.get("type") != FIXTURE_PLAY:
            raise DuplexError("event_too_large", f"event exceeds {self.max_event_bytes} bytes")
        return obj

    def _command(self, kind: str, obj: dict[str, Any], eid: str | None) -> Any:
        if kind == "session.start":
            model, patch = self.session_patch(obj.get("session"))
            history = history_items(obj["session"].get("input"), self._realtime)
            self._start_eid = eid
            return LiveStart(patch=patch, model=model, event_id=eid, history=history)
        if kind == "session.update":
            session = obj.get("session")
            if not isinstance(session, dict):
                raise DuplexError("invalid_value", "session must be an object", param="session")
            triggers = self.decisions.check_triggers(session.get("triggers"))
            patch = SessionPatch()
            if session.get("delegation") is not None:
                self._update_delegation(session.get("delegation"))
                patch = self._realtime.session_patch(
                    {"type": "realtime", **realtime_fields(self._delegation, self._instructions)})
            if triggers is not None:  # omitted: kept; a list replaces them
                self.decisions.triggers = triggers
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
            self.raw_audio = pcm
            if self.muted or self.fixtures.playing is not None:  # heard as silence, never later
                pcm = self.silence * len(pcm)
            return AudioAppend(audio=pcm, event_id=eid)
        if kind in ("session.input_audio.mute", "session.input_audio.unmute"):
            self.muted = kind.endswith(".mute")
            return LiveAck(type="session.input_audio.muted" if self.muted
                           else "session.input_audio.unmuted", event_id=eid)
        if kind in APPENDS:
            return self._appends.parse(kind, obj, eid)
        if kind in DECISION_EVENTS:
            return self.decisions.parse(kind, obj, eid, self._delegation)
        if kind == FIXTURE_PLAY:
            return self.fixtures.parse(obj, eid)
        if kind == "transport.dtmf.send":
            digit = obj.get("event")
            if not isinstance(digit, str) or len(digit) != 1 or digit not in DTMF_KEYS:
                raise DuplexError("invalid_value", "event is one DTMF key: 0-9, A-D, * or #",
                                  param="event")
            return LiveDtmf(digit=digit, event_id=eid)
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
            for backend in ("responses", "decisions"):  # its fields too: the model stays
                if same and backend in delegation:
                    delegation[backend] = {**current.get(backend, {}), **delegation[backend]}
            self._delegation = {**current, **delegation} if same else delegation

    def call_session_patch(self, raw: dict[str, Any], *,
                           storable: bool = False) -> tuple[str, SessionPatch]:
        """A WebRTC or SIP session's config (``live.create``, a fork, an accept)
        as ``session_patch``; an initial history refused by name (a fork's is
        delivered by its route), and a stored session unless ``storable`` (WebRTC)."""
        refuse_fields(raw, ("input",))
        if raw.get("store") is True and not storable:
            raise DuplexError("unsupported_option", REFUSED_FIELDS["store"], param="session.store")
        return self.session_patch(raw)

    def session_patch(self, raw: Any) -> tuple[str, SessionPatch]:
        """A ``session.start``'s config as the Realtime session it means
        (``start_config.py``; validated by the Realtime codec's field parsers)."""
        start = read_start(raw)
        self._delegation = start.delegation
        self.decisions.triggers = self.decisions.check_triggers(raw.get("triggers")) or {}
        if start.instructions is not None:
            self._instructions = start.instructions
        if start.silence is not None:
            self.silence = start.silence
        doc = {**start.doc, **realtime_fields(self._delegation, self._instructions)}
        patch = self._realtime.session_patch(doc)
        if patch.get("model") not in self._realtime.model_aliases.values():
            raise DuplexError("model_not_found", f"model {start.model!r} is not served here",
                              param="session.model")
        self.model = start.model
        self.store = start.store
        self.started_with = start.started_with
        return start.model, patch

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

    def frames(self, item: Envelope) -> list[str]:
        """Every GPT-Live frame one session event means: a backchannel's two
        (its audio, then its transcript fragment); else the delegation's
        (``delegated.py``), then ``render``'s."""
        e = item.event
        if isinstance(e, ev.OutputAudioBackchannel):
            start = self.now_ms()
            audio = audio_delta(e.audio)
            said = self._frame("session.output_transcript.delta", delta=e.transcript,
                               start_ms=start, end_ms=start + e.duration_ms)
            return [audio, said]
        if isinstance(e, ev.ErrorEvent) and self._delegations.refused(e.error):
            return []
        frames = [self._frame(f.pop("type"), **f) for f in self._delegations.render(e)]
        one = self.render(item)
        said = self.said(item)
        return [f for f in (*frames, one, said) if f is not None]

    def said(self, item: Envelope) -> str | None:
        """The words a reply's audio is the first to say, as the transcript
        fragment sent with it (a transport that plays the audio itself sends
        this alone). The reply's words as its voice says them, not as the LLM
        wrote them: a barge-in stops both, and GPT-Live cannot take words back."""
        e = item.event
        if not isinstance(e, ev.OutputAudioDelta) or self.fixtures.drops(e):
            return None
        frame = self._transcript("session.output_transcript.delta", "assistant", e.spoken)
        if frame is not None:
            self.decisions.spoke(e.spoken, self.last_event_id)
        return frame

    def due(self) -> list[Command]:
        """Commands the shell delivers now: replies asked for on the client's
        behalf that waited for the one shown to end (``delegated.py``)."""
        return self._delegations.due()

    def render(self, item: Envelope) -> str | None:
        e = item.event
        if self.fixtures.drops(e):
            return None  # the fixture is what the client hears now (fixtures.py)
        if isinstance(e, ev.SessionCreated):
            self.now_ms()  # the timeline starts here
            return self._frame("session.started", session=self.resource(e.session),
                               client_event_id=self._start_eid)
        if isinstance(e, ev.SessionUpdated):
            eid = self._update_eids.pop(0) if self._update_eids else None
            return self._frame("session.updated", session=self.resource(e.session),
                               client_event_id=eid)
        if isinstance(e, ev.OutputAudioDelta):
            return audio_delta(e.delta) if e.delta else None
        if isinstance(e, ev.InputTranscriptionDelta):
            self._heard[e.item_id] = self._heard.get(e.item_id, "") + e.delta
            return self._transcript("session.input_transcript.delta", "user", e.delta)
        if isinstance(e, ev.InputTranscriptionCompleted):
            frame = self._transcript("session.input_transcript.delta", "user",
                                     final_rest(self._heard.pop(e.item_id, ""), e.transcript))
            self.decisions.heard(e.transcript, self._fragments.pop("user", None))
            return frame
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
            self.decisions.reply_done()
            # Usage after each reply: the cumulative session time, as GPT-Live
            # bills it, and how full the model's context is now.
            return self._frame("session.usage.updated", usage=self.usage(),
                               context_window=self.context_window(e.response))
        if isinstance(e, ev.ErrorEvent):
            if self.fixtures.own_error(e.error):
                return None
            return self.render_error(e.error)
        if isinstance(e, ev.SessionClosed):
            return self.closed(e.reason)
        return None  # no GPT-Live equivalent (response, item and buffer events)

    def context_window(self, response: dict[str, Any]) -> dict[str, float] | None:
        """GPT-Live's ``context_window``: the tokens the model's context holds
        after this reply (its prompt, as the LLM counted it after any
        truncation, and the reply) over its context length; None when the
        limit or the count is unknown (GPT-Live omits it then)."""
        tokens = (response.get("usage") or {}).get("total_tokens")
        if not self.context_limit or not isinstance(tokens, int) or tokens <= 0:
            return None
        return {"usage_ratio": round(min(1.0, tokens / self.context_limit), 4)}
    def closed(self, reason: str) -> str:
        """``session.closed`` for one of our close reasons (``CloseReason``'s values)."""
        return self._frame("session.closed", reason=_CLOSED.get(reason, "connection_lost"),
                           session=self.resource(self._last_session or {}), usage=self.usage())

    def started(self) -> str:
        """``session.started`` for a sideband that attaches: the session as it is now."""
        return self._frame("session.started", session=self.resource(self._last_session or {}))

    def usage(self) -> dict[str, Any]:
        """GPT-Live's ``SessionUsage``: whole seconds of the session so far."""
        return {"seconds": float(self.now_ms() // 1000)}

    def _transcript(self, kind: str, who: str, delta: str) -> str | None:
        if not delta:
            return None
        end = self.now_ms()
        start = self._speech.get(who, end)
        frame = self._frame(kind, delta=delta, start_ms=min(start, end), end_ms=end)
        self._fragments[who] = self.last_event_id
        return frame

    def resource(self, session: dict[str, Any]) -> dict[str, Any]:
        """Our session document as GPT-Live's ``SessionResource``."""
        self._last_session = session
        audio = session.get("audio") or {}
        fmt = dict((audio.get("output") or {}).get("format") or {"type": "audio/pcm",
                                                                 "rate": 24000})
        fmt.setdefault("rate", 8000)
        out: dict[str, Any] = {
            "id": self.session_id or session.get("id", ""),
            "expires_at": int(session.get("expires_at") or 0),
            "model": self.model,
            "status": "active",
            "audio": {"format": fmt,
                      "output": {"voice": (audio.get("output") or {}).get("voice")}},
            "delegation": self._delegation,
            "store": self.store,
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

    def render_ack(self, ack: LiveAck | ItemReply) -> str:
        fields = ack.fields if isinstance(ack, ItemReply) else {}
        return self._frame(ack.type, client_event_id=ack.event_id, **fields)

    def render_remote(self, events: list[dict[str, Any]]) -> list[str]:
        """A remote run's events (``remote.py``), framed; its delegation's
        creation placed on the session timeline."""
        return [self._frame(kind, **e, offset_ms=self.now_ms() if kind ==
                            "session.delegation.created" else None)
                for e in events for kind in [e.pop("type")]]

    def render_delegated(self, run: DecisionRun) -> str:
        """``session.delegation.created`` for a ``decision.create``'s run."""
        return self._frame("session.delegation.created",
                           delegation={"id": run.delegation_id, "target": "decisions",
                                       "type": "delegation"},
                           offset_ms=self.now_ms(), client_event_id=run.event_id)

    def render_decision(self, run: DecisionRun, model: str, chosen: list[Any]) -> str:
        """``decision.event``: ``run``'s answers (``chosen``, in question order)."""
        return self._frame("decision.event", **decision_event(run, model, chosen))

    def render_dtmf(self, kind: str, digit: str, event_id: str | None = None) -> str:
        """``transport.dtmf.received`` (a key the caller pressed) or
        ``transport.dtmf.sent`` (one a sideband pressed, ``client_event_id``
        its command's)."""
        return self._frame(kind, event=digit, client_event_id=event_id)

    def _frame(self, kind: str, **fields: Any) -> str:
        out: dict[str, Any] = {"type": kind, "event_id": self.next_event_id()}
        self.last_event_id = out["event_id"]
        out.update({k: v for k, v in fields.items() if v is not None})
        return _encode(out)


def _encode(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
