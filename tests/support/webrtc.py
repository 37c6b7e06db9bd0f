"""A real WebRTC client for the call tests: aiortc, as a browser would use it.

``RtcClient`` offers one microphone track (``Microphone``: PCM queued by the
test, played at real time, silence otherwise) and the ``oai-events`` data
channel, POSTs the offer to ``/v1/realtime/calls``, and collects what comes
back: every data-channel event (parsed) and the reply track's audio (48 kHz
mono, with the time each frame arrived)::

    async with RtcClient(server.http_url) as call:
        await call.event("session.created")
        call.mic.say(tone(0.8, rate=48000) + silence(1.0, rate=48000))
        await call.event("response.done")
        assert call.heard_audio()

Waits are for conditions (an event, audio), bounded by a timeout; nothing
sleeps a fixed time.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from collections import deque
from typing import Any

import av
import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

RATE = 48000
FRAME = RATE // 50


class Microphone(MediaStreamTrack):
    """What the test says, at real time; silence between."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pending: deque[np.ndarray] = deque()
        self._start: float | None = None
        self._pts = 0
        self.spoken = asyncio.Event()  # set once all that was said went out

    def say(self, pcm16_48k: bytes) -> None:
        """Queue PCM16 at 48 kHz to be spoken (after what is queued)."""
        self.spoken.clear()
        self._pending.append(np.frombuffer(pcm16_48k, dtype="<i2").copy())

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        wait = self._start + self._pts / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        out = np.zeros(FRAME, dtype=np.int16)
        filled = 0
        while filled < FRAME and self._pending:
            head = self._pending[0]
            take = min(FRAME - filled, head.size)
            out[filled:filled + take] = head[:take]
            filled += take
            if take == head.size:
                self._pending.popleft()
            else:
                self._pending[0] = head[take:]
        if not self._pending:
            self.spoken.set()
        frame = av.AudioFrame.from_ndarray(out.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        self._pts += FRAME
        return frame


class RtcClient:
    def __init__(self, base_url: str, *, key: str | None = None, session: dict[str, Any] | None = None,
                 data_channel: bool = True, timeout: float = 30.0) -> None:
        self.base_url = base_url
        self.key = key
        self.session = session
        self.timeout = timeout
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = Microphone()
        self.pc.addTrack(self.mic)
        self.channel = self.pc.createDataChannel("oai-events") if data_channel else None
        self.events: list[dict[str, Any]] = []
        self._arrived = asyncio.Condition()
        self.audio: list[tuple[float, np.ndarray]] = []  # (arrival, 48 kHz mono PCM16)
        self._frame = asyncio.Condition()
        self.call_id: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._opened = asyncio.Event()
        if self.channel is not None:
            self.channel.on("message", self._on_message)
            self.channel.on("open", self._opened.set)
        self.pc.on("track", self._on_track)

    # ---- connect / close -----------------------------------------------------------

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def connect(self) -> None:
        sdp = await self.offer()
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout) as http:
            if self.session is None:
                r = await http.post("/v1/realtime/calls", content=sdp,
                                    headers={**headers, "Content-Type": "application/sdp"})
            else:
                r = await http.post("/v1/realtime/calls", headers=headers,
                                    files={"sdp": (None, sdp), "session": (None, json.dumps(self.session))})
        if r.status_code != 201:
            raise CallRefused(r.status_code, r.json())
        self.call_id = r.headers["location"].rsplit("/", 1)[-1]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
        if self.channel is not None:
            await asyncio.wait_for(self._opened.wait(), self.timeout)

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> RtcClient:
        try:
            await self.connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # ---- events ----------------------------------------------------------------------

    def _on_message(self, message: str | bytes) -> None:
        event = json.loads(message)
        self.events.append(event)
        asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._arrived:
            self._arrived.notify_all()

    def send(self, event: dict[str, Any]) -> None:
        assert self.channel is not None
        self.channel.send(json.dumps(event))

    async def event(self, kind: str, *, after: int = 0, timeout: float | None = None,
                    where: Any = None) -> dict[str, Any]:
        """The first event of type ``kind`` at index >= ``after`` (waits for it)."""
        def found() -> dict[str, Any] | None:
            for e in self.events[after:]:
                if e.get("type") == kind and (where is None or where(e)):
                    return e
            return None

        async def wait() -> dict[str, Any]:
            async with self._arrived:
                await self._arrived.wait_for(lambda: found() is not None)
            hit = found()
            assert hit is not None
            return hit

        try:
            return await asyncio.wait_for(wait(), timeout or self.timeout)
        except asyncio.TimeoutError:
            types = [e.get("type") for e in self.events[after:]]
            raise AssertionError(f"no {kind} event within the timeout; got {types}") from None

    def types(self, after: int = 0) -> list[str]:
        return [e["type"] for e in self.events[after:]]

    # ---- the reply track ---------------------------------------------------------------

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._tasks.append(asyncio.ensure_future(self._listen(track)))

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            data = frame.to_ndarray()
            channels = len(frame.layout.channels)
            pcm = data.reshape(-1, channels)[:, 0] if not frame.format.is_planar else data[0]
            self.audio.append((time.monotonic(), pcm.astype(np.int16)))
            async with self._frame:
                self._frame.notify_all()

    async def frames(self, n: int, *, timeout: float | None = None) -> float:
        """Wait for ``n`` more frames of the reply track (20 ms each, silence
        included); the arrival time of the last."""
        target = len(self.audio) + n

        async def wait() -> None:
            async with self._frame:
                await self._frame.wait_for(lambda: len(self.audio) >= target)

        await asyncio.wait_for(wait(), timeout or self.timeout)
        return self.audio[target - 1][0]

    def loud_since(self, since: float, threshold: int = 1000) -> float | None:
        """When the reply track first carried sound after ``since`` (None: not yet)."""
        for at, pcm in self.audio:
            if at >= since and pcm.size and int(np.abs(pcm.astype(np.int32)).max()) > threshold:
                return at
        return None

    async def heard(self, since: float, *, timeout: float | None = None) -> float:
        """Wait until the reply track carries sound after ``since``; its arrival time."""
        async def wait() -> float:
            async with self._frame:
                await self._frame.wait_for(lambda: self.loud_since(since) is not None)
            at = self.loud_since(since)
            assert at is not None
            return at

        try:
            return await asyncio.wait_for(wait(), timeout or self.timeout)
        except asyncio.TimeoutError:
            raise AssertionError("no audio on the reply track within the timeout") from None

    def sound_seconds(self, since: float = 0.0, threshold: int = 1000) -> float:
        return sum(pcm.size for at, pcm in self.audio if at >= since and pcm.size
                   and int(np.abs(pcm.astype(np.int32)).max()) > threshold) / RATE


class CallRefused(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body
        self.code = (body.get("error") or {}).get("code")
