"""Video input without I/O: still images, WebM/MP4 fragments, sampling, limits.

Nothing here touches a socket or the event loop. ``decode_image`` is a
plain function; ``FrameSampler`` and ``RateLimiter`` are
clock-free state machines that take timestamps as arguments; ``ChunkDecoder``
owns one demuxer thread (PyAV's demuxer pulls bytes, so it cannot be driven
push-style) behind a non-blocking ``feed`` / ``poll`` surface.

Client data that does not decode raises ``DuplexError("invalid_image")``;
traffic over a session's limits raises ``DuplexError("rate_limited")``.
PIL, PyAV and OpenCV are imported on first use (the ``video`` extra).
"""

from __future__ import annotations

import io
import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from vllm_duplex.domain.errors import DuplexError

MAX_PIXELS = 4096 * 4096  # per image or frame: a decompression-bomb guard
MAX_BUFFERED = 8 << 20  # bytes fed to a ChunkDecoder and not yet demuxed
MAX_PENDING = 8  # decoded frames held for poll(); older ones are dropped

_MAGIC = {b"\xff\xd8\xff": "JPEG", b"\x89PNG\r\n\x1a\n": "PNG"}
# container name -> FFmpeg demuxer ("webm" is the matroska demuxer)
CONTAINERS = {"webm": "matroska", "mp4": "mp4"}
# Live fragments: codec parameters are in the header / init segment, so the
# demuxer must not read ahead seconds of video to "find stream info".
_PROBE = {"probesize": "32", "analyzeduration": "0"}


def decode_image(data: bytes, *, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """A JPEG or PNG file -> RGB ``uint8`` ``(height, width, 3)``.

    The size is checked from the header before any pixel is decoded."""
    from PIL import Image

    fmt = next((f for m, f in _MAGIC.items() if data[: len(m)] == m), None)
    if fmt is None:
        raise DuplexError("invalid_image", "image is neither JPEG nor PNG")
    try:
        with Image.open(io.BytesIO(data), formats=[fmt]) as img:
            w, h = img.size
            if w * h > max_pixels:
                raise DuplexError("invalid_image", f"image is {w}x{h}, over {max_pixels} pixels")
            rgb = np.asarray(img.convert("RGB"))
    except DuplexError:
        raise
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, ...
        raise DuplexError("invalid_image", f"cannot decode {fmt}: {exc}") from exc
    return np.ascontiguousarray(rgb, dtype=np.uint8)


class FrameSampler:
    """Keeps a frame only if at least ``1/fps`` passed since the last kept one.

    A timestamp before the last kept one starts a new timeline (kept)."""

    def __init__(self, fps: float) -> None:
        if not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.interval_ms = 1000.0 / fps
        self._last: int | None = None
        self.kept = 0
        self.dropped = 0

    def keep(self, timestamp_ms: int) -> bool:
        last = self._last
        if last is None or timestamp_ms < last or timestamp_ms - last >= self.interval_ms:
            self._last = timestamp_ms
            self.kept += 1
            return True
        self.dropped += 1
        return False


class RateLimiter:
    """Per-session video limits over a sliding window (1 s by default):
    frames and bytes. ``admit`` either counts the traffic or raises
    ``rate_limited`` (refused traffic is not counted). Memory is bounded:
    traffic is summed in ``buckets`` slots of the window."""

    def __init__(
        self, max_fps: float, max_bytes_per_s: int, *, window_s: float = 1.0, buckets: int = 100
    ) -> None:
        if max_fps <= 0 or max_bytes_per_s <= 0 or window_s <= 0 or buckets < 1:
            raise ValueError("limits, window and buckets must be positive")
        self.max_frames = max_fps * window_s
        self.max_bytes = max_bytes_per_s * window_s
        self.window_s = window_s
        self._slot = window_s / buckets
        self._buckets: deque[list[float]] = deque()  # [slot start, frames, bytes]
        self._frames = 0
        self._bytes = 0
        self.refused = 0

    def _expire(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] <= now - self.window_s:
            _, frames, nbytes = self._buckets.popleft()
            self._frames -= int(frames)
            self._bytes -= int(nbytes)

    def admit(self, now: float, *, frames: int = 0, nbytes: int = 0) -> None:
        """Count ``frames`` and ``nbytes`` arriving at ``now`` (seconds)."""
        self._expire(now)
        if self._frames + frames > self.max_frames:
            self.refused += 1
            raise DuplexError(
                "rate_limited", f"video over {self.max_frames / self.window_s:g} frames/s")
        if self._bytes + nbytes > self.max_bytes:
            self.refused += 1
            raise DuplexError(
                "rate_limited", f"video over {self.max_bytes / self.window_s:g} bytes/s")
        start = math.floor(now / self._slot) * self._slot
        if not self._buckets or self._buckets[-1][0] != start:
            self._buckets.append([start, 0, 0])
        self._buckets[-1][1] += frames
        self._buckets[-1][2] += nbytes
        self._frames += frames
        self._bytes += nbytes


@dataclass(frozen=True, eq=False)
class DecodedFrame:
    rgb: np.ndarray  # uint8 (height, width, 3)
    pts_ms: int  # presentation time in the stream (need not start at 0)


class _Pipe:
    """Bytes from ``write`` (never blocks) to ``read`` (blocks on the demuxer
    thread until data, end or abort). Bounded: ``write`` over ``limit``
    buffered bytes raises ``rate_limited``."""

    def __init__(self, limit: int) -> None:
        self._buf = bytearray()
        self._cond = threading.Condition()
        self._limit = limit
        self._eof = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        with self._cond:
            if len(self._buf) + len(data) > self._limit:
                raise DuplexError("rate_limited", "video decoder is behind the stream")
            self._buf += data
            self._cond.notify()

    def finish(self, *, abort: bool = False) -> None:
        with self._cond:
            self._eof = True
            self.aborted = self.aborted or abort
            if abort:
                self._buf.clear()
            self._cond.notify()

    def drained(self) -> bool:
        """The writer finished and every byte was read."""
        with self._cond:
            return self._eof and not self._buf

    def read(self, n: int = -1) -> bytes:
        with self._cond:
            self._cond.wait_for(lambda: self._buf or self._eof)
            n = len(self._buf) if n < 0 else n
            out = bytes(self._buf[:n])
            del self._buf[:n]
            return out


class ChunkDecoder:
    """Incremental decoder of a WebM or (fragmented) MP4 stream that arrives in
    chunks, as MediaRecorder or ``ffmpeg -f webm`` / ``-movflags
    frag_keyframe+empty_moov`` cut it: the first chunk carries the header or
    init segment, later ones clusters / fragments, at arbitrary byte
    boundaries.

    ``feed`` never blocks; a demuxer thread (started by the first ``feed``)
    decodes as bytes arrive. ``poll`` takes the decoded frames (at most
    ``max_pending`` are held: when the consumer lags, the oldest are dropped
    and counted in ``dropped``); ``notify`` (if given) is called on the
    decoder thread after each new frame and when decoding ends, e.g.
    ``lambda: loop.call_soon_threadsafe(event.set)``. With ``fps`` only
    frames ``FrameSampler(fps)`` keeps are converted to RGB. A stream that
    does not decode surfaces as ``invalid_image`` from ``poll`` (once the
    frames before it are taken) and from ``feed``. ``close`` stops and joins
    the thread; call it on every path.
    """

    def __init__(
        self,
        container: str,
        *,
        notify: Callable[[], None] | None = None,
        fps: float | None = None,
        max_pixels: int = MAX_PIXELS,
        max_buffered: int = MAX_BUFFERED,
        max_pending: int = MAX_PENDING,
    ) -> None:
        if container not in CONTAINERS:
            raise DuplexError("invalid_value", f"container must be one of {sorted(CONTAINERS)}",
                              param="container")
        self.container = container
        self._notify = notify
        self._sampler = FrameSampler(fps) if fps else None
        self._max_pixels = max_pixels
        self._pipe = _Pipe(max_buffered)
        self._lock = threading.Lock()
        self._pending: deque[DecodedFrame] = deque(maxlen=max_pending)
        self._thread: threading.Thread | None = None
        self._ended = False
        self._finished = threading.Event()
        self.error: DuplexError | None = None
        self.decoded = 0  # frames out of the decoder (sampled or not)
        self.dropped = 0  # converted frames nobody polled in time

    @property
    def done(self) -> bool:
        """The decoder thread has finished (end of stream, error or close)."""
        return self._finished.is_set()

    def feed(self, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        if self._ended:
            raise RuntimeError("ChunkDecoder.feed after end() or close()")
        self._pipe.write(data)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"duplex-video-{self.container}", daemon=True)
            self._thread.start()

    def end(self) -> None:
        """No more data: the thread decodes what is buffered, then finishes."""
        self._ended = True
        self._pipe.finish()
        if self._thread is None:
            self._finished.set()

    def poll(self) -> list[DecodedFrame]:
        """The frames decoded since the last poll, oldest first; raises the
        stream's ``invalid_image`` once they are all taken."""
        with self._lock:
            frames = list(self._pending)
            self._pending.clear()
        if not frames and self.error is not None:
            raise self.error
        return frames

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the thread finished (for synchronous callers; call
        ``end`` first). Returns whether it did."""
        return self._finished.wait(timeout)

    def close(self) -> None:
        """Abort decoding and join the thread (idempotent)."""
        self._ended = True
        self._pipe.finish(abort=True)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._finished.set()

    def _run(self) -> None:
        try:
            self._demux()
            if not self._pipe.drained():  # the demuxer gave up on a live stream
                raise DuplexError("invalid_image", f"{self.container} stream stopped decoding "
                                  "before its end (corrupt data)")
        except DuplexError as exc:
            self.error = exc
        except Exception as exc:  # noqa: BLE001 - PyAV raises InvalidDataError, EOFError, ...
            if not self._pipe.aborted:
                error = DuplexError("invalid_image", f"cannot decode {self.container} video: {exc}")
                error.__cause__ = exc
                self.error = error
        finally:
            self._finished.set()
            if self._notify is not None and not self._pipe.aborted:
                self._notify()

    def _demux(self) -> None:
        import av

        fmt = CONTAINERS[self.container]
        with av.open(self._pipe, mode="r", format=fmt, options=_PROBE) as src:
            if not src.streams.video:
                raise DuplexError("invalid_image", f"{self.container} stream has no video track")
            stream = src.streams.video[0]
            self._check_size(stream.width, stream.height)  # before the decoder allocates
            last_ms = 0
            for frame in src.decode(stream):
                if self._pipe.aborted:
                    return
                self._check_size(frame.width, frame.height)  # the size can change mid-stream
                self.decoded += 1
                # pts can be missing on broken streams: then the previous time
                last_ms = round(frame.time * 1000) if frame.time is not None else last_ms
                if self._sampler is not None and not self._sampler.keep(last_ms):
                    continue
                out = DecodedFrame(frame.to_ndarray(format="rgb24"), last_ms)
                with self._lock:
                    if len(self._pending) == self._pending.maxlen:
                        self.dropped += 1
                    self._pending.append(out)
                if self._notify is not None and not self._pipe.aborted:
                    self._notify()

    def _check_size(self, width: int, height: int) -> None:
        if width * height > self._max_pixels:
            raise DuplexError(
                "invalid_image", f"video is {width}x{height}, over {self._max_pixels} pixels")
