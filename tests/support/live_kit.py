"""What the GPT-Live tests share: a codec on a virtual clock and its frames
(unit tests), the SDK's live client on a server and a reader that validates
every raw frame by the SDK's model of its type (scripted pipeline), and a
microphone that streams at real time (default CPU pipeline)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
from openai import AsyncOpenAI
from openai.types.live import SessionStartEvent
from openai.types.live.session_config import SessionConfig
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.commands import LiveStart

from support.live_shapes import live_event
from support.speech_fixtures import RATE, chunks

SILENCE = np.zeros(RATE // 50, np.int16).astype("<i2").tobytes()  # 20 ms


# ---- the codec, sans I/O ----------------------------------------------------------------

FENCE = Fence("sess_1")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def codec(clock: Clock | None = None) -> LiveCodec:
    return LiveCodec(max_event_bytes=1 << 20, model_aliases={"smollm2": "smollm2"},
                     clock=clock or Clock())


def frame(event) -> str:
    return event.to_json(use_api_names=True, exclude_unset=True)


def start(c: LiveCodec, **session) -> LiveStart:
    session.setdefault("model", "gpt-live-1")
    cmd = c.parse(frame(SessionStartEvent(type="session.start", event_id="start_1",
                                          session=SessionConfig(**session))))
    assert isinstance(cmd, LiveStart)
    return cmd


def env(event: ev.ServerEvent, seq: int = 1) -> Envelope:
    return Envelope(seq=seq, fence=FENCE, event=event)


SESSION_DOC = {"id": "sess_1", "model": "smollm2", "instructions": "Be brief.",
               "expires_at": 1_800_000_000,
               "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000},
                                    "voice": "marin"}}}


# ---- the SDK's live client on a server --------------------------------------------------

@asynccontextmanager
async def live(server) -> AsyncIterator:
    async with AsyncOpenAI(api_key="sk-local", base_url=server.http_url + "/v1") as client:
        async with client.live.connect() as conn:
            yield conn


class Reader:
    """Server events through the SDK, each raw frame validated by its model."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.events: list = []

    async def until(self, kind: str, timeout: float = 20.0):
        async def read():
            while True:
                event = live_event((await self.conn.recv_bytes()).decode())
                self.events.append(event)
                if event.type == kind:
                    return event
        return await asyncio.wait_for(read(), timeout)

    def of(self, kind: str) -> list:
        return [e for e in self.events if e.type == kind]


async def started(conn, **session) -> tuple[Reader, object]:
    events = Reader(conn)
    await conn.session.start(session={"model": "gpt-live-1", **session}, event_id="start_1")
    return events, await events.until("session.started")


# ---- a microphone at real time ------------------------------------------------------------

class Microphone:
    """Sends speech when given, silence otherwise, at real time, and reads
    every server event (stamped with when it arrived)."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.events: list[tuple[float, object]] = []
        self._queue: list[bytes] = []
        self._tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> Microphone:
        self._tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._read())]
        return self

    async def __aexit__(self, *exc) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def say(self, pcm: np.ndarray) -> float:
        """Queue ``pcm``; returns when its first chunk goes out (about)."""
        self._queue.extend(chunks(pcm))
        return time.monotonic() + 0.02

    async def _send(self) -> None:
        start = time.monotonic()
        i = 0
        while True:
            chunk = self._queue.pop(0) if self._queue else SILENCE
            await self.conn.session.input_audio.append(audio=base64.b64encode(chunk).decode())
            i += 1
            await asyncio.sleep(max(0.0, start + i * 0.02 - time.monotonic()))

    async def _read(self) -> None:
        while True:
            event = live_event((await self.conn.recv_bytes()).decode())
            self.events.append((time.monotonic(), event))

    def of(self, kind: str, since: float = 0.0) -> list:
        return [e for t, e in self.events if e.type == kind and t >= since]

    def text(self, kind: str, since: float = 0.0) -> str:
        return "".join(e.delta for e in self.of(kind, since))

    def audio(self, since: float = 0.0, until: float = float("inf")) -> bytes:
        return b"".join(base64.b64decode(e.delta) for t, e in self.events
                        if e.type == "session.output_audio.delta" and since <= t < until)

    def quiet(self, seconds: float) -> bool:
        """Some reply audio came, and none for ``seconds`` (GPT-Live has no
        "done": a reply ends when its voice does)."""
        stamps = [t for t, e in self.events if e.type == "session.output_audio.delta"]
        return bool(stamps) and time.monotonic() - stamps[-1] > seconds

    async def until(self, done, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, [e.type for _, e in self.events][-20:]
            await asyncio.sleep(0.05)
