"""The session port every transport stands on (``realtime/server/port/``),
without sockets: what a client's frame becomes, what is counted, what a call's
clear keeps of the item, and how a call ends -- once, for every transport.

The session and the sessions service are small stand-ins that record what the
port asked of them; the codec is the real one."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.commands import AudioAppend, AudioCommit, ItemTruncate
from vllm_duplex.domain.errors import Closed, DuplexError
from vllm_duplex.domain.events import Envelope, SessionUpdated
from vllm_duplex.domain.fence import Fence
from vllm_duplex.realtime.server.port.calls import Call, Calls
from vllm_duplex.realtime.server.port.session_port import Rules, SessionPort
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.replay.outbox import Notice


class Attachment:
    def __init__(self, *items: Any) -> None:
        self.items = list(items)

    async def get(self) -> Any:
        return self.items.pop(0)


class Session:
    session_id = "sess_1"

    def __init__(self, attachment: Attachment | None = None) -> None:
        self.fence = Fence("sess_1", 1, 3)
        self.delivered: list[tuple[Any, float]] = []
        self.attachment = attachment
        self.close_reason: CloseReason | None = None

    def deliver(self, command: Any, received_at: float) -> None:
        if self.close_reason is not None:
            raise Closed("session_closed", "the session is closed")
        self.delivered.append((command, received_at))


class Sessions:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.ended: list[CloseReason] = []
        self.clock = 7.0

    def now(self) -> float:
        return self.clock

    def count_error(self, code: str) -> None:
        self.errors.append(code)

    async def end(self, session: Session, reason: CloseReason) -> None:
        self.ended.append(reason)
        session.close_reason = session.close_reason or reason

    def check_owner(self, session_id: str, key: str | None) -> None:
        if key != "owner":
            raise DuplexError("session_not_found", "not yours")


def port(session: Session | None = None) -> tuple[SessionPort, Session, Sessions]:
    session = session or Session()
    sessions = Sessions()
    return SessionPort(sessions, session, session.attachment, RealtimeCodec()), session, sessions  # type: ignore[arg-type]


def frame(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields})


SOCKET = Rules("session.resume starts a ?resume=1 socket")


def test_a_frame_reaches_the_session_stamped_when_it_arrived() -> None:
    p, session, sessions = port()
    p.feed(frame("input_audio_buffer.commit"), SOCKET)
    [(command, at)] = session.delivered
    assert isinstance(command, AudioCommit) and at == 7.0
    assert sessions.errors == []


def test_a_bad_frame_is_a_typed_error_counted_once_and_never_delivered() -> None:
    p, session, sessions = port()
    with pytest.raises(DuplexError) as err:
        p.feed("{not json", SOCKET)
    assert err.value.code == "invalid_json"
    assert sessions.errors == ["invalid_json"] and session.delivered == []
    wire = json.loads(p.error(err.value))
    assert wire["type"] == "error" and wire["metadata"]["fence"] == {"incarnation": 1, "epoch": 3}


def test_each_dialect_says_why_a_resume_mid_stream_is_refused() -> None:
    call_rules = Rules("a call has no resume: its session ends with it")
    resume = frame("session.resume", session_id="sess_1", resume_token="t", last_seq=0,
                   event_id="e1")
    for rules in (SOCKET, call_rules):
        p, session, sessions = port()
        with pytest.raises(DuplexError) as err:
            p.feed(resume, rules)
        assert (err.value.code, err.value.message) == ("invalid_event", rules.no_resume)
        assert err.value.event_id == "e1" and session.delivered == []
        assert sessions.errors == ["invalid_event"]


def test_clear_cuts_what_the_transport_plays_or_is_refused_where_nothing_plays() -> None:
    cleared: list[bool] = []
    p, session, _ = port()
    p.feed(frame("output_audio_buffer.clear"), Rules("no", clear=lambda: cleared.append(True)))
    assert cleared == [True] and session.delivered == []
    p, session, sessions = port()
    with pytest.raises(DuplexError) as err:
        p.feed(frame("output_audio_buffer.clear"), Rules("no", no_clear="nothing plays here"))
    assert (err.value.code, err.value.message) == ("capability_unsupported", "nothing plays here")
    assert sessions.errors == ["capability_unsupported"]


def test_audio_into_a_closed_session_ends_the_stream_without_counting_an_error() -> None:
    p, session, sessions = port()
    p.append_audio(b"\x00\x01")
    assert isinstance(session.delivered[0][0], AudioAppend)
    session.close_reason = CloseReason.CLIENT
    with pytest.raises(Closed):
        p.append_audio(b"\x00\x01")
    assert sessions.errors == []  # the caller did nothing wrong
    with pytest.raises(Closed):  # a frame, though, was refused: counted
        p.feed(frame("input_audio_buffer.commit"), SOCKET)
    assert sessions.errors == ["session_closed"]


def test_truncate_keeps_what_was_heard_and_is_quiet_once_the_session_closed() -> None:
    p, session, _ = port()
    p.truncate("item_1", 1234)
    [(command, _)] = session.delivered
    assert command == ItemTruncate(item_id="item_1", content_index=0, audio_end_ms=1234)
    session.close_reason = CloseReason.HANGUP
    p.truncate("item_1", 99)  # no error: the item goes with its session
    assert len(session.delivered) == 1


async def test_events_stop_at_the_attachments_end_and_say_why() -> None:
    event = Envelope(seq=1, event=SessionUpdated(session={}), fence=Fence("sess_1"))
    for end in (None, Notice.REPLACED, Notice.SLOW_CONSUMER):
        p, _, _ = port(Session(Attachment(event, end, event)))
        assert [item async for item in p.events()] == [event]
        assert p.ended_by is end


async def test_ending_keeps_the_sessions_own_reason() -> None:
    p, session, sessions = port()
    assert await p.end(CloseReason.HANGUP) is CloseReason.HANGUP
    p, session, sessions = port()
    session.close_reason = CloseReason.MAX_DURATION
    assert await p.end(CloseReason.HANGUP) is CloseReason.MAX_DURATION
    assert sessions.ended == [CloseReason.MAX_DURATION]


class Phone(Call):
    """A call whose wire is a list of what it did, in order."""

    task_prefix = "test"

    def __init__(self, p: SessionPort, log: list[str], cut: tuple[str, int] | None = None) -> None:
        super().__init__(p, "call_1", on_end=lambda call: log.append("unregistered"))
        self.log = log
        self.cut = cut

    def _cut_output(self) -> tuple[str, int] | None:
        return self.cut

    async def _close_wire(self, reason: CloseReason) -> None:
        self.log.append(f"wire closed: {reason.value}")

    async def _after_stop(self, reason: CloseReason) -> None:
        self.log.append("goodbye")


async def test_a_call_hangs_up_once_in_order_whoever_asks() -> None:
    log: list[str] = []
    p, session, sessions = port()
    call = Phone(p, log)
    never = asyncio.Event()
    task = call._spawn(never.wait(), "media")
    assert task.get_name() == "duplex-test-media-call_1"
    await asyncio.gather(call.hangup(), call.hangup(CloseReason.CLIENT), call.hangup())
    assert log == ["unregistered", "wire closed: hangup", "goodbye"]
    assert sessions.ended == [CloseReason.HANGUP] and task.cancelled() and call.ended.is_set()
    await call.hangup()
    assert log == ["unregistered", "wire closed: hangup", "goodbye"]


async def test_a_calls_clear_truncates_its_item_to_what_was_heard() -> None:
    p, session, _ = port()
    Phone(p, [], cut=("item_9", 480)).clear_output()
    assert session.delivered[0][0] == ItemTruncate(item_id="item_9", content_index=0,
                                                   audio_end_ms=480)
    p, session, _ = port()
    Phone(p, [], cut=None).clear_output()  # nothing playing: nothing to keep short
    assert session.delivered == []


async def test_a_sideband_hears_call_events_with_the_fence() -> None:
    p, _, _ = port()
    call = Phone(p, [])
    heard: list[str] = []

    async def send(text: str) -> None:
        heard.append(text)

    call.sidebands.add(send)
    call._notify("output_audio_buffer.started", response_id="resp_1")
    await asyncio.sleep(0)
    [text] = heard
    event = json.loads(text)
    assert event["type"] == "output_audio_buffer.started" and event["response_id"] == "resp_1"
    assert event["metadata"]["fence"] == {"incarnation": 1, "epoch": 3} and "seq" not in event


def test_a_call_is_found_only_by_the_key_that_owns_it() -> None:
    p, _, sessions = port()
    calls = Calls(sessions)  # type: ignore[arg-type]
    call = Phone(p, [])
    calls.add(call)
    assert calls.get("call_1", "owner") is call
    for call_id, key in (("call_1", "stranger"), ("call_2", "owner")):
        with pytest.raises(DuplexError) as err:
            calls.get(call_id, key)
        assert err.value.code == "call_not_found"  # the same for both: no existence leak
    calls.remove(call)
    assert len(calls) == 0
