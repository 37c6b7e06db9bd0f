"""``vllm-duplex talk``: stream a WAV to a realtime server and save the spoken reply.

The input is paced at real time by default so the server's VAD and latency
figures behave as they would with a live microphone. Timings are taken from the
``_recv_t`` stamps the client puts on every event; events are read while the
input is still streaming so those stamps are arrival times, not read times.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
import wave
from typing import Any

import numpy as np
import soxr
from vllm_duplex.realtime.client.realtime import (
    RealtimeClient,
    RealtimeError,
    ResponseResult,
)
from websockets.exceptions import ConnectionClosed, WebSocketException

TRAILING_SILENCE_S = 1.2  # longer than the default 500 ms VAD silence, so the turn ends
PCM = "audio/pcm"


def read_wav(path: str) -> tuple[np.ndarray, int]:
    """PCM16 WAV -> (float32 mono samples in [-1, 1), sample rate); channels are averaged."""
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV is supported "
                             f"(got {8 * w.getsampwidth()}-bit)")
        channels, rate = w.getnchannels(), w.getframerate()
        frames = w.readframes(w.getnframes())
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    return samples.reshape(-1, channels).mean(axis=1), rate


def to_pcm16(samples: np.ndarray, rate: int, target_rate: int) -> bytes:
    """Resample float mono to ``target_rate`` and encode little-endian PCM16."""
    if rate != target_rate:
        samples = soxr.resample(samples, rate, target_rate)
    return (np.clip(samples, -1.0, 32767 / 32768) * 32768.0).round().astype("<i2").tobytes()


def load_wav_pcm16(path: str, target_rate: int) -> bytes:
    samples, rate = read_wav(path)
    return to_pcm16(samples, rate, target_rate)


def write_wav(path: str, pcm16: bytes, rate: int) -> None:
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16)


def _audio_format(session: dict[str, Any], direction: str) -> dict[str, Any]:
    return ((session.get("audio") or {}).get(direction) or {}).get("format") or {}


def _rate(session: dict[str, Any], direction: str) -> int:
    return int(_audio_format(session, direction).get("rate") or 24000)


async def _ensure_pcm(client: RealtimeClient) -> None:
    """We send and save PCM16; ask for it if the session was set up with G.711."""
    patch = {d: {"format": {"type": PCM, "rate": 24000}} for d in ("input", "output")
             if _audio_format(client.session, d).get("type", PCM) != PCM}
    if patch:
        await client.update_session({"type": "realtime", "audio": patch})


async def _pump(client: RealtimeClient, until: float, stop: str | None = None) -> None:
    """Read events until monotonic time ``until`` (or until an event of type ``stop``)."""
    while (left := until - time.monotonic()) > 0:
        try:
            event = await client.recv(timeout=left)
        except TimeoutError:
            return
        if stop is not None and event.get("type") == stop:
            return


def _seen(client: RealtimeClient, etype: str) -> dict[str, Any] | None:
    return next((e for e in reversed(client.events) if e.get("type") == etype), None)


async def _talk(args: argparse.Namespace, samples: np.ndarray, wav_rate: int) -> int:
    try:
        client = await RealtimeClient.connect(args.url, api_key=args.api_key, model=args.model,
                                              open_timeout=min(args.timeout, 30.0))
    except RealtimeError as e:
        print(f"error: server refused the session: {e}", file=sys.stderr)
        return 2
    except ConnectionClosed as e:  # accepted, then dropped before session.created
        print(f"error: {args.url} closed the connection before session.created: {e}",
              file=sys.stderr)
        return 2
    except (OSError, WebSocketException, TimeoutError) as e:
        print(f"error: cannot connect to {args.url}: {e!r}", file=sys.stderr)
        return 2

    async with client:
        await _ensure_pcm(client)
        in_rate, out_rate = _rate(client.session, "input"), _rate(client.session, "output")
        pcm = to_pcm16(samples, wav_rate, in_rate)
        chunk_ms = max(1, args.chunk_ms)
        step = in_rate * chunk_ms // 1000 * 2
        chunks = [pcm[i:i + step] for i in range(0, len(pcm), step)]
        chunks += [bytes(step)] * math.ceil(TRAILING_SILENCE_S * 1000 / chunk_ms)

        start = time.monotonic()
        for k, chunk in enumerate(chunks):
            await client.append_audio(chunk)
            if not args.no_realtime:  # read events while waiting for chunk k+1's slot
                await _pump(client, start + (k + 1) * chunk_ms / 1000)
        vad_on = ((client.session.get("audio") or {}).get("input") or {}).get(
            "turn_detection") is not None
        if vad_on and args.no_realtime:  # the server may still be catching up on VAD
            await _pump(client, time.monotonic() + 0.5, stop="input_audio_buffer.speech_started")

        manual_t: float | None = None
        if not vad_on or _seen(client, "input_audio_buffer.speech_started") is None:
            manual_t = time.monotonic()
            await client.commit()
            await client.create_response()
        result = await client.collect_response(timeout=args.timeout)

        transcribing = ((client.session.get("audio") or {}).get("input") or {}).get(
            "transcription") is not None
        done_type = "conversation.item.input_audio_transcription.completed"
        if transcribing and _seen(client, done_type) is None:
            try:  # the user transcript may land just after the reply
                await client.wait_for(done_type, timeout=1.0)
            except TimeoutError:
                pass
        user = _seen(client, done_type)

    write_wav(args.out, result.audio, out_rate)
    stopped = _seen(client, "input_audio_buffer.speech_stopped")
    ref_t = manual_t if manual_t is not None else (stopped or {}).get("_recv_t", start)
    _report(result, user, ref_t, len(pcm) / 2 / in_rate, out_rate, manual_t is not None)
    print(f"wrote {args.out}")
    if result.status != "completed":
        details = (result.done.get("response") or {}).get("status_details")
        for err in result.errors:  # usually the reason a response failed
            print(f"error event: {RealtimeError(err)}", file=sys.stderr)
        print(f"error: response ended with status {result.status!r}: {details}",
              file=sys.stderr)
        return 1
    return 0


_TEXT_DELTAS = ("response.output_audio_transcript.delta", "response.output_text.delta",
                "response.audio_transcript.delta", "response.text.delta")


def _report(result: ResponseResult, user: dict[str, Any] | None, ref_t: float,
            in_s: float, out_rate: int, manual: bool) -> None:
    if user is not None:
        print(f"user:      {user.get('transcript', '')}")
    print(f"assistant: {result.transcript or result.text}")
    done_t = result.done["_recv_t"]
    first = next((e for e in result.events if e.get("type") in
                  ("response.output_audio.delta", "response.audio.delta")), None)
    out_s = len(result.audio) / 2 / out_rate
    ref = "commit" if manual else "speech_stopped"
    ttfa = f"{(first['_recv_t'] - ref_t) * 1000:.0f} ms" if first else "n/a (no audio)"
    print(f"TTFA ({ref} -> first audio): {ttfa}")
    # The first word of the reply: the LLM's time to first token as the client sees it.
    word = next((e for e in result.events if e.get("type") in _TEXT_DELTAS), None)
    if word is not None:
        print(f"LLM TTFT ({ref} -> first reply text): {(word['_recv_t'] - ref_t) * 1000:.0f} ms")
    print(f"end of input ({ref}) -> response.done: {(done_t - ref_t) * 1000:.0f} ms")
    print(f"audio in: {in_s:.2f} s, out: {out_s:.2f} s")
    if out_s > 0:  # < 1 means the reply was produced faster than it plays
        print(f"real-time factor (response time / reply audio): {(done_t - ref_t) / out_s:.3f}")


def run_talk(args: argparse.Namespace) -> int:
    try:  # read the input first: a bad file should fail before any connection is made
        samples, wav_rate = read_wav(args.audio)
    except (OSError, EOFError, ValueError, wave.Error) as e:
        print(f"error: cannot read {args.audio}: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_talk(args, samples, wav_rate))
    except RealtimeError as e:
        print(f"error: server error: {e}", file=sys.stderr)
    except TimeoutError:
        print(f"error: timed out after {args.timeout:g} s waiting for the reply",
              file=sys.stderr)
    except ConnectionClosed as e:
        print(f"error: connection closed by the server: {e}", file=sys.stderr)
    return 1
