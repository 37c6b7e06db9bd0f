"""A session's camera: the per-session limits, sampling to the rate the
vision stage wants, and decoding off the event loop.

Three ways in, one way out (``VideoFrame``): still frames
(``duplex.video.frame``: JPEG/PNG with the client's timestamp), WebM/MP4
fragments (``duplex.video.chunk``: decoded by a ``ChunkDecoder`` thread as
they arrive), and ``input_image`` parts of conversation items. Every frame
counts against ``video_max_fps`` and every byte against
``video_max_bytes_per_s`` (``rate_limited`` beyond); frames over
``video_fps`` are dropped before they are decoded (they would be analysed for
nothing). A stream that does not decode is ``invalid_image``; the next chunk
starts a new stream (it must carry a header again), and the session goes on.

Two halves, as the session is split: ``VideoAdmission`` (limits, sampling,
timestamps; no I/O) belongs to the session core, ``VideoDecoding`` (the
decoder threads) to its runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from vllm_duplex.domain.errors import DuplexError, InvalidMedia
from vllm_duplex.domain.payloads import VideoFrame
from vllm_duplex.media.video import (
    ChunkDecoder,
    FrameSampler,
    RateLimiter,
    decode_image,
)


@dataclass(frozen=True)
class VideoLimits:
    fps: float = 2.0  # frames the vision stage gets, at most
    max_fps: float = 30.0  # frames a client may send (per second, sliding)
    max_bytes_per_s: int = 8 << 20


class VideoAdmission:
    """What may be decoded, and at which timestamp (the session's video clock
    starts when the session does)."""

    def __init__(self, limits: VideoLimits, started_at: float) -> None:
        self._started = started_at
        self.rate = RateLimiter(limits.max_fps, limits.max_bytes_per_s)
        self.sampler = FrameSampler(limits.fps)
        self.sampled_out = 0  # frames dropped by the sampler (not errors)

    def _ms(self, now: float) -> int:
        return int((now - self._started) * 1000)

    def frame(self, now: float, nbytes: int, timestamp_ms: int | None) -> int | None:
        """A still frame's timestamp, or None when the sampler skips it."""
        self.rate.admit(now, frames=1, nbytes=nbytes)
        ts = self._ms(now) if timestamp_ms is None else timestamp_ms
        if not self.sampler.keep(ts):
            self.sampled_out += 1
            return None
        return ts

    def image(self, now: float, nbytes: int) -> int:
        """An ``input_image`` part: always seen (it was sent on purpose)."""
        self.rate.admit(now, frames=1, nbytes=nbytes)
        return self._ms(now)

    def chunk(self, now: float, nbytes: int) -> None:
        self.rate.admit(now, nbytes=nbytes)


class VideoDecoding:
    """The runner's decoders: still images in a worker thread, the stream in
    a ``ChunkDecoder`` whose thread calls ``wake`` (thread-safely, on the
    loop) when it has frames for ``take``."""

    def __init__(self, fps: float, wake: Callable[[], None]) -> None:
        self.fps = fps
        self._wake = wake
        self.decoder: ChunkDecoder | None = None

    async def image(self, data: bytes) -> np.ndarray:
        return await asyncio.to_thread(decode_image, data)

    def feed(self, data: bytes, container: str) -> None:
        """A fragment of the session's video stream."""
        decoder = self.decoder
        if decoder is not None and decoder.container != container:
            raise DuplexError("invalid_value", f"the video stream is {decoder.container}; "
                              f"a {container} chunk cannot continue it", param="container")
        if decoder is None:
            loop = asyncio.get_running_loop()
            decoder = self.decoder = ChunkDecoder(
                container, fps=self.fps, notify=lambda: loop.call_soon_threadsafe(self._wake))
        try:
            decoder.feed(data)
        except DuplexError as err:
            if isinstance(err, InvalidMedia):
                self._reset()
            raise

    def take(self) -> list[VideoFrame]:
        """The frames decoded since the last call (the decoder samples them)."""
        if self.decoder is None:
            return []
        try:
            frames = self.decoder.poll()
        except DuplexError:
            self._reset()
            raise
        return [VideoFrame(f.rgb, f.pts_ms, "chunk") for f in frames]

    def _reset(self) -> None:
        decoder, self.decoder = self.decoder, None
        if decoder is not None:
            decoder.close()  # its thread already ended on the error: a quick join

    async def close(self) -> None:
        decoder, self.decoder = self.decoder, None
        if decoder is not None:
            await asyncio.to_thread(decoder.close)
