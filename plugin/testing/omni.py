"""A scripted omni stage (type ``scripted_omni``) that honours the omni
contract (``vllm_duplex.domain.omni``) on CPU, for tests.

``ScriptedOmniStage`` replies deterministically with what it received since
the last reply, word by word, e.g. "I heard 2.0 s of audio in 2 units and saw
2 frames, the last 64x48." -- so tests can check the contract end to end
without a model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.omni import OmniInstructions, OmniUnit
from vllm_duplex.domain.payloads import (
    INTERNAL_RATE,
    GenerateRequest,
    GenerationDone,
    StageInput,
    TextDelta,
    TextIn,
)
from vllm_duplex.stages.port import FencedPort, StageBase, StagePort
from vllm_duplex.testing.stages import split_tokens

log = logging.getLogger(__name__)


# ---- the scripted stage -------------------------------------------------------


@dataclass
class Heard:
    """What an omni port received since its last reply."""

    units: int = 0
    samples: int = 0
    frames: int = 0
    last_frame: tuple[int, int] | None = None  # (width, height)
    words: int = 0
    instructions: str = ""

    def add_unit(self, unit: OmniUnit) -> None:
        self.units += 1
        self.samples += unit.samples
        for f in unit.frames:
            self.frames += 1
            self.last_frame = (int(f.shape[1]), int(f.shape[0]))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def describe(heard: Heard) -> str:
    """The scripted reply: e.g. "I heard 2.0 s of audio in 2 units and saw
    2 frames, the last 64x48." (plus "You typed 3 words." for text)."""
    seconds = heard.samples / INTERNAL_RATE
    text = f"I heard {seconds:.1f} s of audio in {_plural(heard.units, 'unit')}"
    if heard.frames:
        w, h = heard.last_frame or (0, 0)
        text += f" and saw {_plural(heard.frames, 'frame')}, the last {w}x{h}."
    else:
        text += " and saw no frames."
    if heard.words:
        text += f" You typed {_plural(heard.words, 'word')}."
    return text


class ScriptedOmniStage(StageBase):
    """``OmniUnit`` / ``OmniInstructions`` / ``TextIn`` / ``GenerateRequest``
    in; a deterministic description of the turn's input out, as
    ``TextDelta`` words and one ``GenerationDone`` (``token_interval_s``
    apart, on the injected clock)."""

    accepted = (OmniUnit, OmniInstructions, TextIn, GenerateRequest)

    def __init__(self, name: str = "omni", *, clock: Clock, token_interval_s: float = 0.02) -> None:
        super().__init__(name, clock)
        if token_interval_s < 0:
            raise ValueError("token_interval_s must be >= 0")
        self.token_interval_s = token_interval_s

    def port(self, session_id: str) -> StagePort:
        return _OmniPort(self, session_id)


class _OmniPort(FencedPort):
    _stage: ScriptedOmniStage

    def __init__(self, stage: ScriptedOmniStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self.heard = Heard()
        self.replies: list[str] = []  # every reply started (for tests)

    async def _handle(self, item: StageInput) -> None:
        p: Any = item.payload
        if isinstance(p, OmniUnit):
            self.heard.add_unit(p)
        elif isinstance(p, TextIn):
            self.heard.words += len(p.text.split())
        elif isinstance(p, OmniInstructions):
            self.heard.instructions = p.text
        else:  # GenerateRequest: answer what was heard; input after it is the next turn's
            heard, self.heard = self.heard, Heard(instructions=self.heard.instructions)
            reply = describe(heard)
            self.replies.append(reply)
            self._spawn(item, lambda: self._reply(item, p, reply, heard))

    async def _reply(self, item: StageInput, req: GenerateRequest, reply: str, heard: Heard) -> None:
        tokens = split_tokens(reply)
        finish = "stop"
        limit = req.sampling.max_tokens if req.sampling is not None else None
        if limit is not None and limit < len(tokens):
            tokens, finish = tokens[: max(0, limit)], "length"
        for i, token in enumerate(tokens):
            if i:
                await self._clock.sleep(self._stage.token_interval_s)
            await self._emit(item.fence, item.request_id, TextDelta(req.response_id, token))
        done = GenerationDone(req.response_id, finish, input_tokens=heard.units + heard.frames + heard.words,
                              output_tokens=len(tokens))
        await self._emit(item.fence, item.request_id, done)
