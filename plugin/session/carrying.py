"""How the session core carries out what its parts return (``asks.py``):
``carry`` takes the steps in order -- an ask by the table below, with its
follow-ups first; an event to the client; any other effect to the runner --
and the asks that need more than one call of the core are its methods here.

A part of the core's class (``SessionCore`` inherits it, as it inherits its
``SessionView``), kept apart so ``core.py`` holds the messages, the session's
state and the reply's start; the names it uses are the core's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from vllm_duplex.core import events as ev
from vllm_duplex.core.contracts import OutputDecision
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.payloads import StageOutput
from vllm_duplex.session import asks, mcp_calls
from vllm_duplex.session.asks import Step, Steps
from vllm_duplex.session.effects import Forward


class CarriesAsks:
    # The core's, used here (core.py).
    policy: Any
    floor: Any
    out: Any
    mcp: Any
    _config: Any
    fence: Any
    emit: Callable[[ev.ServerEvent], None]
    error: Callable[[DuplexError], None]
    apply: Callable[..., None]
    create_response: Callable[..., None]

    def carry(self, steps: Iterable[Step]) -> None:
        """Carry out what a part returned, in order: an ask (``asks.py``) by
        the core, with its follow-ups before the next step; an event to the
        client; any other effect to the runner."""
        for step in steps:
            ask = _ASKS.get(type(step))
            if ask is not None:
                more = ask(self, step)
                if more:
                    self.carry(more)
            elif isinstance(step, ev.ServerEvent):
                self.emit(step)
            else:
                self.out.add(step)

    def apply_decision(self, out: StageOutput) -> OutputDecision:
        """Ask the policy about ``out`` and carry out its answer."""
        decision = self.policy.decide_output(self, out)
        self.apply(out, decision)
        return decision

    def _decide(self, a: asks.Decide) -> None:
        self.apply_decision(a.out)

    def _observe(self, a: asks.Observe) -> Steps | None:
        fence = self.fence
        decision = self.apply_decision(
            StageOutput(fence, fence.request_id("vad"), "vad", a.observation))
        return a.then(decision) if a.then is not None else None

    def _hold(self, a: asks.Hold) -> None:
        decision = self.policy.decide_output(self, a.out)
        if self.floor.keep(a.out, decision) and decision.forward is not None:
            # e.g. its text is synthesized now, into the held buffer
            self.out.add(Forward(a.out, decision.forward))

    def _discard(self, a: asks.Discard) -> Steps | None:
        discarded, steps = self.floor.discard()
        self.carry(steps)
        return a.then(discarded) if a.then is not None else None

    def _offer_mcp_tools(self, tools: tuple[tuple[str, dict[str, Any]], ...]) -> None:
        """The tools the session's MCP servers listed, offered to the model from now on."""
        self._config = self.floor.config = dataclasses.replace(self._config, mcp_tools=tools)

    def _mcp_respond(self, a: mcp_calls.Respond) -> None:
        """A response.create held while its own MCP servers were listed."""
        try:
            self.create_response(a.options)
        except DuplexError as err:
            self.error(err.with_event_id(a.event_id))
            return
        self.mcp.responding(self.floor.shown, a.offered)

    def _mcp_follow_up(self, a: mcp_calls.FollowUp) -> None:
        """The response that answers with the MCP calls' results."""
        self.create_response(a.options)
        self.mcp.followed(self.floor.shown)


# How the core carries out each ask, by its exact type; an ask may answer
# with follow-up steps.
_ASKS: dict[type, Callable[[CarriesAsks, Any], Steps | None]] = {
    asks.Plan: lambda core, a: core.execute(core.policy.plan_append(core, a.payload),
                                            ingest=a.ingest),
    asks.Decide: CarriesAsks._decide,
    asks.Observe: CarriesAsks._observe,
    asks.Hold: CarriesAsks._hold,
    asks.Speculate: lambda core, a: core.speculate(a.words),
    asks.Discard: CarriesAsks._discard,
    asks.Rest: lambda core, a: core.floor.rest(),
    asks.CommitInput: lambda core, a: core.commit_input(),
    asks.Respond: lambda core, a: core.create_response(a.options),
    asks.Interrupt: lambda core, a: core.floor.interrupt(a.reason),
    asks.ItemGone: lambda core, a: core.floor.item_gone(a.item_id, truncated=a.truncated),
    asks.Fail: lambda core, a: core.fail(a.error),
    mcp_calls.Offer: lambda core, a: core._offer_mcp_tools(a.tools),
    mcp_calls.Show: lambda core, a: core.floor.show(a.payload),
    mcp_calls.Finish: lambda core, a: core.floor.finish(),
    mcp_calls.Report: lambda core, a: core.error(a.error),
    mcp_calls.FollowUp: CarriesAsks._mcp_follow_up,
    mcp_calls.Respond: CarriesAsks._mcp_respond,
}
