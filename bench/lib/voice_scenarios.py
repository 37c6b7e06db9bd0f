"""Part A of the voice latency benchmark: the spoken scenarios over the realtime socket.

The audio the client sends (Flite speech cut into 20 ms PCM16 24 kHz chunks, with the
onset/end chunks of the speech known), a ``RealtimeClient`` connection that streams on a
real-time schedule, and the two scenarios driven through it: multi-turn spoken questions
(``run_turns``) and barge-in on a long reply (``run_barge``). Used by
``bench/voice_latency.py``, which describes the figures.
"""

from __future__ import annotations

import asyncio
import base64
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# support.speech_fixtures (Flite speech, PocketSphinx) lives in the repository's tests/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from support.speech_fixtures import chunks as pcm_chunks  # noqa: E402
from support.speech_fixtures import speak  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

RATE = 24000
CHUNK_S = 0.020
ONSET_DBFS = -40.0  # a 20 ms chunk "holds speech" when its RMS is above this

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
    from vllm_duplex.domain.payloads import INTERNAL_RATE, VadSpeechStarted
    from vllm_duplex.media.audio import Resampler
    from vllm_duplex.stages.listening.energy_vad import EnergyVad
    from vllm_duplex.stages.listening.silero_vad import SileroVad, load_model

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


# ---- duplex_bench.py's speech (Full-Duplex-Bench trials; soak.py's too) -----------------


@dataclass(frozen=True)
class Speech:
    text: str
    chunks: tuple[bytes, ...]
    onset: int  # first chunk holding speech
    end: int  # last chunk holding speech


def utter(text: str, voice: str, lead_s: float = 0.3, tail_s: float = 1.2) -> Speech:
    cs = tuple(pcm_chunks(speak(text, rate=RATE, lead_s=lead_s, tail_s=tail_s, voice=voice),
                          rate=RATE))
    floor = 32768.0 * 10 ** (ONSET_DBFS / 20)
    loud = [i for i, c in enumerate(cs)
            if math.sqrt(np.mean(np.frombuffer(c, "<i2").astype(np.float64) ** 2)) > floor]
    return Speech(text, cs, loud[0], loud[-1])


def joined(*parts: Speech, gaps_ms: tuple[int, ...]) -> tuple[tuple[bytes, ...], int]:
    """Speech parts with silence between them; returns the chunks and the
    index of the last speech chunk."""
    out: list[bytes] = []
    last = 0
    for i, part in enumerate(parts):
        body = part.chunks[:part.end + 1] if i < len(parts) - 1 else part.chunks
        start = len(out)
        out += body
        last = start + part.end
        if i < len(gaps_ms):
            out += [SILENCE] * (gaps_ms[i] // int(CHUNK_S * 1000))
    return tuple(out), last


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
