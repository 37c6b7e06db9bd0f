"""A whole session (core, runner, scripted stages), driven without a socket.

Pins: the control lane overtakes queued audio (a cancel behind 100 appends is
applied first); stale outputs never reach the client and are dropped in the
fence gate; listening outputs survive an interruption; fences only grow; a
session that lags keeps bounded queues (merging deltas) and never deadlocks
on a stage that waits for it. The core alone: tests/unit/test_session_core.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.audio import pcm16
from support.sessions import next_event
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    AudioIn,
    GenerateRequest,
    GenerationDone,
    StageInput,
    StageOutput,
    TextDelta,
    TranscriptDelta,
    VadConfig,
)
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.host.deploy import StageSpec, load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.replay.outbox import Notice
from vllm_duplex.session.feed import HIGH_WATER
from vllm_duplex.session.mailbox import Lane
from vllm_duplex.session.replies import response_context
from vllm_duplex.stages.port import FencedPort, StageBase


@pytest.fixture
async def runtime():
    runtime = Runtime(load_config("scripted"))
    await runtime.start()
    yield runtime
    await runtime.stop()


async def manual_session(runtime):
    session = await runtime.sessions.open(None)
    session.deliver(cmd.SessionUpdate(patch=SessionPatch(turn_detection=None)))
    await next_event(session, "session.updated")
    return session


async def test_cancel_behind_100_appends_is_applied_first(runtime):
    session = await manual_session(runtime)
    session.deliver(cmd.ResponseCreate())
    await next_event(session, "response.created")
    # Queue 100 audio appends, then the cancel, then a commit, without letting
    # the session run in between: the cancel passes the audio (it never waits
    # behind audio decoding) but not the commit after it.
    chunk = pcm16(0.02)
    for _ in range(100):
        session.deliver(cmd.AudioAppend(audio=chunk))
    session.deliver(cmd.ResponseCancel(event_id="cancel-1"))
    session.deliver(cmd.AudioCommit(event_id="commit-1"))
    order = []
    while "input_audio_buffer.committed" not in order:
        env = await next_event(session, "response.done", "input_audio_buffer.committed")
        order.append(env.event.type)
        if env.event.type == "response.done":
            assert env.event.response["status"] == "cancelled"
            assert env.event.response["status_details"]["reason"] == "client_cancelled"
    assert order == ["response.done", "input_audio_buffer.committed"]
    assert session.mailbox.overtaken >= 1
    assert runtime.metrics.control_overtakes.get() >= 1
    await runtime.sessions.end(session, CloseReason.CLIENT)


async def test_interrupt_bumps_epoch_once_and_drops_stale_deltas(runtime):
    session = await manual_session(runtime)
    session.deliver(cmd.ResponseCreate())
    await next_event(session, "response.output_audio_transcript.delta")
    before = session.fence
    session.deliver(cmd.ResponseCancel())
    done = await next_event(session, "response.done")
    assert session.fence == before.next_epoch()
    assert done.fence == session.fence
    response_id = done.event.response["id"]
    # Nothing of the cancelled response may follow its response.done.
    session.deliver(cmd.ItemRetrieve(item_id="nope", event_id="sentinel"))
    while True:
        env = await next_event(session)
        assert getattr(env.event, "response_id", None) != response_id
        if env.event.type == "error":
            assert env.event.error.event_id == "sentinel"
            break
    await runtime.sessions.end(session, CloseReason.CLIENT)


class _DeafLlmStage:
    """An LLM fake that ignores cancel: it keeps producing for the old fence,
    which is exactly what the fence gate must stop from reaching the client."""

    name = "llm"

    def port(self, session_id: str):
        return _DeafPort()


class _DeafPort:
    name = "llm"

    def __init__(self) -> None:
        self.queue: asyncio.Queue[StageOutput | None] = asyncio.Queue()
        self.tasks: list[asyncio.Task[Any]] = []

    def accepts(self, payload: Any) -> bool:
        return isinstance(payload, GenerateRequest)

    async def open(self, fence: Fence) -> None:
        pass

    async def submit(self, item: StageInput) -> None:
        async def talk():
            for i in range(1000):
                await self.queue.put(StageOutput(item.fence, item.request_id, self.name,
                                                 TextDelta(item.payload.response_id, f"w{i} ")))
                await asyncio.sleep(0.001)

        self.tasks.append(asyncio.create_task(talk()))

    async def outputs(self) -> AsyncIterator[StageOutput]:
        while (out := await self.queue.get()) is not None:
            yield out

    async def cancel(self, fence: Fence) -> None:
        pass  # deaf on purpose

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.queue.put(None)


async def test_fence_gate_is_the_one_place_stale_outputs_die(runtime):
    runtime.stages[1:] = [_DeafLlmStage()]  # in place: the sessions service opens on this list
    session = await manual_session(runtime)
    session.deliver(cmd.SessionUpdate(patch=SessionPatch(output_modalities=("text",))))
    await next_event(session, "session.updated")
    session.deliver(cmd.ResponseCreate())
    first = await next_event(session, "response.output_text.delta")
    session.deliver(cmd.ResponseCancel())
    done = await next_event(session, "response.done")
    assert done.event.response["status"] == "cancelled"
    async with asyncio.timeout(5):
        while session.gate.dropped == 0:  # the deaf stage keeps talking for the old fence
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # and some more of it is dropped on the way
    assert runtime.metrics.stale_dropped.get(stage="llm") == session.gate.dropped
    while not session.attachment.empty():
        env = session.attachment.get_nowait()
        assert env.event.type != "response.output_text.delta", "a stale delta reached the client"
    assert first.fence.epoch < session.fence.epoch
    await runtime.sessions.end(session, CloseReason.CLIENT)


async def test_speech_after_cancel_still_starts_a_turn(runtime):
    """Input-side (VAD) outputs describe the user, not a reply: an epoch bump
    between the audio and its VAD event must not lose the user's turn."""
    session = await runtime.sessions.open(None)
    session.deliver(cmd.ResponseCreate())
    await next_event(session, "response.created")
    session.deliver(cmd.AudioAppend(audio=pcm16(0.3, amplitude=0.3)))
    session.deliver(cmd.ResponseCancel())  # overtakes the audio, bumps the epoch
    started = await next_event(session, "input_audio_buffer.speech_started")
    assert started.event.item_id
    await runtime.sessions.end(session, CloseReason.CLIENT)


async def test_fences_only_grow_and_seq_is_dense(runtime):
    session = await runtime.sessions.open(None)
    audio = pcm16(0.1) + pcm16(0.6, amplitude=0.3) + pcm16(1.0)
    for i in range(0, len(audio), 960):
        session.deliver(cmd.AudioAppend(audio=audio[i:i + 960]))
    seen: list[ev.Envelope] = []
    while True:
        env = await next_event(session)
        seen.append(env)
        if env.event.type == "response.output_audio.delta":
            session.deliver(cmd.ResponseCancel())
        if env.event.type == "response.done":
            break
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
    fences = [(e.fence.incarnation, e.fence.epoch) for e in seen]
    assert fences == sorted(fences) and fences[-1][1] == fences[0][1] + 1
    await runtime.sessions.end(session, CloseReason.CLIENT)


async def test_immutable_and_unsupported_updates_are_refused(runtime):
    session = await runtime.sessions.open(None)
    session.deliver(cmd.SessionUpdate(patch=SessionPatch(model="other"), event_id="u1"))
    err = await next_event(session, "error")
    assert (err.event.error.code, err.event.error.param, err.event.error.event_id) == (
        "immutable_field", "session.model", "u1")
    session.deliver(cmd.SessionUpdate(patch=SessionPatch(model=session.config.model)))
    await next_event(session, "session.updated")  # unchanged immutable value is fine
    await runtime.sessions.end(session, CloseReason.CLIENT)


async def test_close_is_idempotent_and_refuses_later_commands(runtime):
    session = await runtime.sessions.open(None)
    await runtime.sessions.end(session, CloseReason.CLIENT)
    await runtime.sessions.end(session, CloseReason.CLIENT)
    assert len(runtime.manager) == 0
    with pytest.raises(Exception) as info:
        session.deliver(cmd.AudioCommit(event_id="late"))
    assert info.value.code == "session_closed" and info.value.event_id == "late"


def test_runtime_rejects_unknown_stage_type():
    config = load_config("scripted")
    bad = dataclasses.replace(config, stages=(dataclasses.replace(config.stages[0], type="nope"),))
    with pytest.raises(ValueError, match="unknown stage type 'nope'"):
        Runtime(bad)


def _scripted_as(policy: str, types: tuple[str, ...], **options: Any):
    config = load_config("scripted")
    return dataclasses.replace(config, policy=policy, policy_options=options,
                               stages=tuple(StageSpec(t) for t in types))


@pytest.mark.parametrize("config, missing", [
    (_scripted_as("scripted", ("energy_vad", "scripted_llm")), "'tts'"),
    (_scripted_as("cascade", ("energy_vad", "scripted_llm", "tone_tts")), "'asr'"),
    (_scripted_as("cascade", ("energy_vad", "pocketsphinx", "scripted_llm", "tone_tts"),
                  vision=True), "'vision'"),
    (_scripted_as("omni", ("scripted_omni",)), "'vad'"),
    (_scripted_as("omni", ("energy_vad", "scripted_llm")), "'omni'"),
])
def test_a_deployment_without_a_stage_its_policy_needs_is_refused_at_load(config, missing):
    with pytest.raises(ValueError) as info:
        Runtime(config)
    message = str(info.value)
    assert f"its stages do not fit policy {config.policy!r}" in message
    assert f"no stage is named {missing}" in message
    assert "(it has: vad (energy_vad)" in message or "(it has: omni (scripted_omni))" in message


def test_a_deployment_whose_stages_route_ambiguously_is_refused_at_load():
    """Stages are addressed by name: two TTS stages of the default name would
    leave "which one speaks?" to chance."""
    config = _scripted_as("scripted", ("energy_vad", "scripted_llm", "tone_tts", "tone_tts"))
    with pytest.raises(ValueError, match="2 stages are named 'tts'"):
        Runtime(config)


def test_a_stage_that_does_not_take_what_the_policy_sends_it_is_refused_at_load():
    # The cascade streams the user's words into its LLM (TextIn); the scripted
    # LLM takes only whole requests.
    config = _scripted_as("cascade", ("energy_vad", "pocketsphinx", "scripted_llm", "tone_tts"))
    with pytest.raises(ValueError, match="stage 'llm' \\(ScriptedLlmStage\\) does not take TextIn"):
        Runtime(config)


def test_the_shipped_deployments_have_what_their_policies_need():
    for name in ("scripted", "omni-scripted"):  # the others build real engines
        Runtime(load_config(name))


def test_gate_keeps_listening_outputs_across_fence_bumps():
    from vllm_duplex.domain.gate import FenceGate
    from vllm_duplex.domain.payloads import VadSpeechStarted

    old = Fence("s", 0, 0)
    gate = FenceGate(old)
    gate.advance(old.next_epoch())
    heard = StageOutput(old, old.request_id("in"), "vad", VadSpeechStarted(0))
    spoken = StageOutput(old, old.request_id("llm"), "llm", TextDelta("r", "x"))
    assert gate.admit(heard) and not gate.admit(spoken)
    gate.advance(gate.fence.next_incarnation())  # a rollback rebuilt the model context
    assert gate.admit(heard) and not gate.admit(spoken)  # the user's words still stand
    assert gate.dropped == 2


async def test_a_consumer_that_stops_reading_ends_its_session_with_bounded_memory(runtime):
    """Without resume (grace 0), a socket that stops reading ends its session."""
    runtime.sessions.limits = dataclasses.replace(runtime.sessions.limits, outbound_capacity=8,
                                                survives_disconnect=False)
    session = await manual_session(runtime)  # reads session.created/updated only
    att = session.attachment
    session.deliver(cmd.ResponseCreate())  # ~60 events, nobody reads them
    await asyncio.wait_for(session.closed.wait(), 5)
    assert session.close_reason is CloseReason.SLOW_CONSUMER
    assert att.qsize() == 1 and att.get_nowait() is Notice.SLOW_CONSUMER  # backlog dropped
    await runtime.sessions.end(session, CloseReason.CLIENT)
    assert runtime.metrics.sessions_closed.get(reason="slow_consumer") == 1


async def test_with_resume_a_slow_consumer_loses_its_socket_not_its_session(runtime):
    runtime.sessions.limits = dataclasses.replace(runtime.sessions.limits, outbound_capacity=8,
                                                survives_disconnect=True)
    session = await manual_session(runtime)
    att = session.attachment
    session.deliver(cmd.ResponseCreate())
    while session.attachment is att:
        await asyncio.sleep(0.01)
    assert att.get_nowait() is Notice.SLOW_CONSUMER and att.pending_bytes == 0
    assert session.close_reason is None and runtime.metrics.slow_consumers.get() == 1
    # the journal kept everything: a resume from the last seq read replays it all
    new, replay, resumed = session.resume(session.resume_token, 2)
    assert not replay.resync and [e.seq for e in replay.events] == list(range(3, replay.head_seq + 1))
    assert resumed["resume_token"] == session.resume_token
    await runtime.sessions.end(session, CloseReason.CLIENT)


async def test_silence_under_server_vad_does_not_grow_the_buffer(runtime):
    session = await runtime.sessions.open(None)
    for _ in range(250):  # 5 s of silence
        session.deliver(cmd.AudioAppend(audio=pcm16(0.02)))
    session.deliver(cmd.ItemRetrieve(item_id="x"))  # a sentinel behind the audio
    await next_event(session, "error")
    td = session.config.turn_detection
    assert session.core.input.samples <= (td.prefix_padding_ms + 1000 + 20) * 16
    await runtime.sessions.end(session, CloseReason.CLIENT)


async def test_manual_buffer_is_capped_with_a_typed_error(runtime):
    runtime.sessions.limits = dataclasses.replace(runtime.sessions.limits, max_buffer_ms=100)
    session = await manual_session(runtime)
    for i in range(6):
        session.deliver(cmd.AudioAppend(audio=pcm16(0.02), event_id=f"a{i}"))
    err = await next_event(session, "error")
    assert (err.event.error.code, err.event.error.event_id) == ("resource_exhausted", "a5")
    session.deliver(cmd.AudioCommit())
    committed = await next_event(session, "conversation.item.done")
    assert committed.event.item["role"] == "user"
    await runtime.sessions.end(session, CloseReason.CLIENT)


async def test_barge_in_cuts_the_assistant_item_to_what_was_heard():
    """Virtual clock, unpaced output: the user barges in exactly 500 ms after
    the first audio delta; the first sentence is 6 words x 120 ms, so 4 words
    were heard. (Paced output knows what was heard from the pacer:
    tests/unit/test_output_pacing.py.)"""
    from vllm_duplex.domain.interruption import OutputPacing
    from vllm_duplex.testing.clock import VirtualClock

    clock = VirtualClock()
    runtime = Runtime(load_config("scripted"), clock=clock)
    await runtime.start()
    session = await runtime.sessions.open(None)
    session.deliver(cmd.SessionUpdate(patch=SessionPatch(pacing=OutputPacing("none"))))
    session.deliver(cmd.ResponseCreate())
    while session.core.shown is None or session.core.shown.first_audio_at is None:
        await clock.advance(0.01)
    first_audio_at = session.core.shown.first_audio_at
    item_id = session.core.shown.record.item.id
    await clock.advance(first_audio_at + 0.5 - clock.now())
    session.deliver(cmd.AudioAppend(audio=pcm16(0.3, amplitude=0.3)))  # the user speaks
    truncated = await next_event(session, "conversation.item.truncated")
    assert (truncated.event.item_id, truncated.event.audio_end_ms) == (item_id, 500)
    heard = session.core.conversation.get(item_id)
    assert heard.text() == "Hello from the scripted"
    context = response_context(session.core.policy, session.core, session.core.conversation,
                               cmd.ResponseOptions())
    assert context[-1].role == "assistant" and context[-1].text == "Hello from the scripted"
    await runtime.sessions.end(session, CloseReason.CLIENT)
    await runtime.stop()


async def test_a_terminal_stage_failure_ends_the_session_with_one_error(runtime):
    from vllm_duplex.domain.errors import DuplexError
    from vllm_duplex.domain.payloads import StageFailed

    session = await runtime.sessions.open(None)
    dead = DuplexError("engine_dead", "the vLLM engine died")
    fence = session.fence
    await session._enqueue_output(StageOutput(fence, fence.request_id("llm"), "llm", StageFailed(dead)))
    err = await next_event(session, "error")
    assert err.event.error.code == "engine_dead" and err.event.error.to_wire()["retryable"]
    await asyncio.wait_for(session.closed.wait(), 5)
    assert session.close_reason is CloseReason.ENGINE_DEAD
    await runtime.sessions.end(session, CloseReason.CLIENT)


# ---- a session that lags: bounded, merged, never deadlocked ---------------------------


class _FloodLlmStage(StageBase):
    """Writes its whole reply at once: word after word, as fast as its
    queue takes them (a fast engine against a slow session)."""

    accepted = (GenerateRequest,)

    def __init__(self, words: list[str]) -> None:
        super().__init__("llm", MonotonicClock())
        self.words = words

    def port(self, session_id: str):
        return _FloodPort(self, session_id)


class _FloodPort(FencedPort):
    async def _handle(self, item: StageInput) -> None:
        self._spawn(item, lambda: self._flood(item))

    async def _flood(self, item: StageInput) -> None:
        rid = item.payload.response_id
        for word in self._stage.words:
            await self._emit(item.fence, item.request_id, TextDelta(rid, word))
        await self._emit(item.fence, item.request_id,
                         GenerationDone(rid, "stop", 0, len(self._stage.words)))


async def test_a_flood_of_deltas_is_merged_not_queued_without_bound(runtime):
    words = [f"w{i} " for i in range(2000)]
    runtime.stages[1:] = [_FloodLlmStage(words)]  # in place: the sessions service opens on this list
    runtime.sessions.limits = dataclasses.replace(runtime.sessions.limits, stage_capacity=4)
    session = await manual_session(runtime)
    session.deliver(cmd.SessionUpdate(patch=SessionPatch(output_modalities=("text",))))
    await next_event(session, "session.updated")
    session.deliver(cmd.ResponseCreate())
    text, deltas = "", 0
    while True:
        env = await next_event(session, "response.output_text.delta", "response.done")
        if env.event.type == "response.done":
            break
        text, deltas = text + env.event.delta, deltas + 1
    assert text == "".join(words)  # every word, in order
    assert deltas < len(words) and session.mailbox.merged == len(words) - deltas
    assert session.mailbox.peak[Lane.STAGE] <= 4
    assert env.event.response["status"] == "completed"
    await runtime.sessions.end(session, CloseReason.CLIENT)


class _ChattyVadStage(StageBase):
    """Like the energy VAD it produces inline, from ``submit``: each chunk
    makes five outputs that cannot merge, into an output queue of one."""

    accepted = (AudioIn, VadConfig)

    def __init__(self) -> None:
        super().__init__("vad", MonotonicClock())
        self.chunks = 0

    def port(self, session_id: str):
        return _ChattyPort(self, session_id)


class _ChattyPort(FencedPort):
    def __init__(self, stage: _ChattyVadStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._queue = asyncio.Queue(maxsize=1)

    async def _handle(self, item: StageInput) -> None:
        if isinstance(item.payload, AudioIn):
            n = self._stage.chunks
            self._stage.chunks += 1
            for k in range(5):
                await self._emit(item.fence, item.request_id, TranscriptDelta(f"{n}.{k} "))


async def test_a_stage_that_waits_on_its_outputs_cannot_deadlock_the_session(runtime):
    """The session used to await ``submit``; here ``submit`` waits for the
    session to take outputs from a full STAGE lane. It must still finish,
    with every output, and with both the lane and the stage feed bounded."""
    runtime.stages[0] = _ChattyVadStage()  # in place: the sessions service opens on this list
    runtime.sessions.limits = dataclasses.replace(runtime.sessions.limits, stage_capacity=2)
    session = await runtime.sessions.open(None)
    for _ in range(100):  # 100 ms each: every one yields samples past the resampler's delay
        session.deliver(cmd.AudioAppend(audio=pcm16(0.1)))
    got = []
    while len(got) < 500:
        env = await next_event(session, "conversation.item.input_audio_transcription.delta")
        got.append(env.event.delta)
    assert got == [f"{n}.{k} " for n in range(100) for k in range(5)]
    assert session.mailbox.peak[Lane.STAGE] <= 2
    assert session.feed.peak <= HIGH_WATER + 1  # client data paused above the watermark
    assert not session.feed.paused
    await runtime.sessions.end(session, CloseReason.CLIENT)


async def test_a_submission_the_stage_refuses_is_an_internal_error_not_a_stall(runtime):
    session = await runtime.sessions.open(None)
    fence = session.fence
    session.feed.submit("llm", fence, "llm", TextDelta("r", "not a request"))  # llm takes GenerateRequest
    err = await next_event(session, "error")
    assert err.event.error.code == "internal_error"
    session.deliver(cmd.ItemRetrieve(item_id="nope", event_id="after"))
    err = await next_event(session, "error")
    assert err.event.error.event_id == "after"  # the session goes on
    await runtime.sessions.end(session, CloseReason.CLIENT)


def test_a_timer_never_wakes_the_core_before_its_time():
    """Under uvloop (the server's loop) ``asyncio.sleep`` wakes up to ~1 ms
    before a ``time.monotonic`` deadline; the core drops a timer that is not
    yet due as stale, so a semantic_vad pause whose ``turn_end`` timer woke
    early was never committed and the session never answered (issue 21)."""
    import random

    import uvloop

    async def fire_timers() -> list[float]:
        runtime = Runtime(load_config("scripted"))
        await runtime.start()
        try:
            session = await runtime.sessions.open(None)
            fired: dict[str, float] = {}  # timer -> the session clock when it woke the core
            put = session.mailbox.put_nowait

            def spy(item: Any, lane: Lane) -> None:
                stamp, message = item
                if lane is Lane.CONTROL and isinstance(getattr(message, "name", None), str):
                    fired[message.name] = stamp
                put(item, lane)

            session.mailbox.put_nowait = spy  # type: ignore[method-assign]
            early = []
            for i in range(40):
                await asyncio.sleep(random.random() * 0.003)
                at = session.clock.now() + 0.0123
                await session._timer(f"t{i}", at)  # sleeps, then queues TimerFired
                early.append(at - fired[f"t{i}"])
            await runtime.sessions.end(session, CloseReason.CLIENT)
            return early
        finally:
            await runtime.stop()

    early = uvloop.run(fire_timers())
    assert max(early) <= 0, f"{sum(e > 0 for e in early)} of 40 timers woke the core early"
