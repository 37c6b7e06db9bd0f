"""What the session asks of its ASR stage: the ``audio.input.transcription``
settings it honours per session -- the prompt (Whisper's previous text) and
the language spoken -- and whether the deployment's ASR can honour them.

The language is checked against what the ASR transcribes (``Hears``:
Whisper's ~100 languages with a multilingual model such as ``whisper-base``,
English only with ``whisper-tiny.en`` or PocketSphinx), so a session never
believes a language is in force that its ASR cannot hear: ``unsupported_option``
names the field and what the deployment hears instead.

Pure: functions of the session config.
"""

from __future__ import annotations

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import AsrConfig
from vllm_duplex.domain.session_config import SessionConfig

LANGUAGE_PARAM = "session.audio.input.transcription.language"


def asr_config(config: SessionConfig) -> AsrConfig:
    """The ASR settings of ``config`` (an empty prompt is none)."""
    t = config.transcription
    if t is None:
        return AsrConfig()
    return AsrConfig(prompt=t.prompt or None, language=t.language or None)


def check_language(config: SessionConfig, *, configurable: bool,
                   languages: frozenset[str] | None) -> None:
    """Refuse a ``transcription.language`` the pipeline cannot honour
    (``languages``: what its ASR hears; None: any)."""
    language = asr_config(config).language
    if language is None:
        return
    if not configurable:
        raise DuplexError("unsupported_option", f"{LANGUAGE_PARAM} is not supported: this "
                          "pipeline has no ASR stage to tell (its model hears the audio itself)",
                          param=LANGUAGE_PARAM)
    if languages is not None and language not in languages:
        heard = ", ".join(sorted(languages)) if len(languages) <= 5 else f"{len(languages)} languages"
        raise DuplexError("unsupported_option", f"{LANGUAGE_PARAM} {language!r} is not supported: "
                          f"this deployment's ASR transcribes {heard} (a multilingual model, "
                          "e.g. whisper-base, hears others)", param=LANGUAGE_PARAM)
