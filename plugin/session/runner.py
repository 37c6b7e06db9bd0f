"""``DuplexSession``: one realtime session, mutated by exactly one task.

Client commands and stage outputs both arrive through the session's
``Mailbox``; its control lane overtakes queued audio, so a cancel or a close
never waits behind audio decoding. The runner task is the only writer of the
session's state (fence, conversation, input buffer, active response); the
transport only enqueues commands and drains the ``Attachment`` of its socket
(``vllm_duplex.replay.outbox``: the journal and the socket attached now).

Stale outputs are dropped in one place: ``_on_stage_output`` asks the
session's ``FenceGate`` before anything else.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm_duplex.core import commands as cmd
from vllm_duplex.core import events as ev
from vllm_duplex.core.clock import Clock
from vllm_duplex.core.contracts import (
    AppendPlan,
    FenceBump,
    InputMode,
    InterruptReason,
    TurnCommitted,
)
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
    INTERNAL_RATE,
    AudioOut,
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    SceneDescription,
    SpeechDone,
    StageFailed,
    StageOutput,
    TextDelta,
    TextIn,
    ToolCall,
    TranscriptDelta,
    TranscriptFinal,
    VadConfig,
    VadSpeechStarted,
    VadSpeechStopped,
    VideoFrame,
)
from vllm_duplex.core.session_config import SessionConfig, session_wire
from vllm_duplex.media.audio import AudioEncoder
from vllm_duplex.policy import ModelPolicy
from vllm_duplex.replay.journal import Journal, JournalBudget, Replay
from vllm_duplex.replay.outbox import Attachment, Outbox, OutboxLimits
from vllm_duplex.session.input_buffer import InputBuffer
from vllm_duplex.session.mailbox import (
    Lane,
    Mailbox,
    MailboxClosed,
    MailboxFull,
    lane_of,
)
from vllm_duplex.session.responses import ActiveResponse
from vllm_duplex.session.video_input import VideoIntake, VideoLimits, data_url_bytes
from vllm_duplex.stages.pipeline import Pipeline
from vllm_duplex.stages.port import Stage

log = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(12)}"


@dataclass(frozen=True)
class SessionLimits:
    mailbox_capacity: int = 1024  # queued client data commands
    outbound_capacity: int = 8192  # events waiting for a slow socket
    outbound_bytes: int = 16 << 20
    journal_events: int = 4096  # recent events kept for replay
    journal_bytes: int = 8 << 20
    journal_age_s: float = 300.0
    survives_disconnect: bool = False  # detach (and await a resume) instead of closing
    video: VideoLimits = VideoLimits()
    max_items: int = 4096  # conversation items
    max_buffer_ms: int = 10 * 60 * 1000  # uncommitted input audio


class DuplexSession:
    def __init__(
        self,
        session_id: str,
        *,
        config: SessionConfig,
        policy: ModelPolicy,
        stages: Sequence[Stage],
        clock: Clock,
        metrics: Metrics,
        limits: SessionLimits = SessionLimits(),
        extra_wire: dict[str, Any] | None = None,
        journal_budget: JournalBudget | None = None,
    ) -> None:
        self.session_id = session_id
        self._config = config
        self.policy = policy
        self.caps = policy.capabilities()
        self.clock = clock
        self.metrics = metrics
        self.limits = limits
        self.extra_wire = extra_wire or {}
        self.gate = FenceGate(Fence(session_id))
        self.mailbox = Mailbox(data_capacity=limits.mailbox_capacity)
        self.outbox = Outbox(
            Journal(max_events=limits.journal_events, max_bytes=limits.journal_bytes,
                    max_age_s=limits.journal_age_s, budget=journal_budget),
            OutboxLimits(max_events=limits.outbound_capacity, max_bytes=limits.outbound_bytes))
        self.resume_token = secrets.token_urlsafe(24)
        self.pipeline = Pipeline([s.port(session_id) for s in stages], self._enqueue_output)
        self._stage_for_generate = next(
            (p.name for p in self.pipeline.ports if p.accepts(_PROBE_REQUEST)), None
        )
        self._seq = 0
        self._input_seq = InputSequence(max_chunk_bytes=1 << 62, max_total_bytes=1 << 62)
        self._items: list[ConversationItem] = []
        self._input = InputBuffer(config.input_format, max_ms=limits.max_buffer_ms)
        self._video = VideoIntake(limits.video, clock, self._video_decoded)
        self._video_wake_pending = False
        self._pending_user_item: str | None = None  # id minted at speech onset
        self._user_speaking = False
        self._response: ActiveResponse | None = None
        self._task: asyncio.Task[None] | None = None
        self._overtaken_seen = 0
        self._policy_state: dict[str, Any] = {}
        self._closer: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.close_reason: str | None = None

    # ---- SessionView (what the policy may read) ---------------------------

    @property
    def fence(self) -> Fence:
        return self.gate.fence

    @property
    def config(self) -> SessionConfig:
        return self._config

    @property
    def items(self) -> Sequence[ConversationItem]:
        return tuple(self._items)

    @property
    def active_response_id(self) -> str | None:
        return self._response.id if self._response else None

    @property
    def user_speaking(self) -> bool:
        return self._user_speaking

    @property
    def output_modalities(self) -> tuple[str, ...]:
        """What the reply in progress produces: a ``response.create`` may ask
        for other modalities than the session's."""
        active = self._response
        return active.response.output_modalities if active else tuple(self._config.output_modalities)

    @property
    def policy_state(self) -> dict[str, Any]:
        return self._policy_state

    @property
    def journal(self) -> Journal:
        return self.outbox.journal

    @property
    def attachment(self) -> Attachment | None:
        """The queue of the socket attached now (None while detached)."""
        return self.outbox.attachment

    # ---- lifecycle (called by the transport / manager) --------------------

    def attach(self) -> Attachment:
        """The first socket (before ``start``, so it sees ``session.created``)."""
        att, _ = self.outbox.attach()
        return att

    def resume(self, token: str, last_seq: int) -> tuple[Attachment, Replay, dict[str, Any]]:
        """Attach a reconnecting socket: check the token (constant time), replay
        after ``last_seq`` (or resync), rotate the token. Returns the new
        attachment, the replay verdict, and the ``session.resumed`` fields."""
        if self.close_reason is not None:
            raise DuplexError("session_closed", "the session is closed", param="session_id")
        if not hmac.compare_digest(token.encode(), self.resume_token.encode()):
            raise DuplexError("invalid_resume_token", "the resume token does not match "
                              "(tokens rotate on every resume)", param="resume_token")
        self.journal.expire(self.clock.now())
        att, replay = self.outbox.attach(last_seq)
        assert replay is not None
        self.resume_token = secrets.token_urlsafe(24)
        resumed = {"session_id": self.session_id, "resume_token": self.resume_token,
                   "last_seq": last_seq, "head_seq": replay.head_seq,
                   "last_input_seq": self._input_seq.next_seq - 1}  # resend numbered input after it
        return att, replay, resumed

    def snapshot(self) -> dict[str, Any]:
        """What a client that must resync starts again from."""
        return {"session": self.session_object(), "items": [i.wire() for i in self._items],
                "active_response_id": self.active_response_id}

    def detach(self, att: Attachment) -> bool:
        return self.outbox.detach(att)

    async def start(self) -> None:
        await self.pipeline.open(self.fence)
        self._emit(ev.SessionCreated(session=self.session_object(), resume_token=self.resume_token))
        if self._config.turn_detection is not None:
            await self._execute(self.policy.plan_append(self, self._vad_config()), None)
        self._task = asyncio.create_task(self._run(), name=f"duplex-session-{self.session_id}")
        self.metrics.sessions_opened.inc()

    def deliver(self, command: cmd.Command, received_at: float | None = None) -> None:
        """Enqueue a client command (never blocks). A full data lane means the
        client sends faster than the session can work: ``resource_exhausted``."""
        if self.close_reason is not None:
            raise DuplexError("session_closed", "the session is closed", event_id=command.event_id)
        try:
            at = self.clock.now() if received_at is None else received_at
            self.mailbox.put_nowait((at, command), lane_of(command))
        except MailboxFull:
            raise DuplexError("resource_exhausted", "too many queued input events",
                              event_id=command.event_id) from None

    async def close(self, reason: str = "client") -> None:
        """Idempotent. Aborts stage work, ends the runner, ends ``outbound``."""
        if self.close_reason is not None:
            await self.closed.wait()
            return
        self.close_reason = reason
        self.mailbox.close()
        if self._task is not None and self._task is not asyncio.current_task():
            await asyncio.gather(self._task, return_exceptions=True)
        await self.pipeline.close()
        await self._video.close()
        self.metrics.sessions_closed.inc(reason=reason)
        self.outbox.close()
        self.closed.set()

    def session_object(self) -> dict[str, Any]:
        extra = {"policy": self.policy.name, "capabilities": self.caps.wire(),
                 "fence": self.fence.wire(), **self.extra_wire}
        return session_wire(self._config, session_id=self.session_id, extra=extra)

    # ---- the single writer ------------------------------------------------

    async def _enqueue_output(self, output: StageOutput) -> None:
        if self.close_reason is None:
            self.mailbox.put_nowait((self.clock.now(), output), Lane.STAGE)

    async def _run(self) -> None:
        try:
            while True:
                lane, (received_at, item) = await self.mailbox.get()
                if self.mailbox.overtaken != self._overtaken_seen:
                    self.metrics.control_overtakes.inc(self.mailbox.overtaken - self._overtaken_seen)
                    self._overtaken_seen = self.mailbox.overtaken
                try:
                    if lane is Lane.STAGE:
                        await self._on_stage_output(item, received_at)
                    else:
                        await self._on_command(item, received_at)
                except DuplexError as err:
                    event_id = getattr(item, "event_id", None)
                    self._error(err.with_event_id(event_id))
                except Exception:  # contained: one bad command must not end the session
                    log.exception("session %s failed on %r", self.session_id, type(item).__name__)
                    self._error(DuplexError("internal_error", "internal error handling the event",
                                            event_id=getattr(item, "event_id", None)))
        except MailboxClosed:
            pass

    def _emit(self, event: ev.ServerEvent) -> None:
        self._seq += 1
        env = ev.Envelope(self._seq, self.fence, event)
        if self.outbox.publish(env, self.clock.now()):
            return
        # A socket that stopped reading was cut off (its memory stays bounded).
        self.metrics.slow_consumers.inc()
        if not self.limits.survives_disconnect and self.close_reason is None and self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(
                self.close("slow_consumer"), name=f"duplex-close-{self.session_id}")

    def _emit_all(self, events: Sequence[ev.ServerEvent]) -> None:
        for event in events:
            self._emit(event)

    def _error(self, err: DuplexError) -> None:
        self.metrics.errors.inc(code=err.code)
        self._emit(ev.ErrorEvent(error=err))

    # ---- client commands --------------------------------------------------

    async def _on_command(self, c: cmd.Command, received_at: float) -> None:
        if isinstance(c, cmd.AudioAppend):
            # Numbered chunks (CONFORMANCE 23): a duplicate (a resend after a
            # resume) is ignored, a gap is refused naming the expected seq.
            if c.seq is None or self._input_seq.accept(c.seq, 0) is Accepted.NEW:
                await self._append_audio(c.audio, received_at)
        elif isinstance(c, cmd.AudioCommit):
            if self._input.samples == 0:
                raise DuplexError("input_audio_buffer_empty",
                                  "the input audio buffer is empty: append audio before committing")
            await self._commit_input()
        elif isinstance(c, cmd.AudioClear):
            self._input.clear()
            self._emit(ev.InputAudioBufferCleared())
        elif isinstance(c, cmd.SessionUpdate):
            await self._update(c)
        elif isinstance(c, cmd.ResponseCreate):
            await self._create_response(c.options)
        elif isinstance(c, cmd.ResponseCancel):
            active = self._response
            if active is None or (c.response_id and c.response_id != active.id):
                raise DuplexError("response_cancel_not_active",
                                  "there is no active response to cancel", param="response_id")
            await self._interrupt(InterruptReason.CLIENT_CANCELLED, received_at)
        elif isinstance(c, cmd.ItemCreate):
            await self._create_item(c)
        elif isinstance(c, cmd.ItemRetrieve):
            self._emit(ev.ConversationItemRetrieved(item=self._item(c.item_id).wire()))
        elif isinstance(c, cmd.ItemDelete):
            self._items.remove(self._item(c.item_id))
            if self._response is not None and self._response.item.id == c.item_id:
                self._response.in_conversation = False  # no item.done for a deleted item
            self._emit(ev.ConversationItemDeleted(item_id=c.item_id))
        elif isinstance(c, cmd.ItemTruncate):
            self._truncate(c)
        elif isinstance(c, cmd.DuplexInput):
            await self._duplex_input(c, received_at)
        elif isinstance(c, cmd.VideoFrameIn | cmd.VideoChunkIn | cmd.VideoDecoded):
            await self._on_video(c)
        elif isinstance(c, cmd.EventAck):
            self.journal.ack(c.seq)
        elif isinstance(c, cmd.SessionClose):
            self._emit(ev.SessionClosed(reason=c.reason))
            await self.close(c.reason)  # nothing queued behind the close may run
        else:
            raise DuplexError("unknown_event", f"unhandled command {type(c).__name__}")

    async def _update(self, c: cmd.SessionUpdate) -> None:
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
        self._input.set_format(new.input_format)
        if td is not None and td != old.turn_detection:
            await self._execute(self.policy.plan_append(self, self._vad_config()), None)
        self._emit(ev.SessionUpdated(session=self.session_object()))

    def _vad_config(self) -> VadConfig:
        td = self._config.turn_detection
        assert td is not None
        return VadConfig(threshold=td.threshold, prefix_padding_ms=td.prefix_padding_ms,
                         silence_duration_ms=td.silence_duration_ms)

    # ---- input ------------------------------------------------------------

    async def _append_audio(self, data: bytes, received_at: float | None) -> None:
        chunk = self._input.append(data)
        if chunk is None:
            return
        td = self._config.turn_detection
        if td is not None and not self._user_speaking:
            self._input.trim_idle(td.prefix_padding_ms)
        await self._execute(self.policy.plan_append(self, chunk), received_at)

    async def _commit_input(self) -> None:
        audio, errors = self._input.commit()
        for err in errors:  # e.g. an odd PCM16 byte count: reported, the turn is kept
            self._error(err)
        item_id = self._pending_user_item or new_id("item")
        self._pending_user_item = None
        audio_ms = int(audio.size * 1000 // INTERNAL_RATE)
        item = ConversationItem(id=item_id, type=ItemType.MESSAGE, role=Role.USER,
                                content=[ContentPart(type="input_audio", audio_ms=audio_ms)])
        previous = self._append_item(item)
        self._emit(ev.InputAudioBufferCommitted(item_id=item_id, previous_item_id=previous))
        self._emit(ev.ConversationItemAdded(item=item.wire(), previous_item_id=previous))
        self._emit(ev.ConversationItemDone(item=item.wire(), previous_item_id=previous))
        await self._execute(self.policy.plan_append(self, TurnCommitted(item_id, audio)), None)

    async def _create_item(self, c: cmd.ItemCreate) -> None:
        item = c.item
        if item.id and any(i.id == item.id for i in self._items):
            raise DuplexError("invalid_value", f"an item with id {item.id!r} already exists",
                              param="item.id")
        if not item.id:
            item.id = new_id("item")
        previous = self._append_item(item, after=c.previous_item_id)
        self._emit(ev.ConversationItemAdded(item=item.wire(), previous_item_id=previous))
        self._emit(ev.ConversationItemDone(item=item.wire(), previous_item_id=previous))
        if item.type is ItemType.MESSAGE and item.role is Role.USER and item.text():
            await self._execute(self.policy.plan_append(self, TextIn(item.text())), None)
        for part in item.content if item.role is Role.USER else ():
            if part.type == "input_image" and part.image_url:
                self._need_video()
                await self._see(await self._video.image(data_url_bytes(part.image_url)))

    # ---- video ----------------------------------------------------------------

    def _need_video(self) -> None:
        if "video" not in self.caps.input_modalities:
            raise DuplexError("capability_unsupported", f"policy {self.policy.name!r} takes no "
                              "video or images", param="type")

    async def _on_video(self, c: cmd.Command) -> None:
        if isinstance(c, cmd.VideoDecoded):
            self._video_wake_pending = False
            frames = self._video.take()
        else:
            self._need_video()
            if isinstance(c, cmd.VideoChunkIn):
                self._video.chunk(c.data, c.container)
                return
            frame = await self._video.frame(c.image, c.timestamp_ms)  # type: ignore[attr-defined]
            frames = [frame] if frame is not None else []
        for frame in frames:
            await self._see(frame)

    async def _see(self, frame: VideoFrame) -> None:
        await self._execute(self.policy.plan_append(self, frame), None)

    def _video_decoded(self) -> None:
        """On the loop, from the decoder thread's wake-up: one marker at a time."""
        if not self._video_wake_pending and self.close_reason is None:
            try:
                self.mailbox.put_nowait((self.clock.now(), cmd.VideoDecoded()), Lane.DATA)
            except MailboxFull:
                return  # the decoder's next frame wakes us again; frames wait in it
            self._video_wake_pending = True

    def _append_item(self, item: ConversationItem, after: str | None = None) -> str | None:
        """Insert into the conversation; returns the id of the item before it."""
        if len(self._items) >= self.limits.max_items:
            raise DuplexError("resource_exhausted", "the conversation holds too many items")
        if after is None:
            index = len(self._items)
        elif after == "root":
            index = 0
        else:
            index = self._items.index(self._item(after, param="previous_item_id")) + 1
        self._items.insert(index, item)
        return self._items[index - 1].id if index > 0 else None

    def _item(self, item_id: str, param: str = "item_id") -> ConversationItem:
        for item in self._items:
            if item.id == item_id:
                return item
        raise DuplexError("item_not_found", f"no item with id {item_id!r}", param=param)

    def _truncate(self, c: cmd.ItemTruncate) -> None:
        item = self._item(c.item_id)
        if item.role is not Role.ASSISTANT:
            raise DuplexError("invalid_value", "only assistant items can be truncated",
                              param="item_id")
        if not 0 <= c.content_index < len(item.content) or \
                item.content[c.content_index].type != "output_audio":
            raise DuplexError("invalid_value", "content_index does not name an audio part",
                              param="content_index")
        part = item.content[c.content_index]
        if c.audio_end_ms > part.audio_ms:
            raise DuplexError("invalid_value",
                              f"audio_end_ms {c.audio_end_ms} is beyond the audio ({part.audio_ms} ms)",
                              param="audio_end_ms")
        part.transcript = part.heard_text(c.audio_end_ms)
        part.audio_ms = c.audio_end_ms
        self._emit(ev.ConversationItemTruncated(item_id=item.id, content_index=c.content_index,
                                                audio_end_ms=c.audio_end_ms))

    async def _duplex_input(self, c: cmd.DuplexInput, received_at: float) -> None:
        if not self.caps.supports(c.mode):
            raise DuplexError("capability_unsupported",
                              f"input mode {c.mode.value!r} is not supported by policy "
                              f"{self.policy.name!r}", param="mode")
        if c.mode is InputMode.APPEND_AUDIO_CHUNK and c.audio is not None:
            await self._append_audio(c.audio, received_at)
        elif c.mode is InputMode.TURN_COMMIT_ONLY:
            await self._on_command(cmd.AudioCommit(event_id=c.event_id), received_at)
        elif c.mode is InputMode.APPEND_TOKENS and c.text:
            item = ConversationItem(id="", type=ItemType.MESSAGE, role=Role.USER,
                                    content=[ContentPart(type="input_text", text=c.text)])
            await self._create_item(cmd.ItemCreate(item=item, event_id=c.event_id))
        else:  # the policy owns the meaning of the advanced modes
            await self._execute(self.policy.plan_append(self, c), received_at)

    async def _execute(self, plan: AppendPlan, received_at: float | None) -> None:
        """Carry out a policy plan: move the fence first, then submit."""
        if plan.bump is FenceBump.INCARNATION:
            await self._advance(self.fence.next_incarnation())
            self.metrics.incarnation_bumps.inc()
        elif plan.bump is FenceBump.EPOCH:
            await self._advance(self.fence.next_epoch())
        for sub in plan.submissions:
            await self.pipeline.submit(sub.stage, self.fence, sub.role, sub.payload)
        if received_at is not None and plan.submissions:
            self.metrics.ingest_latency.observe(self.clock.now() - received_at)

    async def _advance(self, fence: Fence) -> None:
        self.gate.advance(fence)
        self.metrics.epoch_bumps.inc()
        await self.pipeline.cancel(fence)

    # ---- responses --------------------------------------------------------

    async def _create_response(self, options: cmd.ResponseOptions) -> None:
        if self._response is not None:
            raise DuplexError("conversation_already_has_active_response",
                              f"response {self._response.id} is still in progress; cancel it "
                              "or wait for response.done")
        if self._stage_for_generate is None:
            raise DuplexError("capability_unsupported", "this pipeline has no generating stage")
        modalities = tuple(options.output_modalities or self._config.output_modalities)
        unsupported = set(modalities) - self.caps.output_modalities
        if unsupported:
            raise DuplexError("invalid_value", f"output modalities {sorted(unsupported)} unsupported",
                              param="response.output_modalities")
        in_conversation = options.conversation != "none"
        response = Response(
            id=new_id("resp"), conversation_id=None if not in_conversation else "conv_" + self.session_id,
            output_modalities=modalities, output_format=self._config.output_format.wire(),
            voice=self._config.voice,
            max_output_tokens=options.max_output_tokens or self._config.max_output_tokens,
            metadata=options.metadata)
        context = self._context(options)
        previous = self._items[-1].id if self._items else None
        active = ActiveResponse(response, new_id("item"), in_conversation=in_conversation,
                                previous_item_id=previous, encoder_factory=self._encoder)
        self._response = active
        if in_conversation:
            self._items.append(active.item)
        self._emit_all(active.start_events())
        sampling = self.policy.configure_sampling_params(self, options)
        request = GenerateRequest(response_id=active.id, context=context, sampling=sampling,
                                  tools=self._config.tools,
                                  tool_choice=self._config.tool_choice)
        active.request_id = await self.pipeline.submit(self._stage_for_generate, self.fence,
                                                       "llm", request)

    def _encoder(self, rate: int) -> AudioEncoder:
        return AudioEncoder(self._config.output_format, in_rate=rate)

    def _context(self, options: cmd.ResponseOptions) -> tuple[ContextMessage, ...]:
        messages = context_messages(self._items, options.instructions or self._config.instructions)
        shape = getattr(self.policy, "shape_context", None)  # optional policy hook
        return shape(self, messages) if shape is not None else messages

    async def _interrupt(self, reason: InterruptReason, received_at: float | None) -> None:
        """Barge-in or cancel: one epoch bump, one response.done(cancelled),
        one cancel of the stages -- in that order. Silence comes first: once
        the gate has moved, nothing of the old reply can reach the client, so
        the client need not wait for the stages to finish aborting."""
        active = self._response
        if active is None:
            return
        self._response = None
        fence = self.fence.next_epoch()
        self.gate.advance(fence)
        self.metrics.epoch_bumps.inc()
        self.metrics.interrupts.inc(reason=reason.value)
        truncated = self._truncate_to_heard(active) if reason is InterruptReason.TURN_DETECTED else None
        self._emit_all(active.finish(ResponseStatus.CANCELLED,
                                     {"type": "cancelled", "reason": reason.value}))
        if truncated is not None:
            self._emit(truncated)
        if received_at is not None:
            self.metrics.cancel_latency.observe(self.clock.now() - received_at)
        await self.pipeline.cancel(fence)

    def _truncate_to_heard(self, active: ActiveResponse) -> ev.ServerEvent | None:
        """Barge-in: the client plays audio in real time from the first delta,
        so it cannot have heard more than the time since then. Cut the
        assistant item to those words, so the next turn's context holds only
        what the user heard (a client that knows better sends truncate)."""
        if not active.audio or active.first_audio_at is None:
            return None
        part = active.part
        heard_ms = min(part.audio_ms, int((self.clock.now() - active.first_audio_at) * 1000))
        part.transcript = active.text = part.heard_text(heard_ms)
        part.audio_ms = heard_ms
        if not active.in_conversation:
            return None
        return ev.ConversationItemTruncated(item_id=active.item.id, content_index=0,
                                            audio_end_ms=heard_ms)

    def _finish_response(self) -> None:
        active, self._response = self._response, None
        if active is not None:
            self._emit_all(active.finish(ResponseStatus.COMPLETED))

    # ---- stage outputs ----------------------------------------------------

    async def _on_stage_output(self, out: StageOutput, received_at: float) -> None:
        if not self.gate.admit(out):  # the one place stale outputs are dropped
            self.metrics.stale_dropped.inc(stage=out.stage)
            return
        if isinstance(out.payload, StageFailed) and out.payload.error.spec.terminal:
            # e.g. engine_dead: one terminal error, then the session ends
            # (whatever the policy would have decided).
            self._render_output(out.payload)
            await self.close(out.payload.error.code)
            return
        decision = self.policy.decide_output(self, out)
        if decision.emit:
            self._render_output(out.payload if decision.render is None else decision.render)
        if decision.plan is not None:
            await self._execute(decision.plan, None)
        if decision.interrupt is not None:
            await self._interrupt(decision.interrupt, received_at)
        if decision.forward:
            await self.pipeline.forward(out)
        if decision.commit_turn and self._input.samples > 0:
            await self._commit_input()
        if decision.create_response and self._response is None:
            await self._create_response(cmd.ResponseOptions())
        if decision.finish_response:
            self._finish_response()

    def _render_output(self, payload: Any) -> None:
        active = self._response
        if isinstance(payload, VadSpeechStarted):
            self._user_speaking = True
            self._pending_user_item = self._pending_user_item or new_id("item")
            self._emit(ev.SpeechStarted(audio_start_ms=payload.audio_ms,
                                        item_id=self._pending_user_item))
        elif isinstance(payload, VadSpeechStopped):
            self._user_speaking = False
            self._pending_user_item = self._pending_user_item or new_id("item")
            self._emit(ev.SpeechStopped(audio_end_ms=payload.audio_ms,
                                        item_id=self._pending_user_item))
        elif isinstance(payload, TranscriptDelta | TranscriptFinal):
            self._render_transcript(payload)
        elif isinstance(payload, TextDelta):
            if active is not None and active.id == payload.response_id:
                self._emit_all(active.on_text(payload.text))
        elif isinstance(payload, AudioOut):
            if active is not None and active.id == payload.response_id:
                if active.first_audio_at is None:
                    active.first_audio_at = self.clock.now()
                self._emit_all(active.on_audio(payload))
        elif isinstance(payload, GenerationDone):
            if active is not None and active.id == payload.response_id:
                active.on_generation_done(payload)
        elif isinstance(payload, ToolCall):
            if active is not None and active.id == payload.response_id:
                item, events = active.on_tool_call(payload)
                if active.in_conversation:
                    self._items.append(item)
                self._emit_all(events)
        elif isinstance(payload, StageFailed):
            self._error(payload.error)
            if active is not None:
                self._response = None
                self._emit_all(active.finish(ResponseStatus.FAILED,
                                             {"type": "failed", "error": payload.error.to_wire()}))
        elif isinstance(payload, SceneDescription):
            self._emit(ev.VideoSceneUpdated(text=payload.text, timestamp_ms=payload.timestamp_ms,
                                            texts=list(payload.texts), faces=payload.faces))
        elif isinstance(payload, SpeechDone):
            pass  # completion is the policy's call (finish_response)

    def _render_transcript(self, payload: TranscriptDelta | TranscriptFinal) -> None:
        item_id = self._pending_user_item
        if item_id is None and self._items and self._items[-1].role is Role.USER:
            item_id = self._items[-1].id
        if item_id is None:
            item_id = self._pending_user_item = new_id("item")
        if isinstance(payload, TranscriptDelta):
            self._emit(ev.InputTranscriptionDelta(item_id=item_id, content_index=0,
                                                  delta=payload.text))
            return
        for item in self._items:
            if item.id == item_id and item.content:
                item.content[0].transcript = payload.text
        self._emit(ev.InputTranscriptionCompleted(item_id=item_id, content_index=0,
                                                  transcript=payload.text))


# Used once per session to find the stage that generates responses.
_PROBE_REQUEST = GenerateRequest(response_id="probe", context=(), sampling=None)  # type: ignore[arg-type]
