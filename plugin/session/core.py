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
from vllm_duplex.core.contracts import AppendPlan, FenceBump, InterruptReason, OutputDecision
from vllm_duplex.core.conversation import ConversationItem, Response, ResponseStatus
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
from vllm_duplex.session.replies import reply_request, reply_tools, response_context
from vllm_duplex.session.responses import ActiveResponse
from vllm_duplex.session.speculation import Speculation
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
        self.response: ActiveResponse | None = None
        self.latency = TurnLatency(metrics.stage_latency, metrics.critical_path)
        self.pause = Pause()  # semantic_vad: the pause being judged
        self.speculation = Speculation()  # a reply started at a pause, held
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
        return self.response.id if self.response else None

    @property
    def user_speaking(self) -> bool:
        return self.user.speaking

    @property
    def output_modalities(self) -> tuple[str, ...]:
        """What the reply in progress produces: a ``response.create`` may ask
        for other modalities than the session's."""
        active = self.response
        return active.response.output_modalities if active else tuple(self._config.output_modalities)

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
        return self.response is not None and self.response.barge_pending

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
        """A stage failed: the client hears of it, and the reply in progress fails."""
        self.error(err)
        active, self.response = self.response, None
        if active is not None:
            self.emit_all(active.finish(ResponseStatus.FAILED,
                                        {"type": "failed", "error": err.to_wire()}))

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

    def bump_epoch(self) -> None:
        """Void every output under way (the gate drops it, the stages abort it)."""
        self._advance(self.fence.next_epoch())

    def _advance(self, fence: Fence) -> None:
        self.gate.advance(fence)
        self.metrics.epoch_bumps.inc()
        self._effects.append(Cancel(fence))
        if self.speculation.drop():  # its request is cancelled with the rest: never claimed
            self.metrics.speculations.inc(outcome="discarded")

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

    # ---- what an output shows (output.py) ----------------------------------------

    def show(self, payload: Any) -> None:
        output.show(self, payload)

    def pause_output(self) -> None:
        output.pause(self)

    def dismiss(self, reason: str, transcript: str) -> None:
        output.dismiss(self, reason, transcript)

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

    def decide(self, out: StageOutput) -> OutputDecision:
        """Ask the policy about ``out`` and carry out its decision (the one
        applier, ``decisions.apply``)."""
        return decisions.decide(self, out)

    # ---- responses --------------------------------------------------------

    def create_response(self, options: cmd.ResponseOptions) -> None:
        if not self._config.responds:
            raise DuplexError("capability_unsupported", "a transcription session makes no "
                              "responses (open a realtime session to get answers)",
                              param="type")
        if self.response is not None:
            raise DuplexError("conversation_already_has_active_response",
                              f"response {self.response.id} is still in progress; cancel it "
                              "or wait for response.done")
        if self._generator not in self.stage_names:
            raise DuplexError("capability_unsupported", "this pipeline has no generating stage")
        modalities = tuple(options.output_modalities or self._config.output_modalities)
        check_modalities(modalities, self.caps, param="response.output_modalities")
        tools = reply_tools(self._config, options)
        idle.void(self)
        in_conversation = options.conversation != "none"
        fmt = options.output_format or self._config.output_format
        context = self.context(options)
        # A reply started at the pause with exactly this context (and the
        # session's tools, which it ran with) is used; any other is void --
        # also when this response cannot use it at all (its own tools, or
        # outside the conversation): left running, it would speak unseen and
        # hold this response's request behind it.
        own_tools = options.tools is not None or options.tool_choice is not None
        held = self.speculation.claim(context) if in_conversation and not own_tools else None
        if held is not None:
            self.metrics.speculations.inc(outcome="used")
        else:
            self.discard_speculation()
        response = Response(
            id=held.response_id if held is not None else self.make_id("resp"),
            conversation_id=None if not in_conversation else "conv_" + self.session_id,
            output_modalities=modalities, output_format=fmt.wire(),
            voice=options.voice or self._config.voice,
            max_output_tokens=options.max_output_tokens or self._config.max_output_tokens,
            metadata=options.metadata)
        active = ActiveResponse.after(response, self.make_id("item"), self.conversation,
                                      in_conversation=in_conversation, output_format=fmt)
        active.times = self.latency.response_created(self._now)
        self.response = active
        if "audio" in modalities:
            active.pacer = pacing.new_pacer(self._config.pacing)
        self.emit_all(active.start_events())
        if held is not None:  # its held output goes out now, the rest as it comes
            active.request_id = held.request_id
            for out, decision in held.outputs:
                decisions.apply(self, out, decision, forwarded=True)
            return
        request = reply_request(self.policy, self, active.id, context, options, tools)
        fence = self.fence
        active.request_id = fence.request_id("llm")
        self.latency.reply_started(active.id, self._now, active.times.trace)
        self._effects.append(Submit(self._generator, fence, "llm", request))

    def context(self, options: cmd.ResponseOptions) -> tuple[ContextMessage, ...]:
        """What the model of a response sees (``replies.response_context``)."""
        return response_context(self.policy, self, self.conversation, options)

    def discard_speculation(self) -> bool:
        """One epoch bump: nothing of the held reply reaches the client, its
        request is aborted. False: there was none."""
        if not self.speculation.drop():
            return False
        self.metrics.speculations.inc(outcome="discarded")
        self.bump_epoch()
        return True

    def interrupt(self, reason: InterruptReason) -> None:
        """Barge-in or cancel: one epoch bump, one response.done(cancelled),
        one cancel of the stages -- in that order. Silence comes first: once
        the gate has moved, nothing of the old reply can reach the client, so
        the client need not wait for the stages to finish aborting."""
        active = self.response
        if active is None:
            return
        self.response = None
        fence = self.fence.next_epoch()
        self.gate.advance(fence)
        self.metrics.epoch_bumps.inc()
        self.metrics.interrupts.inc(reason=reason.value)
        if active.barge_pending:
            self.metrics.barge_ins.inc(outcome="interrupted")
        elif reason is InterruptReason.TURN_DETECTED and not self.user.speaking:
            # Not speech over it: the words it answered changed under it.
            self.metrics.visible_revisions.inc()
        heard = active.pacer.heard_ms(self._now) if active.pacer is not None else None
        truncated = (active.cut_to_heard(self._now, heard)
                     if reason is InterruptReason.TURN_DETECTED else None)
        self.emit_all(active.finish(ResponseStatus.CANCELLED,
                                    {"type": "cancelled", "reason": reason.value}))
        if truncated is not None:
            self.emit(truncated)
        self.metrics.cancel_latency.observe(self._now - self._received_at)
        self._effects.append(Cancel(fence))
        for effect in barge_in.stop_timers(active):
            self.effect(effect)

    def finish_response(self) -> None:
        active = self.response
        if active is not None and (active.barge_pending or (
                active.pacer is not None and not active.pacer.drained)):
            # response.done goes after its last audio, and not while speech
            # over it may still cancel it
            active.finish_pending = True
            return
        self.response = None
        if active is not None:
            self.emit_all(active.finish(ResponseStatus.COMPLETED))
            idle.arm(self, active)


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
