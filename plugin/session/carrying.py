"""How the session core carries out what its parts and its policy return:
``carry`` takes the steps in order -- an ask (``asks.py``; the policy's steps,
``domain/contracts.py``, are asks too) by the one table below, with its
follow-ups first; an event to the client; any other effect to the runner --
and the asks that need more than one call of the core are its methods here.

A policy's steps are about the stage output it decided (``about``): ``Show``
renders it, ``ForwardTo`` sends it on, ``Dismiss`` quotes its words. Where a
step may do nothing (a policy's ``Respond`` while a reply is shown, an
``Interrupt`` with none, a ``CommitTurn`` of an empty buffer, a
``FinishReply`` while the reply's MCP call runs) is decided here and in the
floor, from the session's state, so no policy keeps a copy
of it.

A part of the core's class (``SessionCore`` inherits it, as it inherits its
``SessionView``), kept apart so ``core.py`` holds the messages, the session's
state and the reply's start; the names it uses are the core's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import contracts as policy_steps
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.contracts import PolicyStep
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import StageOutput
from vllm_duplex.session import asks, mcp_calls
from vllm_duplex.session.asks import Step, Steps
from vllm_duplex.session.effects import Forward


class CarriesAsks:
    # The core's, used here (core.py).
    policy: Any
    floor: Any
    out: Any
    mcp: Any
    backchannels: Any
    input: Any
    user: Any
    _config: Any
    fence: Any
    emit: Callable[[ev.ServerEvent], None]
    error: Callable[[DuplexError], None]
    execute: Callable[..., None]
    show: Callable[[object], None]
    commit_input: Callable[[], None]
    create_response: Callable[..., None]

    def carry(self, steps: Iterable[Step], about: StageOutput | None = None) -> None:
        """Carry out what a part or the policy returned, in order: an ask by
        the core, with its follow-ups before the next step; an event to the
        client; any other effect to the runner. ``about``: the stage output
        the policy's steps answer."""
        for step in steps:
            ask = _ASKS.get(type(step))
            if ask is not None:
                more = ask(self, step, about)
                if more:
                    self.carry(more)
            elif isinstance(step, ev.ServerEvent):
                self.emit(step)
            else:
                self.out.add(step)

    def decide(self, out: StageOutput) -> Sequence[PolicyStep]:
        """Ask the policy about ``out`` and carry out its steps."""
        steps = self.policy.decide_output(self, out)
        self.carry(steps, about=out)
        return steps

    def release(self, held: Iterable[tuple[StageOutput, Sequence[PolicyStep]]]) -> None:
        """A claimed reply's held outputs, in order: the steps the policy took
        for each, but its ``ForwardTo`` -- carried out when it was held."""
        for out, steps in held:
            self.carry([s for s in steps if type(s) is not policy_steps.ForwardTo], about=out)

    def _observe(self, a: asks.Observe) -> Steps | None:
        fence = self.fence
        steps = self.decide(StageOutput(fence, fence.request_id("vad"), "vad", a.observation))
        return a.then(steps) if a.then is not None else None

    def _hold(self, a: asks.Hold) -> None:
        steps = self.policy.decide_output(self, a.out)
        if self.floor.keep(a.out, steps):
            for step in steps:  # e.g. its text is synthesized now, into the held buffer
                if type(step) is policy_steps.ForwardTo:
                    self.out.add(Forward(a.out, step.stage))

    def _discard(self, a: asks.Discard) -> Steps | None:
        discarded, steps = self.floor.discard()
        self.carry(steps)
        return a.then(discarded) if a.then is not None else None

    # ---- the policy's steps (and the parts' that are the same) -----------------------

    def _show(self, a: policy_steps.Show, about: StageOutput | None) -> None:
        if a.render is not None:
            self.show(a.render)
        else:
            assert about is not None, "Show() shows the output decided: none here"
            self.show(about.payload)

    def _commit_turn(self) -> None:
        if self.input.samples > 0:  # (a client's commit of nothing is refused before)
            self.commit_input()

    def _respond(self, a: policy_steps.Respond) -> None:
        options = a.options if a.options is not None else cmd.ResponseOptions()
        if not a.client and (self.floor.shown is not None or not self._config.responds):
            return  # the policy's: a reply goes out already, or the session only transcribes
        self.create_response(options)

    def _dismiss(self, a: policy_steps.Dismiss, about: StageOutput | None) -> Steps:
        self.input.clear()
        self.user.dismiss()
        self.carry(self.backchannels.turn_ended())  # no turn: the next speech begins one
        words = getattr(about.payload, "text", "") if about is not None else ""
        return self.floor.dismiss(a.reason, words)

    # ---- the MCP calls' own asks -------------------------------------------------------

    def _offer_mcp_tools(self, tools: tuple[tuple[str, dict[str, Any]], ...]) -> None:
        """The tools the session's MCP servers listed, offered to the model from now on."""
        self._config = self.floor.config = dataclasses.replace(self._config, mcp_tools=tools)

    def _mcp_respond(self, a: mcp_calls.RespondWhenListed) -> None:
        """A response.create held while its own MCP servers were listed: its
        reply offers only their tools (and its function tools)."""
        try:
            self.create_response(a.options, mcp_tools=a.offered)
        except DuplexError as err:
            self.error(err.with_event_id(a.event_id))


# How the core carries out each ask, by its exact type (with the output the
# policy's steps are about); an ask may answer with follow-up steps. The
# policy's vocabulary first, then the parts' own, then the MCP calls'.
_ASKS: dict[type, Callable[[CarriesAsks, Any, StageOutput | None], Steps | None]] = {
    policy_steps.Show: CarriesAsks._show,
    policy_steps.ForwardTo: lambda core, a, about: core.out.add(Forward(about, a.stage)),
    policy_steps.AppendPlan: lambda core, a, about: core.execute(a),
    policy_steps.PauseReply: lambda core, a, about: core.floor.pause(),
    policy_steps.Interrupt: lambda core, a, about: core.floor.interrupt(a.reason),
    policy_steps.CommitTurn: lambda core, a, about: core._commit_turn(),
    policy_steps.Respond: lambda core, a, about: core._respond(a),
    policy_steps.Dismiss: CarriesAsks._dismiss,
    policy_steps.FinishReply: lambda core, a, about: core.floor.finish(),
    asks.Plan: lambda core, a, about: core.execute(core.policy.plan_append(core, a.payload),
                                                   ingest=a.ingest),
    asks.Decide: lambda core, a, about: core.decide(a.out) and None,
    asks.Observe: lambda core, a, about: core._observe(a),
    asks.Hold: lambda core, a, about: core._hold(a),
    asks.Speculate: lambda core, a, about: core.speculate(a.words),
    asks.Discard: lambda core, a, about: core._discard(a),
    asks.Rest: lambda core, a, about: core.floor.rest(),
    asks.ItemGone: lambda core, a, about: core.floor.item_gone(a.item_id, truncated=a.truncated),
    asks.Fail: lambda core, a, about: core.fail(a.error),
    mcp_calls.Offer: lambda core, a, about: core._offer_mcp_tools(a.tools),
    mcp_calls.Awaited: lambda core, a, about: core.floor.await_call(a.item_id),
    mcp_calls.Returned: lambda core, a, about: core.floor.call_returned(a.item_id, a.answer),
    mcp_calls.Answer: lambda core, a, about: core.mcp.answer(),
    mcp_calls.Report: lambda core, a, about: core.error(a.error),
    mcp_calls.FollowUp: lambda core, a, about: core.create_response(a.options, follows_up=True),
    mcp_calls.RespondWhenListed: lambda core, a, about: core._mcp_respond(a),
}
