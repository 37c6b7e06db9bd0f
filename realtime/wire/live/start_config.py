"""A GPT-Live session config (``session.start``'s ``session``, a WebRTC
session's, a SIP accept's) read as the Realtime session document it means.

Sans-I/O and stateless: ``read_start`` validates the SDK's ``SessionConfig``
fields this engine honours and says what they ask for; the codec keeps what
lasts (the delegation, the instructions, the muted microphone's silence) and
hands the document to the Realtime codec's field parsers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.live.client_events import REFUSED_FIELDS
from vllm_duplex.realtime.wire.live.delegation import check_delegation

# What every GPT-Live session is on this engine: the engine decides when to
# speak, yields to a real barge-in and hears the user's words.
TURN = {"type": "semantic_vad", "create_response": True, "interrupt_response": True}

# Silence in each input encoding: what a muted microphone sends on.
SILENCE = {"audio/pcm": b"\x00", "audio/pcmu": b"\xff", "audio/pcma": b"\xd5"}


@dataclass(frozen=True)
class StartConfig:
    model: str  # as the client named it (the resource repeats it)
    doc: dict[str, Any]  # the Realtime session document, but the delegation's fields
    instructions: str | None  # the Live instructions; None: blank or omitted
    delegation: dict[str, Any] | None  # as accepted (delegation.py)
    silence: bytes | None  # the input format's silence, when the config names a format
    store: bool
    started_with: dict[str, Any]  # what a stored session keeps of its start: all but history


def refuse_fields(session: dict[str, Any], names: tuple[str, ...]) -> None:
    """``unsupported_option`` for the first of ``names`` the config sets."""
    for name in names:
        if session.get(name) not in (None, [], {}):
            raise DuplexError("unsupported_option", REFUSED_FIELDS[name],
                              param=f"session.{name}")


def read_start(raw: Any) -> StartConfig:
    if not isinstance(raw, dict):
        raise DuplexError("invalid_value", "session must be an object", param="session")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise DuplexError("invalid_value", "session.model is required", param="session.model")
    refuse_fields(raw, ("client",))
    if raw.get("store") not in (None, True, False):
        raise DuplexError("invalid_value", "session.store must be a boolean",
                          param="session.store")
    delegation = check_delegation(raw.get("delegation"))
    doc: dict[str, Any] = {"type": "realtime", "model": model}
    instructions = raw.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise DuplexError("invalid_value", "session.instructions must be a string",
                          param="session.instructions")
    if instructions is not None and not instructions.strip():
        instructions = None  # blank means the server's default, as GPT-Live says
    if instructions is not None:
        doc["instructions"] = instructions
    audio_in: dict[str, Any] = {"turn_detection": dict(TURN), "transcription": {}}
    audio_out: dict[str, Any] = {}
    audio = raw.get("audio") or {}
    if not isinstance(audio, dict):
        raise DuplexError("invalid_value", "session.audio must be an object",
                          param="session.audio")
    silence = None
    fmt = audio.get("format")
    if fmt is not None:
        check_format(fmt)
        audio_in["format"] = audio_out["format"] = {"type": fmt["type"], "rate": fmt["rate"]}
        silence = SILENCE[fmt["type"]]
    output = audio.get("output") or {}
    if not isinstance(output, dict):
        raise DuplexError("invalid_value", "session.audio.output must be an object",
                          param="session.audio.output")
    if "backchannels" in output:  # duplex extension (realtime/wire/fields.py)
        audio_out["backchannels"] = output["backchannels"]
    voice = output.get("voice")
    if isinstance(voice, dict):
        raise DuplexError("unsupported_option", "custom voices are not supported; "
                          "name a built-in voice", param="session.audio.output.voice")
    if voice is not None:
        audio_out["voice"] = voice
    doc["audio"] = {"input": audio_in, "output": audio_out}
    return StartConfig(
        model=model, doc=doc, instructions=instructions, delegation=delegation,
        silence=silence, store=bool(raw.get("store")),
        started_with=json.loads(json.dumps({k: v for k, v in raw.items() if k != "input"})))


def check_format(fmt: Any) -> None:
    p = "session.audio.format"
    if not isinstance(fmt, dict) or fmt.get("type") not in SILENCE:
        raise DuplexError("unsupported_audio_format",
                          "format.type must be audio/pcm, audio/pcmu or audio/pcma",
                          param=f"{p}.type")
    rates = (16000, 24000) if fmt["type"] == "audio/pcm" else (8000,)
    if fmt.get("rate") not in rates:
        raise DuplexError("unsupported_audio_format",
                          f"{fmt['type']} takes a rate of {' or '.join(map(str, rates))}",
                          param=f"{p}.rate")
