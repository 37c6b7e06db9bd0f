"""What a Decisions evaluator asks of a language model, and what it gets back.

A question of GPT-Live's Decisions (a choice, a score, a predicate) is asked
as one ``ChoiceAsk``: a prompt and the options its answer must be one of. The
``Chooser`` that answers it (the engine's own LLM under vLLM structured
outputs: ``text/decisions.py``; a scripted one in tests) returns which option
it chose and how likely it found each. Neither side knows the other: the
evaluator (``realtime/wire/live/decision_eval.py``) is sans-I/O, the chooser
knows nothing of questions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from vllm_duplex.domain.payloads import ContextMessage


@dataclass(frozen=True)
class ChoiceAsk:
    """One question: ``messages`` to prompt with; the answer is exactly one of
    ``options`` (their texts, distinct)."""

    messages: tuple[ContextMessage, ...]
    options: tuple[str, ...]


@dataclass(frozen=True)
class Chosen:
    """The answer to a ``ChoiceAsk``: ``index`` into its options, the
    probability of each option (summing to 1), and the tokens it took."""

    index: int
    probabilities: tuple[float, ...]
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0


class Chooser(Protocol):
    """Answers ``ChoiceAsk``s; ``model`` names what answers them. Failures
    are ``DuplexError``s; cancelling ``choose`` frees what it started."""

    model: str

    async def choose(self, ask: ChoiceAsk) -> Chosen: ...
