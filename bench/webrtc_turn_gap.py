"""Turn gap over WebRTC beside the WebSocket, on the same pipeline, in one run.

    .venv/bin/python bench/webrtc_turn_gap.py [--config scripted] [--turns 10] [--json out.json]

One in-process ``BackgroundServer`` (loopback). Each turn is the same
utterance (``--config scripted``: a 0.8 s tone, the energy VAD's speech; a
cascade config: Flite's "What is the capital of France?") followed by
silence, sent at real time:

- WebSocket (the baseline): 20 ms PCM16 24 kHz appends on an absolute
  schedule; the gap is the end of the speech's last chunk's slot -> the first
  ``response.output_audio.delta`` of the reply.
- WebRTC: the same audio at 48 kHz on an aiortc client's microphone track
  (Opus, paced by the track); the gap is the moment the last speech sample
  went into the track -> the first frame with sound on the reply track
  (Opus decode, jitter buffer and the track's 20 ms framing included, as a
  caller hears it).

Both include the server VAD's silence window (500 ms on the scripted
config): that part is the same on both; the difference is the transport.
Prints p50 / p90 per transport and the WebRTC/WebSocket ratio. Never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import soxr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import machine  # noqa: E402
from support.audio import silence, tone  # noqa: E402
from support.webrtc import RtcClient  # noqa: E402
from vllm_duplex.host.deploy import load_config  # noqa: E402
from vllm_duplex.host.runtime import Runtime  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient  # noqa: E402
from vllm_duplex.realtime.server.serving import BackgroundServer  # noqa: E402


def utterance(config: str) -> tuple[np.ndarray, float]:
    """The turn's speech at 24 kHz and its end (s) inside it."""
    if config.startswith("scripted"):
        speech = np.frombuffer(tone(0.8), "<i2")
        return np.concatenate([speech, np.frombuffer(silence(1.5), "<i2")]), 0.8
    from support.speech_fixtures import speak

    pcm = speak("What is the capital of France?", lead_s=0.0, tail_s=0.0)
    return np.concatenate([pcm, np.zeros(int(24000 * 2.5), np.int16)]), len(pcm) / 24000


async def websocket_turn(url: str, pcm: np.ndarray, end_s: float) -> float:
    async with await RealtimeClient.connect(url) as rt:
        async def first_audio() -> float:  # read while sending, as a client does
            await rt.wait_for("response.output_audio.delta", timeout=60)
            return time.monotonic()

        heard = asyncio.ensure_future(first_audio())
        chunk = 480  # 20 ms at 24 kHz
        t0 = time.monotonic()
        end_at = t0 + end_s
        for i in range(0, len(pcm), chunk):
            if heard.done():
                break
            await rt.append_audio(pcm[i:i + chunk].astype("<i2").tobytes())
            await asyncio.sleep(max(0.0, t0 + (i // chunk + 1) * 0.02 - time.monotonic()))
        return await heard - end_at


async def webrtc_turn(http_url: str, pcm: np.ndarray, end_s: float) -> float:
    pcm48 = soxr.resample(pcm, 24000, 48000).astype("<i2")
    async with RtcClient(http_url, timeout=60) as call:
        await call.event("session.created")
        await call.frames(5)  # the track is flowing
        call.mic.say(pcm48[: int(end_s * 48000)].tobytes())
        await call.mic.spoken.wait()  # the last speech sample went into the track now
        end_at = time.monotonic()
        call.mic.say(pcm48[int(end_s * 48000):].tobytes())
        return await call.heard(end_at) - end_at


def quantiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="scripted")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    pcm, end_s = utterance(args.config)
    gaps: dict[str, list[float]] = {"websocket": [], "webrtc": []}
    async with BackgroundServer(Runtime(load_config(args.config))) as server:
        for turn in range(args.turns):  # interleaved: load drifts hit both alike
            gaps["websocket"].append(await websocket_turn(server.ws_url, pcm, end_s))
            gaps["webrtc"].append(await webrtc_turn(server.http_url, pcm, end_s))
            print(f"turn {turn + 1}: websocket {gaps['websocket'][-1] * 1000:.0f} ms, "
                  f"webrtc {gaps['webrtc'][-1] * 1000:.0f} ms", flush=True)
    ws50, ws90 = quantiles(gaps["websocket"])
    rtc50, rtc90 = quantiles(gaps["webrtc"])
    print(f"\nconfig {args.config}, {args.turns} turns each (end of speech -> first reply audio)")
    print(machine.line())
    print(f"{'transport':<12}{'p50 ms':>10}{'p90 ms':>10}")
    print(f"{'websocket':<12}{ws50 * 1000:>10.0f}{ws90 * 1000:>10.0f}")
    print(f"{'webrtc':<12}{rtc50 * 1000:>10.0f}{rtc90 * 1000:>10.0f}   "
          f"({rtc50 / ws50:.2f}x / {rtc90 / ws90:.2f}x the socket)")
    if args.json:
        Path(args.json).write_text(json.dumps(gaps))


if __name__ == "__main__":
    asyncio.run(main())
