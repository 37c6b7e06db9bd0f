"""GA fields this engine cannot honour, refused by name (``unsupported_option``).

A field that a client sets and the engine quietly ignores is worse than an
error: the client believes it is in force. So every Realtime GA field is either
honoured or refused here, naming it in ``param``; ``null`` (and an empty list)
still means "not given" and passes. The audit of every field, with the reason
for each refusal, is ``docs/realtime-conformance.md``.

Not refused, on purpose: fields that every common client sends by default and
that name an OpenAI-hosted resource (a voice, a transcription model). Refusing
those would fail the whole ``session.update`` of LiveKit, Pipecat and both
Agents SDKs; the doc lists them as not applicable.
"""

from __future__ import annotations

from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.aliases import _MISSING, _dig


def refused(param: str, why: str) -> DuplexError:
    return DuplexError("unsupported_option", f"{param} is not supported: {why}", param=param)


def _given(v: Any) -> bool:
    return v is not _MISSING and v is not None and v != [] and v != {}


# Session paths (GA; no beta alias exists for these) -> why they are refused.
SESSION_REFUSED: dict[tuple[str, ...], str] = {
    ("include",): "the ASR stage produces no transcription logprobs",
    ("prompt",): "stored prompts live on OpenAI's platform; send the instructions themselves",
    ("reasoning", "effort"): "the realtime pipeline does not run the model with a reasoning budget",
}

# ``response.create`` paths -> why.
RESPONSE_REFUSED: dict[tuple[str, ...], str] = {
    ("prompt",): SESSION_REFUSED[("prompt",)],
    ("reasoning", "effort"): SESSION_REFUSED[("reasoning", "effort")],
}

# ``audio.input.transcription`` keys -> why (the ASR stage is configured by
# the deployment; its prompt and language are per session).
TRANSCRIPTION_REFUSED: dict[str, str] = {
    "languages": "the ASR transcribes one language per session: name it in `language`",
    "keywords": "the ASR stage takes no keyword list (a transcription prompt is honoured)",
    "delay": "the ASR stage's latency is set by the deployment's config",
}

NOISE_REDUCTION_REFUSED: dict[str, str] = {
    "strength": "the noise suppressor runs at its one setting for each type",
}


def refuse_paths(obj: dict[str, Any], table: dict[tuple[str, ...], str], prefix: str) -> None:
    """Raise for the first path of ``table`` that ``obj`` sets."""
    for path, why in table.items():
        if _given(_dig(obj, path, prefix)):
            raise refused(".".join((prefix, *path)), why)


def refuse_keys(obj: dict[str, Any], table: dict[str, str], prefix: str) -> None:
    for key, why in table.items():
        if _given(obj.get(key, _MISSING)):
            raise refused(f"{prefix}.{key}", why)
