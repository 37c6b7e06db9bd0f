"""What the GPT-Live dialect does with each client event the ``openai`` SDK
defines (``openai/types/live/client_event.py`` and ``connect_client_event.py``).

One table, so the conformance document and the codec cannot disagree: an
event is either parsed by the codec (``HANDLED``) or refused with a typed
error that names it and says why (``REFUSED``). Nothing is dropped silently.
"""

from __future__ import annotations

# Parsed into a command of the session (or, for mute, into the codec's own
# input gate): see ``LiveCodec.parse``.
HANDLED: tuple[str, ...] = (
    "session.start",
    "session.update",  # delegation as delegation.py says; triggers: decisions.py
    "session.input_audio.append",
    "session.input_audio.mute",
    "session.input_audio.unmute",
    "session.close",
    "session.instructions.append",  # appends.py
    "session.thinking.append",
    "decision.create",  # decisions.py
    "decision.item.create",
    "decision.item.delete",
    "session.output_audio.fixture.play",  # fixtures.py; played by the shell
    # A sideband command for SIP calls: the sideband presses the key
    # (live/sideband.py); a primary socket refuses it (live/socket.py).
    "transport.dtmf.send",
    "session.commentary.append",  # delegated.py, as the delegation events below
    "response.create",  # with responses delegation: continue a delegation (delegated.py)
    "response.item.create",  # with responses delegation: a function_call_output or a message
)

# Defined by the SDK and not built: refused with ``capability_unsupported``
# naming the event, the socket stays open. None today: every event is handled.
NOT_YET = "is not supported by this engine yet (docs/live-conformance.md)"
REFUSED: dict[str, str] = {}

# Session configuration fields a primary WebSocket may set that are refused
# by name (``unsupported_option``), with why.
REFUSED_FIELDS: dict[str, str] = {
    "client": "client capabilities apply to a WebRTC frontend; this is a primary WebSocket",
    # On a WebRTC or SIP session (LiveCodec.call_session_patch):
    "input": "an initial history is taken by a WebSocket session only, not yet by a "
             "WebRTC or SIP one",
    "store": "stored sessions are WebSocket and WebRTC sessions only, not yet SIP ones",
}

# Session fields that are honoured ("audio", "instructions", "model") or
# accepted with no effect because nothing here depends on them.
ACCEPTED_FIELDS = ("model", "audio", "instructions", "safety_identifier", "store",
                   "input")  # input: history.py

# The GPT-Live model names; each means this server's one model (as the
# Realtime aliases do: a client's default name works unchanged).
LIVE_MODELS = ("gpt-live-1", "gpt-live-1.1")
