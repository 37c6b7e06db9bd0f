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

import math
from collections.abc import Hashable, Mapping, Sequence
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


def spread(firsts: Sequence[Hashable | None], chosen: int,
           logprobs: Mapping[Hashable, float]) -> tuple[float, ...]:
    """Each option's probability from its first token's: ``firsts[i]`` is
    option i's first token (None: none seen), ``logprobs`` the answer's first
    position's. A token outside ``logprobs`` gives nothing (less likely than
    all of them); options that share a token split it, all of it to
    ``chosen`` when it is among them; normalised to 1. Both choosers read
    their answers so (``plugin/text/decisions.py`` with token ids,
    ``realtime/wire/live/remote_choice.py`` with token texts)."""
    mass = [0.0] * len(firsts)
    for tok in {t for t in firsts if t is not None}:
        p = math.exp(logprobs[tok]) if tok in logprobs else 0.0
        sharing = [i for i, t in enumerate(firsts) if t == tok]
        if chosen in sharing:
            mass[chosen] += p
        else:
            for i in sharing:
                mass[i] += p / len(sharing)
    total = sum(mass)
    if total <= 0.0:  # the chosen token is always among the logprobs; guard anyway
        return tuple(1.0 if i == chosen else 0.0 for i in range(len(firsts)))
    return tuple(m / total for m in mass)
