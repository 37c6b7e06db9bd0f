"""What each client command does to a session (the client's half of the
session core's dispatch table; stage outputs walk the chain of
``decisions.py``).

Functions of the core and one typed command: they read and change the
core's state and add effects through it, never await, and raise
``DuplexError`` for a client's mistake (the core turns it into an error
event echoing the command's ``event_id``).

Why these take the whole core, where the parts (``floor``, ``reply``,
``turn_end``, ``pacing``, ``barge_in``, ``rendering``) take a small state of
their own and ``replies`` the session's read-only view: a client command
*is* the session's business -- ``conversation.item.truncate`` cuts the
conversation's item, the shown reply's text and, while that item is still
being generated, ends the reply (``Floor.interrupt``: an epoch bump, its
``response.done``, a cancel of the stages) at once -- so this file is the
core's own dispatch, split out by size, not a part with state to narrow.
The same holds for ``decisions.py`` and ``pauses.py``: they compose the
parts; the parts stay pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_duplex.core import commands as cmd
from vllm_duplex.core import events as ev
from vllm_duplex.core.contracts import InputMode, InterruptReason
from vllm_duplex.core.conversation import ContentPart, ConversationItem, ItemType, Role
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.input_sequence import Accepted
from vllm_duplex.core.payloads import INTERNAL_RATE, TextIn
from vllm_duplex.media.data_url import data_url_bytes
from vllm_duplex.session.effects import DecodeImage, FeedVideo, PollVideo

if TYPE_CHECKING:
    from vllm_duplex.session.core import SessionCore


def _append(core: SessionCore, c: cmd.AudioAppend) -> None:
    # Numbered chunks: a duplicate (a resend after a
    # resume) is ignored, a gap is refused naming the expected seq.
    if c.seq is None or core.input_seq.accept(c.seq, 0) is Accepted.NEW:
        _append_audio(core, c.audio)


def _append_audio(core: SessionCore, data: bytes) -> None:
    chunk = core.input.append(data)
    if chunk is None:
        return
    core.latency.audio_arrived(chunk.start_ms + chunk.pcm.size * 1000 // INTERNAL_RATE,
                               core.received_at)
    td = core.config.turn_detection
    if td is not None and not core.user.speaking:
        core.input.trim_idle(td.prefix_padding_ms)
    core.execute(core.policy.plan_append(core, chunk), ingest=True)


def _commit(core: SessionCore, c: cmd.AudioCommit) -> None:
    if core.input.samples == 0:
        raise DuplexError("input_audio_buffer_empty",
                          "the input audio buffer is empty: append audio before committing")
    core.commit_input()


def _clear(core: SessionCore, c: cmd.AudioClear) -> None:
    core.input.clear()
    core.emit(ev.InputAudioBufferCleared())


def _response_create(core: SessionCore, c: cmd.ResponseCreate) -> None:
    core.create_response(c.options)


def _response_cancel(core: SessionCore, c: cmd.ResponseCancel) -> None:
    shown = core.shown
    if shown is None or (c.response_id and c.response_id != shown.id):
        raise DuplexError("response_cancel_not_active",
                          "there is no active response to cancel", param="response_id")
    core.floor.interrupt(InterruptReason.CLIENT_CANCELLED)


def _item_create(core: SessionCore, c: cmd.ItemCreate) -> None:
    item = c.item
    if item.id and core.conversation.has(item.id):
        raise DuplexError("invalid_value", f"an item with id {item.id!r} already exists",
                          param="item.id")
    if not item.id:
        item.id = core.make_id("item")
    previous = core.conversation.insert(item, after=c.previous_item_id)
    core.emit(ev.ConversationItemAdded(item=item.wire(), previous_item_id=previous))
    core.emit(ev.ConversationItemDone(item=item.wire(), previous_item_id=previous))
    if item.type is ItemType.MESSAGE and item.role is Role.USER and item.text():
        core.execute(core.policy.plan_append(core, TextIn(item.text())))
    for part in item.content if item.role is Role.USER else ():
        if part.type == "input_image" and part.image_url:
            _need_video(core)
            data = data_url_bytes(part.image_url)
            ts = core.video.image(core.now, len(data))
            core.effect(DecodeImage(data, ts, "image", c.event_id))


def _item_retrieve(core: SessionCore, c: cmd.ItemRetrieve) -> None:
    core.emit(ev.ConversationItemRetrieved(item=core.conversation.get(c.item_id).wire()))


def _item_delete(core: SessionCore, c: cmd.ItemDelete) -> None:
    core.conversation.delete(c.item_id)
    record = core.shown.record if core.shown is not None else None
    if record is not None and record.item.id == c.item_id:
        record.in_conversation = False  # no item.done for a deleted item
    core.emit(ev.ConversationItemDeleted(item_id=c.item_id))


def _item_truncate(core: SessionCore, c: cmd.ItemTruncate) -> None:
    core.conversation.truncate(c.item_id, c.content_index, c.audio_end_ms)
    core.emit(ev.ConversationItemTruncated(item_id=c.item_id, content_index=c.content_index,
                                           audio_end_ms=c.audio_end_ms))
    record = core.shown.record if core.shown is not None else None
    if record is not None and record.item.id == c.item_id:
        # The item is still being generated: the client stopped
        # playing it (the Agents SDK's interrupt() sends only this), so its output
        # stops and its .done events hold the heard part, as for a cancel.
        record.truncated()
        core.floor.interrupt(InterruptReason.CLIENT_CANCELLED)


def _duplex_input(core: SessionCore, c: cmd.DuplexInput) -> None:
    if not core.caps.supports(c.mode):
        raise DuplexError("capability_unsupported",
                          f"input mode {c.mode.value!r} is not supported by policy "
                          f"{core.policy.name!r}", param="mode")
    if c.mode is InputMode.APPEND_AUDIO_CHUNK and c.audio is not None:
        _append_audio(core, c.audio)
    elif c.mode is InputMode.TURN_COMMIT_ONLY:
        _commit(core, cmd.AudioCommit(event_id=c.event_id))
    elif c.mode is InputMode.APPEND_TOKENS and c.text:
        item = ConversationItem(id="", type=ItemType.MESSAGE, role=Role.USER,
                                content=[ContentPart(type="input_text", text=c.text)])
        _item_create(core, cmd.ItemCreate(item=item, event_id=c.event_id))
    else:  # the policy owns the meaning of the advanced modes
        core.execute(core.policy.plan_append(core, c), ingest=True)


def _need_video(core: SessionCore) -> None:
    if "video" not in core.caps.input_modalities:
        raise DuplexError("capability_unsupported", f"policy {core.policy.name!r} takes no "
                          "video or images", param="type")


def _video_frame(core: SessionCore, c: cmd.VideoFrameIn) -> None:
    _need_video(core)
    ts = core.video.frame(core.now, len(c.image), c.timestamp_ms)
    if ts is not None:
        core.effect(DecodeImage(c.image, ts, "frame", c.event_id))


def _video_chunk(core: SessionCore, c: cmd.VideoChunkIn) -> None:
    _need_video(core)
    core.video.chunk(core.now, len(c.data))
    core.effect(FeedVideo(c.data, c.container, c.event_id))


def _video_decoded(core: SessionCore, c: cmd.VideoDecoded) -> None:
    core.effect(PollVideo())


COMMANDS: dict[type, Callable[[SessionCore, Any], None]] = {
    cmd.AudioAppend: _append,
    cmd.AudioCommit: _commit,
    cmd.AudioClear: _clear,
    cmd.ResponseCreate: _response_create,
    cmd.ResponseCancel: _response_cancel,
    cmd.ItemCreate: _item_create,
    cmd.ItemRetrieve: _item_retrieve,
    cmd.ItemDelete: _item_delete,
    cmd.ItemTruncate: _item_truncate,
    cmd.DuplexInput: _duplex_input,
    cmd.VideoFrameIn: _video_frame,
    cmd.VideoChunkIn: _video_chunk,
    cmd.VideoDecoded: _video_decoded,
}
