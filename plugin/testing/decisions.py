"""A scripted ``Chooser`` (``domain/decisions.py``) for tests of Decisions'
control plane: it answers each ``ChoiceAsk`` with what ``pick`` says (an
option's text), or hangs, or fails, and keeps every ask it was given."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from vllm_duplex.domain.decisions import ChoiceAsk, Chosen
from vllm_duplex.domain.errors import DuplexError

CHOSEN_PROBABILITY = 0.75  # the rest is shared by the other options


class ScriptedChooser:
    def __init__(self, pick: Callable[[ChoiceAsk], str] | None = None, *,
                 model: str = "scripted-decider", hang: bool = False,
                 fail: DuplexError | None = None) -> None:
        self.model = model
        self.pick = pick or (lambda ask: ask.options[0])
        self.hang = hang
        self.fail = fail
        self.asks: list[ChoiceAsk] = []
        self.cancelled = 0  # choices stopped before they answered

    async def choose(self, ask: ChoiceAsk) -> Chosen:
        self.asks.append(ask)
        if self.fail is not None:
            raise self.fail
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        index = ask.options.index(self.pick(ask))
        rest = (1.0 - CHOSEN_PROBABILITY) / (len(ask.options) - 1)
        probs = tuple(CHOSEN_PROBABILITY if i == index else rest for i in range(len(ask.options)))
        return Chosen(index, probs, input_tokens=10, output_tokens=1)
