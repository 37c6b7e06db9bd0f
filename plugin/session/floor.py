"""``Floor``: who has the floor -- the turn's phase -- and the one reply that
may hold it.

The session core owns one ``Floor`` and is its only caller. The floor is the
single writer of the turn's phase (``phase.py``) and of the reply slot: a
reply is started here (``speculate``: held; ``respond``: shown, or the held
one claimed -- the reply made with its trace, its request submitted; the core
builds the request, as only it is the policy's view), goes out (``show``, ``send_due``: paced), is paused by speech over
it and resumed or cut (``pause``, ``dismiss``, ``barge_in_due``), and ends
one way, ``end(End...)``:

* where the reply is void (cancelled, cut by speech, discarded unseen) the
  fence moves first -- one epoch bump: once the gate has moved nothing of it
  can reach the client, so silence comes before the stages finish aborting;
* then its ``response.done`` and the item's end (cut to what was heard),
  the ``Cancel`` of its stage requests, its timers; a completed reply arms
  the idle timeout.

What it needs of the session it is given once (the effect log, read for the
message's times only; the fence mover -- ``fences.py``: the core's own, so
the fence moves in one place --, the metrics, the latency tracker, the
conversation, the user's turn, the pause, the idle timer) or per call; it
never holds the core, and what it does comes back as steps (``asks.Steps``:
events and effects, in order), which the core carries out where it called it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain.contracts import InterruptReason, PolicyStep
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import AudioOut, ContextMessage, GenerateRequest, StageOutput
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.session import barge_in, idle, mcp_calls, pacing, rendering
from vllm_duplex.session.asks import Steps
from vllm_duplex.session.effects import CancelTimer, EffectLog, Submit
from vllm_duplex.session.fences import FenceMover
from vllm_duplex.session.items import ItemStore
from vllm_duplex.session.latency import TurnLatency
from vllm_duplex.session.phase import Phase, TurnPhase
from vllm_duplex.session.replies import new_response
from vllm_duplex.session.reply import End, Reply
from vllm_duplex.session.responses import ResponseRecord
from vllm_duplex.session.turn_end import Pause
from vllm_duplex.session.user_turn import UserTurn

Held = list[tuple[StageOutput, Sequence[PolicyStep]]]
_SHOWN = (Phase.RESPONDING, Phase.BARGE_PAUSED)  # the phases of a reply the client sees


class Floor:
    def __init__(self, out: EffectLog, fences: FenceMover, *, config: SessionConfig,
                 metrics: Metrics, generator: str, latency: TurnLatency, conversation: ItemStore,
                 user: UserTurn,
                 pause: Pause, idle_timer: idle.IdleTimer, make_id: Callable[[str], str],
                 session_id: str) -> None:
        self.phase = TurnPhase()
        self.reply: Reply | None = None  # held (speculated) or shown
        self.config = config  # the session's; the core sets it on session.update
        self._out = out  # read for the message's times only: steps are returned
        self._fences = fences
        self._metrics = metrics
        self._generator = generator  # the stage that writes replies
        self._latency = latency
        self._conversation = conversation
        self._user = user
        self._pause = pause
        self._idle = idle_timer
        self._make_id = make_id
        self._session_id = session_id

    # Whether the reply is held or shown is the phase's to say (no flag of the
    # reply mirrors it): it is moved with the slot, in this class alone.

    @property
    def shown(self) -> Reply | None:
        """The reply the client sees (None: none, or one still held)."""
        return self.reply if self.phase.value in _SHOWN else None

    @property
    def held(self) -> Reply | None:
        """The reply started at a pause, not shown yet."""
        return self.reply if self.phase.value is Phase.ANSWER_HELD else None

    def rest(self) -> None:
        """With no reply, the phase follows the pause: judged, or listening."""
        if self.phase.value in (Phase.LISTENING, Phase.PAUSED):
            self.phase.to(self._at_rest())

    def _at_rest(self) -> Phase:
        return Phase.PAUSED if self._pause.pausing else Phase.LISTENING

    # ---- a reply starts ---------------------------------------------------------

    def speculate(self, reply_id: str, request: GenerateRequest, words: str,
                  context: tuple[ContextMessage, ...]) -> Steps:
        """Reply ``reply_id`` to ``words`` (the user's turn so far) started at
        the pause on ``context`` with ``request``: held until a response claims
        it. Returns its submission."""
        assert self.reply is None
        fence = self._fences.fence
        submit = Submit(self._generator, fence, "llm", request)
        # Traced on the turn being heard: a reply started at its pause.
        self.reply = Reply(reply_id, fence.request_id("llm"), answers=words, context=context,
                           trace=self._latency.reply_started(reply_id, self._out.now))
        self.phase.to(Phase.ANSWER_HELD)
        self._metrics.speculations.inc(outcome="started")
        return [submit]

    def respond(self, options: cmd.ResponseOptions, context: tuple[ContextMessage, ...],
                request: Callable[[str], GenerateRequest], *,
                mcp_tools: dict[str, Any] | None = None,
                follows_up: bool = False) -> tuple[Held, Steps]:
        """A response asked for with ``context``: the held reply when it may
        be that (the same context, and the session's tools, which it ran with);
        else any held one is discarded -- left running, it would speak unseen
        and hold this response's request behind it -- and a new reply starts,
        its request made by ``request`` (given its id). Shown either way.
        Returns what the reply held (its outputs with the policy's steps, to
        be carried out in order) and the steps to carry out before them (a
        discarded held reply's end, the new one's start events, its request).
        ``mcp_tools``, ``follows_up``: its MCP side (``Reply``)."""
        own_tools = options.tools is not None or options.tool_choice is not None
        in_conversation = options.conversation != "none"
        reply = self.held
        steps: Steps = []
        if reply is not None and in_conversation and not own_tools and reply.claimable(context):
            self._metrics.speculations.inc(outcome="used")
        else:
            steps += self.end(End.DISCARDED)
            reply = None
        response, fmt = new_response(self.config, options, reply.id if reply is not None
                                     else self._make_id("resp"), self._session_id)
        record = ResponseRecord.after(response, self._make_id("item"), self._conversation,
                                      in_conversation=in_conversation, output_format=fmt)
        times = self._latency.response_created(self._out.now)
        submit = None
        if reply is None:
            fence = self._fences.fence
            reply = Reply(response.id, fence.request_id("llm"),
                          trace=self._latency.reply_started(response.id, self._out.now, times.trace))
            submit = Submit(self._generator, fence, "llm", request(reply.id))
        self.reply = reply
        reply.mcp_tools, reply.follows_up = mcp_tools, follows_up
        audio = "audio" in response.output_modalities
        # the server cancelling the echo: the client's player kept fed (pacing.py)
        pacer = pacing.new_pacer(self.config.pacing,
                                 keep_fed=self.config.echo_cancellation == "server")
        held = reply.show(record, times, pacer if audio else None)
        self.phase.to(Phase.RESPONDING)
        steps += record.start_events()
        if submit is not None:
            steps.append(submit)
        return held, steps

    def keep(self, out: StageOutput, steps: Sequence[PolicyStep]) -> bool:
        """An output of the held reply, with the policy's steps for it: kept
        until the reply is claimed. False: no reply is held."""
        reply = self.held
        if reply is None:
            return False
        reply.keep(out, steps)
        return True

    # ---- its way out --------------------------------------------------------------

    def _scope(self) -> rendering.Scope:
        return rendering.Scope(self._out.now, self._user, self._conversation, self._latency,
                               self.shown)

    def show(self, payload: object) -> Steps:
        """Show the client ``payload``: reply audio through the pacer (or at
        once, unpaced), anything else as its events."""
        shown = self.shown
        if type(payload) is AudioOut and shown is not None and shown.pacer is not None:
            if shown.id == payload.response_id:
                shown.pacer.push(payload)
                return self.send_due()
            return []
        if (type(payload) is AudioOut and shown is not None and shown.id == payload.response_id
                and self.phase.value is Phase.BARGE_PAUSED):
            # Unpaced, paused by speech over it: the client stopped playing
            # at speech_started, and audio sent now would play on after it.
            shown.paused_audio.append(payload)
            return []
        return list(rendering.render(payload, self._scope()))

    def send_due(self) -> Steps:
        """The paced frames due now (also the ``pacing`` timer's work), then
        the timer of the next; the reply completes once all of it went out."""
        shown = self.shown
        if shown is None or shown.pacer is None or self.phase.value is Phase.BARGE_PAUSED:
            return []  # (paused by speech over it: the client stopped playing it)
        events, timer = shown.send_due(self._scope())
        steps: Steps = list(events)
        if timer is not None:
            steps.append(timer)
        elif shown.drained and shown.complete and self.phase.value is Phase.RESPONDING:
            steps += self.finish()
        return steps

    def pause(self) -> Steps:
        """Speech over the reply: stop sending it while the words are awaited."""
        shown = self.shown
        if shown is not None and self.phase.value is Phase.RESPONDING:
            self.phase.to(Phase.BARGE_PAUSED)
            return list(barge_in.pause(shown, self.config, self._out.now))
        return []

    def dismiss(self, reason: str, transcript: str) -> Steps:
        """The speech over the reply was not a turn: the reply goes on."""
        steps: Steps = [CancelTimer(barge_in.BARGE_IN)]
        shown = self.shown
        if shown is None or self.phase.value is not Phase.BARGE_PAUSED:
            return steps
        self._metrics.barge_ins.inc(outcome="dismissed")
        self.phase.to(Phase.RESPONDING)
        steps.append(barge_in.resume(shown, self._out.now, reason, transcript))
        if shown.pacer is None:
            held, shown.paused_audio = shown.paused_audio, []
            for audio in held:  # unpaced: from where it paused, as made meanwhile
                steps += rendering.render(audio, self._scope())
            if shown.complete:
                steps += self.finish()
        return steps + self.send_due()

    def barge_in_due(self) -> Steps:
        """The ``barge_in`` timer: speech still going is an interruption."""
        if self.phase.value is Phase.BARGE_PAUSED and barge_in.interrupts(
                user_speaking=self._user.speaking, pause_judged=self._pause.pausing):
            return self.interrupt(InterruptReason.TURN_DETECTED)
        return []

    # ---- it ends ------------------------------------------------------------------

    def finish(self) -> Steps:
        """The reply is generated to its end: ``response.done`` goes after its
        last audio and once its MCP calls are back, and not while speech over
        it may still cancel it."""
        shown = self.shown
        if shown is None:
            return []
        if self.phase.value is Phase.BARGE_PAUSED or not shown.drained or shown.calls:
            shown.complete = True
            return []
        return self.end(End.COMPLETED)

    def await_call(self, item_id: str) -> None:
        """The reply shown made MCP call ``item_id``: it ends only once it is back."""
        if self.shown is not None:
            self.shown.calls.add(item_id)

    def call_returned(self, item_id: str, answer: bool) -> Steps:
        """MCP call ``item_id`` is back: the reply that made it ends if it was
        generated to its end meanwhile (``answer``: once it completes, a
        follow-up answers with the result)."""
        shown = self.shown
        if shown is None or item_id not in shown.calls:
            return []
        shown.calls.discard(item_id)
        shown.answered = shown.answered or answer
        return self.finish() if shown.complete else []

    def interrupt(self, reason: InterruptReason) -> Steps:
        """Barge-in or cancel of the reply shown."""
        if self.shown is None:
            return []
        return self.end(End.TURN_DETECTED if reason is InterruptReason.TURN_DETECTED
                        else End.CANCELLED)

    def item_gone(self, item_id: str, *, truncated: bool) -> Steps:
        """The client deleted or truncated ``item_id``; the reply shown may be
        writing it."""
        shown = self.shown
        record = shown.record if shown is not None else None
        if record is None or record.item.id != item_id:
            return []
        if not truncated:
            record.in_conversation = False  # no item.done for a deleted item
            return []
        # The item is still being generated: the client stopped playing it
        # (the Agents SDK's interrupt() sends only a truncate), so its output
        # stops and its .done events hold the heard part, as for a cancel.
        record.truncated()
        return self.interrupt(InterruptReason.CLIENT_CANCELLED)

    def discard(self) -> tuple[bool, Steps]:
        """The held reply ends unseen (False: there was none), and its end's steps."""
        if self.held is None:
            return False, []
        return True, self.end(End.DISCARDED)

    def end(self, end: End, *, error: dict | None = None, voided: bool = False) -> Steps:
        """The one way a reply ends (``voided``: a plan moved the fence already).
        The fence moves now, so the events of its steps, emitted by the core
        where it called this, carry the moved fence."""
        reply = self.reply
        if reply is None:
            return []
        self.reply = None
        barge_paused = self.phase.value is Phase.BARGE_PAUSED
        self.phase.to(self._at_rest())
        cancel = None
        if end.voids and not voided:  # moved now, its Cancel placed after the reply's end
            cancel = self._fences.bump(self._fences.fence.next_epoch())
        self._count(end, barge_paused)
        now = self._out.now
        ending = reply.finish(end, now, error)
        steps: Steps = list(ending.events)
        if end.interrupt is not None:
            self._metrics.cancel_latency.observe(now - self._out.received_at)
        if cancel is not None:
            steps.append(cancel)
        steps += ending.timers
        if barge_paused:
            steps.append(CancelTimer(barge_in.BARGE_IN))
        if end is End.COMPLETED:
            steps += idle.arm(self._idle, self.config, reply, now, self._user.onsets)
            if reply.answered:
                steps.append(mcp_calls.Answer())  # the model answers its calls' results
        return steps

    def _count(self, end: End, barge_paused: bool) -> None:
        m = self._metrics
        if end is End.DISCARDED:
            m.speculations.inc(outcome="discarded")
        elif end.interrupt is not None:
            m.interrupts.inc(reason=end.interrupt.value)
            if barge_paused:
                m.barge_ins.inc(outcome="interrupted")
            elif end is End.TURN_DETECTED and not self._user.speaking:
                m.visible_revisions.inc()  # not speech over it: its words changed under it
