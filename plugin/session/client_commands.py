"""``ClientCommands``: what each client command does to a session (the
client's half of the session core's dispatch table; stage outputs walk the
chain of ``decisions.py``).

It owns the input side the client writes -- the numbered input chunks, the
input audio buffer, the conversation's items, the video admission -- and
reads the floor (is a reply shown?). A command returns what it causes, in
order: events for the client, effects for the runner, and asks
(``asks.py``) for what only the core may do -- hand the policy an input,
commit the buffer as a user item, make a response, end the reply shown or
tell it its item was deleted or truncated (the ``Floor`` is the reply's one
writer). A client's mistake is a ``DuplexError`` (the core turns it into an
error event echoing the command's ``event_id``). It never holds the core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.contracts import Capabilities, InputMode, InterruptReason
from vllm_duplex.domain.conversation import ContentPart, ConversationItem, ItemType, Role
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.input_sequence import Accepted, InputSequence
from vllm_duplex.domain.payloads import INTERNAL_RATE, TextIn
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.media.data_url import data_url_bytes
from vllm_duplex.session.asks import CommitTurn, Interrupt, ItemGone, Plan, Respond, Steps
from vllm_duplex.session.effects import DecodeImage, EffectLog, FeedVideo, PollVideo
from vllm_duplex.session.floor import Floor
from vllm_duplex.session.input_buffer import InputBuffer
from vllm_duplex.session.items import ItemStore
from vllm_duplex.session.latency import TurnLatency
from vllm_duplex.session.user_turn import UserTurn
from vllm_duplex.session.video_input import VideoAdmission


class ClientCommands:
    def __init__(self, out: EffectLog, floor: Floor, *, input_buffer: InputBuffer,
                 conversation: ItemStore, user: UserTurn, video: VideoAdmission,
                 latency: TurnLatency, caps: Capabilities, policy_name: str,
                 make_id: Callable[[str], str]) -> None:
        self.input_seq = InputSequence(max_chunk_bytes=1 << 62, max_total_bytes=1 << 62)
        self._out = out  # read for the message's times only: steps are returned
        self._floor = floor
        self._input = input_buffer
        self._conversation = conversation
        self._user = user
        self._video = video
        self._latency = latency
        self._caps = caps
        self._policy_name = policy_name
        self._make_id = make_id

    def handle(self, c: object, config: SessionConfig) -> Steps:
        return COMMANDS[type(c)](self, c, config)

    # ---- input audio -----------------------------------------------------------

    def _append(self, c: cmd.AudioAppend, config: SessionConfig) -> Steps:
        # Numbered chunks: a duplicate (a resend after a resume) is ignored,
        # a gap is refused naming the expected seq.
        if c.seq is None or self.input_seq.accept(c.seq, 0) is Accepted.NEW:
            return self._append_audio(c.audio, config)
        return []

    def _append_audio(self, data: bytes, config: SessionConfig) -> Steps:
        chunk = self._input.append(data)
        if chunk is None:
            return []
        self._latency.audio_arrived(chunk.start_ms + chunk.pcm.size * 1000 // INTERNAL_RATE,
                                    self._out.received_at)
        td = config.turn_detection
        if td is not None and not self._user.speaking:
            self._input.trim_idle(td.prefix_padding_ms)
        return [Plan(chunk, ingest=True)]

    def _commit(self, c: cmd.AudioCommit, config: SessionConfig) -> Steps:
        if self._input.samples == 0:
            raise DuplexError("input_audio_buffer_empty",
                              "the input audio buffer is empty: append audio before committing")
        return [CommitTurn()]

    def _clear(self, c: cmd.AudioClear, config: SessionConfig) -> Steps:
        self._input.clear()
        return [ev.InputAudioBufferCleared()]

    # ---- responses ----------------------------------------------------------------

    def _response_create(self, c: cmd.ResponseCreate, config: SessionConfig) -> Steps:
        return [Respond(c.options, client=True)]

    def _response_cancel(self, c: cmd.ResponseCancel, config: SessionConfig) -> Steps:
        shown = self._floor.shown
        if shown is None or (c.response_id and c.response_id != shown.id):
            raise DuplexError("response_cancel_not_active",
                              "there is no active response to cancel", param="response_id")
        return [Interrupt(InterruptReason.CLIENT_CANCELLED)]

    # ---- the conversation's items ---------------------------------------------------

    def _item_create(self, c: cmd.ItemCreate, config: SessionConfig) -> Steps:
        item = c.item
        if item.id and self._conversation.has(item.id):
            raise DuplexError("invalid_value", f"an item with id {item.id!r} already exists",
                              param="item.id")
        # Refused before anything is kept: a bad image leaves no item behind.
        urls = [part.image_url for part in (item.content if item.role is Role.USER else ())
                if part.type == "input_image" and part.image_url]
        if urls:
            self._need_video()
        images = [data_url_bytes(url) for url in urls]
        if not item.id:
            item.id = self._make_id("item")
        previous = self._conversation.insert(item, after=c.previous_item_id)
        steps: Steps = [ev.ConversationItemAdded(item=item.wire(), previous_item_id=previous),
                        ev.ConversationItemDone(item=item.wire(), previous_item_id=previous)]
        if item.type is ItemType.MESSAGE and item.role is Role.USER and item.text():
            steps.append(Plan(TextIn(item.text())))
        for data in images:
            ts = self._video.image(self._out.now, len(data))
            steps.append(DecodeImage(data, ts, "image", c.event_id))
        return steps

    def _item_retrieve(self, c: cmd.ItemRetrieve, config: SessionConfig) -> Steps:
        return [ev.ConversationItemRetrieved(item=self._conversation.get(c.item_id).wire())]

    def _item_delete(self, c: cmd.ItemDelete, config: SessionConfig) -> Steps:
        self._conversation.delete(c.item_id)
        return [ItemGone(c.item_id, truncated=False), ev.ConversationItemDeleted(item_id=c.item_id)]

    def _item_truncate(self, c: cmd.ItemTruncate, config: SessionConfig) -> Steps:
        self._conversation.truncate(c.item_id, c.content_index, c.audio_end_ms)
        return [ev.ConversationItemTruncated(item_id=c.item_id, content_index=c.content_index,
                                             audio_end_ms=c.audio_end_ms),
                ItemGone(c.item_id, truncated=True)]

    # ---- the duplex extensions and video ----------------------------------------------

    def _duplex_input(self, c: cmd.DuplexInput, config: SessionConfig) -> Steps:
        if not self._caps.supports(c.mode):
            raise DuplexError("capability_unsupported",
                              f"input mode {c.mode.value!r} is not supported by policy "
                              f"{self._policy_name!r}", param="mode")
        if c.mode is InputMode.APPEND_AUDIO_CHUNK and c.audio is not None:
            return self._append_audio(c.audio, config)
        if c.mode is InputMode.TURN_COMMIT_ONLY:
            return self._commit(cmd.AudioCommit(event_id=c.event_id), config)
        if c.mode is InputMode.APPEND_TOKENS and c.text:
            item = ConversationItem(id="", type=ItemType.MESSAGE, role=Role.USER,
                                    content=[ContentPart(type="input_text", text=c.text)])
            return self._item_create(cmd.ItemCreate(item=item, event_id=c.event_id), config)
        return [Plan(c, ingest=True)]  # the policy owns the meaning of the advanced modes

    def _need_video(self) -> None:
        if "video" not in self._caps.input_modalities:
            raise DuplexError("capability_unsupported", f"policy {self._policy_name!r} takes "
                              "no video or images", param="type")

    def _video_frame(self, c: cmd.VideoFrameIn, config: SessionConfig) -> Steps:
        self._need_video()
        ts = self._video.frame(self._out.now, len(c.image), c.timestamp_ms)
        return [DecodeImage(c.image, ts, "frame", c.event_id)] if ts is not None else []

    def _video_chunk(self, c: cmd.VideoChunkIn, config: SessionConfig) -> Steps:
        self._need_video()
        self._video.chunk(self._out.now, len(c.data))
        return [FeedVideo(c.data, c.container, c.event_id)]

    def _video_decoded(self, c: cmd.VideoDecoded, config: SessionConfig) -> Steps:
        return [PollVideo()]


Command = Callable[[ClientCommands, Any, SessionConfig], Steps]

# The client's commands, by exact type (the codec makes exactly these classes).
COMMANDS: dict[type, Command] = {
    cmd.AudioAppend: ClientCommands._append,
    cmd.AudioCommit: ClientCommands._commit,
    cmd.AudioClear: ClientCommands._clear,
    cmd.ResponseCreate: ClientCommands._response_create,
    cmd.ResponseCancel: ClientCommands._response_cancel,
    cmd.ItemCreate: ClientCommands._item_create,
    cmd.ItemRetrieve: ClientCommands._item_retrieve,
    cmd.ItemDelete: ClientCommands._item_delete,
    cmd.ItemTruncate: ClientCommands._item_truncate,
    cmd.DuplexInput: ClientCommands._duplex_input,
    cmd.VideoFrameIn: ClientCommands._video_frame,
    cmd.VideoChunkIn: ClientCommands._video_chunk,
    cmd.VideoDecoded: ClientCommands._video_decoded,
}
