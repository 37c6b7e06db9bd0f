"""GA <-> beta aliases for the Realtime wire: the one place for GA <-> beta.

The alias tables serve both directions: parsing (``fields.py``,
``codec.py``) accepts beta keys and formats as aliases of the GA ones; the
beta *dialect* renders through the event renames and document converters here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.session_config import AudioEncoding, AudioFormat

# ---- paths --------------------------------------------------------------------

_MISSING: Any = object()


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
                raise DuplexError("invalid_value", "must be an object", param=".".join((prefix, *path[: depth + 1])))
    return cur


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
