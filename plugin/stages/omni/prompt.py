"""Prompt text for native omni models, free of the engine (``omni_vllm``).

A session's live model context is a list of ``Chunk``s (text with the
model's placeholders, plus the audio and images they stand for), appended
one at a time as vLLM streaming-input chunks. ``OmniPrompt`` is the pure
state machine that renders them: the system block, user turns opened by a
unit or typed text, the assistant prefix at end of turn, and the reply the
model wrote (kept so a rebuilt context can be replayed chunk by chunk).

Both dialects are ChatML (MiniCPM-o 2.6's LLM is Qwen2.5-7B; Qwen2.5-Omni's
thinker is Qwen2.5). Placeholders, one per item (vLLM's processor expands each
into the item's embedding tokens):

``qwen_omni`` (Qwen2.5-Omni): vLLM's ``qwen2_5_omni_thinker.py`` replaces the
single ``<|AUDIO|>`` / ``<|IMAGE|>`` token (``_get_prompt_updates``); the
model's chat template wraps them as ``<|audio_bos|><|AUDIO|><|audio_eos|>``
and ``<|vision_bos|><|IMAGE|><|vision_eos|>``, which is what this dialect
sends. (vLLM's ``get_placeholder_str`` spells the vision pair
``<|vision_start|>`` / ``<|vision_end|>``, Qwen2-VL's names; only the inner
token is replaced, and which spelling the checkpoint's tokenizer knows is
to be checked on a GPU host with the weights.)

``minicpmo`` (MiniCPM-o 2.6): vLLM's ``minicpmo.py`` --
``get_placeholder_str``: ``(<image>./</image>)``, ``(<audio>./</audio>)``
(``MiniCPMOProcessingInfo.audio_pattern``). In omni mode each one-second unit
is ``<unit>`` + image + audio, joined without separators (the model's
``chat(omni_input=True)``: ``contents.extend(["<unit>", image, audio])``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from vllm_duplex.domain.omni import OmniUnit
from vllm_duplex.domain.payloads import INTERNAL_RATE


@dataclass(frozen=True)
class Dialect:
    name: str
    default_system: str
    unit_open: str  # before a unit's media
    image: str  # one image
    audio: str  # one audio segment
    # The shortest audio item the model's processor turns into tokens: less
    # gives MiniCPM-o no audio token at all (its encoder halves 100 feature
    # frames a second, then pools 5 -- 2 in 2.6 -- into one), which vLLM
    # refuses ("1 audio items, but ... 0 prompt placeholders"). A shorter
    # unit (the end of a turn) is padded with silence to this length.
    min_audio_ms: int = 100
    system_open: str = "<|im_start|>system\n"
    user_open: str = "<|im_start|>user\n"
    assistant_open: str = "<|im_start|>assistant\n"
    close: str = "<|im_end|>\n"


DIALECTS: dict[str, Dialect] = {
    "qwen_omni": Dialect(
        "qwen_omni",
        # Qwen2.5-Omni's documented system prompt (the model card asks for it verbatim).
        default_system=("You are Qwen, a virtual human developed by the Qwen Team, Alibaba "
                        "Group, capable of perceiving auditory and visual inputs, as well as "
                        "generating text and speech."),
        unit_open="",
        image="<|vision_bos|><|IMAGE|><|vision_eos|>",
        audio="<|audio_bos|><|AUDIO|><|audio_eos|>",
    ),
    "minicpmo": Dialect(
        "minicpmo",
        default_system="You are a helpful assistant. You can accept video, audio and text input "
                       "and output voice and text.",
        unit_open="<unit>",
        image="(<image>./</image>)",
        audio="(<audio>./</audio>)",
    ),
}


def dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown omni dialect {name!r}; known: {sorted(DIALECTS)}") from None


@dataclass(frozen=True, eq=False)
class Chunk:
    """One streaming-input chunk: ``text`` holds one placeholder per item of
    ``audios`` (float32, mono, 16 kHz) and ``images`` (RGB uint8), in order."""

    text: str
    audios: tuple[np.ndarray, ...] = ()
    images: tuple[np.ndarray, ...] = ()
    kind: str = "text"  # system | unit | text | generation | reply
    # Opens a message (a user turn, the assistant's reply): where truncation may cut.
    opens: bool = False

    def prompt(self) -> dict[str, Any]:
        """vLLM's prompt dict: ``{"prompt": text, "multi_modal_data": {...}}``
        with audio as ``(array, rate)`` and images as PIL images."""
        mm: dict[str, Any] = {}
        if self.audios:
            mm["audio"] = [(a, INTERNAL_RATE) for a in self.audios]
        if self.images:
            from PIL import Image

            mm["image"] = [Image.fromarray(i) for i in self.images]
        return {"prompt": self.text, "multi_modal_data": mm} if mm else {"prompt": self.text}


class OmniPrompt:
    """One session's model context as chunks (``history``), and where it
    stands: ``empty`` (nothing yet), ``user`` (a user turn is open),
    ``assistant`` (a generation was asked for), ``reply`` (a reply ended; its
    closing token is not in the context: the model's last sampled token never
    is, see ``stages.vllm.llm``)."""

    def __init__(self, d: Dialect, system: str | None = None) -> None:
        self.dialect = d
        self.system = system or d.default_system
        self.history: list[Chunk] = []
        self.state = "empty"

    def set_system(self, text: str) -> bool:
        """Use ``text`` (empty: the dialect's default) as the system prompt.
        True when the context already started with another one: it must be
        rebuilt (replayed) to take effect."""
        text = text or self.dialect.default_system
        if text == self.system:
            return False
        self.system = text
        if not self.history:
            return False
        self.history[0] = self._system_chunk()
        return True

    def _system_chunk(self) -> Chunk:
        d = self.dialect
        return Chunk(d.system_open + self.system + d.close, kind="system")

    def _begin(self) -> None:
        if not self.history:
            self.history.append(self._system_chunk())

    def _open_user(self) -> str:
        self._begin()
        d = self.dialect
        if self.state == "user":
            return ""
        prefix = d.close if self.state in ("assistant", "reply") else ""
        self.state = "user"
        return prefix + d.user_open

    def _add(self, chunk: Chunk) -> Chunk:
        self.history.append(chunk)
        return chunk

    def unit(self, unit: OmniUnit) -> Chunk:
        d = self.dialect
        opener = self._open_user()
        text = opener + d.unit_open + d.image * len(unit.frames)
        audios: tuple[np.ndarray, ...] = ()
        if unit.samples:
            text += d.audio
            audio = unit.audio_f32()
            short = d.min_audio_ms * INTERNAL_RATE // 1000 - audio.size
            audios = (np.pad(audio, (0, short)) if short > 0 else audio,)
        return self._add(Chunk(text, audios, tuple(unit.frames), kind="unit", opens=bool(opener)))

    def text(self, words: str) -> Chunk:
        opener = self._open_user()
        # Words after a unit or earlier words are separated by one space.
        sep = "" if opener or words[:1].isspace() else " "
        return self._add(Chunk(opener + sep + words, kind="text", opens=bool(opener)))

    def generation(self) -> Chunk:
        """The assistant prefix: the chunk that asks for a reply."""
        self._begin()
        d = self.dialect
        prefix = d.close if self.state != "empty" else ""
        self.state = "assistant"
        return self._add(Chunk(prefix + d.assistant_open, kind="generation", opens=True))

    def reply(self, text: str) -> Chunk | None:
        """The reply the model wrote (what its context now holds of it);
        None for an empty one (aborted before its first token)."""
        self.state = "reply"
        return self._add(Chunk(text, kind="reply")) if text else None

    def cut_reply(self, heard: str) -> bool:
        """The last reply was heard only up to ``heard`` (a prefix of what it
        holds): keep that much. True when the history changed."""
        last = next((i for i in range(len(self.history) - 1, -1, -1)
                     if self.history[i].kind == "reply"), None)
        if last is None:
            return False
        kept = self.history[last].text
        if kept == heard or not kept.startswith(heard):  # another reply's text: not this one
            return False
        if heard:
            self.history[last] = Chunk(heard, kind="reply")
        else:
            del self.history[last]
        return True

    def messages(self) -> list[tuple[int, int]]:
        """The conversation after the system block, message by message: the
        ``[start, end)`` spans of ``history``, each from a chunk that opens a
        message (a user turn, an assistant reply with its prefix)."""
        starts = [i for i, c in enumerate(self.history) if i > 0 and c.opens]
        return list(zip(starts, [*starts[1:], len(self.history)]))

    def drop(self, n: int) -> list[Chunk]:
        """Leave the oldest ``n`` messages after the system block out of the
        context (the session's truncation); returns the chunks removed. The
        first message kept follows the system block directly, so the closing
        tag its first chunk carried for the message before it goes too."""
        spans = self.messages()
        if n <= 0 or not spans:
            return []
        cut = spans[n][0] if n < len(spans) else len(self.history)
        removed = self.history[1:cut]
        del self.history[1:cut]
        close = self.dialect.close
        if len(self.history) > 1 and self.history[1].text.startswith(close):
            first = self.history[1]
            self.history[1] = dataclasses.replace(first, text=first.text[len(close):])
        return removed
