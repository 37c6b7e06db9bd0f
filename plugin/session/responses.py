"""``ResponseRecord``: what the client sees of one reply -- the response, its
items and their events, in which order, and what the assistant item ends up
holding (the text the client received).

Pure (no awaits): its ``Reply`` (``reply.py``) feeds it stage payloads once
the reply is shown, and the session sends what it returns. Event order follows OpenAI Realtime: response.created,
output_item.added, conversation.item.added, content_part.added, deltas,
the matching .done events, output_item.done, exactly one response.done.
The assistant message opens with its first words or audio, so a response
that only calls a tool holds only the call (no empty message item before it).
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.conversation import (
    ContentPart,
    ConversationItem,
    ItemType,
    Response,
    ResponseStatus,
    Role,
    SpokenSegment,
)
from vllm_duplex.domain.payloads import AudioOut, GenerationDone, ToolCall
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.audio import AudioEncoder
from vllm_duplex.session.items import ItemStore
from vllm_duplex.session.latency import ResponseTimes

# Makes an encoder for PCM at a given rate into the response's output format.
EncoderFactory = Callable[[int], AudioEncoder]
# Puts an item of the response into the conversation (when it opens).
AddItem = Callable[[ConversationItem], None]


class ResponseRecord:
    def __init__(
        self,
        response: Response,
        item_id: str,
        *,
        in_conversation: bool,
        previous_item_id: str | None,
        encoder_factory: EncoderFactory,
        add_item: AddItem = lambda item: None,
    ) -> None:
        self.response = response
        self.audio = "audio" in response.output_modalities
        self.in_conversation = in_conversation
        self.previous_item_id = previous_item_id
        self.part = ContentPart(type="output_audio" if self.audio else "output_text",
                                transcript="" if self.audio else None,
                                text=None if self.audio else "")
        self.item = ConversationItem(id=item_id, type=ItemType.MESSAGE, role=Role.ASSISTANT,
                                     status="in_progress", content=[self.part])
        self._encoder_factory = encoder_factory
        self._add_item = add_item
        self.opened = False  # the message item was announced
        self.index = 0  # its output_index
        self._last_item_id = previous_item_id  # what the next item follows
        self._encoders: dict[int, AudioEncoder] = {}
        self.finish_reason: str | None = None
        self.text = ""  # what the client received of its words
        # Words whose audio the encoder still holds; words no audio says (a
        # last "...") are never shown as spoken.
        self._unspoken = ""

    @classmethod
    def after(cls, response: Response, item_id: str, conversation: ItemStore, *,
              in_conversation: bool, output_format: AudioFormat) -> ResponseRecord:
        """A response whose items follow the conversation's last one (and join it)."""
        last = conversation.last
        return cls(response, item_id, in_conversation=in_conversation,
                   previous_item_id=last.id if last else None,
                   encoder_factory=lambda rate: AudioEncoder(output_format, in_rate=rate),
                   add_item=conversation.append)

    @property
    def id(self) -> str:
        return self.response.id

    def _ids(self) -> dict[str, object]:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": self.index,
                "content_index": 0}

    def _part_event_wire(self) -> dict:
        """content_part events name the part "audio"/"text" (GA schema), while
        the item itself keeps "output_audio"/"output_text"."""
        wire = self.part.wire()
        wire["type"] = "audio" if self.audio else "text"
        return wire

    def start_events(self) -> list[ev.ServerEvent]:
        return [ev.ResponseCreated(response=self.response.wire())]

    def _open(self) -> list[ev.ServerEvent]:
        """Announce the message item (once), before its first delta."""
        if self.opened:
            return []
        self.opened = True
        self.index = len(self.response.output)
        self.response.output.append(self.item)
        out: list[ev.ServerEvent] = [
            ev.OutputItemAdded(response_id=self.id, output_index=self.index, item=self.item.wire())]
        if self.in_conversation:
            self._add_item(self.item)
            out.append(ev.ConversationItemAdded(item=self.item.wire(),
                                                previous_item_id=self._last_item_id))
        self.previous_item_id = self._last_item_id
        self._last_item_id = self.item.id
        out.append(ev.ContentPartAdded(**self._ids(), part=self._part_event_wire()))
        return out

    def on_text(self, text: str) -> list[ev.ServerEvent]:
        if not text:
            return []
        opened = self._open()
        self.text += text
        self.response.output_tokens += 1
        if self.audio:
            self.part.transcript = self.text
            return [*opened, ev.OutputAudioTranscriptDelta(**self._ids(), delta=text)]
        self.part.text = self.text
        return [*opened, ev.OutputTextDelta(**self._ids(), delta=text)]

    def on_audio(self, out: AudioOut) -> list[ev.ServerEvent]:
        if not self.audio:
            return []
        self._unspoken += out.text
        if out.pcm.size == 0:
            return []
        opened = self._open()
        encoder = self._encoders.get(out.rate)
        if encoder is None:
            encoder = self._encoders[out.rate] = self._encoder_factory(out.rate)
        start = self.part.audio_ms
        self.part.audio_ms = self.part.sent_ms = start + int(round(out.pcm.size * 1000 / out.rate))
        if out.text or not self.part.spoken:
            self.part.spoken.append(SpokenSegment(start, self.part.audio_ms, out.text))
        else:
            last = self.part.spoken[-1]
            self.part.spoken[-1] = SpokenSegment(last.start_ms, self.part.audio_ms, last.text)
        data = encoder.encode(out.pcm)
        return [*opened, *self._sent(data)] if data else opened

    def _sent(self, data: bytes) -> list[ev.ServerEvent]:
        """Audio sent, with the words it is the first to say."""
        spoken, self._unspoken = self._unspoken, ""
        return [ev.OutputAudioDelta(**self._ids(), delta=data, spoken=spoken)]

    def on_tool_call(self, call: ToolCall) -> tuple[ConversationItem, list[ev.ServerEvent]]:
        """A complete function call: its own output item, with the arguments
        as one delta (the LLM stage only reports calls once they parse)."""
        item = ConversationItem(id=f"{self.item.id}_call{len(self.response.output)}",
                                type=ItemType.FUNCTION_CALL, status="completed",
                                call_id=call.call_id, name=call.name, arguments=call.arguments)
        index = len(self.response.output)
        self.response.output.append(item)
        base = {"response_id": self.id, "item_id": item.id, "output_index": index,
                "call_id": call.call_id}
        in_progress = {**item.wire(), "status": "in_progress", "arguments": ""}
        previous, self._last_item_id = self._last_item_id, item.id
        out: list[ev.ServerEvent] = [
            ev.OutputItemAdded(response_id=self.id, output_index=index, item=in_progress)]
        if self.in_conversation:
            out.append(ev.ConversationItemAdded(item=in_progress, previous_item_id=previous))
        out += [
            ev.FunctionCallArgumentsDelta(**base, delta=call.arguments),
            ev.FunctionCallArgumentsDone(**base, name=call.name, arguments=call.arguments),
            ev.OutputItemDone(response_id=self.id, output_index=index, item=item.wire()),
        ]
        if self.in_conversation:
            out.append(ev.ConversationItemDone(item=item.wire(), previous_item_id=previous))
        return item, out

    def add_output(self, item: ConversationItem) -> tuple[int, str | None]:
        """Another output item of the response (an MCP call or approval
        request, ``mcp_calls.py``): its ``output_index`` and the item it follows."""
        index = len(self.response.output)
        self.response.output.append(item)
        previous, self._last_item_id = self._last_item_id, item.id
        return index, previous

    def on_generation_done(self, done: GenerationDone) -> None:
        self.finish_reason = done.finish_reason
        self.response.input_tokens = done.input_tokens
        self.response.output_tokens = max(self.response.output_tokens, done.output_tokens)

    def cut_to_heard(self, heard_ms: int) -> ev.ServerEvent | None:
        """Barge-in: cut the assistant item to the words heard (``heard_ms``
        of its audio played), so the next turn's context holds only those (a
        client that knows better sends truncate)."""
        if not self.audio:
            return None
        part = self.part
        heard_ms = min(part.audio_ms, heard_ms)
        part.transcript = self.text = part.heard_text(heard_ms)
        part.audio_ms = heard_ms
        if not self.in_conversation:
            return None
        return ev.ConversationItemTruncated(item_id=self.item.id, content_index=0,
                                            audio_end_ms=heard_ms)

    def truncated(self) -> None:
        """The client cut this item while it was generated (its part is
        already cut to what was heard): the .done events carry only that."""
        self.text = self.part.transcript or ""

    def finish(self, status: ResponseStatus, times: ResponseTimes,
               details: dict | None = None) -> list[ev.ServerEvent]:
        """Close every open part; exactly one response.done (its metadata
        carries the reply's latency figures, ``times``)."""
        if status is ResponseStatus.COMPLETED and self.finish_reason == "length":
            status = ResponseStatus.INCOMPLETE
            details = {"type": "incomplete", "reason": "max_output_tokens"}
        only_calls = not self.opened and len(self.response.output) > 0  # no message to close
        out: list[ev.ServerEvent] = [] if only_calls else self._open()  # a reply with no words has one
        self.response.status = status
        self.response.status_details = details
        if figures := times.metadata():  # the client's metadata is kept beside them
            self.response.metadata = {**(self.response.metadata or {}), **figures}
        self.item.status = "completed" if status is ResponseStatus.COMPLETED else "incomplete"
        if only_calls:
            return [ev.ResponseDone(response=self.response.wire())]
        if status is ResponseStatus.COMPLETED:
            # The resampler holds the last few ms of the reply: send them too.
            for encoder in self._encoders.values():
                if tail := encoder.flush():
                    out += self._sent(tail)
        if self.audio:
            out += [ev.OutputAudioDone(**self._ids()),
                    ev.OutputAudioTranscriptDone(**self._ids(), transcript=self.text)]
        else:
            out.append(ev.OutputTextDone(**self._ids(), text=self.text))
        out += [
            ev.ContentPartDone(**self._ids(), part=self._part_event_wire()),
            ev.OutputItemDone(response_id=self.id, output_index=self.index, item=self.item.wire()),
        ]
        if self.in_conversation:
            out.append(ev.ConversationItemDone(item=self.item.wire(),
                                               previous_item_id=self.previous_item_id))
        out.append(ev.ResponseDone(response=self.response.wire()))
        return out
