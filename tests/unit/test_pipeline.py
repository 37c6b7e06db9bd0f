"""Pipeline, fence gate and scripted stages, on a virtual clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.gate import FenceGate
from vllm_duplex.domain.payloads import (
    AudioIn,
    AudioOut,
    ContextMessage,
    EndOfText,
    GenerateRequest,
    GenerationDone,
    SpeechDone,
    StageFailed,
    StageInput,
    StageOutput,
    TextDelta,
    VadConfig,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.stages.listening.energy_vad import EnergyVadStage
from vllm_duplex.stages.pipeline import Pipeline
from vllm_duplex.testing.clock import VirtualClock
from vllm_duplex.testing.stages import (
    DEFAULT_REPLY,
    ScriptedLlmStage,
    ToneTtsStage,
    split_tokens,
)

SID = "sess-1"
F0 = Fence(SID)


async def settle(rounds: int = 200) -> None:
    """Let every runnable task run until it blocks (virtual time stands still)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def run_for(clock: VirtualClock, seconds: float, step: float = 0.02) -> None:
    """Advance virtual time in small steps, letting tasks reach their next
    sleep before each step (a task that has not run yet has no sleeper)."""
    for _ in range(round(seconds / step)):
        await settle()
        await clock.advance(step)
    await settle()


def request(rid: str = "resp_1", max_tokens: int | None = None) -> GenerateRequest:
    return GenerateRequest(
        response_id=rid,
        context=(ContextMessage("system", "be brief"), ContextMessage("user", "hi there you")),
        sampling=SamplingConfig(max_tokens=max_tokens),
    )


class Harness:
    """A session stand-in: one gate, and what the policy forwards after the
    gate admitted it: the LLM's output goes on to the TTS."""

    def __init__(self, ports: list[Any], clock: VirtualClock) -> None:
        self.gate = FenceGate(F0)
        self.raw: list[StageOutput] = []  # everything the pumps delivered
        self.admitted: list[StageOutput] = []
        self.pipeline = Pipeline(ports, self.sink, clock=clock)

    async def sink(self, output: StageOutput) -> None:
        self.raw.append(output)
        if self.gate.admit(output):
            self.admitted.append(output)
            if output.stage == "llm":
                await self.pipeline.forward(output, "tts")

    def payloads(self, kind: type | tuple[type, ...] = object) -> list[Any]:
        return [o.payload for o in self.admitted if isinstance(o.payload, kind)]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


async def cascade(clock: VirtualClock, **llm: Any) -> tuple[Harness, ScriptedLlmStage, ToneTtsStage]:
    llm_stage = ScriptedLlmStage(clock=clock, **llm)
    tts_stage = ToneTtsStage(clock=clock)
    h = Harness([llm_stage.port(SID), tts_stage.port(SID)], clock)
    await h.pipeline.open(F0)
    return h, llm_stage, tts_stage


# ---- pipeline ----------------------------------------------------------------


async def test_open_names_pumps_and_close_is_idempotent(clock: VirtualClock) -> None:
    h, _, _ = await cascade(clock)
    assert h.pipeline.names == ("llm", "tts")
    assert [p.name for p in h.pipeline.ports] == ["llm", "tts"]
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert {f"duplex-pump-llm-{SID}", f"duplex-pump-tts-{SID}"} <= names
    await h.pipeline.close()
    await h.pipeline.close()
    assert not any(t.get_name().startswith("duplex-pump-") for t in asyncio.all_tasks())
    with pytest.raises(RuntimeError):
        await h.pipeline.submit("llm", F0, "gen", request())


async def test_unknown_stage_is_a_clear_key_error(clock: VirtualClock) -> None:
    h, _, _ = await cascade(clock)
    try:
        with pytest.raises(KeyError, match="unknown stage 'asr'.*llm, tts"):
            await h.pipeline.submit("asr", F0, "x", request())
    finally:
        await h.pipeline.close()


async def test_llm_streams_into_tts_before_generation_ends(clock: VirtualClock) -> None:
    h, llm, tts = await cascade(clock)
    try:
        rid = await h.pipeline.submit("llm", F0, "gen", request())
        assert rid == F0.request_id("gen")
        await run_for(clock, 0.8)
        kinds = [type(o.payload) for o in h.admitted]
        assert kinds.index(AudioOut) < kinds.index(GenerationDone)  # early output
        assert kinds[-1] is SpeechDone
        # text and spoken words both add up to the reply exactly
        assert "".join(d.text for d in h.payloads(TextDelta)) == DEFAULT_REPLY
        audio = h.payloads(AudioOut)
        assert "".join(a.text for a in audio) == DEFAULT_REPLY
        assert sum(len(a.pcm) for a in audio) == 24000 * 12 * 120 // 1000  # 12 words
        done = h.payloads(GenerationDone)[0]
        assert (done.finish_reason, done.input_tokens, done.output_tokens) == ("stop", 5, 12)
        assert all(o.request_id == rid and o.fence == F0 for o in h.admitted)
        assert h.pipeline.stats.forwarded == 13  # 12 deltas + done
        assert h.pipeline.stats.submitted == 1
        assert (llm.active_requests, tts.active_requests) == (0, 0)
        assert (llm.completed_requests, tts.completed_requests) == (1, 1)
    finally:
        await h.pipeline.close()


async def test_max_tokens_stops_with_length(clock: VirtualClock) -> None:
    h, _, _ = await cascade(clock)
    try:
        await h.pipeline.submit("llm", F0, "gen", request(max_tokens=3))
        await run_for(clock, 1.0)
        assert "".join(d.text for d in h.payloads(TextDelta)) == "Hello from the "
        done = h.payloads(GenerationDone)[0]
        assert (done.finish_reason, done.output_tokens) == ("length", 3)
        assert h.payloads(SpeechDone)  # the fragment is flushed and spoken
        assert h.payloads(AudioOut)[0].text == "Hello from the "
    finally:
        await h.pipeline.close()


async def test_cancel_aborts_in_flight_work(clock: VirtualClock) -> None:
    h, llm, tts = await cascade(clock)
    try:
        await h.pipeline.submit("llm", F0, "gen", request())
        await run_for(clock, 0.12)  # first sentence done: TTS is speaking too
        assert llm.active_requests == 1 and tts.active_requests == 1
        assert h.payloads(AudioOut)
        f1 = F0.next_epoch()
        h.gate.advance(f1)
        await h.pipeline.cancel(f1)
        assert llm.aborted_requests == 1 and llm.active_requests == 0
        assert tts.aborted_requests == 1 and tts.active_requests == 0
        await settle()
        before = len(h.raw)
        await run_for(clock, 2.0)
        assert len(h.raw) == before  # nothing more from the old fence
        assert not any(isinstance(o.payload, GenerationDone) for o in h.raw)
        assert h.gate.dropped == before - len(h.admitted)
        # a new request under the new fence runs normally
        await h.pipeline.submit("llm", f1, "gen", request("resp_2"))
        await run_for(clock, 1.0)
        assert [o.fence for o in h.admitted if isinstance(o.payload, GenerationDone)] == [f1]
        # a submission under the cancelled fence is refused, not started
        await h.pipeline.submit("llm", F0, "gen", request("resp_3"))
        assert llm.active_requests == 0
    finally:
        await h.pipeline.close()


async def test_close_cancels_running_work(clock: VirtualClock) -> None:
    h, llm, _ = await cascade(clock)
    await h.pipeline.submit("llm", F0, "gen", request())
    await clock.advance(0.05)
    assert llm.active_requests == 1
    await h.pipeline.close()
    assert llm.active_requests == 0  # and the conftest fixture finds no task


async def test_forward_goes_to_the_stage_named_not_the_next_one(clock: VirtualClock) -> None:
    h, _, _ = await cascade(clock)
    try:
        out = StageOutput(F0, F0.request_id("x"), "tts", TextDelta("r", "a"))
        assert not await h.pipeline.forward(out, "vision")  # no such stage here
        out = StageOutput(F0, F0.request_id("x"), "llm", VadSpeechStarted(0))
        with pytest.raises(TypeError, match="does not accept VadSpeechStarted"):
            await h.pipeline.forward(out, "tts")  # a route the load check would refuse
        assert h.pipeline.stats.forwarded == 0
        # The stage's position means nothing: the TTS comes after the LLM,
        # yet a (scripted) LLM is what "llm" names.
        out = StageOutput(F0, F0.request_id("x"), "tts", GenerateRequest("r", (), SamplingConfig()))
        assert await h.pipeline.forward(out, "llm") and h.pipeline.stats.forwarded == 1
    finally:
        await h.pipeline.close()


class ExplodingPort:
    """Yields one output, then its engine dies."""

    name = "boom"

    def __init__(self) -> None:
        self._go = asyncio.Event()
        self._fence = F0

    def accepts(self, payload: Any) -> bool:
        return isinstance(payload, str)

    async def open(self, fence: Fence) -> None:
        self._fence = fence

    async def submit(self, item: StageInput) -> None:
        self._go.set()

    async def _gen(self) -> AsyncIterator[StageOutput]:
        await self._go.wait()
        yield StageOutput(self._fence, self._fence.request_id("boom"), self.name, TextDelta("r", "x"))
        raise RuntimeError("engine died")

    def outputs(self) -> AsyncIterator[StageOutput]:
        return self._gen()

    async def cancel(self, fence: Fence) -> None:
        raise RuntimeError("cannot cancel either")

    async def close(self) -> None:
        pass


async def test_failing_port_reports_and_others_keep_going(clock: VirtualClock) -> None:
    llm = ScriptedLlmStage(clock=clock)
    tts = ToneTtsStage(clock=clock)
    h = Harness([ExplodingPort(), llm.port(SID), tts.port(SID)], clock)
    await h.pipeline.open(F0)
    try:
        f1 = F0.next_epoch()
        h.gate.advance(f1)
        await h.pipeline.cancel(f1)  # the broken port's cancel must not stop the others
        await run_for(clock, 2.0)
        await h.pipeline.submit("boom", f1, "x", "go")
        await settle()
        failures = [o for o in h.admitted if isinstance(o.payload, StageFailed)]
        assert len(failures) == 1
        assert failures[0].created_at == clock.now() > 0  # stamped by the session's clock
        # reported under the newest fence, so the gate admits it
        assert failures[0].stage == "boom" and failures[0].fence == f1
        assert failures[0].payload.error.code == "stage_failed"
        assert "engine died" in failures[0].payload.error.message
        assert h.pipeline.stats.failures == 1
        await h.pipeline.submit("llm", f1, "gen", request())
        await run_for(clock, 1.0)
        assert h.payloads(GenerationDone) and h.payloads(SpeechDone)
    finally:
        await h.pipeline.close()


async def test_sink_errors_do_not_stop_a_pump(clock: VirtualClock) -> None:
    llm = ScriptedLlmStage(clock=clock, reply="a b c")
    seen: list[Any] = []

    async def sink(o: StageOutput) -> None:
        seen.append(o.payload)
        if len(seen) == 1:
            raise RuntimeError("sink bug")

    p = Pipeline([llm.port(SID)], sink, clock=clock)
    await p.open(F0)
    try:
        await p.submit("llm", F0, "gen", request())
        await run_for(clock, 1.0)
        assert isinstance(seen[-1], GenerationDone) and len(seen) == 4
    finally:
        await p.close()


def test_pipeline_rejects_duplicate_stage_names() -> None:
    clock = VirtualClock()
    with pytest.raises(ValueError):
        Pipeline([ScriptedLlmStage(clock=clock).port(SID), ScriptedLlmStage(clock=clock).port(SID)],
                 None, clock=clock)  # type: ignore[arg-type]


# ---- fence gate --------------------------------------------------------------


def test_gate_admits_current_and_drops_stale() -> None:
    gate = FenceGate(F0)
    old = StageOutput(F0, F0.request_id("a"), "llm", TextDelta("r", "x"))
    assert gate.admit(old)
    f1 = F0.next_epoch()
    gate.advance(f1)
    assert gate.fence == f1
    assert not gate.admit(old)
    assert not gate.admit(StageOutput(Fence("other", 9, 9), "id", "tts", SpeechDone("r")))
    assert gate.admit(StageOutput(f1, f1.request_id("a"), "llm", TextDelta("r", "y")))
    newer = f1.next_incarnation()  # output of a fence the gate has not reached yet
    assert gate.admit(StageOutput(newer, newer.request_id("a"), "llm", TextDelta("r", "z")))
    assert (gate.dropped, gate.admitted) == (2, 3)
    assert gate.dropped_by_stage == {"llm": 1, "tts": 1}


@pytest.mark.parametrize("bad", [F0, Fence(SID, 0, 0), Fence("other", 5, 5)])
def test_gate_only_grows(bad: Fence) -> None:
    gate = FenceGate(F0)
    with pytest.raises(ValueError):
        gate.advance(bad)
    gate.advance(F0.next_incarnation())
    with pytest.raises(ValueError):
        gate.advance(F0.next_epoch())
    assert gate.fence == F0.next_incarnation()


# ---- scripted VAD port -------------------------------------------------------


def tone(ms: int, dbfs: float = -20.0) -> np.ndarray:
    t = np.arange(16 * ms) / 16000
    return np.round(32767 * 10 ** (dbfs / 20) * np.sin(2 * np.pi * 220 * t)).astype(np.int16)


async def test_vad_port_emits_fenced_events_in_audio_time(clock: VirtualClock) -> None:
    vad = EnergyVadStage(clock=clock)
    h = Harness([vad.port(SID)], clock)
    await h.pipeline.open(F0)
    try:
        await h.pipeline.submit("vad", F0, "cfg", VadConfig(0.5, 100, 200))
        audio = np.concatenate([np.zeros(16 * 300, np.int16), tone(400), np.zeros(16 * 400, np.int16)])
        ids = []
        for start in range(0, 1100, 20):  # 20 ms chunks, like a client would send
            chunk = audio[16 * start : 16 * (start + 20)]
            ids.append(await h.pipeline.submit("vad", F0, "audio", AudioIn(chunk, start)))
        await settle()
        assert h.payloads() == [VadSpeechStarted(200), VadSpeechStopped(700)]
        assert vad.active_requests == 0  # inline, no tasks
        with pytest.raises(TypeError):
            await h.pipeline.submit("vad", F0, "x", "not audio")
    finally:
        await h.pipeline.close()


def test_split_tokens_round_trips() -> None:
    for text in [DEFAULT_REPLY, "  lead and trail  ", "", "one"]:
        assert "".join(split_tokens(text)) == text


async def test_tts_speaks_each_response_once(clock: VirtualClock) -> None:
    tts = ToneTtsStage(clock=clock)
    h = Harness([tts.port(SID)], clock)
    await h.pipeline.open(F0)
    try:
        for payload in [TextDelta("r", "One two! Three"), GenerationDone("r", "stop")]:
            await h.pipeline.submit("tts", F0, "t", payload)
        await settle()
        await h.pipeline.submit("tts", F0, "t", EndOfText("r"))  # late duplicate end
        await settle()
        audio = h.payloads(AudioOut)
        assert [a.text for a in audio if a.text] == ["One two! ", "Three"]
        assert sum(len(a.pcm) for a in audio) == 24000 * 3 * 120 // 1000
        assert all(len(a.pcm) <= 960 and a.rate == 24000 for a in audio)
        peak = max(int(np.abs(a.pcm).max()) for a in audio)
        assert 8000 < peak < 8300  # about -12 dBFS
        assert h.payloads(SpeechDone) == [SpeechDone("r")]
    finally:
        await h.pipeline.close()
