"""Voice latency benchmark: spoken turns over the real socket, barge-in, and LLM TTFT.

    python bench/voice_latency.py [--turns 5] [--barge-ins 3] [--barge-after 1.0]
                                  [--story-tokens 400] [--reps 5] [--context-tokens 500]
                                  [--config cascade-cpu] [--no-baseline] [--no-part-b]
                                  [--json out.json]

Part A (end to end, one in-process ``BackgroundServer`` per pipeline, loopback socket,
``RealtimeClient``): ``--turns`` questions spoken by Flite are streamed in 20 ms PCM16
24 kHz chunks on a real-time schedule, in ONE session (a multi-turn conversation); the
client keeps streaming silence while a reply is produced, as an open microphone does.
Per turn, on the client: ``input_audio_buffer.speech_stopped`` -> first
``response.output_audio.delta`` (TTFA), -> ``response.done``, the reply's audio seconds
and RTF = (speech_stopped -> response.done) / reply audio seconds.

Barge-in (``--barge-ins`` tries, a fresh session each): the client asks for a long story
(session ``max_output_tokens`` raised), keeps streaming silence until the reply has
played for ``--barge-after`` seconds, then streams a spoken interruption. From the slot
(scheduled send time) of the first chunk holding speech (the audio is built here, so its
onset chunk is known) to ``response.done`` (status ``cancelled``) and to the last
``response.output_audio.delta`` of the interrupted response.

The server runs in this process, so the client's arrival stamps share its event loop:
a loop stall delays both. Two cross-checks do not depend on the server's own events:
TTFA from the slot at which ``speech_stopped`` was due (end-of-speech audio position +
``silence_duration_ms``), and the client's send lag (printed, flagged above 20 ms).

Part B (the vLLM stage driven directly, same process, same engine, after Part A): LLM
TTFT at end of turn for a ~``--context-tokens`` context (long system prompt + history).
Streaming: the history is prefilled on a port, the turn's words are pushed as ``TextIn``
at speech pace, then ``GenerateRequest``. Full prefill (the baseline): the same turn as a
``GenerateRequest`` on a fresh port. Every run starts its system prompt with a fresh
nonce, so vLLM's prefix cache cannot turn the full prefill into a cache hit.

Baselines (house rule: figures next to a baseline from the same process, as ratios):
Part A's is the model-free ``scripted`` pipeline (energy VAD -> scripted LLM -> tone TTS)
through the same server code and client, i.e. the control-plane floor; Part B's is the
full prefill. Targets are reported PASS/MISS, never asserted. See bench/README.md.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the figures readable

# ruff: noqa: E402
import argparse
import asyncio
import base64
import datetime as dt
import json
import math
import platform
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # speech_fixtures: Flite speech, PocketSphinx

from speech_fixtures import chunks as pcm_chunks  # noqa: E402
from speech_fixtures import speak  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

from vllm_duplex.contracts import SamplingConfig  # noqa: E402
from vllm_duplex.deploy import DeployConfig, load_config, resolve_config_path  # noqa: E402
from vllm_duplex.engine import DuplexEngine  # noqa: E402
from vllm_duplex.fence import Fence  # noqa: E402
from vllm_duplex.realtime.client import RealtimeClient  # noqa: E402
from vllm_duplex.realtime.serving import BackgroundServer  # noqa: E402
from vllm_duplex.stages.base import (  # noqa: E402
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    ResetContext,
    StageFailed,
    StageInput,
    TextDelta,
    TextIn,
)

RATE = 24000
CHUNK_S = 0.020
ONSET_DBFS = -40.0  # a 20 ms chunk "holds speech" when its RMS is above this
TTFA_TARGET_S = 0.300
BARGE_TARGET_S = 0.150
TTFT_RATIO_TARGET = 0.5
WORD_INTERVAL_S = 0.30  # Part B: one word every 300 ms (~200 words/min)
END_OF_TURN_SILENCE_S = 0.5  # Part B: the VAD's default silence_duration_ms before the reply

QUESTIONS = (  # PocketSphinx hears these right when Flite (slt) says them
    "What is the capital of France?",
    "What is the largest ocean?",
    "What is the capital of Italy?",
    "Where is the Eiffel Tower?",
    "How are you today?",
    "What is the capital of Spain?",
    "Tell me a joke.",
)
STORY = "Tell me a long story about a dragon."
INTERRUPTION = "Stop, wait a moment please."
SCRIPTED_REPLY = " ".join(["Hello from the scripted duplex engine."] * 40)

AUDIO_DELTA = "response.output_audio.delta"
TIMED = ("completed", "incomplete")  # incomplete: the reply reached max_output_tokens


# ---- audio we send ------------------------------------------------------------------------


@dataclass(frozen=True)
class Utterance:
    text: str
    chunks: tuple[bytes, ...]
    onset: int  # index of the first chunk holding speech
    end: int  # index of the last chunk holding speech

    @property
    def seconds(self) -> float:
        return len(self.chunks) * CHUNK_S


def utterance(text: str) -> Utterance:
    pcm = speak(text, rate=RATE)  # 0.3 s silence, speech, 1.2 s silence
    cs = tuple(pcm_chunks(pcm, rate=RATE))
    floor = 32768.0 * 10 ** (ONSET_DBFS / 20)
    loud = [i for i, c in enumerate(cs)
            if math.sqrt(np.mean(np.frombuffer(c, "<i2").astype(np.float64) ** 2)) > floor]
    return Utterance(text, cs, loud[0], loud[-1])


SILENCE = bytes(2 * int(RATE * CHUNK_S))
SEND_LAG: list[float] = []  # how late each chunk went out, this phase (reset per phase)


def vad_floor_s(utt: Utterance, kind: str) -> float:
    """Offline, no clock: how much audio after the onset chunk the VAD needs before it
    reports speech -- the algorithmic part of the barge-in figure. The utterance's 20 ms
    chunks go through the product's streaming resampler (24 -> 16 kHz, its filter lag
    included) into the VAD, as in a session; online the VAD's window grid has another
    phase, so this is good to about one window (20 ms energy, 32 ms Silero)."""
    from vllm_duplex.audio import Resampler
    from vllm_duplex.stages.base import INTERNAL_RATE, VadSpeechStarted
    from vllm_duplex.stages.scripted import EnergyVad
    from vllm_duplex.stages.silero_vad import SileroVad, load_model

    vad = (SileroVad(load_model("onnx"), min_speech_ms=64) if kind == "silero"
           else EnergyVad(rate=INTERNAL_RATE, frame_ms=20, min_speech_ms=60))
    resampler = Resampler(RATE, INTERNAL_RATE)
    fed = 0
    for k, chunk in enumerate(utt.chunks):
        pcm = resampler.process(np.frombuffer(chunk, "<i2"))
        events = vad.feed(pcm, fed * 1000 // INTERNAL_RATE) if len(pcm) else []
        fed += len(pcm)
        if any(isinstance(e, VadSpeechStarted) for e in events):
            return (k - utt.onset) * CHUNK_S
    return math.nan


# ---- machine and load -----------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "unknown", ""
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": model,
            "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
            "python": platform.python_version(), "kernel": platform.release(),
            "commit": commit + (" (modified tree)" if dirty else "")}


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of this process, its reaped children and its live descendants
    (the vLLM engine core)."""
    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


class LoadWindow:
    """Cores used by the bench process tree and by everything else during a phase."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.t0 = time.monotonic()
        self.own0 = _tree_cpu(self.proc)
        self.sys0 = psutil.cpu_times()

    def close(self) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        own = (_tree_cpu(self.proc) - self.own0) / wall
        s1 = psutil.cpu_times()
        busy = lambda t: t.user + t.nice + t.system + t.irq + t.softirq + t.steal  # noqa: E731
        machine_busy = (busy(s1) - busy(self.sys0)) / wall
        return {"wall_s": wall, "bench_cores": own, "machine_cores": machine_busy,
                "other_cores": max(0.0, machine_busy - own)}


# ---- one realtime connection ------------------------------------------------------------------


class Conn:
    """A ``RealtimeClient`` with a reader task (events are stamped on arrival, ``_recv_t``)
    and a real-time sender: one 20 ms chunk per slot on an absolute schedule."""

    def __init__(self, rt: RealtimeClient) -> None:
        self.rt = rt
        self.closed = False
        self.next_slot = time.monotonic()
        self.sent: list[float] = []  # slot of every chunk sent: chunk k is audio [20k, 20k+20) ms
        self.reader = asyncio.create_task(self._read(), name="bench-reader")

    @classmethod
    async def open(cls, url: str) -> Conn:
        return cls(await RealtimeClient.connect(url, open_timeout=60))

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.rt.events

    async def _read(self) -> None:
        try:
            while True:
                await self.rt.recv()
        except (ConnectionClosed, asyncio.CancelledError):
            self.closed = True

    async def close(self) -> None:
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        await self.rt.close()

    async def send_chunk(self, chunk: bytes) -> float:
        """Wait for the chunk's slot, send it, and return the slot: the wall time at which
        a live microphone would have delivered it. Figures are measured from slots, so a
        chunk that went out late (a stalled event loop) counts against the server, as a
        late delivery would."""
        now = time.monotonic()
        if self.next_slot - now > 0:
            await asyncio.sleep(self.next_slot - now)
        elif now - self.next_slot > 0.2:  # fell far behind (a stall): restart the schedule
            self.next_slot = now
        slot = self.next_slot
        SEND_LAG.append(time.monotonic() - slot)
        self.sent.append(slot)
        await self.rt.append_audio(chunk)
        self.next_slot += CHUNK_S
        return slot

    async def send(self, chunks: tuple[bytes, ...]) -> list[float]:
        self.next_slot = max(self.next_slot, time.monotonic())
        return [await self.send_chunk(c) for c in chunks]

    async def silence_until(self, done: Any, timeout: float) -> bool:
        """Stream silence until ``done()`` is true; False on timeout or a closed socket."""
        self.next_slot = max(self.next_slot, time.monotonic())
        deadline = time.monotonic() + timeout
        while not done():
            if self.closed or time.monotonic() > deadline:
                return False
            await self.send_chunk(SILENCE)
        return True

    def find(self, start: int, etype: str, **match: Any) -> dict[str, Any] | None:
        for e in self.events[start:]:
            if e.get("type") == etype and all(_get(e, k) == v for k, v in match.items()):
                return e
        return None


def _get(event: dict[str, Any], key: str) -> Any:
    if key == "rid":
        return event.get("response_id") or (event.get("response") or {}).get("id")
    if key == "status":
        return (event.get("response") or {}).get("status")
    return event.get(key)


def audio_seconds(deltas: list[dict[str, Any]], rate: int) -> float:
    return sum(len(base64.b64decode(e.get("delta", ""))) for e in deltas) / 2 / rate


def output_rate(rt: RealtimeClient) -> int:
    fmt = ((rt.session.get("audio") or {}).get("output") or {}).get("format") or {}
    return int(fmt.get("rate") or RATE)


# ---- Part A: turns -----------------------------------------------------------------------------


@dataclass
class Turn:
    question: str
    heard: str = ""
    reply: str = ""
    ttfa_s: float = math.nan
    done_s: float = math.nan
    eos_to_audio_s: float = math.nan  # end of speech sent -> first audio (user-perceived)
    ttfa_due_s: float = math.nan  # first audio - when speech_stopped was due (audio position)
    stopped_late_s: float = math.nan  # speech_stopped seen - when it was due
    asr_s: float = math.nan  # speech_stopped -> input transcription completed (ASR final)
    created_s: float = math.nan  # speech_stopped -> response.created
    audio_s: float = math.nan
    rtf: float = math.nan
    status: str = "no reply"


async def run_turns(url: str, utts: list[Utterance], session: dict[str, Any]) -> list[Turn]:
    conn = await Conn.open(url)
    out: list[Turn] = []
    try:
        if session:
            await conn.rt.send({"type": "session.update", "session": {"type": "realtime", **session}})
            await conn.silence_until(lambda: conn.find(0, "session.updated") is not None, 10)
        rate = output_rate(conn.rt)
        td = ((conn.rt.session.get("audio") or {}).get("input") or {}).get("turn_detection") or {}
        silence_ms = int(td.get("silence_duration_ms") or 500)
        for utt in utts:
            turn = Turn(utt.text)
            out.append(turn)
            i0 = len(conn.events)
            sent = await conn.send(utt.chunks)

            def created() -> dict[str, Any] | None:
                return conn.find(i0, "response.created")

            def finished() -> bool:
                c = created()
                return c is not None and conn.find(i0, "response.done", rid=_get(c, "rid")) is not None

            await conn.silence_until(finished, 90)
            await conn.silence_until(lambda: False, 0.3)  # a gap before the next question
            stopped = conn.find(i0, "input_audio_buffer.speech_stopped")
            heard = conn.find(i0, "conversation.item.input_audio_transcription.completed")
            turn.heard = (heard or {}).get("transcript", "")
            c = created()
            if stopped is None or c is None:
                turn.status = "no speech_stopped" if stopped is None else "no response"
                continue
            rid = _get(c, "rid")
            done = conn.find(i0, "response.done", rid=rid)
            if done is None:
                turn.status = "timeout"
                continue
            deltas = [e for e in conn.events[i0:]
                      if e.get("type") == AUDIO_DELTA and e.get("response_id") == rid]
            tx = conn.find(i0, "response.output_audio_transcript.done", rid=rid)
            turn.reply = (tx or {}).get("transcript", "")
            turn.status = _get(done, "status")
            ts = stopped["_recv_t"]
            turn.created_s = c["_recv_t"] - ts
            # When speech_stopped was due: the wall time at which the chunk holding audio
            # position (end of speech + silence_duration_ms) was sent. The session's audio
            # timeline counts every sample appended, so position p ms is chunk p // 20.
            k = int((stopped.get("audio_end_ms", -10**9) + silence_ms) // (CHUNK_S * 1e3))
            t_due = conn.sent[k] if 0 <= k < len(conn.sent) else math.nan
            turn.stopped_late_s = ts - t_due
            if heard is not None:
                turn.asr_s = heard["_recv_t"] - ts
            turn.done_s = done["_recv_t"] - ts
            if deltas:
                turn.ttfa_s = deltas[0]["_recv_t"] - ts
                turn.eos_to_audio_s = deltas[0]["_recv_t"] - sent[utt.end]
                turn.ttfa_due_s = deltas[0]["_recv_t"] - t_due
                turn.audio_s = audio_seconds(deltas, rate)
                turn.rtf = turn.done_s / turn.audio_s if turn.audio_s > 0 else math.nan
    finally:
        await conn.close()
    return out


# ---- Part A: barge-in ------------------------------------------------------------------------


@dataclass
class Barge:
    to_done_s: float = math.nan  # speech onset sent -> response.done(cancelled)
    to_last_audio_s: float = math.nan  # speech onset sent -> last audio delta (0: none after onset)
    to_speech_started_s: float = math.nan  # speech onset sent -> speech_started (VAD onset)
    deltas_after_onset: int = 0
    deltas_after_done: int = 0
    played_s: float = math.nan  # reply audio played (wall) before the onset
    status: str = "not run"


async def run_barge(url: str, story: Utterance, stop: Utterance, max_tokens: int,
                    barge_after_s: float) -> Barge:
    b = Barge()
    conn = await Conn.open(url)
    try:
        await conn.rt.send({"type": "session.update",
                            "session": {"type": "realtime", "max_output_tokens": max_tokens}})
        await conn.silence_until(lambda: conn.find(0, "session.updated") is not None, 10)
        i0 = len(conn.events)
        await conn.send(story.chunks)

        def first_audio() -> dict[str, Any] | None:
            return conn.find(i0, AUDIO_DELTA)

        if not await conn.silence_until(lambda: first_audio() is not None, 90):
            b.status = "no reply audio"
            return b
        first = first_audio()
        assert first is not None
        rid = first["response_id"]
        play_until = first["_recv_t"] + barge_after_s
        await conn.silence_until(lambda: time.monotonic() >= play_until, barge_after_s + 5)
        if conn.find(i0, "response.done", rid=rid) is not None:
            b.status = "reply ended before the interruption"
            return b
        i1 = len(conn.events)
        sent = await conn.send(stop.chunks)
        t_on = sent[stop.onset]
        b.played_s = t_on - first["_recv_t"]

        def done() -> dict[str, Any] | None:
            return conn.find(i0, "response.done", rid=rid)

        await conn.silence_until(lambda: done() is not None, 30)
        d = done()
        if d is None:
            b.status = "no response.done"
            return b
        settle = time.monotonic() + 1.0  # stragglers of the interrupted reply would show here
        await conn.silence_until(lambda: time.monotonic() >= settle, 3)
        b.status = _get(d, "status")
        b.to_done_s = d["_recv_t"] - t_on
        deltas = [e for e in conn.events[i0:]
                  if e.get("type") == AUDIO_DELTA and e.get("response_id") == rid]
        b.to_last_audio_s = max(0.0, deltas[-1]["_recv_t"] - t_on)
        b.deltas_after_onset = sum(e["_recv_t"] > t_on for e in deltas)
        b.deltas_after_done = sum(e["_recv_t"] > d["_recv_t"] for e in deltas)
        started = conn.find(i1, "input_audio_buffer.speech_started")
        if started is not None:
            b.to_speech_started_s = started["_recv_t"] - t_on
    finally:
        await conn.close()
    return b


# ---- Part B: LLM TTFT ------------------------------------------------------------------------

SYSTEM = (
    "You are a helpful voice assistant for a travel company. You speak with customers on the "
    "phone, so every answer is read aloud by a speech synthesizer: answer in one or two short "
    "sentences, never use lists, tables, markdown, emoji or URLs, and spell out numbers the way "
    "a person would say them. Be warm and polite but brief. If the customer asks about a booking, "
    "ask for the booking reference, which is six letters and digits, before anything else. If "
    "the customer is upset, acknowledge the problem first and then offer one concrete next step. "
    "Never promise refunds; say that a colleague will review the case within two working days. "
    "You know the following facts. Flights can be changed up to twenty four hours before "
    "departure for a fee of forty euros. Hotel bookings can be cancelled free of charge until "
    "six in the evening on the day before arrival. Car rentals require a credit card in the name "
    "of the main driver and a driving licence held for at least one year. Travel insurance covers "
    "cancellations for illness with a doctor's note, but not for a change of mind. Our office "
    "hours are from eight in the morning to eight in the evening, Monday to Saturday. Baggage "
    "allowance is one cabin bag of eight kilograms and one checked bag of twenty three kilograms "
    "on most routes. Children under two travel on a parent's lap and pay ten percent of the adult "
    "fare. Pets up to eight kilograms may travel in the cabin in an approved carrier. If you do "
    "not know an answer, say so and offer to transfer the call to a colleague."
)
HISTORY = (
    ("user", "Hi, I would like to change my flight to Lisbon next week."),
    ("assistant", "Of course. Could you tell me your booking reference, please?"),
    ("user", "It is K7 P2 Q9. I want to leave on Thursday instead of Tuesday."),
    ("assistant", "Thank you. Changing to Thursday is possible for a fee of forty euros."),
    ("user", "That is fine. Can I also bring my small dog in the cabin?"),
    ("assistant", "Yes, pets up to eight kilograms may travel in the cabin in an approved carrier."),
    ("user", "Great. And how much checked baggage can I take on that route?"),
    ("assistant", "You can take one checked bag of twenty three kilograms and one cabin bag."),
)
TURN = "Could you also book me a hotel near the old town for three nights starting on Thursday"


def part_b_context(nonce: str, target_tokens: int, count: Any) -> tuple[ContextMessage, ...]:
    """System prompt (nonce first) + history, trimmed/padded to about ``target_tokens``
    tokens before the new user turn."""
    history = [ContextMessage(r, t) for r, t in HISTORY]
    system = f"Call {nonce}. {SYSTEM}"
    ctx = (ContextMessage("system", system), *history)
    # Pad with more history (repeat) or trim the system prompt to hit the target size.
    while count(ctx) < target_tokens - 40:
        history = history + [ContextMessage(r, t) for r, t in HISTORY[:2]]
        ctx = (ContextMessage("system", system), *history)
    words = system.split()
    while count(ctx) > target_tokens and len(words) > 10:
        words = words[:-5]
        ctx = (ContextMessage("system", " ".join(words)), *history)
    return ctx


@dataclass
class PortRun:
    ttft_s: float = math.nan
    decode_s: float = math.nan  # per token after the first
    input_tokens: int = 0
    status: str = "not run"
    reply: str = ""
    words_ready: bool | None = None  # streaming: every pushed word prefilled at end of turn


class PortReader:
    def __init__(self, port: Any) -> None:
        self.port = port
        self.first_delta_t: float | None = None
        self.text = ""
        self.done: GenerationDone | None = None
        self.done_t: float | None = None
        self.failed: StageFailed | None = None
        self.ended = asyncio.Event()
        self.task = asyncio.create_task(self._read(), name="bench-port-reader")

    async def _read(self) -> None:
        async for out in self.port.outputs():
            p = out.payload
            if isinstance(p, TextDelta):
                if self.first_delta_t is None:
                    self.first_delta_t = time.monotonic()
                self.text += p.text
            elif isinstance(p, GenerationDone):
                self.done, self.done_t = p, time.monotonic()
                self.ended.set()
            elif isinstance(p, StageFailed):
                self.failed = p
                self.ended.set()


def _prefilled(port: Any) -> bool | None:
    """Whether every chunk appended to the port's live request has been computed.
    Reads the port's private state (read only); None when it is not there."""
    live = getattr(port, "_live", None)
    pending = getattr(live, "pending", None)
    return None if pending is None else len(pending) == 0


async def _wait_prefilled(port: Any, timeout: float) -> bool | None:
    deadline = time.monotonic() + timeout
    while (ready := _prefilled(port)) is False and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return ready


async def port_run(stage: Any, ctx: tuple[ContextMessage, ...], *, streaming: bool,
                   max_tokens: int) -> PortRun:
    r = PortRun()
    sid = f"bench-{'stream' if streaming else 'full'}-{uuid.uuid4().hex[:8]}"
    fence = Fence(sid)
    port = stage.port(sid)
    await port.open(fence)
    reader = PortReader(port)
    sampling = SamplingConfig(temperature=0.0, max_tokens=max_tokens)
    turn_ctx = (*ctx, ContextMessage("user", TURN))
    try:
        if streaming:
            # Before the turn: the live request holds the history (in the product, from the
            # previous turns). Then the words arrive while the user speaks.
            await port.submit(StageInput(fence, fence.request_id("llm"), ResetContext(ctx)))
            await _wait_prefilled(port, 60)
            for word in TURN.split():
                await port.submit(StageInput(fence, fence.request_id("llm"), TextIn(word)))
                await asyncio.sleep(WORD_INTERVAL_S)
            await asyncio.sleep(END_OF_TURN_SILENCE_S - WORD_INTERVAL_S)
            r.words_ready = _prefilled(port)
        t0 = time.monotonic()
        await port.submit(StageInput(fence, fence.request_id("resp"),
                                     GenerateRequest(f"resp_{sid}", turn_ctx, sampling)))
        await asyncio.wait_for(reader.ended.wait(), 120)
        if reader.failed is not None:
            r.status = f"failed: {reader.failed.error}"
        elif reader.done is not None and reader.first_delta_t is not None:
            r.ttft_s = reader.first_delta_t - t0
            if reader.done.output_tokens > 1 and reader.done_t is not None:
                r.decode_s = (reader.done_t - reader.first_delta_t) / (reader.done.output_tokens - 1)
            r.input_tokens = reader.done.input_tokens
            r.status = reader.done.finish_reason
            r.reply = reader.text
        else:
            r.status = "no text"
    except TimeoutError:
        r.status = "timeout"
    finally:
        await port.close()
        await asyncio.gather(reader.task, return_exceptions=True)
    return r


async def run_part_b(stage: Any, reps: int, target_tokens: int) -> dict[str, Any]:
    tok = stage.engine.get_tokenizer()
    tok = await tok if asyncio.iscoroutine(tok) else tok

    def count(ctx: tuple[ContextMessage, ...]) -> int:
        return len(tok.encode(stage.render(ctx, False), add_special_tokens=False))

    before = {k: getattr(stage, k) for k in ("fast_paths", "rebuilds", "fresh_prefills")}
    full: list[PortRun] = []
    stream: list[PortRun] = []
    hit: list[PortRun] = []
    for rep in range(reps):
        # A fresh nonce for EVERY run (streaming and full included): the first tokens differ,
        # so no block of the prompt can be found in the prefix cache.
        ctx_full = part_b_context(uuid.uuid4().hex[:12], target_tokens, count)
        ctx_stream = part_b_context(uuid.uuid4().hex[:12], target_tokens, count)
        order = ("full", "stream") if rep % 2 == 0 else ("stream", "full")
        for mode in order:
            if mode == "full":
                full.append(await port_run(stage, ctx_full, streaming=False, max_tokens=16))
            else:
                stream.append(await port_run(stage, ctx_stream, streaming=True, max_tokens=16))
        # For reference only: the same full prompt again is a prefix-cache hit.
        hit.append(await port_run(stage, ctx_full, streaming=False, max_tokens=16))
        print(f"  rep {rep + 1}/{reps}: full {full[-1].ttft_s * 1e3:.1f} ms, streaming "
              f"{stream[-1].ttft_s * 1e3:.1f} ms, cached full {hit[-1].ttft_s * 1e3:.1f} ms "
              f"({full[-1].input_tokens} prompt tokens)", flush=True)
    after = {k: getattr(stage, k) for k in before}
    return {"full": full, "stream": stream, "hit": hit,
            "counters": {k: after[k] - before[k] for k in before}}


# ---- phases -----------------------------------------------------------------------------------


def scripted_config() -> DeployConfig:
    raw = yaml.safe_load(resolve_config_path("scripted").read_text())
    for spec in raw["stages"]:
        if spec["type"] == "scripted_llm":
            spec["reply"] = SCRIPTED_REPLY  # long enough to be interrupted
    return DeployConfig.from_dict(raw)


def _find_llm(engine: DuplexEngine) -> Any:
    for stage in engine.stages:
        if hasattr(stage, "fast_paths") and hasattr(stage, "port"):
            return stage
    return None


async def run_phase(name: str, config: DeployConfig, args: argparse.Namespace,
                    utts: dict[str, Any], turn_session: dict[str, Any]) -> dict[str, Any]:
    print(f"[{name}] starting the server ({config.name}) ...", flush=True)
    t_start = time.monotonic()
    engine = DuplexEngine(config)
    result: dict[str, Any] = {"name": name, "config": config.name, "loadavg_before": loadavg()}
    vad = next((sp.type for sp in config.stages if sp.type in ("silero_vad", "energy_vad")), None)
    if vad is not None:
        result["vad_floor_s"] = vad_floor_s(utts["stop"], "silero" if vad == "silero_vad" else "energy")
    async with BackgroundServer(engine) as server:
        result["server_start_s"] = time.monotonic() - t_start
        llm = _find_llm(engine)
        c0 = {k: getattr(llm, k) for k in ("fast_paths", "rebuilds", "fresh_prefills")} if llm else {}
        print(f"[{name}] {args.turns} spoken turns ...", flush=True)
        SEND_LAG.clear()
        win = LoadWindow()
        turns = await run_turns(server.ws_url, utts["turns"], turn_session)
        for t in turns:
            print(f"  {t.status:9s} TTFA {t.ttfa_s * 1e3:7.1f} ms  done {t.done_s * 1e3:7.1f} ms  "
                  f"audio {t.audio_s:5.2f} s  heard {t.heard!r} -> {t.reply[:60]!r}", flush=True)
        result["turns"] = turns
        if llm:
            result["turn_counters"] = {k: getattr(llm, k) - v for k, v in c0.items()}
        print(f"[{name}] {args.barge_ins} barge-ins ...", flush=True)
        barges = []
        for _ in range(args.barge_ins):
            b = await run_barge(server.ws_url, utts["story"], utts["stop"], args.story_tokens,
                                args.barge_after)
            print(f"  {b.status:9s} onset->done {b.to_done_s * 1e3:7.1f} ms  onset->last audio "
                  f"{b.to_last_audio_s * 1e3:7.1f} ms  onset->speech_started "
                  f"{b.to_speech_started_s * 1e3:7.1f} ms  deltas after onset {b.deltas_after_onset}"
                  f"  reply played {b.played_s:.2f} s", flush=True)
            barges.append(b)
        result["barges"] = barges
        result["load_a"] = win.close()
        result["send_lag_max_s"] = max(SEND_LAG, default=math.nan)
        result["send_lag_p99_s"] = (float(np.percentile(SEND_LAG, 99)) if SEND_LAG else math.nan)
        if llm is not None and not args.no_part_b:
            print(f"[{name}] Part B: LLM TTFT, {args.reps} repetitions ...", flush=True)
            win = LoadWindow()
            result["part_b"] = await run_part_b(llm, args.reps, args.context_tokens)
            result["load_b"] = win.close()
        if llm is not None:
            result["platform"] = _platform()
    result["loadavg_after"] = loadavg()
    return result


def _platform() -> str:
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            return "vLLM on CPU (no GPU in this machine)"
        return f"vLLM on {current_platform.device_name}"
    except Exception as exc:  # noqa: BLE001
        return f"unknown ({exc!r})"


# ---- report -----------------------------------------------------------------------------------


def p50(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else math.nan


def pmax(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return max(xs) if xs else math.nan


def fmt(v: float, spec: str = "{:.1f}") -> str:
    return "n/a" if v is None or math.isnan(v) else spec.format(v)


def verdict(v: float, target: float) -> str:
    return "n/a" if math.isnan(v) else ("PASS" if v <= target else "MISS")


def render_table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def part_a_rows(base: dict[str, Any] | None, cas: dict[str, Any]) -> list[tuple[str, ...]]:
    def ok(turns: list[Turn]) -> list[Turn]:
        return [t for t in turns if t.status in TIMED]

    def okb(barges: list[Barge]) -> list[Barge]:
        return [b for b in barges if b.status == "cancelled"]

    def series(phase: dict[str, Any] | None, key: str, barge: bool = False) -> list[float]:
        if phase is None:
            return []
        items = okb(phase["barges"]) if barge else ok(phase["turns"])
        return [getattr(x, key) for x in items]

    specs = [  # label, key, barge?, scale, target
        ("TTFA: speech_stopped -> first audio (ms)", "ttfa_s", False, 1e3, TTFA_TARGET_S),
        ("  of which: speech_stopped -> ASR final (ms)", "asr_s", False, 1e3, None),
        ("  of which: speech_stopped -> response.created (ms)", "created_s", False, 1e3, None),
        ("TTFA from when speech_stopped was due (ms)", "ttfa_due_s", False, 1e3, TTFA_TARGET_S),
        ("  speech_stopped seen after it was due (ms)", "stopped_late_s", False, 1e3, None),
        ("speech_stopped -> response.done (ms)", "done_s", False, 1e3, None),
        ("end of speech sent -> first audio (ms)", "eos_to_audio_s", False, 1e3, None),
        ("reply audio (s)", "audio_s", False, 1, None),
        ("RTF: (stopped -> done) / reply audio", "rtf", False, 1, None),
        ("barge-in: onset -> response.done(cancelled) (ms)", "to_done_s", True, 1e3, BARGE_TARGET_S),
        ("barge-in: onset -> last audio delta (ms)", "to_last_audio_s", True, 1e3, None),
        ("barge-in: onset -> speech_started (ms)", "to_speech_started_s", True, 1e3, None),
        ("barge-in: audio deltas after onset", "deltas_after_onset", True, 1, None),
    ]
    rows = [("Part A (p50 / max)", "baseline: scripted", f"{cas['config']}", "ratio p50",
             "target", "p50 / max")]
    for label, key, barge, scale, target in specs:
        b, c = series(base, key, barge), series(cas, key, barge)
        spec = "{:.0f}" if scale == 1e3 or key == "deltas_after_onset" else "{:.2f}"
        bp, cp = p50(b) * scale, p50(c) * scale
        ratio = (cp / bp if key != "deltas_after_onset" and not math.isnan(bp) and not math.isnan(cp)
                 and bp >= (1.0 if scale == 1e3 else 0.01) else math.nan)
        tgt = f"<= {target * 1e3:.0f} ms" if target else ""
        ver = (f"{verdict(p50(c), target)} / {verdict(pmax(c), target)}" if target else "")
        rows.append((label, f"{fmt(bp, spec)} / {fmt(pmax(b) * scale, spec)}" if base else "n/a",
                     f"{fmt(cp, spec)} / {fmt(pmax(c) * scale, spec)}", fmt(ratio, "{:.2f}x"),
                     tgt, ver))
        if key == "to_speech_started_s":
            bf = (base or {}).get("vad_floor_s", math.nan) * 1e3
            cf = cas.get("vad_floor_s", math.nan) * 1e3
            rows.append(("  of which: VAD needs this much audio (offline)", fmt(bf, "{:.0f}"),
                         fmt(cf, "{:.0f}"), fmt(cf / bf if bf else math.nan, "{:.2f}x"), "", ""))
    return rows


def part_b_rows(pb: dict[str, Any]) -> tuple[list[tuple[str, ...]], dict[str, float]]:
    full = [r.ttft_s for r in pb["full"]]
    stream = [r.ttft_s for r in pb["stream"]]
    hit = [r.ttft_s for r in pb["hit"]]
    decode = [r.decode_s for r in pb["full"] + pb["stream"] + pb["hit"]]
    ratios = [s / f for s, f in zip(stream, full) if f and not math.isnan(s) and not math.isnan(f)]
    fp = p50(full)
    rows = [("Part B: LLM TTFT at end of turn", "p50 (ms)", "max (ms)", "vs full p50", "target",
             "verdict"),
            ("full prefill, fresh port [baseline]", fmt(fp * 1e3), fmt(pmax(full) * 1e3), "1.00x",
             "", ""),
            ("streaming prefill (fast path)", fmt(p50(stream) * 1e3), fmt(pmax(stream) * 1e3),
             fmt(p50(stream) / fp if fp else math.nan, "{:.3f}x"),
             f"<= {TTFT_RATIO_TARGET}x", verdict(p50(stream) / fp if fp else math.nan, TTFT_RATIO_TARGET)),
            ("per-rep ratio streaming/full", fmt(p50(ratios), "{:.3f}x"),
             fmt(pmax(ratios), "{:.3f}x"), "", f"<= {TTFT_RATIO_TARGET}x",
             verdict(pmax(ratios), TTFT_RATIO_TARGET) + " (max)"),
            ("full prefill, same prompt again (cache hit) [info]", fmt(p50(hit) * 1e3),
             fmt(pmax(hit) * 1e3), fmt(p50(hit) / fp if fp else math.nan, "{:.3f}x"), "", ""),
            ("decode per token after the first [info]", fmt(p50(decode) * 1e3),
             fmt(pmax(decode) * 1e3), "", "", "")]
    return rows, {"full_p50_s": fp, "stream_p50_s": p50(stream), "ratio_p50": p50(ratios)}


def notes(phases: list[dict[str, Any]], info: dict[str, Any]) -> list[str]:
    out = []
    for ph in phases:
        tag = f"[{ph['name']}]"
        if ph["send_lag_p99_s"] > CHUNK_S:
            out.append(f"{tag} client send lag p99 {ph['send_lag_p99_s'] * 1e3:.1f} ms > 20 ms: "
                       "the input was not streamed at real time")
        bad = [t for t in ph["turns"] if t.status not in TIMED]
        if bad:
            out.append(f"{tag} {len(bad)} turn(s) not timed: {[t.status for t in bad]}")
        badb = [b for b in ph["barges"] if b.status != "cancelled"]
        if badb:
            out.append(f"{tag} {len(badb)} barge-in(s) not timed: {[b.status for b in badb]}")
        stray = sum(b.deltas_after_done for b in ph["barges"])
        if stray:
            out.append(f"{tag} {stray} audio delta(s) of an interrupted response arrived AFTER "
                       "its response.done(cancelled)")
        for key in ("load_a", "load_b"):
            ld = ph.get(key)
            if ld and ld["other_cores"] >= 0.2:
                out.append(f"{tag} other processes used {ld['other_cores']:.2f} cores during "
                           f"{'Part A' if key == 'load_a' else 'Part B'}: the machine was not quiet")
        pb = ph.get("part_b")
        if pb:
            notready = [r for r in pb["stream"] if r.words_ready is False]
            if notready:
                out.append(f"{tag} {len(notready)} streaming run(s) still had pushed words to "
                           "prefill at end of turn")
            failed = [r.status for r in pb["full"] + pb["stream"] + pb["hit"]
                      if r.status not in ("length", "stop")]
            if failed:
                out.append(f"{tag} Part B runs not timed: {failed}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--barge-ins", type=int, default=3)
    p.add_argument("--barge-after", type=float, default=1.0,
                   help="seconds of reply audio before the interruption starts")
    p.add_argument("--story-tokens", type=int, default=400,
                   help="session max_output_tokens for the long reply that gets interrupted")
    p.add_argument("--reps", type=int, default=5, help="Part B repetitions")
    p.add_argument("--context-tokens", type=int, default=500, help="Part B context size")
    p.add_argument("--config", default="cascade-cpu")
    p.add_argument("--no-baseline", action="store_true", help="skip the scripted baseline")
    p.add_argument("--no-part-b", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not 1 <= args.turns <= len(QUESTIONS):
        p.error(f"--turns must be 1..{len(QUESTIONS)}")

    info = machine()
    print(f"machine: {info['nproc']} CPUs ({info['cpu_model']}), {info['memory_gib']} GiB, "
          f"Python {info['python']}, Linux {info['kernel']}, commit {info['commit']}", flush=True)
    print(f"load average before: {loadavg()}", flush=True)
    utts = {"turns": [utterance(q) for q in QUESTIONS[:args.turns]],
            "story": utterance(STORY), "stop": utterance(INTERRUPTION)}

    async def run_all() -> list[dict[str, Any]]:
        phases = []
        if not args.no_baseline:
            # Replies of about one sentence, like the cascade's (its policy caps at 96 tokens
            # and the instructions ask for one sentence).
            phases.append(await run_phase("baseline", scripted_config(), args, utts,
                                          {"max_output_tokens": 12}))
        phases.append(await run_phase("cascade", load_config(args.config), args, utts, {}))
        return phases

    phases = asyncio.run(run_all())
    base = phases[0] if not args.no_baseline else None
    cas = phases[-1]
    print()
    print(f"accelerator: {cas.get('platform', 'n/a')}; a GPU run (vLLM on GPU) was not possible here")
    print(f"load average: before {phases[0]['loadavg_before']}, after {cas['loadavg_after']}")
    for ph in phases:
        for key, label in (("load_a", "Part A"), ("load_b", "Part B")):
            if key in ph:
                ld = ph[key]
                lag = (f", client send lag p99 / max {ph['send_lag_p99_s'] * 1e3:.1f} / "
                       f"{ph['send_lag_max_s'] * 1e3:.1f} ms" if key == "load_a" else "")
                print(f"[{ph['name']}] {label}: bench process tree {ld['bench_cores']:.2f} cores, "
                      f"machine {ld['machine_cores']:.2f}, other processes {ld['other_cores']:.2f} "
                      f"over {ld['wall_s']:.0f} s{lag}")
    if "turn_counters" in cas:
        print(f"[cascade] LLM stage during the spoken turns: {cas['turn_counters']}")
    print()
    print(render_table(part_a_rows(base, cas)))
    print("ratio = cascade / scripted baseline (same process, same server code and client); "
          f"{len([t for t in cas['turns'] if t.status in TIMED])} turns, "
          f"{len([b for b in cas['barges'] if b.status == 'cancelled'])} barge-ins timed")
    summary: dict[str, Any] = {}
    if "part_b" in cas:
        rows, summary = part_b_rows(cas["part_b"])
        print()
        print(render_table(rows))
        n = cas["part_b"]["full"][0].input_tokens if cas["part_b"]["full"] else 0
        print(f"context {n} prompt tokens; streaming words every {WORD_INTERVAL_S * 1e3:.0f} ms, "
              f"end of turn {END_OF_TURN_SILENCE_S * 1e3:.0f} ms after the last word; "
              f"stage counters {cas['part_b']['counters']}")
    print()
    ttfa = p50([t.ttfa_s for t in cas["turns"] if t.status in TIMED])
    barge = p50([b.to_done_s for b in cas["barges"] if b.status == "cancelled"])
    print(f"target TTFA <= {TTFA_TARGET_S * 1e3:.0f} ms: p50 {fmt(ttfa * 1e3)} ms -> "
          f"{verdict(ttfa, TTFA_TARGET_S)}")
    print(f"target barge-in <= {BARGE_TARGET_S * 1e3:.0f} ms (speech onset -> response.done, VAD "
          f"included): p50 {fmt(barge * 1e3)} ms -> {verdict(barge, BARGE_TARGET_S)}")
    if summary:
        r = summary["stream_p50_s"] / summary["full_p50_s"]
        print(f"target streaming-prefill TTFT <= {TTFT_RATIO_TARGET}x full prefill: "
              f"{fmt(r, '{:.3f}')}x -> {verdict(r, TTFT_RATIO_TARGET)}")
    for line in notes(phases, info):
        print("note:", line)
    if args.json:
        def plain(x: Any) -> Any:
            if isinstance(x, list):
                return [plain(i) for i in x]
            if isinstance(x, dict):
                return {k: plain(v) for k, v in x.items()}
            if hasattr(x, "__dataclass_fields__"):
                return {k: plain(getattr(x, k)) for k in x.__dataclass_fields__}
            return x

        Path(args.json).write_text(json.dumps(
            {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "machine": info, "args": vars(args), "phases": plain(phases)}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
