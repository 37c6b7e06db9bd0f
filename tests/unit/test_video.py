"""Video input without a model: image decoding, incremental WebM/MP4 decoding,
sampling, tiling and rate limits (``vllm_duplex.media.video``).

Streams are encoded here with PyAV's bundled FFmpeg, so nothing is
downloaded; every frame carries a bar whose width encodes its index, so a
decoded frame can be matched to the one that was encoded.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import random
import threading

import av
import numpy as np
import pytest
from PIL import Image
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.media.video import (
    ChunkDecoder,
    DecodedFrame,
    FrameSampler,
    RateLimiter,
    decode_image,
)
from vllm_duplex.models.omni.units import tile

W, H, FPS, N = 160, 120, 30, 30
FRAG_MP4 = {"movflags": "frag_keyframe+empty_moov+default_base_moof"}
# (container, codec, muxer options): what a browser's MediaRecorder or
# `ffmpeg -f webm` / fragmented MP4 produce
STREAMS = [
    ("webm", "libvpx", {}),
    ("webm", "libvpx", {"live": "1"}),  # unknown-size clusters, no cues: MediaRecorder's shape
    ("webm", "libvpx-vp9", {}),
    ("mp4", "libx264", FRAG_MP4),
    ("mp4", "mpeg4", FRAG_MP4),
]


def bar_frame(i: int) -> np.ndarray:
    img = np.zeros((H, W, 3), np.uint8)
    img[:, : 4 * (i + 1)] = 220
    return img


def bar_index(rgb: np.ndarray) -> int:
    """The index ``bar_frame`` drew (from the bar's width, codec noise aside)."""
    return round(int((rgb[H // 2, :, 1] > 110).sum()) / 4) - 1


def encode(container: str, codec: str, options: dict[str, str], n: int = N) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=container, options=options) as out:
        stream = out.add_stream(codec, rate=FPS)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        stream.gop_size = 10  # small fragments / clusters, as a live recorder cuts them
        if codec.startswith("libvpx"):
            stream.options = {"deadline": "realtime", "cpu-used": "8"}
        for i in range(n):
            for packet in stream.encode(av.VideoFrame.from_ndarray(bar_frame(i), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def chunks(data: bytes, rng: random.Random, most: int) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, most)
        out.append(data[i : i + n])
        i += n
    return out


def decode_all(container: str, parts: list[bytes], **kw) -> list[DecodedFrame]:
    dec = ChunkDecoder(container, max_pending=1000, **kw)
    frames: list[DecodedFrame] = []
    try:
        for part in parts:
            dec.feed(part)
            frames += dec.poll()
        dec.end()
        assert dec.wait(10)
        frames += dec.poll()
    finally:
        dec.close()
    return frames


def video_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("duplex-video")]


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    assert video_threads() == []


@pytest.fixture(scope="module", params=STREAMS,
                ids=lambda s: f"{s[0]}-{s[1]}" + ("-live" if "live" in s[2] else ""))
def stream(request) -> tuple[str, bytes]:
    container, codec, options = request.param
    if codec not in av.codecs_available:
        pytest.skip(f"PyAV's FFmpeg has no {codec}")
    return container, encode(container, codec, options)


# ---- still images ----------------------------------------------------------


def encoded(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_decode_png_is_exact_and_jpeg_close():
    rgb = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    out = decode_image(encoded(Image.fromarray(rgb), "PNG"))
    assert out.dtype == np.uint8 and out.shape == (48, 64, 3)
    np.testing.assert_array_equal(out, rgb)
    smooth = np.zeros((48, 64, 3), np.uint8)
    smooth[:, :32] = (200, 40, 10)
    jpeg = decode_image(encoded(Image.fromarray(smooth), "JPEG", quality=95))
    assert jpeg.shape == (48, 64, 3)
    assert np.abs(jpeg.astype(int) - smooth).mean() < 3


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "I;16"])
def test_decode_png_other_modes_become_rgb(mode):
    out = decode_image(encoded(Image.new(mode, (10, 8)), "PNG"))
    assert out.shape == (8, 10, 3) and out.dtype == np.uint8


@pytest.mark.parametrize("data", [
    b"", b"garbage", b"GIF89a" + bytes(100), b"\x89PNG\r\n\x1a\n" + bytes(40),
    b"\xff\xd8\xff\xe0" + bytes(200),
])
def test_decode_garbage_is_invalid_image(data):
    with pytest.raises(DuplexError) as err:
        decode_image(data)
    assert err.value.code == "invalid_image"


def test_decode_truncated_image_is_invalid():
    rgb = np.random.default_rng(2).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    for fmt in ("PNG", "JPEG"):
        data = encoded(Image.fromarray(rgb), fmt)
        with pytest.raises(DuplexError) as err:
            decode_image(data[: len(data) // 2])
        assert err.value.code == "invalid_image"


def test_decompression_bomb_is_refused_before_decoding():
    bomb = encoded(Image.new("L", (5000, 5000)), "PNG")  # ~25 KB of zeros, 25 Mpx
    assert len(bomb) < 100_000
    with pytest.raises(DuplexError, match="over") as err:
        decode_image(bomb)
    assert err.value.code == "invalid_image"
    with pytest.raises(DuplexError):
        decode_image(encoded(Image.new("RGB", (100, 100)), "PNG"), max_pixels=9999)


# ---- WebM / MP4 fragments --------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_chunked_stream_decodes_every_frame_in_order(stream, seed):
    container, data = stream
    rng = random.Random(seed)
    frames = decode_all(container, chunks(data, rng, rng.choice([7, 300, 4000])))
    assert [bar_index(f.rgb) for f in frames] == list(range(N))
    pts = [f.pts_ms for f in frames]
    assert all(b - a in (33, 34) for a, b in itertools.pairwise(pts)), pts
    assert all(f.rgb.shape == (H, W, 3) and f.rgb.dtype == np.uint8 for f in frames)


def test_chunking_does_not_change_the_frames(stream):
    """Streaming equals batch: one chunk or byte-sized ones, same frames."""
    container, data = stream
    whole = decode_all(container, [data])
    tiny = decode_all(container, chunks(data, random.Random(5), 3))
    assert [f.pts_ms for f in tiny] == [f.pts_ms for f in whole]
    for a, b in zip(tiny, whole):
        np.testing.assert_array_equal(a.rgb, b.rgb)


def test_frames_arrive_before_the_stream_ends(stream):
    """Incremental: the first half of the bytes yields frames without end()."""
    container, data = stream
    ready = threading.Event()
    dec = ChunkDecoder(container, notify=ready.set, max_pending=100)
    try:
        for part in chunks(data[: len(data) // 2], random.Random(3), 500):
            dec.feed(part)
        frames: list[DecodedFrame] = []
        while len(frames) < 5 and ready.wait(10):
            ready.clear()
            frames += dec.poll()
        assert len(frames) >= 5 and not dec.done
    finally:
        dec.close()
    assert dec.done


async def test_notify_wakes_an_event_loop_consumer(stream):
    """The wiring a session uses: feed from the loop, wake it from the thread."""
    container, data = stream
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    dec = ChunkDecoder(container, notify=lambda: loop.call_soon_threadsafe(ready.set),
                       max_pending=100)
    frames: list[DecodedFrame] = []
    try:
        for part in chunks(data, random.Random(4), 1000):
            dec.feed(part)
        dec.end()
        while True:
            await asyncio.wait_for(ready.wait(), 10)
            ready.clear()
            frames += dec.poll()
            if dec.done:  # set before the last notify: every frame is in
                frames += dec.poll()
                break
    finally:
        dec.close()
    assert [f.pts_ms for f in frames] == sorted(f.pts_ms for f in frames)
    assert len(frames) == N


def test_sampling_in_the_decoder(stream):
    container, data = stream
    frames = decode_all(container, [data], fps=10)
    pts = [f.pts_ms for f in frames]
    assert len(frames) == 10 and all(b - a >= 100 for a, b in itertools.pairwise(pts))


def test_a_lagging_consumer_gets_the_newest_frames(stream):
    container, data = stream
    dec = ChunkDecoder(container, max_pending=2)
    try:
        dec.feed(data)
        dec.end()
        assert dec.wait(10)
        frames = dec.poll()
    finally:
        dec.close()
    assert [bar_index(f.rgb) for f in frames] == [N - 2, N - 1]
    assert dec.dropped == N - 2 and dec.decoded == N


@pytest.mark.parametrize("container", ["webm", "mp4"])
def test_garbage_stream_is_invalid_image(container):
    dec = ChunkDecoder(container)
    try:
        dec.feed(bytes(random.Random(7).getrandbits(8) for _ in range(5000)))
        dec.end()
        assert dec.wait(10)
        with pytest.raises(DuplexError) as err:
            dec.poll()
        assert err.value.code == "invalid_image"
        with pytest.raises(DuplexError):
            dec.feed(b"more")
    finally:
        dec.close()


def test_a_header_cut_short_is_invalid_image(stream):
    container, data = stream
    dec = ChunkDecoder(container)
    try:
        dec.feed(data[:40])
        dec.end()
        assert dec.wait(10)
        with pytest.raises(DuplexError) as err:
            dec.poll()
        assert err.value.code == "invalid_image"
    finally:
        dec.close()


@pytest.mark.parametrize("codec", ["libx264", "mpeg4"])
def test_garbage_mid_stream_is_invalid_image(codec):
    """Fragments overwritten with garbage: the demuxer gives up before the
    stream ended; that is an error, not a silent stall."""
    data = bytearray(encode("mp4", codec, FRAG_MP4))
    data[len(data) // 2 : len(data) // 2 + 300] = random.Random(1).randbytes(300)
    dec = ChunkDecoder("mp4", max_pending=100)
    try:
        dec.feed(bytes(data))  # no end(): a live stream
        assert dec.wait(10)
        frames = dec.poll()
        assert 0 < len(frames) < N
        with pytest.raises(DuplexError) as err:
            dec.poll()
        assert err.value.code == "invalid_image"
        with pytest.raises(DuplexError):
            dec.feed(b"more")
    finally:
        dec.close()


def test_oversized_video_is_invalid_image(stream):
    container, data = stream
    with pytest.raises(DuplexError, match="over 1000 pixels"):
        decode_all(container, [data], max_pixels=1000)


def test_decoder_limits_and_misuse():
    with pytest.raises(DuplexError) as err:
        ChunkDecoder("avi")
    assert err.value.code == "invalid_value"
    dec = ChunkDecoder("webm", max_buffered=100)
    with pytest.raises(DuplexError) as err:
        dec.feed(bytes(101))  # nothing demuxes it yet: over the buffer bound
    assert err.value.code == "rate_limited"
    dec.end()
    assert dec.done and dec.poll() == []
    with pytest.raises(RuntimeError):
        dec.feed(b"x")
    dec.close()
    dec.close()  # idempotent


def test_close_mid_stream_joins_the_thread(stream):
    container, data = stream
    dec = ChunkDecoder(container)
    dec.feed(data[: len(data) // 3])  # the demuxer now waits for more bytes
    dec.close()
    assert dec.done and video_threads() == []


# ---- sampling, tiling, limits ----------------------------------------------


def test_frame_sampler_keeps_one_per_interval():
    sampler = FrameSampler(2)
    kept = [t for t in (round(i * 1000 / 30) for i in range(61)) if sampler.keep(t)]
    assert kept == [0, 500, 1000, 1500, 2000]
    assert (sampler.kept, sampler.dropped) == (5, 56)
    assert sampler.keep(100)  # time went backwards: a new timeline
    assert not sampler.keep(599) and sampler.keep(600)
    with pytest.raises(ValueError):
        FrameSampler(0)


def test_tile_places_frames_in_a_grid_keeping_aspect():
    frames = [np.full((48, 64, 3), 10 * (i + 1), np.uint8) for i in range(5)]
    frames[4] = np.full((50, 100, 3), 200, np.uint8)  # wide: letterboxed
    grid = tile(frames, cols=2, cell=(64, 48))
    assert grid.shape == (3 * 48, 2 * 64, 3) and grid.dtype == np.uint8
    for i in range(4):
        y, x = (i // 2) * 48, (i % 2) * 64
        assert (grid[y : y + 48, x : x + 64] == 10 * (i + 1)).all()
    last = grid[96:144, 0:64]
    assert (last[8:40] == 200).all() and (last[:8] == 0).all() and (last[40:] == 0).all()
    assert (grid[96:, 64:] == 0).all()  # the empty cell
    assert tile(frames[:1], cols=4, cell=(32, 32)).shape == (32, 32, 3)
    with pytest.raises(ValueError):
        tile([], cols=2, cell=(10, 10))


def test_rate_limiter_frames_per_second_sliding_window():
    limits = RateLimiter(max_fps=5, max_bytes_per_s=10**9)
    for i in range(5):
        limits.admit(i * 0.1, frames=1)
    with pytest.raises(DuplexError) as err:
        limits.admit(0.5, frames=1)
    assert err.value.code == "rate_limited" and err.value.spec.http_status == 429
    with pytest.raises(DuplexError):
        limits.admit(0.99, frames=1)
    limits.admit(1.0, frames=1)  # the frame of t=0 left the window
    with pytest.raises(DuplexError):
        limits.admit(1.05, frames=1)
    limits.admit(1.1, frames=1)
    assert limits.refused == 3


def test_rate_limiter_bytes_per_second_and_refusals_not_counted():
    limits = RateLimiter(max_fps=100, max_bytes_per_s=1000)
    limits.admit(0.0, nbytes=900)
    with pytest.raises(DuplexError, match="bytes/s"):
        limits.admit(0.2, nbytes=200)
    limits.admit(0.3, nbytes=100)  # the refused 200 did not count
    with pytest.raises(DuplexError):
        limits.admit(0.4, nbytes=1)
    limits.admit(1.0, nbytes=900)
    for t in range(10_000):  # memory stays bounded by the bucket count
        limits.admit(2.0 + t * 0.0001, nbytes=0, frames=0)
    assert len(limits._buckets) <= 101
