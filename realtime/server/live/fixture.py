"""Playing an audio fixture on a GPT-Live socket (``session.output_audio.fixture.play``).

What the fixture is and what the session does meanwhile is the dialect's
(``realtime/wire/live/fixtures.py``); this is its playout. The fixture's
audio goes out as the session's own reply audio does on this socket: in the
session's output format (resampled from 24 kHz, G.711-encoded where the
session is), in frames of at most 100 ms, paced by the session's
``OutputPacer`` with its lead (the client never holds more than ~300 ms
unplayed), so ``fixture.played`` -- "drained from the server mixer" -- is
sent when the client's player has run through it, not when the bytes left.

``FixturePlayer`` is the sans-I/O part (times in, frames out: tested with a
virtual clock); ``play_fixture`` is the loop that sleeps between its frames.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

from vllm_duplex.domain.payloads import AudioOut
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.audio import AudioEncoder
from vllm_duplex.realtime.wire.live.audio_frames import audio_delta
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.fixtures import FIXTURE_RATE, FixturePlay
from vllm_duplex.session.pacing import OutputPacer


class FixturePlayer:
    def __init__(self, pcm: bytes, fmt: AudioFormat, lead_ms: int) -> None:
        self._pacer = OutputPacer(lead_ms)
        self._pacer.push(AudioOut("fixture", np.frombuffer(pcm, "<i2"), FIXTURE_RATE))
        self._encoder = AudioEncoder(fmt, in_rate=FIXTURE_RATE)

    def due(self, now: float) -> list[bytes]:
        """The fixture's audio to send at ``now``, encoded for the session."""
        out = [self._encoder.encode(frame.audio.pcm) for frame in self._pacer.due(now)]
        if out and self._pacer.drained:
            out[-1] += self._encoder.flush()  # the resampler's tail goes with the last frame
        return [chunk for chunk in out if chunk]

    def next_at(self, now: float) -> float | None:
        """When the next frame is due (None: everything is sent)."""
        return None if self._pacer.drained else self._pacer.next_at(now)

    def drained_at(self, now: float) -> float:
        """When the client's player runs through what it was sent."""
        return now + self._pacer.lead(now)


async def play_fixture(play: FixturePlay, codec: LiveCodec, send: Callable[[str], Awaitable[None]],
                       *, fmt: AudioFormat, lead_ms: int, clock: Callable[[], float],
                       on_audio: Callable[[bytes], None] | None = None) -> None:
    """``fixture.playing``, the fixture's audio at playback speed, then
    ``fixture.played`` once it drained; the dialect's playback state is
    ended however this ends (a cancelled playback has no ``played``).
    ``on_audio``: each chunk as it is sent (a stored session's recording)."""
    try:
        await send(codec.render_notice("session.output_audio.fixture.playing",
                                       client_event_id=play.event_id))
        player = FixturePlayer(play.pcm, fmt, lead_ms)
        while True:
            now = clock()
            for chunk in player.due(now):
                if on_audio is not None:
                    on_audio(chunk)
                await send(audio_delta(chunk))
            wake = player.next_at(now)
            if wake is None:
                break
            await asyncio.sleep(max(0.0, wake - clock()))
        now = clock()
        await asyncio.sleep(max(0.0, player.drained_at(now) - now))
    finally:
        codec.fixtures.end()
    await send(codec.render_notice("session.output_audio.fixture.played",
                                   client_event_id=play.event_id))
