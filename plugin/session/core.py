"""``SessionCore``: one realtime session as a state machine without I/O.

``handle(message, now)`` takes one message -- a client command, a stage
output, or what the runner reports back (``FrameDecoded``, ``Failed``) --
and returns the effects it causes, in order (``effects.py``): events to
emit, submissions, forwards and cancels for the pipeline, a close. It never
awaits and never blocks, so the runner can keep serving the mailbox while
the stages work; a test drives it with messages and a clock value and
checks the exact effects (``tests/unit/test_session_core.py``), the way
python-websockets tests its ``Protocol`` with bytes.

It is the single writer of the session's state -- fence gate, config,
conversation, input buffer, active response, the policy's per-session
state -- and it is the ``SessionView`` the policy reads. Messages are
dispatched through one table by type: the client's commands
(``client_commands.py``), stage outputs (the chain of ``decisions.py``: the
gate first, so stale outputs die in one place; then the speculation, the
turn end and the policy, whose decision ``decisions.apply`` carries out --
a held reply's forward aside, done as it arrives) and the
session-level rest here. Functions of the core compose its parts by concern
-- the output chain (``decisions.py``), a pause and the reply started in it
(``pauses.py``), the reply's way out (``output.py``) -- and the parts own
their small state and return what to do: the pause judge (``turn_end.py``),
the held reply (``speculation.py``), pacing (``pacing.py``), barge-in timers
(``barge_in.py``), the idle timeout (``idle.py``), the session's maximum
length (``lifetime.py``), what an output shows (``rendering.py``) and a
reply's request (``replies.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Callable, Collection, Sequence
from typing import Any

from vllm_duplex.core import commands as cmd
from vllm_duplex.core import events as ev
from vllm_duplex.core.close_reason import CloseReason
from vllm_duplex.core.contracts import AppendPlan, FenceBump, InterruptReason
from vllm_duplex.core.conversation import ConversationItem, Response
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.fence import Fence
from vllm_duplex.core.gate import FenceGate
from vllm_duplex.core.input_sequence import InputSequence
from vllm_duplex.core.metrics import Metrics
from vllm_duplex.core.payloads import AsrConfig, ContextMessage, StageOutput
from vllm_duplex.core.session_config import (
    SessionConfig,
    check_modalities,
    session_wire,
    updated_config,
)
from vllm_duplex.policy import ModelPolicy
from vllm_duplex.session import barge_in, decisions, idle, lifetime, output, pacing, pauses, turn_end
from vllm_duplex.session.client_commands import COMMANDS
from vllm_duplex.session.effects import (
    AckEvents,
    Cancel,
    CancelTimer,
    Close,
    Effect,
    Emit,
    Failed,
    FrameDecoded,
    Submit,
    TimerFired,
)
from vllm_duplex.session.input_buffer import InputBuffer
from vllm_duplex.session.items import ItemStore
from vllm_duplex.session.latency import TurnLatency
from vllm_duplex.session.limits import SessionLimits
from vllm_duplex.session.phase import Phase, TurnPhase
from vllm_duplex.session.replies import reply_request, reply_tools, response_context
from vllm_duplex.session.reply import End, Reply
from vllm_duplex.session.responses import ResponseRecord
from vllm_duplex.session.turn_end import Pause
from vllm_duplex.session.user_turn import UserTurn
from vllm_duplex.session.video_input import VideoAdmission

log = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(12)}"


class SessionCore:
    def __init__(
        self,
        session_id: str,
        *,
        config: SessionConfig,
        policy: ModelPolicy[Any],
        stage_names: Collection[str],
        metrics: Metrics,
        now: float,
        limits: SessionLimits = SessionLimits(),
        extra_wire: dict[str, Any] | None = None,
        make_id: Callable[[str], str] = new_id,
    ) -> None:
        self.session_id = session_id
        self.policy = policy
        self.caps = policy.capabilities()
        td = config.turn_detection
        if td is not None and td.semantic and (td.type not in self.caps.turn_detection
                                               or not config.responds):
            config = dataclasses.replace(config, turn_detection=td.as_server_vad())  # what runs
        self._config = config
        self.metrics = metrics
        self.limits = limits
        self.extra_wire = extra_wire or {}
        self.make_id = make_id
        self.gate = FenceGate(Fence(session_id))
        self.stage_names = frozenset(stage_names)
        needs = policy.stage_needs()
        self._generator = needs.generator
        # The transcription prompt reaches an ASR stage where the policy routes one.
        self._asr_configurable = any(issubclass(AsrConfig, kinds) for kinds in needs.sends.values())
        self._policy_state = policy.new_state()
        self._seq = 0
        self.input_seq = InputSequence(max_chunk_bytes=1 << 62, max_total_bytes=1 << 62)
        self.conversation = ItemStore(limits.max_items)
        self.input = InputBuffer(config.input_format, max_ms=limits.max_buffer_ms)
        self.input.set_noise_reduction(config.noise_reduction)
        self.user = UserTurn(make_id)
        self.video = VideoAdmission(limits.video, started_at=now)
        self.reply: Reply | None = None  # the one reply: held (speculated) or shown
        self.phase = TurnPhase()  # listening, paused, answer held, responding, barge paused
        self.latency = TurnLatency(metrics.stage_latency, metrics.critical_path)
        self.pause = Pause()  # semantic_vad: the pause being judged
        self.idle = idle.IdleTimer()  # server_vad's idle_timeout_ms
        # What a fired timer (effects.ArmTimer) runs, by name.
        self.timers: dict[str, Callable[[], None]] = {
            turn_end.TIMER: lambda: pauses.due(self),
            pacing.PACING: lambda: output.send_due(self),
            barge_in.BARGE_IN: lambda: output.barge_in_due(self),
            idle.IDLE: lambda: idle.due(self),
            lifetime.WARNING: lambda: lifetime.warn(self),
            lifetime.END: lambda: lifetime.end(self)}
        self._effects: list[Effect] = []
        self._now = now
        self._received_at = now

    # ---- SessionView (what the policy may read) ---------------------------

    @property
    def fence(self) -> Fence:
        return self.gate.fence

    @property
    def config(self) -> SessionConfig:
        return self._config

    @property
    def items(self) -> Sequence[ConversationItem]:
        return self.conversation.snapshot()

    @property
    def active_response_id(self) -> str | None:
        return self.shown.id if self.shown else None

    @property
    def user_speaking(self) -> bool:
        return self.user.speaking

    @property
    def output_modalities(self) -> tuple[str, ...]:
        """What the reply in progress produces: a ``response.create`` may ask
        for other modalities than the session's."""
        shown = self.shown
        if shown is not None and shown.record is not None:
            return shown.record.response.output_modalities
        return tuple(self._config.output_modalities)

    @property
    def policy_state(self) -> Any:
        return self._policy_state

    @property
    def generator(self) -> str:
        """The stage that writes replies."""
        return self._generator

    @property
    def output_paused(self) -> bool:
        """The reply is paused by speech over it (adaptive interruptions)."""
        return self.phase.value is Phase.BARGE_PAUSED

    @property
    def shown(self) -> Reply | None:
        """The reply the client sees (None: none, or one still held)."""
        reply = self.reply
        return reply if reply is not None and reply.visible else None

    # ---- what the runner reads -------------------------------------------

    @property
    def last_input_seq(self) -> int:
        """The last numbered input chunk accepted (a resumed client resends after it)."""
        return self.input_seq.next_seq - 1

    def session_object(self) -> dict[str, Any]:
        extra = {"policy": self.policy.name, "capabilities": self.caps.wire(),
                 "fence": self.fence.wire(), **self.extra_wire}
        return session_wire(self._config, session_id=self.session_id, extra=extra)

    def snapshot(self) -> dict[str, Any]:
        """What a client that must resync starts again from."""
        return {"session": self.session_object(), "items": [i.wire() for i in self.conversation],
                "active_response_id": self.active_response_id}

    # ---- messages in, effects out -----------------------------------------

    def start(self, resume_token: str, now: float) -> list[Effect]:
        """The session's first effects: ``session.created``, and the VAD's
        configuration. Errors propagate: a session that cannot start is not
        admitted."""
        self._now = self._received_at = now
        self.emit(ev.SessionCreated(session=self.session_object(), resume_token=resume_token))
        if self._config.turn_detection is not None:
            self.execute(self.policy.plan_append(self, self.user.vad_config(self._config)))
        self._configure_asr(None)
        lifetime.arm(self)
        return self._take()

    def handle(self, message: object, now: float, received_at: float | None = None) -> list[Effect]:
        """The effects of ``message`` (``received_at``: when it entered the
        mailbox; latencies are measured from there). A client's mistake
        becomes an error event echoing its ``event_id``; a bug in one
        command becomes ``internal_error`` and the session goes on."""
        self._now = now
        self._received_at = now if received_at is None else received_at
        try:
            handler = _HANDLERS.get(type(message))
            if handler is None:
                raise DuplexError("unknown_event", f"unhandled command {type(message).__name__}")
            handler(self, message)
        except DuplexError as err:
            self.error(err.with_event_id(getattr(message, "event_id", None)))
        except Exception:  # contained: one bad command must not end the session
            log.exception("session %s failed on %r", self.session_id, type(message).__name__)
            self.error(DuplexError("internal_error", "internal error handling the event",
                                   event_id=getattr(message, "event_id", None)))
        return self._take()

    def _take(self) -> list[Effect]:
        effects, self._effects = self._effects, []
        return effects

    # ---- the operations the core's own modules compose -----------------------

    @property
    def now(self) -> float:
        """The time of the message being handled."""
        return self._now

    @property
    def received_at(self) -> float:
        """When the message being handled entered the mailbox."""
        return self._received_at

    def effect(self, effect: Effect) -> None:
        self._effects.append(effect)

    def emit(self, event: ev.ServerEvent) -> None:
        self._seq += 1
        self._effects.append(Emit(ev.Envelope(self._seq, self.gate.fence, event)))

    def emit_all(self, events: Sequence[ev.ServerEvent]) -> None:
        for event in events:
            self.emit(event)

    def error(self, err: DuplexError) -> None:
        self.metrics.errors.inc(code=err.code)
        self.emit(ev.ErrorEvent(error=err))

    def fail(self, err: DuplexError) -> None:
        """A stage failed: the client hears of it, and the reply shown fails."""
        self.error(err)
        if self.shown is not None:
            self.end_reply(End.FAILED, error=err.to_wire())

    def execute(self, plan: AppendPlan, *, ingest: bool = False) -> None:
        """Carry out a policy plan: move the fence first, then submit.
        ``ingest``: the plan answers client input (its latency is measured)."""
        if plan.bump is FenceBump.INCARNATION:
            self._advance(self.fence.next_incarnation())
            self.metrics.incarnation_bumps.inc()
        elif plan.bump is FenceBump.EPOCH:
            self._advance(self.fence.next_epoch())
        fence = self.gate.fence
        for sub in plan.submissions:
            self._effects.append(Submit(sub.stage, fence, sub.role, sub.payload))
        if ingest and plan.submissions:
            self.metrics.ingest_latency.observe(self._now - self._received_at)

    def _advance(self, fence: Fence) -> None:
        """A plan moved the fence: every output under way is void (the gate
        drops it, the stages abort it), a held reply with them."""
        self.gate.advance(fence)
        self.metrics.epoch_bumps.inc()
        self._effects.append(Cancel(fence))
        if self.reply is not None and not self.reply.visible:
            self.end_reply(End.DISCARDED, voided=True)

    def rest(self) -> None:
        """With no reply, the phase follows the pause: judged, or listening."""
        if self.phase.value in (Phase.LISTENING, Phase.PAUSED):
            self.phase.to(self._at_rest())

    def _at_rest(self) -> Phase:
        return Phase.PAUSED if self.pause.pausing else Phase.LISTENING

    def commit_input(self) -> None:
        """The input buffer becomes a user item (a commit, or server VAD's end of turn)."""
        audio, errors = self.input.commit()
        for err in errors:  # e.g. an odd PCM16 byte count: reported, the turn is kept
            self.error(err)
        item, committed = self.user.commit(audio)
        self.latency.committed(self._now)
        previous = self.conversation.insert(item)
        self.emit(ev.InputAudioBufferCommitted(item_id=item.id, previous_item_id=previous))
        self.emit(ev.ConversationItemAdded(item=item.wire(), previous_item_id=previous))
        self.emit(ev.ConversationItemDone(item=item.wire(), previous_item_id=previous))
        self.execute(self.policy.plan_append(self, committed))

    # ---- session-level messages ---------------------------------------------

    def _on_update(self, c: cmd.SessionUpdate) -> None:
        old, new = self._config, updated_config(self._config, c.patch, self.caps, self.policy.name)
        self._config = new
        self.input.set_format(new.input_format)
        self.input.set_noise_reduction(new.noise_reduction)
        if new.turn_detection is not None and new.turn_detection != old.turn_detection:
            self.execute(self.policy.plan_append(self, self.user.vad_config(new)))
        self._configure_asr((old.transcription.prompt or None) if old.transcription else None)
        self.emit(ev.SessionUpdated(session=self.session_object()))

    def _configure_asr(self, old_prompt: str | None) -> None:
        """Tell the ASR the session's transcription prompt when it changed."""
        t = self._config.transcription
        prompt = (t.prompt or None) if t is not None else None
        if self._asr_configurable and prompt != old_prompt:
            self.execute(self.policy.plan_append(self, AsrConfig(prompt)))

    def _on_event_ack(self, c: cmd.EventAck) -> None:
        self._effects.append(AckEvents(c.seq))

    def _on_close(self, c: cmd.SessionClose) -> None:
        reason = CloseReason(c.reason)
        self.emit(ev.SessionClosed(reason=reason.value))
        self._effects.append(Close(reason))  # nothing queued behind the close may run

    # ---- what the runner reports back ---------------------------------------

    def _on_frame(self, m: FrameDecoded) -> None:
        self.execute(self.policy.plan_append(self, m.frame))

    def _on_failed(self, m: Failed) -> None:
        self.error(m.error)

    def _on_timer(self, m: TimerFired) -> None:
        fire = self.timers.get(m.name)
        if fire is not None:
            fire()

    def _on_stage_output(self, out: StageOutput) -> None:
        decisions.walk(self, out)

    # ---- the reply (reply.py): asked for, claimed, ended ---------------------

    def create_response(self, options: cmd.ResponseOptions) -> None:
        if not self._config.responds:
            raise DuplexError("capability_unsupported", "a transcription session makes no "
                              "responses (open a realtime session to get answers)",
                              param="type")
        if self.shown is not None:
            raise DuplexError("conversation_already_has_active_response",
                              f"response {self.shown.id} is still in progress; cancel it "
                              "or wait for response.done")
        if self._generator not in self.stage_names:
            raise DuplexError("capability_unsupported", "this pipeline has no generating stage")
        modalities = tuple(options.output_modalities or self._config.output_modalities)
        check_modalities(modalities, self.caps, param="response.output_modalities")
        tools = reply_tools(self._config, options)
        idle.void(self)
        in_conversation = options.conversation != "none"
        fmt = options.output_format or self._config.output_format
        context = response_context(self.policy, self, self.conversation, options)
        # A reply started at the pause with exactly this context (and the
        # session's tools, which it ran with) is used; any other is void --
        # also when this response cannot use it at all (its own tools, or
        # outside the conversation): left running, it would speak unseen and
        # hold this response's request behind it.
        own_tools = options.tools is not None or options.tool_choice is not None
        reply = self.reply
        if reply is not None and in_conversation and not own_tools and reply.claimable(context):
            self.metrics.speculations.inc(outcome="used")
        else:
            self.end_reply(End.DISCARDED)
            reply = None
        response = Response(
            id=reply.id if reply is not None else self.make_id("resp"),
            conversation_id=None if not in_conversation else "conv_" + self.session_id,
            output_modalities=modalities, output_format=fmt.wire(),
            voice=options.voice or self._config.voice,
            max_output_tokens=options.max_output_tokens or self._config.max_output_tokens,
            metadata=options.metadata)
        record = ResponseRecord.after(response, self.make_id("item"), self.conversation,
                                      in_conversation=in_conversation, output_format=fmt)
        times = self.latency.response_created(self._now)
        pacer = pacing.new_pacer(self._config.pacing) if "audio" in modalities else None
        submit = None
        if reply is None:
            fence = self.fence
            reply = Reply(response.id, fence.request_id("llm"))
            self.latency.reply_started(reply.id, self._now, times.trace)
            submit = Submit(self._generator, fence, "llm", reply_request(
                self.policy, self, reply.id, context, options, tools))
        self.reply = reply
        held = reply.show(record, times, pacer)
        self.phase.to(Phase.RESPONDING)
        self.emit_all(record.start_events())
        if submit is not None:
            self._effects.append(submit)
        for out, decision in held:  # its held output goes out now, the rest as it comes
            decisions.apply(self, out, decision, forwarded=True)

    def discard_speculation(self) -> bool:
        """A held reply ends unseen: one epoch bump, nothing of it reaches the
        client, its request is aborted. False: there was none."""
        if self.reply is None or self.reply.visible:
            return False
        self.end_reply(End.DISCARDED)
        return True

    def interrupt(self, reason: InterruptReason) -> None:
        """Barge-in or cancel of the reply shown (``End.TURN_DETECTED`` or
        ``End.CANCELLED``)."""
        if self.shown is not None:
            self.end_reply(End.TURN_DETECTED if reason is InterruptReason.TURN_DETECTED
                           else End.CANCELLED)

    def finish_response(self) -> None:
        shown = self.shown
        if shown is None:
            return
        if self.phase.value is Phase.BARGE_PAUSED or not shown.drained:
            # response.done goes after its last audio, and not while speech
            # over it may still cancel it
            shown.complete = True
            return
        self.end_reply(End.COMPLETED)

    def end_reply(self, end: End, *, error: dict | None = None, voided: bool = False) -> None:
        """The one way a reply ends. Where it is void (``end.voids``), the
        fence moves first (one epoch bump): once the gate has moved nothing of
        it can reach the client, so silence comes before the stages finish
        aborting. Then its ``response.done`` (cut to what was heard), the
        cancel of its stage requests, its timers. ``voided``: a plan moved
        the fence already."""
        reply = self.reply
        if reply is None:
            return
        self.reply = None
        barge_paused = self.phase.value is Phase.BARGE_PAUSED
        self.phase.to(self._at_rest())
        fence = None
        if end.voids and not voided:
            fence = self.fence.next_epoch()
            self.gate.advance(fence)
            self.metrics.epoch_bumps.inc()
        m = self.metrics
        if end is End.DISCARDED:
            m.speculations.inc(outcome="discarded")
        elif end.interrupt is not None:
            m.interrupts.inc(reason=end.interrupt.value)
            if barge_paused:
                m.barge_ins.inc(outcome="interrupted")
            elif end is End.TURN_DETECTED and not self.user.speaking:
                m.visible_revisions.inc()  # not speech over it: its words changed under it
        ending = reply.finish(end, self._now, error)
        self.emit_all(ending.events)
        if end.interrupt is not None:
            m.cancel_latency.observe(self._now - self._received_at)
        if fence is not None:
            self._effects.append(Cancel(fence))
        self._effects.extend(ending.timers)
        if barge_paused:
            self._effects.append(CancelTimer(barge_in.BARGE_IN))
        if end is End.COMPLETED:
            idle.arm(self, reply)


# What handles each message, by its exact type (the codec and the runner make
# exactly these classes): the client's commands, then the session's own.
_HANDLERS: dict[type, Callable[[SessionCore, Any], None]] = {
    **COMMANDS,
    StageOutput: SessionCore._on_stage_output,
    cmd.SessionUpdate: SessionCore._on_update,
    cmd.EventAck: SessionCore._on_event_ack,
    cmd.SessionClose: SessionCore._on_close,
    FrameDecoded: SessionCore._on_frame,
    Failed: SessionCore._on_failed,
    TimerFired: SessionCore._on_timer,
}
