"""Field validation for client events: the ``session.update`` ->
``SessionPatch`` parser and the value parsers it shares with ``response.create``
(conversation items: ``items.py``).

Every bad field raises ``DuplexError`` (``invalid_value`` unless noted) with
``param`` set to the field path; ``_MISSING`` means "not given".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_duplex.domain import backchanneling as bc
from vllm_duplex.domain.interruption import (
    INTERRUPTION_MODES,
    MAX_BACKCHANNEL_CHARS,
    MAX_BACKCHANNELS,
    MAX_LEAD_MS,
    MAX_MIN_SPEECH_MS,
    PACING_TYPES,
    Interruption,
    OutputPacing,
)
from vllm_duplex.domain.session_config import (
    EAGERNESS,
    ECHO_CANCELLATION_TYPES,
    NOISE_REDUCTION_TYPES,
    AudioEncoding,
    AudioFormat,
    SessionPatch,
    SessionType,
    Tracing,
    Transcription,
    TurnDetection,
)
from vllm_duplex.domain.tools import parse_tools
from vllm_duplex.domain.truncation import Truncation
from vllm_duplex.realtime.wire.aliases import (
    _MISSING,
    BETA_AUDIO_FORMATS,
    SESSION_BETA_TO_GA,
    _dig,
)
from vllm_duplex.realtime.wire.refusals import (
    NOISE_REDUCTION_REFUSED,
    SESSION_REFUSED,
    TRANSCRIPTION_REFUSED,
    refuse_keys,
    refuse_paths,
    refused,
)
from vllm_duplex.realtime.wire.values import (
    _bad,
    _bool,
    _is_int,
    _obj,
    _opt_str,
    _ranged,
    _req_str,
    _str,
)

# ---- field validation --------------------------------------------------------

_MIN_PCM_RATE, _MAX_PCM_RATE = 8000, 48000


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


def _language(v: Any, p: str) -> str | None:
    """An ISO-639-1 code ("en"; Whisper's few three-letter ones, "haw",
    too); whether the deployment's ASR hears it is the session's check."""
    language = _opt_str(v, p)
    if language is not None and not (language.isascii() and language.isalpha()
                                     and language.islower() and 2 <= len(language) <= 3):
        raise _bad(p, f"{p} must be an ISO-639-1 language code such as \"en\", not {language!r}")
    return language


def _transcription(v: Any, p: str) -> Transcription | None:
    if v is None:
        return None
    t = _obj(v, p)
    kw: dict[str, Any] = {
        "language": _language(t.get("language"), f"{p}.language"),
        "prompt": _opt_str(t.get("prompt"), f"{p}.prompt"),
    }
    refuse_keys(t, TRANSCRIPTION_REFUSED, p)  # after the types: a non-string is still invalid
    model = _str(t.get("model"), f"{p}.model")
    if model is not _MISSING:
        kw["model"] = model
    return Transcription(**kw)


def _ms(hi: int) -> Callable[[Any, str], Any]:
    """A duration in ms, at most ``hi`` (anything longer is a mistake, not a wish)."""
    def parse(v: Any, p: str) -> Any:
        if v is None:
            return _MISSING
        if not _is_int(v) or not 0 <= v <= hi:
            raise _bad(p, f"{p} must be an integer number of milliseconds in [0, {hi}]")
        return v

    return parse


_TD_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "threshold": _ranged(0.0, 1.0),
    "prefix_padding_ms": _ms(5_000),
    "silence_duration_ms": _ms(10_000),
    "create_response": _bool,
    "interrupt_response": _bool,
}
_IDLE_TIMEOUT_MAX_MS = 3_600_000


# ``semantic_vad`` (OpenAI GA; the default of LiveKit Agents and the OpenAI
# Agents SDK): the end of a turn is decided from what was said as well as the
# silence (``session/turn_end.py``); ``eagerness`` says how soon it may answer.
# A policy that cannot decide from meaning runs it as server VAD and says so in
# ``session.updated`` (``session_config.updated_config``).
def _semantic_vad(td: dict[str, Any], p: str) -> TurnDetection:
    eagerness = td.get("eagerness")
    if eagerness is None:
        eagerness = "auto"
    if not isinstance(eagerness, str) or eagerness not in EAGERNESS:
        raise _bad(f"{p}.eagerness", f'{p}.eagerness must be "low", "medium", "high" or "auto"')
    kw: dict[str, Any] = {"type": "semantic_vad", "eagerness": eagerness}
    for key in ("create_response", "interrupt_response"):
        val = _bool(td.get(key), f"{p}.{key}")
        if val is not _MISSING:
            kw[key] = val
    return TurnDetection(**kw)


def _turn_detection(v: Any, p: str) -> TurnDetection | None:
    if v is None:
        return None  # manual commits
    td = _obj(v, p)
    kind = td.get("type", "server_vad")
    if not isinstance(kind, str):
        raise _bad(f"{p}.type", f"{p}.type must be a string")
    if kind == "semantic_vad":
        return _semantic_vad(td, p)
    if kind != "server_vad":
        raise _bad(f"{p}.type", f"turn detection {kind!r} is not supported", "unsupported_turn_detection")
    kw: dict[str, Any] = {}
    for key, parse in _TD_FIELDS.items():
        val = parse(td.get(key), f"{p}.{key}")
        if val is not _MISSING:
            kw[key] = val
    if "idle_timeout_ms" in td:  # null is meaningful: no idle timeout
        val = _ms(_IDLE_TIMEOUT_MAX_MS)(td["idle_timeout_ms"], f"{p}.idle_timeout_ms")
        kw["idle_timeout_ms"] = None if val is _MISSING else val
    return TurnDetection(**kw)


def _bounded_int(v: Any, p: str, hi: int, lo: int = 0) -> Any:
    if v is None:
        return _MISSING
    if not _is_int(v) or not lo <= v <= hi:
        raise _bad(p, f"{p} must be an integer in [{lo}, {hi}]")
    return v


def _interruption(v: Any, p: str) -> Any:
    """Duplex extension ``session.interruption``: fields not given take their
    defaults (domain/interruption.py), as ``turn_detection``'s do."""
    if v is None:
        return _MISSING
    obj = _obj(v, p)
    kw: dict[str, Any] = {}
    mode = obj.get("mode")
    if mode is not None:
        if not isinstance(mode, str) or mode not in INTERRUPTION_MODES:
            raise _bad(f"{p}.mode", f'{p}.mode must be "adaptive" or "immediate"')
        kw["mode"] = mode
    ms = _bounded_int(obj.get("min_speech_ms"), f"{p}.min_speech_ms", MAX_MIN_SPEECH_MS)
    if ms is not _MISSING:
        kw["min_speech_ms"] = ms
    words = obj.get("backchannels")
    if words is not None:
        bp = f"{p}.backchannels"
        if not isinstance(words, list) or len(words) > MAX_BACKCHANNELS:
            raise _bad(bp, f"{bp} must be a list of at most {MAX_BACKCHANNELS} strings")
        for i, w in enumerate(words):
            if (not isinstance(w, str) or not w.strip() or len(w) > MAX_BACKCHANNEL_CHARS
                    or not any(c.isalnum() for c in w)):
                raise _bad(f"{bp}[{i}]", f"{bp}[{i}] must be a word or short phrase "
                           f"(1-{MAX_BACKCHANNEL_CHARS} characters, with a letter)")
            _str(w, f"{bp}[{i}]")
        kw["backchannels"] = tuple(w.strip().lower() for w in words)
    return Interruption(**kw)


def _pacing(v: Any, p: str) -> Any:
    """Duplex extension ``session.audio.output.pacing``: ``{type: realtime,
    lead_ms}`` or ``{type: none}`` (as fast as made, OpenAI's way)."""
    if v is None:
        return _MISSING
    obj = _obj(v, p)
    kind = obj.get("type", "realtime")
    if not isinstance(kind, str) or kind not in PACING_TYPES:
        raise _bad(f"{p}.type", f'{p}.type must be "realtime" or "none"')
    # at least one 20 ms frame ahead, or the client would underrun every frame
    lead = _bounded_int(obj.get("lead_ms"), f"{p}.lead_ms", MAX_LEAD_MS, lo=20)
    return OutputPacing(kind, lead) if lead is not _MISSING else OutputPacing(kind)


def _truncation(v: Any, p: str) -> Any:
    """``session.truncation``: ``"auto"``, ``"disabled"`` or ``{type:
    "retention_ratio", retention_ratio, token_limits: {post_instructions}}``
    (domain/truncation.py)."""
    if v is None:
        return _MISSING
    if v in ("auto", "disabled"):
        return Truncation(v)
    if isinstance(v, str):
        raise _bad(p, f'{p} must be "auto", "disabled" or a retention_ratio object')
    obj = _obj(v, p)
    if obj.get("type") != "retention_ratio":
        raise _bad(f"{p}.type", f'{p}.type must be "retention_ratio"')
    ratio = obj.get("retention_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
        raise _bad(f"{p}.retention_ratio", f"{p}.retention_ratio must be a number within [0, 1]")
    limits = obj.get("token_limits")
    post = None
    if limits is not None:
        post = _obj(limits, f"{p}.token_limits").get("post_instructions")
        if post is not None and (not _is_int(post) or post < 1):
            raise _bad(f"{p}.token_limits.post_instructions",
                       f"{p}.token_limits.post_instructions must be an integer >= 1")
    return Truncation("retention_ratio", float(ratio), post)


def _voice(v: Any, p: str) -> Any:
    if isinstance(v, dict):  # GA custom voice {"id": ...}
        return _req_str(v, "id", f"{p}.id")
    return _str(v, p)


def _tools(v: Any, p: str) -> Any:
    """A session's or a response's tools: function tools and MCP servers (domain/mcp.py)."""
    return _MISSING if v is None else parse_tools(v, p, mcp=True)


def _tool_choice(v: Any, p: str) -> Any:
    if v is None:
        return _MISSING
    if v in ("auto", "none", "required") and isinstance(v, str):
        return v
    if isinstance(v, dict) and v.get("type") == "function":
        return {"type": "function", "name": _req_str(v, "name", f"{p}.name")}
    if isinstance(v, dict) and v.get("type") == "mcp":  # a tool of an MCP server (session/replies.py)
        choice = {"type": "mcp", "server_label": _req_str(v, "server_label", f"{p}.server_label")}
        name = _opt_str(v.get("name"), f"{p}.name")
        return choice if name is None else {**choice, "name": name}
    raise _bad(p, f'{p} must be "auto", "none", "required", {{"type":"function","name":...}} '
               'or {"type":"mcp","server_label":...}')


_SPEEDS = _ranged(0.25, 1.5)


def _speed(v: Any, p: str) -> Any:
    """``audio.output.speed``: the TTS stages speak at their one rate, so
    only 1.0 (the default) is honoured; another valid speed is refused."""
    speed = _SPEEDS(v, p)
    if speed is not _MISSING and speed != 1.0:
        raise refused(p, "the TTS stage speaks at its configured rate (1.0)")
    return speed


def _tracing(v: Any, p: str) -> Tracing | None:
    """``tracing``: null (no trace: meaningful, as for ``turn_detection``),
    ``"auto"``, or ``{workflow_name, group_id, metadata}``."""
    if v is None:
        return None
    if v == "auto" and isinstance(v, str):
        return Tracing()
    obj = _obj(v, p)
    kw: dict[str, Any] = {}
    for key in ("workflow_name", "group_id"):
        val = _str(obj.get(key), f"{p}.{key}")
        if val is not _MISSING:
            kw[key] = val
    if obj.get("metadata") is not None:
        kw["metadata"] = tuple(sorted(_obj(obj["metadata"], f"{p}.metadata").items()))
    return Tracing(**kw)


def _noise_reduction(v: Any, p: str) -> str | None:
    if v is None:
        return None  # off
    obj = _obj(v, p)
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in NOISE_REDUCTION_TYPES:
        raise _bad(f"{p}.type", f'{p}.type must be "near_field" or "far_field"')
    refuse_keys(obj, NOISE_REDUCTION_REFUSED, p)
    return kind


def _echo_cancellation(v: Any, p: str) -> str | None:
    """Duplex extension ``session.audio.input.echo_cancellation``: ``null``
    (off, the default) or ``{"type": "server"}`` (the server cancels the echo
    of what it sent: a client that plays the reply on a speaker and streams
    its microphone, with no echo cancellation of its own)."""
    if v is None:
        return None  # off
    obj = _obj(v, p)
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in ECHO_CANCELLATION_TYPES:
        raise _bad(f"{p}.type", f'{p}.type must be "server"')
    for key in obj:
        if key != "type":
            raise _bad(f"{p}.{key}", f"{p} takes only type")
    return kind


def _backchannels(v: Any, p: str) -> Any:
    """Duplex extension ``session.audio.output.backchannels``: ``null`` (off,
    the default) or ``{phrases, after_speech_ms, min_words, pause_ms,
    min_interval_ms}`` (fields not given take their defaults,
    domain/backchanneling.py): the engine says one of ``phrases`` at a pause
    of a long turn the user has not finished (session/backchannel.py)."""
    if v is None:
        return None  # off
    obj = _obj(v, p)
    kw: dict[str, Any] = {}
    for key in obj:
        if key not in ("phrases", "after_speech_ms", "min_words", "pause_ms", "min_interval_ms"):
            raise _bad(f"{p}.{key}", f"{p} has no field {key!r}")
    phrases = obj.get("phrases")
    if phrases is not None:
        pp = f"{p}.phrases"
        if not isinstance(phrases, list) or not 1 <= len(phrases) <= bc.MAX_PHRASES:
            raise _bad(pp, f"{pp} must be a list of 1 to {bc.MAX_PHRASES} strings")
        for i, w in enumerate(phrases):
            if (not isinstance(w, str) or len(w.strip()) > bc.MAX_PHRASE_CHARS
                    or not any(c.isalpha() for c in w)):
                raise _bad(f"{pp}[{i}]", f"{pp}[{i}] must be a short phrase "
                           f"(at most {bc.MAX_PHRASE_CHARS} characters, with a letter)")
            _str(w, f"{pp}[{i}]")
        kw["phrases"] = tuple(w.strip() for w in phrases)
    for key, hi, lo in (("after_speech_ms", bc.MAX_AFTER_SPEECH_MS, 0), ("min_words", 1_000, 0),
                        ("pause_ms", bc.MAX_PAUSE_MS, bc.MIN_PAUSE_MS),
                        ("min_interval_ms", bc.MAX_INTERVAL_MS, 0)):
        val = _bounded_int(obj.get(key), f"{p}.{key}", hi, lo=lo)
        if val is not _MISSING:
            kw[key] = val
    return bc.Backchanneling(**kw)


# GA session path -> (SessionPatch field or None, value parser).
_SESSION_FIELDS: dict[tuple[str, ...], tuple[str | None, Callable[[Any, str], Any]]] = {
    ("model",): ("model", _str),
    ("policy",): ("policy", _str),  # duplex extension
    ("instructions",): ("instructions", _str),
    ("output_modalities",): ("output_modalities", _modalities),
    ("audio", "input", "format"): ("input_format", _audio_format),
    ("audio", "input", "transcription"): ("transcription", _transcription),
    ("audio", "input", "turn_detection"): ("turn_detection", _turn_detection),
    ("audio", "input", "noise_reduction"): ("noise_reduction", _noise_reduction),
    ("audio", "input", "echo_cancellation"): ("echo_cancellation", _echo_cancellation),  # duplex extension
    ("audio", "output", "format"): ("output_format", _audio_format),
    ("audio", "output", "voice"): ("voice", _voice),
    ("audio", "output", "speed"): ("speed", _speed),
    ("audio", "output", "pacing"): ("pacing", _pacing),  # duplex extension
    ("audio", "output", "backchannels"): ("backchannels", _backchannels),  # duplex extension
    ("interruption",): ("interruption", _interruption),  # duplex extension
    ("tools",): ("tools", _tools),
    ("tool_choice",): ("tool_choice", _tool_choice),
    ("max_output_tokens",): ("max_output_tokens", _max_tokens),
    ("temperature",): ("temperature", _ranged(0.0, 2.0)),
    ("truncation",): ("truncation", _truncation),
    ("parallel_tool_calls",): (None, _bool),  # validated; one call per response honours both values
    ("tracing",): ("tracing", _tracing),
}


def _session_patch(raw: Any) -> SessionPatch:
    s = _obj(raw, "session")
    kind = s.get("type")
    if kind is not None and kind not in ("realtime", "transcription"):
        raise _bad("session.type", 'session.type must be "realtime" or "transcription"')
    refuse_paths(s, SESSION_REFUSED, "session")
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
    if kind is not None:
        patch["type"] = SessionType(kind)
    return SessionPatch(**patch)
