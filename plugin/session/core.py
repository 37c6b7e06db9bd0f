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
state -- and it is the ``SessionView`` the policy reads. Stale outputs die
in one place: ``_on_stage_output`` asks the gate before anything else.
Messages and stage payloads are dispatched through type tables.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Collection, Sequence
from typing import Any

from vllm_duplex.core import commands as cmd
from vllm_duplex.core import events as ev
from vllm_duplex.core.close_reason import CloseReason
from vllm_duplex.core.contracts import AppendPlan, FenceBump, InputMode, InterruptReason
from vllm_duplex.core.conversation import (
    ContentPart,
    ConversationItem,
    ItemType,
    Response,
    ResponseStatus,
    Role,
    context_messages,
)
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.fence import Fence
from vllm_duplex.core.gate import FenceGate
from vllm_duplex.core.input_sequence import Accepted, InputSequence
from vllm_duplex.core.metrics import Metrics
from vllm_duplex.core.payloads import (
    ContextMessage,
    GenerateRequest,
    StageFailed,
    StageOutput,
    TextIn,
)
from vllm_duplex.core.session_config import SessionConfig, session_wire
from vllm_duplex.media.audio import AudioEncoder
from vllm_duplex.policy import ModelPolicy
from vllm_duplex.session import rendering
from vllm_duplex.session.effects import (
    AckEvents,
    Cancel,
    Close,
    DecodeImage,
    Effect,
    Emit,
    Failed,
    FeedVideo,
    Forward,
    FrameDecoded,
    PollVideo,
    Submit,
)
from vllm_duplex.session.input_buffer import InputBuffer
from vllm_duplex.session.items import ItemStore
from vllm_duplex.session.limits import SessionLimits
from vllm_duplex.session.responses import ActiveResponse
from vllm_duplex.session.user_turn import UserTurn
from vllm_duplex.session.video_input import VideoAdmission, data_url_bytes

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
        self._config = config
        self.policy = policy
        self.caps = policy.capabilities()
        self.metrics = metrics
        self.limits = limits
        self.extra_wire = extra_wire or {}
        self.make_id = make_id
        self.gate = FenceGate(Fence(session_id))
        self.stage_names = frozenset(stage_names)
        self._generator = policy.stage_needs().generator
        self._policy_state = policy.new_state()
        self._seq = 0
        self._input_seq = InputSequence(max_chunk_bytes=1 << 62, max_total_bytes=1 << 62)
        self.conversation = ItemStore(limits.max_items)
        self.input = InputBuffer(config.input_format, max_ms=limits.max_buffer_ms)
        self.user = UserTurn(make_id)
        self.video = VideoAdmission(limits.video, started_at=now)
        self.response: ActiveResponse | None = None
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

    # ---- what the runner reads -------------------------------------------

    @property
    def last_input_seq(self) -> int:
        """The last numbered input chunk accepted (a resumed client resends after it)."""
        return self._input_seq.next_seq - 1

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
            self._execute(self.policy.plan_append(self, self.user.vad_config(self._config)))
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

    # ---- for the core's own modules (rendering) ----------------------------

    @property
    def now(self) -> float:
        """The time of the message being handled."""
        return self._now

    def emit(self, event: ev.ServerEvent) -> None:
        self._seq += 1
        self._effects.append(Emit(ev.Envelope(self._seq, self.gate.fence, event)))

    def emit_all(self, events: Sequence[ev.ServerEvent]) -> None:
        for event in events:
            self.emit(event)

    def error(self, err: DuplexError) -> None:
        self.metrics.errors.inc(code=err.code)
        self.emit(ev.ErrorEvent(error=err))

    def _execute(self, plan: AppendPlan, *, ingest: bool = False) -> None:
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
        self.gate.advance(fence)
        self.metrics.epoch_bumps.inc()
        self._effects.append(Cancel(fence))

    # ---- client commands --------------------------------------------------

    def _on_append(self, c: cmd.AudioAppend) -> None:
        # Numbered chunks (CONFORMANCE 23): a duplicate (a resend after a
        # resume) is ignored, a gap is refused naming the expected seq.
        if c.seq is None or self._input_seq.accept(c.seq, 0) is Accepted.NEW:
            self._append_audio(c.audio)

    def _append_audio(self, data: bytes) -> None:
        chunk = self.input.append(data)
        if chunk is None:
            return
        td = self._config.turn_detection
        if td is not None and not self.user.speaking:
            self.input.trim_idle(td.prefix_padding_ms)
        self._execute(self.policy.plan_append(self, chunk), ingest=True)

    def _on_commit(self, c: cmd.AudioCommit) -> None:
        if self.input.samples == 0:
            raise DuplexError("input_audio_buffer_empty",
                              "the input audio buffer is empty: append audio before committing")
        self._commit_input()

    def _commit_input(self) -> None:
        audio, errors = self.input.commit()
        for err in errors:  # e.g. an odd PCM16 byte count: reported, the turn is kept
            self.error(err)
        item, committed = self.user.commit(audio)
        previous = self.conversation.insert(item)
        self.emit(ev.InputAudioBufferCommitted(item_id=item.id, previous_item_id=previous))
        self.emit(ev.ConversationItemAdded(item=item.wire(), previous_item_id=previous))
        self.emit(ev.ConversationItemDone(item=item.wire(), previous_item_id=previous))
        self._execute(self.policy.plan_append(self, committed))

    def _on_clear(self, c: cmd.AudioClear) -> None:
        self.input.clear()
        self.emit(ev.InputAudioBufferCleared())

    def _on_update(self, c: cmd.SessionUpdate) -> None:
        try:
            new = self._config.apply(c.patch)
        except ValueError as exc:
            name = str(exc)
            raise DuplexError("immutable_field", f"{name} cannot change after the session opened",
                              param=f"session.{name}") from None
        td = new.turn_detection
        if td is not None and td.type not in self.caps.turn_detection:
            raise DuplexError("unsupported_turn_detection",
                              f"turn_detection {td.type!r} is not supported by policy {self.policy.name!r}",
                              param="session.audio.input.turn_detection.type")
        unsupported = set(new.output_modalities) - self.caps.output_modalities
        if unsupported:
            raise DuplexError("invalid_value", f"output modalities {sorted(unsupported)} unsupported",
                              param="session.output_modalities")
        old = self._config
        self._config = new
        self.input.set_format(new.input_format)
        if td is not None and td != old.turn_detection:
            self._execute(self.policy.plan_append(self, self.user.vad_config(new)))
        self.emit(ev.SessionUpdated(session=self.session_object()))

    def _on_response_create(self, c: cmd.ResponseCreate) -> None:
        self._create_response(c.options)

    def _on_response_cancel(self, c: cmd.ResponseCancel) -> None:
        active = self.response
        if active is None or (c.response_id and c.response_id != active.id):
            raise DuplexError("response_cancel_not_active",
                              "there is no active response to cancel", param="response_id")
        self._interrupt(InterruptReason.CLIENT_CANCELLED)

    def _on_item_create(self, c: cmd.ItemCreate) -> None:
        item = c.item
        if item.id and self.conversation.has(item.id):
            raise DuplexError("invalid_value", f"an item with id {item.id!r} already exists",
                              param="item.id")
        if not item.id:
            item.id = self.make_id("item")
        previous = self.conversation.insert(item, after=c.previous_item_id)
        self.emit(ev.ConversationItemAdded(item=item.wire(), previous_item_id=previous))
        self.emit(ev.ConversationItemDone(item=item.wire(), previous_item_id=previous))
        if item.type is ItemType.MESSAGE and item.role is Role.USER and item.text():
            self._execute(self.policy.plan_append(self, TextIn(item.text())))
        for part in item.content if item.role is Role.USER else ():
            if part.type == "input_image" and part.image_url:
                self._need_video()
                data = data_url_bytes(part.image_url)
                ts = self.video.image(self._now, len(data))
                self._effects.append(DecodeImage(data, ts, "image", c.event_id))

    def _on_item_retrieve(self, c: cmd.ItemRetrieve) -> None:
        self.emit(ev.ConversationItemRetrieved(item=self.conversation.get(c.item_id).wire()))

    def _on_item_delete(self, c: cmd.ItemDelete) -> None:
        self.conversation.delete(c.item_id)
        if self.response is not None and self.response.item.id == c.item_id:
            self.response.in_conversation = False  # no item.done for a deleted item
        self.emit(ev.ConversationItemDeleted(item_id=c.item_id))

    def _on_item_truncate(self, c: cmd.ItemTruncate) -> None:
        self.conversation.truncate(c.item_id, c.content_index, c.audio_end_ms)
        self.emit(ev.ConversationItemTruncated(item_id=c.item_id, content_index=c.content_index,
                                                audio_end_ms=c.audio_end_ms))

    def _on_duplex_input(self, c: cmd.DuplexInput) -> None:
        if not self.caps.supports(c.mode):
            raise DuplexError("capability_unsupported",
                              f"input mode {c.mode.value!r} is not supported by policy "
                              f"{self.policy.name!r}", param="mode")
        if c.mode is InputMode.APPEND_AUDIO_CHUNK and c.audio is not None:
            self._append_audio(c.audio)
        elif c.mode is InputMode.TURN_COMMIT_ONLY:
            self._on_commit(cmd.AudioCommit(event_id=c.event_id))
        elif c.mode is InputMode.APPEND_TOKENS and c.text:
            item = ConversationItem(id="", type=ItemType.MESSAGE, role=Role.USER,
                                    content=[ContentPart(type="input_text", text=c.text)])
            self._on_item_create(cmd.ItemCreate(item=item, event_id=c.event_id))
        else:  # the policy owns the meaning of the advanced modes
            self._execute(self.policy.plan_append(self, c), ingest=True)

    def _on_event_ack(self, c: cmd.EventAck) -> None:
        self._effects.append(AckEvents(c.seq))

    def _on_close(self, c: cmd.SessionClose) -> None:
        reason = CloseReason(c.reason)
        self.emit(ev.SessionClosed(reason=reason.value))
        self._effects.append(Close(reason))  # nothing queued behind the close may run

    # ---- video ------------------------------------------------------------

    def _need_video(self) -> None:
        if "video" not in self.caps.input_modalities:
            raise DuplexError("capability_unsupported", f"policy {self.policy.name!r} takes no "
                              "video or images", param="type")

    def _on_video_frame(self, c: cmd.VideoFrameIn) -> None:
        self._need_video()
        ts = self.video.frame(self._now, len(c.image), c.timestamp_ms)
        if ts is not None:
            self._effects.append(DecodeImage(c.image, ts, "frame", c.event_id))

    def _on_video_chunk(self, c: cmd.VideoChunkIn) -> None:
        self._need_video()
        self.video.chunk(self._now, len(c.data))
        self._effects.append(FeedVideo(c.data, c.container, c.event_id))

    def _on_video_decoded(self, c: cmd.VideoDecoded) -> None:
        self._effects.append(PollVideo())

    def _on_frame(self, m: FrameDecoded) -> None:
        self._execute(self.policy.plan_append(self, m.frame))

    def _on_failed(self, m: Failed) -> None:
        self.error(m.error)

    # ---- responses --------------------------------------------------------

    def _create_response(self, options: cmd.ResponseOptions) -> None:
        if self.response is not None:
            raise DuplexError("conversation_already_has_active_response",
                              f"response {self.response.id} is still in progress; cancel it "
                              "or wait for response.done")
        if self._generator not in self.stage_names:
            raise DuplexError("capability_unsupported", "this pipeline has no generating stage")
        modalities = tuple(options.output_modalities or self._config.output_modalities)
        unsupported = set(modalities) - self.caps.output_modalities
        if unsupported:
            raise DuplexError("invalid_value", f"output modalities {sorted(unsupported)} unsupported",
                              param="response.output_modalities")
        in_conversation = options.conversation != "none"
        response = Response(
            id=self.make_id("resp"),
            conversation_id=None if not in_conversation else "conv_" + self.session_id,
            output_modalities=modalities, output_format=self._config.output_format.wire(),
            voice=self._config.voice,
            max_output_tokens=options.max_output_tokens or self._config.max_output_tokens,
            metadata=options.metadata)
        context = self.context(options)
        last = self.conversation.last
        active = ActiveResponse(response, self.make_id("item"), in_conversation=in_conversation,
                                previous_item_id=last.id if last else None,
                                encoder_factory=self._encoder)
        self.response = active
        if in_conversation:
            self.conversation.append(active.item)
        self.emit_all(active.start_events())
        sampling = self.policy.configure_sampling_params(self, options)
        request = GenerateRequest(response_id=active.id, context=context, sampling=sampling,
                                  tools=self._config.tools, tool_choice=self._config.tool_choice)
        fence = self.fence
        active.request_id = fence.request_id("llm")
        self._effects.append(Submit(self._generator, fence, "llm", request))

    def _encoder(self, rate: int) -> AudioEncoder:
        return AudioEncoder(self._config.output_format, in_rate=rate)

    def context(self, options: cmd.ResponseOptions) -> tuple[ContextMessage, ...]:
        """What the model of a response sees (the policy shapes it last)."""
        messages = context_messages(self.conversation,
                                    options.instructions or self._config.instructions)
        return self.policy.shape_context(self, messages)

    def _interrupt(self, reason: InterruptReason) -> None:
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
        truncated = self._truncate_to_heard(active) if reason is InterruptReason.TURN_DETECTED else None
        self.emit_all(active.finish(ResponseStatus.CANCELLED,
                                     {"type": "cancelled", "reason": reason.value}))
        if truncated is not None:
            self.emit(truncated)
        self.metrics.cancel_latency.observe(self._now - self._received_at)
        self._effects.append(Cancel(fence))

    def _truncate_to_heard(self, active: ActiveResponse) -> ev.ServerEvent | None:
        """Barge-in: the client plays audio in real time from the first delta,
        so it cannot have heard more than the time since then. Cut the
        assistant item to those words, so the next turn's context holds only
        what the user heard (a client that knows better sends truncate)."""
        if not active.audio or active.first_audio_at is None:
            return None
        part = active.part
        heard_ms = min(part.audio_ms, int((self._now - active.first_audio_at) * 1000))
        part.transcript = active.text = part.heard_text(heard_ms)
        part.audio_ms = heard_ms
        if not active.in_conversation:
            return None
        return ev.ConversationItemTruncated(item_id=active.item.id, content_index=0,
                                            audio_end_ms=heard_ms)

    def _finish_response(self) -> None:
        active, self.response = self.response, None
        if active is not None:
            self.emit_all(active.finish(ResponseStatus.COMPLETED))

    # ---- stage outputs ----------------------------------------------------

    def _on_stage_output(self, out: StageOutput) -> None:
        if not self.gate.admit(out):  # the one place stale outputs are dropped
            self.metrics.stale_dropped.inc(stage=out.stage)
            return
        payload = out.payload
        if type(payload) is StageFailed and payload.error.spec.terminal:
            # e.g. engine_dead: one terminal error, then the session ends
            # (whatever the policy would have decided).
            rendering.render(self, payload)
            self._effects.append(Close(CloseReason(payload.error.code)))
            return
        decision = self.policy.decide_output(self, out)
        if decision.emit:
            rendering.render(self, payload if decision.render is None else decision.render)
        if decision.plan is not None:
            self._execute(decision.plan)
        if decision.interrupt is not None:
            self._interrupt(decision.interrupt)
        if decision.forward:
            self._effects.append(Forward(out))
        if decision.commit_turn and self.input.samples > 0:
            self._commit_input()
        if decision.create_response and self.response is None:
            self._create_response(cmd.ResponseOptions())
        if decision.finish_response:
            self._finish_response()


# What handles each message, by its exact type (the codec and the runner make
# exactly these classes).
_HANDLERS: dict[type, Callable[[SessionCore, Any], None]] = {
    StageOutput: SessionCore._on_stage_output,
    cmd.AudioAppend: SessionCore._on_append,
    cmd.AudioCommit: SessionCore._on_commit,
    cmd.AudioClear: SessionCore._on_clear,
    cmd.SessionUpdate: SessionCore._on_update,
    cmd.ResponseCreate: SessionCore._on_response_create,
    cmd.ResponseCancel: SessionCore._on_response_cancel,
    cmd.ItemCreate: SessionCore._on_item_create,
    cmd.ItemRetrieve: SessionCore._on_item_retrieve,
    cmd.ItemDelete: SessionCore._on_item_delete,
    cmd.ItemTruncate: SessionCore._on_item_truncate,
    cmd.DuplexInput: SessionCore._on_duplex_input,
    cmd.VideoFrameIn: SessionCore._on_video_frame,
    cmd.VideoChunkIn: SessionCore._on_video_chunk,
    cmd.VideoDecoded: SessionCore._on_video_decoded,
    cmd.EventAck: SessionCore._on_event_ack,
    cmd.SessionClose: SessionCore._on_close,
    FrameDecoded: SessionCore._on_frame,
    Failed: SessionCore._on_failed,
}
