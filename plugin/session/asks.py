"""What a part of the session asks of the core: the operations only the core
may carry out, as typed values.

The parts (the pause, ``pauses.py``; the output chain, ``decisions.py``;
the client's commands, ``client_commands.py``) own their state and never
hold the core. They speak the policies' vocabulary where they ask for the
same thing (``domain/contracts.py``: ``Interrupt``, ``CommitTurn``,
``Respond``...), and add the asks only the session has. What they cannot do themselves -- ask the policy (only the
core is its ``SessionView``), move the fence, make a user item or a
response, touch the floor (the phase's and the reply's only writer is the
``Floor``, which only the core calls) -- they return, in order, as *asks*;
anything else they return is an effect for the runner (``effects.py``).
``SessionCore.carry`` carries both out in the order given, an ask's own
follow-ups first, so a part reads as the sequence it was before.

Two asks answer back (``then``): the pause must know what the policy made of
``UserPaused`` (did it push held words, ask its ASR to hear the pause out?)
and whether the speculation was discarded before it tells the policy the
user resumed. The answer goes to the part's own continuation, never to the
core: the core stays the only caller, as a sans-I/O protocol's driver feeds
a reply back to the state machine that asked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from vllm_duplex.domain.contracts import (
    CommitTurn,
    Dismiss,
    FinishReply,
    ForwardTo,
    Interrupt,
    PauseReply,
    PolicyStep,
    Respond,
    Show,
)
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import StageOutput

if TYPE_CHECKING:  # (mcp_calls.py imports this module)
    from vllm_duplex.domain.events import ServerEvent
    from vllm_duplex.session.effects import Effect
    from vllm_duplex.session.mcp_calls import McpStep

# What a part returns: its steps, in the order they are to happen -- asks (the
# ones below, and the MCP calls' own, ``mcp_calls.McpStep``), events for the
# client, and effects for the runner (``effects.Effect``).
Step: TypeAlias = "Ask | McpStep | ServerEvent | Effect"
Steps: TypeAlias = "list[Step]"


@dataclass(frozen=True, slots=True)
class Plan:
    """Hand the policy an input (``plan_append``) and carry out its plan
    (``ingest``: it answers client input, whose latency is measured)."""

    payload: object
    ingest: bool = False


@dataclass(frozen=True, slots=True)
class Decide:
    """Ask the policy about a stage output and carry out its steps."""

    out: StageOutput


@dataclass(frozen=True, slots=True)
class Observe:
    """Tell the policy about the pause (``UserPaused``, ``UserResumed``) as
    the VAD's output under the fence of the moment, and carry out its steps;
    ``then`` gets them."""

    observation: object
    then: Callable[[Sequence[PolicyStep]], Steps] | None = None


@dataclass(frozen=True, slots=True)
class Hold:
    """An output of the held reply: the policy decides it now (its
    ``ForwardTo`` is carried out at once: its text goes on to the TTS), the
    reply keeps it with the rest of its steps until it is claimed."""

    out: StageOutput


@dataclass(frozen=True, slots=True)
class Speculate:
    """Start a reply to ``words`` ahead of the commit, held."""

    words: str


@dataclass(frozen=True, slots=True)
class Discard:
    """The held reply ends unseen; ``then`` learns whether there was one."""

    then: Callable[[bool], Steps] | None = None


@dataclass(frozen=True, slots=True)
class Rest:
    """With no reply, the phase follows the pause (``Floor.rest``)."""


@dataclass(frozen=True, slots=True)
class ItemGone:
    """The client deleted (``truncated`` False) or truncated an item; the
    reply shown may be writing it."""

    item_id: str
    truncated: bool


@dataclass(frozen=True, slots=True)
class Fail:
    """A stage failed: the client hears of it, and the reply shown fails."""

    error: DuplexError


# Every ask: the ones above and the policy's steps, which the parts use too
# (``Interrupt``, ``CommitTurn``, ``Respond``: one vocabulary, domain/contracts.py);
# ``carrying.py`` carries each out by its type.
Ask: TypeAlias = (Plan | Decide | Observe | Hold | Speculate | Discard | Rest | ItemGone | Fail
                  | PolicyStep)

__all__ = ["Ask", "CommitTurn", "Decide", "Discard", "Dismiss", "Fail", "FinishReply", "ForwardTo",
           "Hold", "Interrupt", "ItemGone", "Observe", "PauseReply", "Plan", "Respond", "Rest",
           "Show", "Speculate", "Step", "Steps"]
