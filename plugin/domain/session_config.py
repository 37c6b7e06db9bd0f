"""The effective configuration of one realtime session (typed, immutable).

``SessionPatch`` is what a ``session.update`` asks for, already validated for
types and ranges by the wire codec; ``SessionConfig.apply`` merges it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from vllm_duplex.domain.contracts import Capabilities
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.backchanneling import Backchanneling
from vllm_duplex.domain.interruption import PACED, Interruption, OutputPacing
from vllm_duplex.domain.mcp import redacted
from vllm_duplex.domain.truncation import Truncation


class AudioEncoding(str, enum.Enum):
    PCM16 = "audio/pcm"
    PCMU = "audio/pcmu"  # G.711 mu-law, 8 kHz
    PCMA = "audio/pcma"  # G.711 A-law, 8 kHz


@dataclass(frozen=True)
class AudioFormat:
    encoding: AudioEncoding = AudioEncoding.PCM16
    rate: int = 24000

    def wire(self) -> dict[str, Any]:
        if self.encoding is AudioEncoding.PCM16:
            return {"type": self.encoding.value, "rate": self.rate}
        return {"type": self.encoding.value}

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.encoding is AudioEncoding.PCM16 else 1


EAGERNESS = ("low", "medium", "high", "auto")
NOISE_REDUCTION_TYPES = ("near_field", "far_field")  # audio.input.noise_reduction.type (media/noise.py)
# audio.input.echo_cancellation.type (duplex extension; session/echo.py): the server
# cancels the echo of the audio it sent
ECHO_CANCELLATION_TYPES = ("server",)

# What ``semantic_vad`` runs as under a policy that cannot decide turns from
# meaning: server VAD with a silence that follows the eagerness (how soon it
# may answer); ``session.updated`` then says ``server_vad``, honestly.
SEMANTIC_FALLBACK_SILENCE_MS = {"high": 300, "auto": 500, "medium": 500, "low": 1000}


@dataclass(frozen=True)
class TurnDetection:
    type: str = "server_vad"  # or "semantic_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    eagerness: str = "auto"  # semantic_vad only

    @property
    def semantic(self) -> bool:
        return self.type == "semantic_vad"

    def as_server_vad(self) -> TurnDetection:
        """The silence-only equivalent of a ``semantic_vad`` setting."""
        return replace(self, type="server_vad",
                       silence_duration_ms=SEMANTIC_FALLBACK_SILENCE_MS[self.eagerness])

    def wire(self) -> dict[str, Any]:
        if self.semantic:  # the GA shape of semantic_vad
            return {"type": self.type, "eagerness": self.eagerness,
                    "create_response": self.create_response,
                    "interrupt_response": self.interrupt_response}
        return {
            "type": self.type,
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
            "idle_timeout_ms": self.idle_timeout_ms,
        }


@dataclass(frozen=True)
class Transcription:
    model: str = "default"
    language: str | None = None
    prompt: str | None = None

    def wire(self) -> dict[str, Any]:
        return {"model": self.model, "language": self.language, "prompt": self.prompt}


@dataclass(frozen=True)
class Tracing:
    """``session.tracing``: ``"auto"`` (every field None) or named. With an
    OpenTelemetry exporter configured (``realtime/server/tracing.py``) the
    session's turns are exported as spans; ``workflow_name`` names the
    session's span, ``group_id`` and ``metadata`` become its attributes."""

    workflow_name: str | None = None
    group_id: str | None = None
    metadata: tuple[tuple[str, Any], ...] = ()  # hashable: the config is frozen

    def wire(self) -> Any:
        if self == Tracing():
            return "auto"
        return {"workflow_name": self.workflow_name, "group_id": self.group_id,
                "metadata": dict(self.metadata) or None}


_UNSET: Any = object()


@dataclass(frozen=True)
class SessionPatch:
    """Fields a ``session.update`` sets; ``_UNSET`` means "leave as is"."""

    type: Any = _UNSET  # SessionType (fixed when the session opens)
    model: Any = _UNSET
    policy: Any = _UNSET
    instructions: Any = _UNSET
    output_modalities: Any = _UNSET
    input_format: Any = _UNSET
    output_format: Any = _UNSET
    voice: Any = _UNSET
    speed: Any = _UNSET
    turn_detection: Any = _UNSET  # TurnDetection | None
    transcription: Any = _UNSET  # Transcription | None
    noise_reduction: Any = _UNSET  # str (NOISE_REDUCTION_TYPES) | None
    echo_cancellation: Any = _UNSET  # str (ECHO_CANCELLATION_TYPES) | None
    tools: Any = _UNSET
    tool_choice: Any = _UNSET
    temperature: Any = _UNSET
    max_output_tokens: Any = _UNSET
    interruption: Any = _UNSET  # Interruption (duplex extension)
    pacing: Any = _UNSET  # OutputPacing (duplex extension)
    backchannels: Any = _UNSET  # Backchanneling | None (duplex extension; None: off)
    truncation: Any = _UNSET  # Truncation
    tracing: Any = _UNSET  # Tracing | None (None: no trace)

    def fields_set(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not _UNSET}

    def get(self, name: str, default: Any = None) -> Any:
        value = getattr(self, name)
        return default if value is _UNSET else value

    def without(self, *names: str) -> SessionPatch:
        return replace(self, **{n: _UNSET for n in names})

    @classmethod
    def played_here(cls) -> SessionPatch:
        """The defaults of a call whose audio the server plays (``PACED``)."""
        return cls(pacing=PACED)

    def over(self, base: SessionPatch) -> SessionPatch:
        """``base`` with what this patch sets on top."""
        return replace(base, **self.fields_set())


IMMUTABLE_FIELDS = ("type", "model", "policy")


class SessionType(str, enum.Enum):
    """What a session is for. ``transcription``: audio in, transcripts out --
    it never makes a response, so it never asks the LLM for anything."""

    REALTIME = "realtime"
    TRANSCRIPTION = "transcription"


@dataclass(frozen=True)
class SessionConfig:
    model: str
    policy: str
    type: SessionType = SessionType.REALTIME
    instructions: str = ""
    output_modalities: tuple[str, ...] = ("audio",)
    input_format: AudioFormat = AudioFormat()
    output_format: AudioFormat = AudioFormat()
    voice: str = "default"
    speed: float = 1.0
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription: Transcription | None = None
    noise_reduction: str | None = None  # off, as OpenAI's default
    echo_cancellation: str | None = None  # off: the client cancels its own echo (or has none)
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    # The tools listed from the MCP servers of ``tools`` (session/mcp_calls.py
    # writes them): (server_label, the function tool the model is offered); not on the wire.
    mcp_tools: tuple[tuple[str, dict[str, Any]], ...] = ()
    temperature: float = 0.8
    max_output_tokens: int | None = None  # None means "inf"
    interruption: Interruption = Interruption()
    pacing: OutputPacing = OutputPacing()
    backchannels: Backchanneling | None = None  # off: the engine says nothing while the user talks
    truncation: Truncation = Truncation()
    tracing: Tracing | None = None  # off, as OpenAI's default

    @property
    def responds(self) -> bool:
        """Whether the session makes responses (a transcription session does not)."""
        return self.type is SessionType.REALTIME

    def apply(self, patch: SessionPatch) -> SessionConfig:
        """Merge a patch. Raises ``ValueError(field)`` naming an immutable
        field that the patch tries to change."""
        changes = patch.fields_set()
        for name in IMMUTABLE_FIELDS:
            if name in changes and changes[name] != getattr(self, name):
                raise ValueError(name)
            changes.pop(name, None)
        return replace(self, **changes)


def session_wire(
    config: SessionConfig, *, session_id: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The GA session object (what session.created/updated carry): a
    ``realtime`` session, or a ``transcription`` one (input audio only).

    ``extra`` holds duplex extensions (policy, capabilities, fence) that the
    official SDK tolerates as unknown fields.
    """
    audio_input = {
        "format": config.input_format.wire(),
        "transcription": config.transcription.wire() if config.transcription else None,
        "turn_detection": config.turn_detection.wire() if config.turn_detection else None,
        "noise_reduction": {"type": config.noise_reduction} if config.noise_reduction else None,
        # duplex extension (session/echo.py)
        "echo_cancellation": ({"type": config.echo_cancellation}
                              if config.echo_cancellation else None),
    }
    if config.type is SessionType.TRANSCRIPTION:
        out: dict[str, Any] = {"type": "transcription", "object": "realtime.transcription_session",
                               "id": session_id, "model": config.model,
                               "audio": {"input": audio_input}, "include": None}
        out.update(extra or {})
        return out
    out = {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": config.model,
        "instructions": config.instructions,
        "output_modalities": list(config.output_modalities),
        "audio": {
            "input": audio_input,
            "output": {
                "format": config.output_format.wire(),
                "voice": config.voice,
                "speed": config.speed,
                "pacing": config.pacing.wire(),  # duplex extension
                # duplex extension (session/backchannel.py)
                "backchannels": config.backchannels.wire() if config.backchannels else None,
            },
        },
        "tools": [redacted(t) for t in config.tools],
        "tool_choice": config.tool_choice,
        "max_output_tokens": "inf" if config.max_output_tokens is None else config.max_output_tokens,
        "temperature": config.temperature,
        "truncation": config.truncation.wire(),
        "tracing": config.tracing.wire() if config.tracing else None,
        "interruption": config.interruption.wire(),  # duplex extension
    }
    if extra:
        out.update(extra)
    return out


def check_modalities(modalities: Iterable[str], caps: Capabilities, *, param: str) -> None:
    unsupported = set(modalities) - caps.output_modalities
    if unsupported:
        raise DuplexError("invalid_value", f"output modalities {sorted(unsupported)} unsupported",
                          param=param)


def updated_config(config: SessionConfig, patch: SessionPatch, caps: Capabilities,
                   policy: str) -> SessionConfig:
    """What a ``session.update`` makes of ``config`` under a policy with
    ``caps``: the typed error of the first thing it may not change."""
    try:
        new = config.apply(patch)
    except ValueError as exc:
        name = str(exc)
        raise DuplexError("immutable_field", f"{name} cannot change after the session opened",
                          param=f"session.{name}") from None
    if config.tracing is not None and new.tracing != config.tracing:  # OpenAI's rule
        if new.tracing != Tracing():
            raise DuplexError("immutable_field", "tracing cannot change once enabled",
                              param="session.tracing")
        # "auto" over a named trace keeps it: the browser Agents SDK sends "auto"
        # after session.created whatever the session was created with.
        new = replace(new, tracing=config.tracing)
    td = new.turn_detection
    if td is not None and td.semantic and (td.type not in caps.turn_detection or not new.responds):
        # A valid GA setting this policy cannot honour (or, in a transcription
        # session, could only with the LLM it never asks): accepted as what
        # runs instead (never the whole update refused for it).
        new = replace(new, turn_detection=td.as_server_vad())
        td = new.turn_detection
    if td is not None and td.type not in caps.turn_detection:
        raise DuplexError("unsupported_turn_detection",
                          f"turn_detection {td.type!r} is not supported by policy {policy!r}",
                          param="session.audio.input.turn_detection.type")
    check_modalities(new.output_modalities, caps, param="session.output_modalities")
    return new
