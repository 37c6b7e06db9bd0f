"""A Twilio stand-in for the tests, written from Twilio's published reference
(twilio.com/docs/voice/media-streams/websocket-messages and
.../twiml/stream), not from our code:

- ``webhook`` POSTs the voice webhook as Twilio does (form fields, signed
  with ``X-Twilio-Signature`` when given an auth token) and reads the TwiML
  (``<Connect><Stream url>`` and its ``<Parameter>``s) with an XML parser;
- ``TwilioPhone`` opens the stream socket, sends ``connected`` and ``start``
  (the parameters as ``customParameters``), then the caller's audio as
  ``media`` (μ-law at 8 kHz, 20 ms a message, ``chunk``/``timestamp``
  counted, at real time); it *plays* what comes back at real time, echoes
  each ``mark`` once the audio before it has played, and on ``clear`` drops
  what it has not played and echoes the pending marks at once -- as Twilio
  does.

Its μ-law is the G.711 formula written out here, not the server's tables.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import xml.etree.ElementTree as ET
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import websockets
from twilio.request_validator import RequestValidator

VOICE_PATH = "/v1/telephony/twilio/voice"
CALL_SID = "CA0123456789abcdef0123456789abcdef"
STREAM_SID = "MZ0123456789abcdef0123456789abcdef"
FRAME = 160  # 20 ms of μ-law at 8 kHz


def mulaw_encode(pcm: np.ndarray) -> bytes:
    """G.711 μ-law of int16 samples: biased magnitude, segment (exponent),
    four mantissa bits, sign, all inverted -- the standard's encoder."""
    x = pcm.astype(np.int32)
    sign = (x < 0).astype(np.int32) << 7
    magnitude = np.minimum(np.abs(x), 32635) + 0x84
    exponent = np.floor(np.log2(magnitude)).astype(np.int32) - 7
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | exponent << 4 | mantissa) & 0xFF).astype(np.uint8).tobytes()


def mulaw_decode(data: bytes) -> np.ndarray:
    """int16 samples of G.711 μ-law bytes (the standard's expansion)."""
    u = ~np.frombuffer(data, np.uint8).astype(np.int32) & 0xFF
    sign, exponent, mantissa = u & 0x80, (u >> 4) & 0x07, u & 0x0F
    magnitude = ((mantissa << 3) + 0x84 << exponent) - 0x84
    return np.where(sign != 0, -magnitude, magnitude).astype(np.int16)


@dataclass
class TwiML:
    stream_url: str
    parameters: dict[str, str]


async def webhook(http_url: str, *, form: dict[str, str] | None = None, query: str = "",
                  auth_token: str | None = None, signature: str | None = None) -> httpx.Response:
    """Twilio's POST of an incoming call to the voice webhook."""
    fields = {"CallSid": CALL_SID, "AccountSid": "AC0123", "From": "+15550100",
              "To": "+15550199", "CallStatus": "ringing", "Direction": "inbound", **(form or {})}
    url = f"{http_url}{VOICE_PATH}{'?' + query if query else ''}"
    headers = {}
    if auth_token is not None:
        headers["X-Twilio-Signature"] = RequestValidator(auth_token).compute_signature(url, fields)
    if signature is not None:
        headers["X-Twilio-Signature"] = signature
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(url, data=fields, headers=headers)


def read_twiml(text: str) -> TwiML:
    root = ET.fromstring(text)
    assert root.tag == "Response", text
    stream = root.find("./Connect/Stream")
    assert stream is not None, text
    params = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
    return TwiML(stream.get("url"), params)


@dataclass
class Heard:
    at: float
    audio: bytes


@dataclass
class TwilioPhone:
    stream_url: str
    parameters: dict[str, str] = field(default_factory=dict)
    call_sid: str = CALL_SID
    stream_sid: str = STREAM_SID
    media_format: dict[str, Any] = field(default_factory=lambda: {
        "encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1})
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # every message
    heard: list[Heard] = field(default_factory=list)  # what was played, 20 ms at a time
    marks_echoed: list[str] = field(default_factory=list)
    # how much later than it arrives the caller hears audio (the network, the
    # carrier's jitter buffer): playback starts this long after idle
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        self.ws: Any = None
        self._seq = 0
        self._chunk = 0
        self._sent_ms = 0
        self._queue: deque[tuple[str, Any]] = deque()  # ("audio", bytes) | ("mark", name)
        self._tasks: list[asyncio.Task[Any]] = []
        self._changed = asyncio.Event()
        self.closed: websockets.ConnectionClosed | None = None

    async def __aenter__(self) -> TwilioPhone:
        await self.connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def connect(self, *, start: bool = True) -> None:
        self.ws = await websockets.connect(self.stream_url, max_size=None)
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._play())]
        await self.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        if start:
            await self.send_start()

    async def send_start(self, **overrides: Any) -> None:
        await self.send({"event": "start", "sequenceNumber": self._next_seq(),
                         "streamSid": self.stream_sid, "start": {
                             "accountSid": "AC0123", "streamSid": self.stream_sid,
                             "callSid": self.call_sid, "tracks": ["inbound"],
                             "mediaFormat": self.media_format,
                             "customParameters": self.parameters, **overrides}})

    def _next_seq(self) -> str:
        self._seq += 1
        return str(self._seq)

    async def send(self, message: dict[str, Any] | str) -> None:
        await self.ws.send(message if isinstance(message, str) else json.dumps(message))

    async def say(self, pcm8k: np.ndarray, *, realtime: bool = True) -> float:
        """The caller speaks ``pcm8k`` (int16 at 8 kHz); returns when it started."""
        audio = mulaw_encode(pcm8k)
        start = time.monotonic()
        for i in range(0, len(audio), FRAME):
            self._chunk += 1
            await self.send({"event": "media", "sequenceNumber": self._next_seq(),
                             "streamSid": self.stream_sid,
                             "media": {"track": "inbound", "chunk": str(self._chunk),
                                       "timestamp": str(self._sent_ms),
                                       "payload": base64.b64encode(audio[i:i + FRAME]).decode()}})
            self._sent_ms += 20
            if realtime:
                await asyncio.sleep(max(0.0, start + (i // FRAME + 1) * 0.02 - time.monotonic()))
        return start

    async def dtmf(self, digit: str) -> None:
        await self.send({"event": "dtmf", "streamSid": self.stream_sid,
                         "sequenceNumber": self._next_seq(),
                         "dtmf": {"track": "inbound_track", "digit": digit}})

    async def stop(self) -> None:
        await self.send({"event": "stop", "sequenceNumber": self._next_seq(),
                         "streamSid": self.stream_sid,
                         "stop": {"accountSid": "AC0123", "callSid": self.call_sid}})

    # ---- what Twilio does with what it gets ------------------------------------

    async def _receive(self) -> None:
        try:
            while True:  # recv, not async for: a clean close must raise too
                message = json.loads(await self.ws.recv())
                self.received.append((time.monotonic(), message))
                kind = message["event"]
                assert message["streamSid"] == self.stream_sid, message
                if kind == "media":
                    self._queue.append(("audio", base64.b64decode(message["media"]["payload"])))
                elif kind == "mark":
                    self._queue.append(("mark", message["mark"]["name"]))
                elif kind == "clear":
                    marks = [v for k, v in self._queue if k == "mark"]
                    self._queue.clear()
                    for name in marks:  # Twilio echoes the marks it will never reach
                        await self._echo(name)
                self._changed.set()
        except websockets.ConnectionClosed as closed:
            self.closed = closed
            self._changed.set()

    async def _echo(self, name: str) -> None:
        self.marks_echoed.append(name)
        await self.ws.send(json.dumps({"event": "mark", "sequenceNumber": self._next_seq(),
                                       "streamSid": self.stream_sid, "mark": {"name": name}}))

    async def _play(self) -> None:
        """20 ms of the queue at a time, at real time; marks when reached."""
        next_at = time.monotonic()
        while True:
            while self._queue and self._queue[0][0] == "mark":
                await self._echo(self._queue.popleft()[1])
            if not self._queue:
                self._changed.clear()
                await self._changed.wait()
                await asyncio.sleep(self.latency_s)
                next_at = time.monotonic()
                continue
            frame = b""
            while self._queue and self._queue[0][0] == "audio" and len(frame) < FRAME:
                audio = self._queue[0][1]
                take = FRAME - len(frame)
                frame += audio[:take]
                if len(audio) > take:
                    self._queue[0] = ("audio", audio[take:])
                else:
                    self._queue.popleft()
            self.heard.append(Heard(time.monotonic(), frame))
            next_at += len(frame) / 8000
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    # ---- for the assertions ----------------------------------------------------------

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [m for _, m in self.received if m["event"] == kind]

    async def wait_for(self, kind: str, *, after: int = 0, timeout: float = 30.0) -> dict[str, Any]:
        """The first ``kind`` message at index ``after`` or later of ``received``."""
        deadline = time.monotonic() + timeout
        while True:
            for _, m in self.received[after:]:
                if m["event"] == kind:
                    return m
            if self.closed is not None:
                raise AssertionError(f"the stream closed ({self.closed}) before {kind}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {kind} within {timeout} s")
            await asyncio.sleep(0.01)

    async def wait_closed(self, timeout: float = 10.0) -> websockets.ConnectionClosed:
        deadline = time.monotonic() + timeout
        while self.closed is None:
            if time.monotonic() > deadline:
                raise AssertionError("the stream did not close")
            await asyncio.sleep(0.01)
        return self.closed

    def heard_pcm(self, since: float = 0.0) -> np.ndarray:
        return mulaw_decode(b"".join(h.audio for h in self.heard if h.at >= since))

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
