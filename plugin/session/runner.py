"""``DuplexSession``: the runner of one realtime session -- the only part of
it that awaits.

The session's logic is ``SessionCore`` (``core.py``): messages in, effects
out, no I/O. The runner owns the I/O around it: the ``Mailbox`` that feeds
it (client commands and stage outputs; the control lane overtakes queued
audio, so a cancel or a close never waits behind audio decoding), the
``Outbox`` events go to (``vllm_duplex.replay.outbox``: the journal and the
socket attached now), the ``StageFeed`` that carries submissions and cancels
to the ``Pipeline``, and the video decoders. One task reads the mailbox,
calls ``core.handle`` and carries out the effects; it is the only writer of
the session's state. The transport only enqueues commands (``deliver``) and
drains the ``Attachment`` of its socket.

The runner never awaits a stage (the feed does), so it always serves the
mailbox, and the STAGE lane can be bounded: stage outputs wait (or merge,
``coalesce.py``) when the session lags, instead of growing memory.

A ``Mirror`` (``vllm_duplex.durable.writer``), when given, is told of every
event published, every resume and the close, to keep a copy of the session in
a store that outlives the process; ``start_adopted`` starts a session rebuilt
from such a copy (``vllm_duplex.durable.adopt``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.gate import FenceGate
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import BackchannelText, StageOutput, VideoFrame
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.policy import ModelPolicy
from vllm_duplex.replay.journal import Journal, JournalBudget, Replay
from vllm_duplex.domain.events import Envelope
from vllm_duplex.replay.outbox import Attachment, DurableMark, Outbox, OutboxLimits
from vllm_duplex.session.backchannel import STAGE
from vllm_duplex.session.coalesce import merge_queued
from vllm_duplex.session.core import SessionCore
from vllm_duplex.session.effects import (
    AckEvents,
    ArmTimer,
    Cancel,
    CancelTimer,
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
    TimerFired,
)
from vllm_duplex.session.feed import StageFeed
from vllm_duplex.session.limits import SessionLimits
from vllm_duplex.session.mcp_calls import CallMcpTool, ListMcpTools
from vllm_duplex.session.mcp_client import McpClients
from vllm_duplex.session.mailbox import (
    Lane,
    Mailbox,
    MailboxClosed,
    MailboxFull,
    lane_of,
)
from vllm_duplex.session.video_input import VideoDecoding
from vllm_duplex.stages.lifecycle import Hears
from vllm_duplex.stages.pipeline import Pipeline
from vllm_duplex.stages.port import Stage

log = logging.getLogger(__name__)

# An effect's step: None when done at once, else an awaitable of what it
# hands back -- the messages for the core to handle next (a decoded frame, a
# failure) -- and whether the rest of its batch still applies.
_Step = Callable[[Any], "Awaitable[tuple[list[Any], bool]] | None"]


class Mirror(Protocol):
    """What keeps a copy of sessions in a store (never awaited: it queues)."""

    def mark(self, session: DuplexSession) -> DurableMark | None: ...

    def published(self, session: DuplexSession, env: Envelope) -> None: ...

    def resumed(self, session: DuplexSession) -> None: ...

    def acked(self, session_id: str, seq: int) -> None: ...

    def closed(self, session: DuplexSession, reason: CloseReason) -> None: ...


class DuplexSession:
    def __init__(
        self,
        session_id: str,
        *,
        config: SessionConfig,
        policy: ModelPolicy[Any],
        stages: Sequence[Stage],
        clock: Clock,
        metrics: Metrics,
        limits: SessionLimits = SessionLimits(),
        extra_wire: dict[str, Any] | None = None,
        journal_budget: JournalBudget | None = None,
        on_closed: Callable[[str, CloseReason], Awaitable[None]] | None = None,
        mirror: Mirror | None = None,
        api_key: str | None = None,
    ) -> None:
        self.session_id = session_id
        self.api_key = api_key  # whose session it is (a store keeps its hash)
        self._mirror = mirror
        # Told once the session has closed, whoever closed it: a session that
        # ends itself while no socket is attached (a ``session.close`` the
        # mailbox reached after the socket went) must leave its host's
        # registry then, not when the resume grace runs out.
        self._on_closed = on_closed
        self.policy = policy
        self.clock = clock
        self.metrics = metrics
        self.limits = limits
        self.mailbox: Mailbox[tuple[float, Any]] = Mailbox(
            data_capacity=limits.mailbox_capacity, stage_capacity=limits.stage_capacity,
            passable=lambda queued: getattr(queued[1], "media", False))
        self.outbox = Outbox(
            Journal(max_events=limits.journal_events, max_bytes=limits.journal_bytes,
                    max_age_s=limits.journal_age_s, budget=journal_budget),
            OutboxLimits(max_events=limits.outbound_capacity, max_bytes=limits.outbound_bytes),
            mirror.mark(self) if mirror is not None else None)
        self.resume_token = secrets.token_urlsafe(24)
        self.pipeline = Pipeline([s.port(session_id) for s in stages], self._enqueue_output,
                                 clock=clock)
        self.core = SessionCore(session_id, config=config, policy=policy,
                                stage_names=self.pipeline.names, metrics=metrics,
                                now=clock.now(), limits=limits, extra_wire=extra_wire,
                                asr_languages=_languages_heard(stages),
                                says_clips=_says_clips(stages))
        self.feed = StageFeed(self.pipeline, pause=lambda: self.mailbox.pause(Lane.DATA),
                              resume=lambda: self.mailbox.resume(Lane.DATA),
                              failed=self._feed_failed, name=f"duplex-feed-{session_id}")
        self._video = VideoDecoding(limits.video.fps, self._video_decoded)
        self._video_wake_pending = False
        # Remote MCP servers: lists and calls, each a task handing its result back.
        self._mcp = McpClients(self._mcp_result, timeout_s=limits.mcp_timeout_s, name=session_id)
        self._steps: dict[type, _Step] = {
            Emit: self._publish, Submit: self._submit, Forward: self._forward,
            Cancel: self._cancel, AckEvents: self._ack, Close: self._close_step,
            DecodeImage: self._decode, FeedVideo: self._feed_video, PollVideo: self._poll_video,
            ArmTimer: self._arm_timer, CancelTimer: self._cancel_timer,
            ListMcpTools: self._mcp.list, CallMcpTool: self._mcp.call,
        }
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._overtaken_seen = 0
        self._closer: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.close_reason: CloseReason | None = None

    # ---- what the transport and the host read ----------------------------

    @property
    def fence(self) -> Fence:
        return self.core.fence

    @property
    def config(self) -> SessionConfig:
        return self.core.config

    @property
    def gate(self) -> FenceGate:
        return self.core.gate

    @property
    def active_response_id(self) -> str | None:
        return self.core.active_response_id

    @property
    def journal(self) -> Journal:
        return self.outbox.journal

    @property
    def attachment(self) -> Attachment | None:
        """The queue of the socket attached now (None while detached)."""
        return self.outbox.attachment

    def session_object(self) -> dict[str, Any]:
        return self.core.session_object()

    def snapshot(self) -> dict[str, Any]:
        """What a client that must resync starts again from."""
        return self.core.snapshot()

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
                   "last_input_seq": self.core.last_input_seq}  # resend numbered input after it
        if self._mirror is not None:
            self._mirror.resumed(self)  # the rotated token
        return att, replay, resumed

    def detach(self, att: Attachment) -> bool:
        return self.outbox.detach(att)

    def watch(self) -> Attachment:
        """Another socket that follows the session live (a call's sideband);
        raises ``session_closed`` once it ended."""
        if self.close_reason is not None:
            raise DuplexError("session_closed", "the session is closed")
        return self.outbox.watch()

    def unwatch(self, att: Attachment) -> None:
        self.outbox.unwatch(att)

    async def start(self) -> None:
        await self.pipeline.open(self.fence)
        self.feed.start()
        for message in await self._apply(self.core.start(self.resume_token, self.clock.now())):
            await self._serve(message)
        self._task = asyncio.create_task(self._run(), name=f"duplex-session-{self.session_id}")
        self.metrics.sessions_opened.inc()

    async def start_adopted(self, head_seq: int, closing: Sequence[Any]) -> None:
        """Start a session rebuilt from a store (its config, items and journal
        are in place): the pipeline opens and the VAD is configured as at a
        first start, but no ``session.created`` goes out -- the client has
        one. Events are numbered on from ``head_seq``; ``closing``, the events
        that end what the dead owner left open (a reply cut off), come first."""
        await self.pipeline.open(self.fence)
        self.feed.start()
        start = [e for e in self.core.start(self.resume_token, self.clock.now())
                 if not isinstance(e, Emit)]
        self.core.out.continue_after(head_seq)
        for event in closing:
            self.core.emit(event)
        for message in await self._apply(start + self.core.out.take()):
            await self._serve(message)
        self._task = asyncio.create_task(self._run(), name=f"duplex-session-{self.session_id}")
        self.metrics.sessions_opened.inc()

    def deliver(self, command: cmd.Command, received_at: float | None = None) -> None:
        """Enqueue a client command (never blocks). A full data lane means the
        client sends faster than the session can work: ``resource_exhausted``."""
        if self.close_reason is not None:
            raise DuplexError("session_closed", "the session is closed", event_id=command.event_id)
        try:
            at = self.clock.now() if received_at is None else received_at
            self.mailbox.put_nowait((at, command), lane_of(command), ordered=True)
        except MailboxFull:
            raise DuplexError("resource_exhausted", "too many queued input events",
                              event_id=command.event_id) from None

    async def close(self, reason: CloseReason | str = CloseReason.CLIENT) -> None:
        """Idempotent. Aborts stage work, ends the runner, ends ``outbound``."""
        reason = CloseReason(reason)
        if self.close_reason is not None:
            await self.closed.wait()
            return
        self.close_reason = reason
        self.mailbox.close()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._task is not None and self._task is not asyncio.current_task():
            await asyncio.gather(self._task, return_exceptions=True)
        await self.feed.close()
        await self.pipeline.close()
        await self._video.close()
        await self._mcp.close()
        self.metrics.sessions_closed.inc(reason=reason.value)
        if self._mirror is not None:
            self._mirror.closed(self, reason)
        self.outbox.close()
        self.closed.set()
        if self._on_closed is not None:
            await self._on_closed(self.session_id, reason)

    # ---- the single writer ------------------------------------------------

    async def _enqueue_output(self, output: StageOutput) -> None:
        """The pipeline's sink: a full STAGE lane merges or makes the stage wait."""
        if self.close_reason is None:
            try:
                await self.mailbox.put((self.clock.now(), output), Lane.STAGE, merge_queued)
            except MailboxClosed:
                pass  # closing: outputs nobody will read

    async def _run(self) -> None:
        mailbox = self.mailbox
        try:
            while True:
                _, (received_at, item) = await mailbox.get()
                if mailbox.overtaken != self._overtaken_seen:
                    self.metrics.control_overtakes.inc(mailbox.overtaken - self._overtaken_seen)
                    self._overtaken_seen = mailbox.overtaken
                await self._serve(item, received_at)
        except MailboxClosed:
            pass

    async def _serve(self, message: Any, received_at: float | None = None) -> None:
        """Handle ``message`` and carry out its effects, then, before the next
        mailbox message, the messages those effects handed back (a decoded
        frame, a failure) -- each batch at the top level, never one inside
        another."""
        pending: deque[Any] = deque([message])
        while pending and self.close_reason is None:
            item = pending.popleft()
            effects = self.core.handle(item, self.clock.now(), received_at)
            received_at = None
            try:
                follow = await self._apply(effects)
            except DuplexError as err:  # e.g. the journal refused an ack
                follow = [Failed(err.with_event_id(getattr(item, "event_id", None)))]
            except Exception:  # contained, as in the core: the session goes on
                log.exception("session %s failed carrying out %r", self.session_id,
                              type(item).__name__)
                follow = [Failed(DuplexError("internal_error", "internal error handling the event",
                                             event_id=getattr(item, "event_id", None)))]
            pending.extendleft(reversed(follow))

    async def _apply(self, effects: list[Effect]) -> list[Any]:
        """Carry out ``effects`` in order; returns the messages they handed back."""
        steps = self._steps
        follow: list[Any] = []
        for effect in effects:
            step = steps[type(effect)](effect)
            if step is None:
                continue
            messages, go_on = await step
            follow += messages
            if not go_on:
                break  # the rest of the batch depended on this step
        return follow

    # ---- effects ----------------------------------------------------------

    def _publish(self, e: Emit) -> None:
        if self._mirror is not None:
            self._mirror.published(self, e.envelope)  # queued before any socket may send it
        if self.outbox.publish(e.envelope, self.clock.now()):
            return
        # A socket that stopped reading was cut off (its memory stays bounded).
        self.metrics.slow_consumers.inc()
        if not self.limits.survives_disconnect and self.close_reason is None and self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(
                self.close(CloseReason.SLOW_CONSUMER), name=f"duplex-close-{self.session_id}")

    def _submit(self, e: Submit) -> None:
        self.feed.submit(e.stage, e.fence, e.role, e.payload)

    def _forward(self, e: Forward) -> None:
        self.feed.forward(e.output, e.to)

    def _cancel(self, e: Cancel) -> None:
        self.feed.cancel(e.fence)

    def _arm_timer(self, e: ArmTimer) -> None:
        self._cancel_timer(CancelTimer(e.name))
        if self.close_reason is None:
            self._timers[e.name] = asyncio.get_running_loop().create_task(
                self._timer(e.name, e.at), name=f"duplex-timer-{e.name}-{self.session_id}")

    def _cancel_timer(self, e: CancelTimer) -> None:
        timer = self._timers.pop(e.name, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()

    async def _timer(self, name: str, at: float) -> None:
        """Sleep on the session's clock (virtual in tests) until ``at``, then
        wake the core on the control lane: a paced frame must not wait behind
        queued audio. Never early: the loop's timers are not the session's
        clock (uvloop's wake up to ~1 ms before a ``time.monotonic`` deadline),
        and a timer the core finds not yet due is dropped as stale -- a
        pause's ``turn_end`` timer so dropped left the turn uncommitted for
        good (the session never answered; issue 21)."""
        while (left := at - self.clock.now()) > 0:
            await self.clock.sleep(left)
        if self._timers.get(name) is asyncio.current_task():
            del self._timers[name]
        if self.close_reason is None:
            try:
                self.mailbox.put_nowait((self.clock.now(), TimerFired(name)), Lane.CONTROL)
            except (MailboxClosed, MailboxFull):
                pass  # closing

    def _ack(self, e: AckEvents) -> None:
        self.journal.ack(e.seq)
        if self._mirror is not None:
            self._mirror.acked(self.session_id, e.seq)  # the stored journal forgets them too

    async def _close_step(self, e: Close) -> tuple[list[Any], bool]:
        await self.close(e.reason)
        return [], False

    async def _decode(self, e: DecodeImage) -> tuple[list[Any], bool]:
        """Decode off the loop; the frame (or the failure, which drops the rest
        of the batch: the item's next images) is the core's next message."""
        try:
            rgb = await self._video.image(e.data)
        except DuplexError as err:
            return [Failed(err.with_event_id(e.event_id))], False
        return [FrameDecoded(VideoFrame(rgb, e.timestamp_ms, e.source))], True

    def _feed_video(self, e: FeedVideo) -> Awaitable[tuple[list[Any], bool]] | None:
        try:
            self._video.feed(e.data, e.container)
        except DuplexError as err:
            return _handed_back([Failed(err.with_event_id(e.event_id))], go_on=False)
        return None

    async def _poll_video(self, e: PollVideo) -> tuple[list[Any], bool]:
        self._video_wake_pending = False
        try:
            frames = self._video.take()
        except DuplexError as err:
            return [Failed(err)], False
        return [FrameDecoded(frame) for frame in frames], True

    # ---- wake-ups from other tasks and threads ------------------------------

    def _video_decoded(self) -> None:
        """On the loop, from the decoder thread's wake-up: one marker at a time."""
        if not self._video_wake_pending and self.close_reason is None:
            try:
                self.mailbox.put_nowait((self.clock.now(), cmd.VideoDecoded()), Lane.DATA)
            except MailboxFull:
                return  # the decoder's next frame wakes us again; frames wait in it
            self._video_wake_pending = True

    def _mcp_result(self, message: object) -> None:
        """An MCP list or call came back (``mcp_client.py``): the core hears
        of it next, ahead of queued audio."""
        if self.close_reason is None:
            try:
                self.mailbox.put_nowait((self.clock.now(), message), Lane.CONTROL)
            except (MailboxClosed, MailboxFull):
                pass  # closing

    def _feed_failed(self, exc: Exception) -> None:
        """A submission raised in the feed: the client hears of it, as it did
        when the session awaited the stage itself."""
        if self.close_reason is None:
            error = DuplexError("internal_error", "internal error handling the event")
            self.mailbox.put_nowait((self.clock.now(), Failed(error)), Lane.CONTROL)


async def _handed_back(messages: list[Any], *, go_on: bool) -> tuple[list[Any], bool]:
    return messages, go_on


def _says_clips(stages: Sequence[Stage]) -> bool:
    """Whether the TTS stage makes backchannel clips (session/backchannel.py)."""
    return any(s.name == STAGE and issubclass(BackchannelText, getattr(s, "accepted", ()))
               for s in stages)


def _languages_heard(stages: Sequence[Stage]) -> frozenset[str] | None:
    """What every ASR stage of the pipeline transcribes (None: no stage says)."""
    heard = [s.languages() for s in stages if isinstance(s, Hears)]
    known = [h for h in heard if h is not None]
    return frozenset.intersection(*known) if known else None
