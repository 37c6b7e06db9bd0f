"""``SessionCore``: one realtime session as a state machine without I/O.

``handle(message, now)`` takes one message -- a client command, a stage
output, or what the runner reports back (``FrameDecoded``, ``Failed``) --
and returns the effects it causes, in order (``effects.py``): events to
emit, submissions, forwards and cancels for the pipeline, a close. It never
awaits and never blocks, so the runner can keep serving the mailbox while
the stages work; a test drives it with messages and a clock value and
checks the exact effects (``tests/unit/test_session_core.py``), the way
python-websockets tests its ``Protocol`` with bytes.

It is the single writer of the session's state -- the fence (moved by its
one ``FenceMover``, ``fences.py``, which it lends the floor), config, the
policy's per-session state -- and it is the ``SessionView`` the policy
reads. The parts own the rest and never hold the core: the turn's phase and
the one reply (``Floor``, ``floor.py``, which it alone calls), the input
side the client writes (``ClientCommands``, ``client_commands.py``), the
pause (``Pauses``, ``pauses.py``, with ``turn_end.py``'s judge), the chain
stage outputs walk (``OutputChain``, ``decisions.py``: the gate first, so
stale outputs die in one place; then the held reply, the turn end and the
policy), the reply (``reply.py``), pacing (``pacing.py``), barge-in timers
(``barge_in.py``), the idle timeout (``idle.py``), the session's maximum
length (``lifetime.py``), what an output shows (``rendering.py``) and a
reply's request (``replies.py``). A part returns what it causes, in order:
events, effects, and asks (``asks.py``) for what only the core does --
ask the policy and carry out its steps, make a user item or a response,
start, claim or end a reply -- which ``carry`` carries out by one table
(``carrying.py``), the policy's steps (``domain/contracts.py``) among them.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Callable, Collection, Iterable
from typing import Any

from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.backchanneling import Backchanneling
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.contracts import AppendPlan, FenceBump
from vllm_duplex.domain.conversation import ConversationItem
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.gate import FenceGate
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import (
    AsrConfig,
    BackchannelAudio,
    ContextMessage,
    StageFailed,
    StageOutput,
    ToolCall,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.session_config import SessionConfig, session_wire, updated_config
from vllm_duplex.policy import ModelPolicy
from vllm_duplex.session import backchannel, barge_in, hearing, idle, lifetime, pacing, turn_end
from vllm_duplex.session.carrying import CarriesAsks
from vllm_duplex.session.client_commands import COMMANDS, ClientCommands
from vllm_duplex.session.decisions import OutputChain
from vllm_duplex.session.effects import (
    AckEvents,
    Close,
    Effect,
    EffectLog,
    Failed,
    FrameDecoded,
    Submit,
    TimerFired,
)
from vllm_duplex.session.input_buffer import InputBuffer
from vllm_duplex.session.items import ItemStore
from vllm_duplex.session.latency import TurnLatency
from vllm_duplex.session.limits import SessionLimits
from vllm_duplex.session import mcp_calls
from vllm_duplex.session.fences import FenceMover
from vllm_duplex.session.floor import Floor
from vllm_duplex.session.pauses import Pauses
from vllm_duplex.session.replies import (
    check_response,
    reply_context,
    reply_request,
    reply_tools,
    response_context,
)
from vllm_duplex.session.reply import End
from vllm_duplex.session.turn_end import Pause
from vllm_duplex.session.user_turn import UserTurn
from vllm_duplex.session.video_input import VideoAdmission
from vllm_duplex.session.view import SessionViewOfParts

log = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(12)}"


class SessionCore(SessionViewOfParts, CarriesAsks):
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
        asr_languages: frozenset[str] | None = None,
        says_clips: bool | None = None,
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
        self.fences = FenceMover(self.gate, metrics)  # the one mover: the core's plans, the floor
        self.stage_names = frozenset(stage_names)
        needs = policy.stage_needs()
        self._generator = needs.generator
        # The transcription prompt reaches an ASR stage where the policy routes one.
        self._asr_configurable = any(issubclass(AsrConfig, kinds) for kinds in needs.sends.values())
        self._asr_languages = asr_languages  # what the ASR hears (None: any)
        # Whether the pipeline's TTS stage makes backchannel clips (None: one named "tts" does).
        self._says_clips = backchannel.STAGE in self.stage_names if says_clips is None else says_clips
        self._policy_state = policy.new_state()
        self.out = EffectLog(self.gate, now)
        self.conversation = ItemStore(limits.max_items)
        self.input = InputBuffer(config.input_format, max_ms=limits.max_buffer_ms,
                                 clock=lambda: self.out.received_at)
        self.input.set_noise_reduction(config.noise_reduction)
        self.input.set_echo_cancellation(config.echo_cancellation, config.output_format)
        self.user = UserTurn(make_id)
        self.video = VideoAdmission(limits.video, started_at=now)
        self.latency = TurnLatency(metrics.stage_latency, metrics.critical_path)
        self.pauses = Pauses(latency=self.latency, metrics=metrics, session_id=session_id)
        self.idle = idle.IdleTimer()  # server_vad's idle_timeout_ms
        self.backchannels = backchannel.Backchannels(make_id, metrics)  # the engine's "mm-hmm"
        # The turn's phase and the one reply (held or shown).
        self.floor = Floor(self.out, self.fences, config=config, metrics=metrics,
                           generator=self._generator,
                           latency=self.latency, conversation=self.conversation, user=self.user,
                           pause=self.pauses.pause, idle_timer=self.idle, make_id=make_id,
                           session_id=session_id)
        self.commands = ClientCommands(self.out, self.floor, input_buffer=self.input,
                                       conversation=self.conversation, user=self.user,
                                       video=self.video, latency=self.latency, caps=self.caps,
                                       policy_name=policy.name, make_id=make_id)
        self.chain = OutputChain(self.gate, self.floor, self.pauses, metrics=metrics)
        # Remote MCP servers: their listings, calls and approvals (mcp_calls.py).
        self.mcp = mcp_calls.McpCalls(self.floor, conversation=self.conversation, make_id=make_id)
        # What a fired timer (effects.ArmTimer) runs, by name.
        self.timers: dict[str, Callable[[], None]] = {
            turn_end.TIMER: lambda: self.carry(self.pauses.due(self._config, self.now)),
            pacing.PACING: lambda: self.carry(self.floor.send_due()),
            barge_in.BARGE_IN: lambda: self.carry(self.floor.barge_in_due()),
            idle.IDLE: self._idle_due,
            backchannel.TIMER: lambda: self.carry(self.backchannels.due(
                self.now, **self._backchannel_state())),
            lifetime.WARNING: lambda: self.emit(lifetime.warning(self.limits)),
            lifetime.END: self._expired}

    # ---- what the runner reads -------------------------------------------

    @property
    def pause(self) -> Pause:
        """The pause being heard or judged (semantic_vad holds its end of speech)."""
        return self.pauses.pause

    @property
    def last_input_seq(self) -> int:
        """The last numbered input chunk accepted (a resumed client resends after it)."""
        return self.commands.input_seq.next_seq - 1

    def session_object(self) -> dict[str, Any]:
        extra = {"policy": self.policy.name, "capabilities": self.caps.wire(),
                 "fence": self.fence.wire(), **self.extra_wire}
        return session_wire(self._config, session_id=self.session_id, extra=extra)

    def snapshot(self) -> dict[str, Any]:
        """What a client that must resync starts again from."""
        return {"session": self.session_object(), "items": [i.wire() for i in self.conversation],
                "active_response_id": self.active_response_id}

    def restore(self, items: Iterable[ConversationItem], fence: Fence, last_input_seq: int) -> None:
        """Rebuild a session whose owner died from its stored state, before
        ``start``: its conversation as the client got it (the LLM context is
        built from it again at the next reply), one incarnation past the
        ``fence`` the owner reached (whatever the old owner's stages still
        make is stale here), and numbered input going on after
        ``last_input_seq`` (a resend of it is a duplicate, a chunk past the
        next one a gap, as before)."""
        for item in items:
            self.conversation.append(item)
        self.fences.restore(fence.next_incarnation())
        self.commands.input_seq.next_seq = last_input_seq + 1

    # ---- messages in, effects out -----------------------------------------

    def start(self, resume_token: str, now: float) -> list[Effect]:
        """The session's first effects: ``session.created``, and the VAD's
        configuration. Errors propagate: a session that cannot start is not
        admitted."""
        self.out.now = self.out.received_at = now
        self._check_hearing(self._config)
        backchannel.check(self._config, self._says_clips)
        self.emit(ev.SessionCreated(session=self.session_object(), resume_token=resume_token))
        self.carry(self.mcp.configure(self._config, starting=True))  # its MCP servers are listed
        if self._config.turn_detection is not None:
            self.execute(self.policy.plan_append(self, self.user.vad_config(self._config)))
        self._configure_asr(AsrConfig())
        self.carry(lifetime.arm(self.limits, now))
        self.carry(backchannel.prepare(None, self._config, self.gate.fence))
        return self._take()

    def handle(self, message: object, now: float, received_at: float | None = None) -> list[Effect]:
        """The effects of ``message`` (``received_at``: when it entered the
        mailbox; latencies are measured from there). A client's mistake
        becomes an error event echoing its ``event_id``; a bug in one
        command becomes ``internal_error`` and the session goes on."""
        self.out.now = now
        self.out.received_at = now if received_at is None else received_at
        try:
            handler = _HANDLERS.get(type(message))
            if handler is None:
                raise DuplexError("unknown_event", f"unhandled command {type(message).__name__}")
            held = self.mcp.hold(message)  # a response whose own MCP servers are listed first
            if held is None:
                handler(self, message)
            else:
                self.carry(held)
            self.carry(self.mcp.after(message, self._config))
        except DuplexError as err:
            self.error(err.with_event_id(getattr(message, "event_id", None)))
        except Exception:  # contained: one bad command must not end the session
            log.exception("session %s failed on %r", self.session_id, type(message).__name__)
            self.error(DuplexError("internal_error", "internal error handling the event",
                                   event_id=getattr(message, "event_id", None)))
        return self._take()

    def _take(self) -> list[Effect]:
        effects = self.out.take()
        self.input.sent(effects, self.out.now)  # the echo canceller's reference (session/echo.py)
        return effects

    # ---- the operations the core's own modules compose -----------------------

    @property
    def now(self) -> float:
        """The time of the message being handled."""
        return self.out.now

    @property
    def received_at(self) -> float:
        """When the message being handled entered the mailbox."""
        return self.out.received_at

    def effect(self, effect: Effect) -> None:
        self.out.add(effect)

    def emit(self, event: ev.ServerEvent) -> None:
        self.out.emit(event)

    def error(self, err: DuplexError) -> None:
        self.metrics.errors.inc(code=err.code)
        self.emit(ev.ErrorEvent(error=err))

    def fail(self, err: DuplexError) -> None:
        """A stage failed: the client hears of it, and the reply shown fails."""
        self.error(err)
        if self.floor.shown is not None:
            self.carry(self.floor.end(End.FAILED, error=err.to_wire()))

    def execute(self, plan: AppendPlan, *, ingest: bool = False) -> None:
        """Carry out a policy plan: move the fence first, then submit.
        ``ingest``: the plan answers client input (its latency is measured)."""
        if plan.bump is FenceBump.INCARNATION:
            self._advance(self.fence.next_incarnation())
        elif plan.bump is FenceBump.EPOCH:
            self._advance(self.fence.next_epoch())
        fence = self.gate.fence
        for sub in plan.submissions:
            self.out.add(Submit(sub.stage, fence, sub.role, sub.payload))
        if ingest and plan.submissions:
            self.metrics.ingest_latency.observe(self.out.now - self.out.received_at)

    def _advance(self, fence: Fence) -> None:
        """A plan moved the fence: every output under way is void (the gate
        drops it, the stages abort it), and so is the reply: a held one ends
        unseen, a shown one is cut to what was heard (its context changed
        under it) -- never left waiting for outputs the gate now drops."""
        self.out.add(self.fences.bump(fence))
        if self.floor.reply is not None:
            self.carry(self.floor.end(End.TURN_DETECTED if self.floor.shown else End.DISCARDED,
                                      voided=True))

    def commit_input(self) -> None:
        """The input buffer becomes a user item (a commit, or server VAD's end of turn)."""
        audio, errors = self.input.commit()
        for err in errors:  # e.g. an odd PCM16 byte count: reported, the turn is kept
            self.error(err)
        item, committed = self.user.commit(audio, self.input.written_ms)
        self.carry(self.backchannels.turn_ended())
        self.latency.committed(self.out.now)
        previous = self.conversation.insert(item)
        self.emit(ev.InputAudioBufferCommitted(item_id=item.id, previous_item_id=previous))
        self.emit(ev.ConversationItemAdded(item=item.wire(), previous_item_id=previous))
        self.emit(ev.ConversationItemDone(item=item.wire(), previous_item_id=previous))
        self.execute(self.policy.plan_append(self, committed))

    # ---- session-level messages ---------------------------------------------

    def _on_update(self, c: cmd.SessionUpdate) -> None:
        old, new = self._config, updated_config(self._config, c.patch, self.caps, self.policy.name)
        self._check_hearing(new)  # refused whole: the old config stays
        backchannel.check(new, self._says_clips)
        self.input.set_echo_cancellation(new.echo_cancellation, new.output_format)  # (or refused)
        self._config = self.floor.config = new
        self.input.set_format(new.input_format)
        self.input.set_noise_reduction(new.noise_reduction)
        if new.turn_detection is not None and (new.turn_detection != old.turn_detection
                                               or new.echo_cancellation != old.echo_cancellation):
            self.execute(self.policy.plan_append(self, self.user.vad_config(new)))
        self._configure_asr(hearing.asr_config(old))
        self.carry(backchannel.prepare(old.backchannels, new, self.gate.fence))
        self.emit(ev.SessionUpdated(session=self.session_object()))
        self.carry(self.mcp.configure(self._config))

    def _check_hearing(self, config: SessionConfig) -> None:
        hearing.check_language(config, configurable=self._asr_configurable,
                               languages=self._asr_languages)

    def _configure_asr(self, old: AsrConfig) -> None:
        """Tell the ASR the session's transcription prompt and language when they changed."""
        new = hearing.asr_config(self._config)
        if self._asr_configurable and new != old:
            self.execute(self.policy.plan_append(self, new))

    def _on_event_ack(self, c: cmd.EventAck) -> None:
        self.out.add(AckEvents(c.seq))

    def _on_close(self, c: cmd.SessionClose) -> None:
        reason = CloseReason(c.reason)
        self.emit(ev.SessionClosed(reason=reason.value))
        self.out.add(Close(reason))  # nothing queued behind the close may run

    # ---- what the runner reports back ---------------------------------------

    def _on_frame(self, m: FrameDecoded) -> None:
        self.execute(self.policy.plan_append(self, m.frame))

    def _on_failed(self, m: Failed) -> None:
        self.error(m.error)

    def _on_timer(self, m: TimerFired) -> None:
        fire = self.timers.get(m.name)
        if fire is not None:
            fire()

    def _on_command(self, c: object) -> None:
        self.carry(self.commands.handle(c, self._config))

    def _on_stage_output(self, out: StageOutput) -> None:
        if type(out.payload) is BackchannelAudio:  # the engine's own: no reply, no policy
            if self.gate.admit(out):
                self.carry(self.backchannels.clip(
                    out.payload, self._config.output_format, replying=self.floor.reply is not None))
            return
        self.carry(self.chain.walk(out, self._config, self.now))
        self._hear_for_backchannels(out.payload)

    # ---- the engine's backchannels (backchannel.py) ------------------------------

    def _backchanneling(self) -> Backchanneling | None:
        """The session's backchannel settings where they apply: a session that
        speaks, with a semantic end of turn to say the user is not done."""
        c = self._config
        td = c.turn_detection
        if (c.backchannels is None or not c.responds or "audio" not in c.output_modalities
                or td is None or not td.semantic):
            return None
        return c.backchannels

    def _backchannel_state(self) -> dict[str, Any]:
        return {"settings": self._backchanneling(), "replying": self.floor.reply is not None,
                "fence": self.gate.fence}

    def _hear_for_backchannels(self, payload: object) -> None:
        """What a backchannel waits on, after the chain took the output: the
        VAD's onsets and held pauses, and the pause's judgement."""
        kind, bc = type(payload), self.backchannels
        if kind is VadSpeechStarted:
            self.carry(bc.speech_started(payload.audio_ms))  # type: ignore[attr-defined]
        elif kind is VadSpeechStopped and self.pause.pausing:
            self.carry(bc.paused(payload.audio_ms, self.now,  # type: ignore[attr-defined]
                                 self._backchanneling()))
        if bc.pending and (p := self.pause.decider.judged) is not None:
            d = self.pause.decider
            self.carry(bc.judged(p, d.heard_text or d.text, self.now, **self._backchannel_state()))

    def _idle_due(self) -> None:
        """The idle timeout passed in silence: the user is prompted to go on."""
        prompt = idle.due(self.idle, self._config, self.now, replying=self.floor.shown is not None,
                          user=self.user, written_ms=self.input.written_ms)
        if prompt is not None:
            self.emit(prompt)
            self.commit_input()
            self.create_response(cmd.ResponseOptions())

    def _expired(self) -> None:
        """The session reached its maximum length."""
        self.error(lifetime.expired(self.limits))
        self.emit(ev.SessionClosed(reason=CloseReason.MAX_DURATION.value))
        self.out.add(Close(CloseReason.MAX_DURATION))

    def speculate(self, words: str) -> None:
        """Answer ``words`` (the user's turn so far) ahead of the commit, held."""
        td, config = self._config.turn_detection, self._config
        if (self.floor.reply is not None or not words.strip() or not config.responds
                or td is None or not td.create_response or self._generator not in self.stage_names):
            return
        options = cmd.ResponseOptions()
        context = reply_context(self.policy, self, self.conversation.snapshot(),
                                config.instructions, (ContextMessage("user", words),))
        reply_id = self.make_id("resp")
        request = reply_request(self.policy, self, reply_id, context, options,
                                reply_tools(config, options))
        self.carry(self.floor.speculate(reply_id, request, words, context))

    def show(self, payload: object) -> None:
        """A stage failure is an error that fails the reply; the floor shows the rest."""
        if type(payload) is StageFailed:
            self.fail(payload.error)
        elif type(payload) is ToolCall and (steps := self.mcp.takes(payload)) is not None:
            self.carry(steps)  # a listed MCP tool: the engine calls it (mcp_calls.py)
        else:
            self.carry(self.floor.show(payload))

    # ---- a reply asked for (the floor starts, claims and ends it) ---------------

    def create_response(self, options: cmd.ResponseOptions, *,
                        mcp_tools: dict[str, Any] | None = None, follows_up: bool = False) -> None:
        """A response (``mcp_tools``: what its own MCP servers offer;
        ``follows_up``: it answers MCP calls' results; ``mcp_calls.py``)."""
        if not self._config.responds:
            raise DuplexError("capability_unsupported", "a transcription session makes no "
                              "responses (open a realtime session to get answers)",
                              param="type")
        if self.floor.shown is not None:
            raise DuplexError("conversation_already_has_active_response",
                              f"response {self.floor.shown.id} is still in progress; cancel it "
                              "or wait for response.done")
        if self._generator not in self.stage_names:
            raise DuplexError("capability_unsupported", "this pipeline has no generating stage")
        check_response(self._config, self.caps, options)
        tools = reply_tools(self._config, options)
        for effect in idle.void(self.idle):
            self.out.add(effect)
        context = response_context(self.policy, self, self.conversation, options)
        held, steps = self.floor.respond(options, context, lambda reply_id: reply_request(
            self.policy, self, reply_id, context, options, tools), mcp_tools=mcp_tools,
            follows_up=follows_up)
        self.carry(steps)
        self.release(held)  # its held outputs go out now, the rest as they come


# What handles each message, by its exact type (the codec and the runner make
# exactly these classes): the client's commands, then the session's own.
_HANDLERS: dict[type, Callable[[SessionCore, Any], None]] = {
    **{kind: SessionCore._on_command for kind in COMMANDS},
    StageOutput: SessionCore._on_stage_output,
    cmd.SessionUpdate: SessionCore._on_update,
    cmd.EventAck: SessionCore._on_event_ack,
    cmd.SessionClose: SessionCore._on_close,
    FrameDecoded: SessionCore._on_frame,
    Failed: SessionCore._on_failed,
    TimerFired: SessionCore._on_timer,
    mcp_calls.McpToolsListed: lambda core, m: core.carry(core.mcp.listed(m, core.config)),
    mcp_calls.McpToolCalled: lambda core, m: core.carry(core.mcp.called(m)),
}
