"""GPT-Live's audio frames, which carry no event id and need no codec state:
output audio on the primary (a reply's, a backchannel's or a fixture's), and
the audio a sideband gets reflected -- the caller's and the reply's, PCM16 at
24 kHz, the reply's with its range on the session timeline (the SDK requires
both on a sideband)."""

from __future__ import annotations

import base64
import json
from typing import Any

_AUDIO_DELTA = "session.output_audio.delta"


def audio_delta(audio: bytes) -> str:
    """Output audio, in the session's format (no event_id: the SDK's shape
    has none on the primary socket)."""
    return _encode({"type": _AUDIO_DELTA, "delta": _b64(audio)})


def is_audio_delta(frame: str) -> bool:
    """Whether a rendered frame is ``audio_delta``'s (not the words sent with it)."""
    return frame.startswith('{"type":"%s"' % _AUDIO_DELTA)


def output_reflection(pcm24k: bytes, start_ms: int, end_ms: int) -> str:
    """The reply's audio reflected to a sideband, with its range."""
    return _encode({"type": _AUDIO_DELTA, "delta": _b64(pcm24k),
                    "start_ms": start_ms, "end_ms": end_ms})


def input_reflection(pcm24k: bytes) -> str:
    """The caller's audio reflected to a sideband (no event_id in the SDK's shape)."""
    return _encode({"type": "session.input_audio.append", "audio": _b64(pcm24k)})


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _encode(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
