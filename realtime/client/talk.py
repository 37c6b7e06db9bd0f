"""``vllm-duplex talk``: stream an audio file to a realtime server and save the spoken reply.

Any file ``soundfile`` (libsndfile) reads goes in -- WAV, FLAC, OGG/Vorbis or
Opus, MP3, AIFF... -- at any rate and channel count: channels are averaged,
the rate is converted with soxr to the session's. The reply is written in the
format the output file's extension names, at the reply's rate unless
``--out-rate`` asks for another. A file that cannot be read, or an output
whose format cannot be written, is a one-line error naming it, before any
connection is made.

The input is paced at real time by default so the server's VAD and latency
figures behave as they would with a live microphone. Timings are taken from the
``_recv_t`` stamps the client puts on every event; events are read while the
input is still streaming so those stamps are arrival times, not read times.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import soxr
from vllm_duplex.realtime.client.realtime import (
    RealtimeClient,
    RealtimeError,
    ResponseResult,
)
from websockets.exceptions import ConnectionClosed, WebSocketException

TRAILING_SILENCE_S = 1.2  # longer than the default 500 ms VAD silence, so the turn ends
PCM = "audio/pcm"
# Extensions libsndfile does not map to a (format, subtype) by itself, or maps
# to a subtype we would not choose for speech.
_OUT_FORMATS = {".wav": ("WAV", "PCM_16"), ".flac": ("FLAC", "PCM_16"), ".ogg": ("OGG", "VORBIS"),
                ".oga": ("OGG", "VORBIS"), ".opus": ("OGG", "OPUS"), ".mp3": ("MP3", "MPEG_LAYER_III"),
                ".aiff": ("AIFF", "PCM_16"), ".aif": ("AIFF", "PCM_16")}
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


class AudioFileError(ValueError):
    """An input that cannot be read or an output that cannot be written; names the file."""


def read_audio(path: str) -> tuple[np.ndarray, int]:
    """Any soundfile-readable file -> (float32 mono samples in [-1, 1], rate); channels averaged."""
    try:
        data, rate = sf.read(path, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError, ValueError, TypeError) as e:
        reason = getattr(e, "error_string", None) or str(e) or type(e).__name__
        raise AudioFileError(f"cannot read {path}: {reason}") from None
    if data.size == 0:
        raise AudioFileError(f"cannot read {path}: it holds no audio")
    return data.mean(axis=1), int(rate)


def to_pcm16(samples: np.ndarray, rate: int, target_rate: int) -> bytes:
    """Resample float mono to ``target_rate`` and encode little-endian PCM16."""
    if rate != target_rate:
        samples = soxr.resample(samples, rate, target_rate)
    return (np.clip(samples, -1.0, 32767 / 32768) * 32768.0).round().astype("<i2").tobytes()


def load_audio_pcm16(path: str, target_rate: int) -> bytes:
    samples, rate = read_audio(path)
    return to_pcm16(samples, rate, target_rate)


def output_format(path: str, rate: int | None = None, channels: int = 1) -> tuple[str, str | None]:
    """The (format, subtype) ``path``'s extension names; raises ``AudioFileError``
    when it names none libsndfile writes, or the folder is not writable."""
    ext = Path(path).suffix.lower()
    fmt, subtype = _OUT_FORMATS.get(ext, (ext.lstrip(".").upper(), None))
    if not ext or fmt not in sf.available_formats():
        raise AudioFileError(f"cannot write {path}: unknown audio format {ext or '(no extension)'!r} "
                             f"(use .wav, .flac, .ogg, .opus, .mp3 ...)")
    if subtype is not None and not sf.check_format(fmt, subtype):
        raise AudioFileError(f"cannot write {path}: this libsndfile cannot write {fmt}/{subtype}")
    if subtype == "OPUS" and rate is not None and rate not in _OPUS_RATES:
        raise AudioFileError(f"cannot write {path}: Opus takes {_OPUS_RATES} Hz, not {rate}")
    if channels < 1:
        raise AudioFileError(f"cannot write {path}: {channels} channels")
    folder = Path(path).resolve().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise AudioFileError(f"cannot write {path}: {folder} is not a writable folder")
    return fmt, subtype


def write_audio(path: str, pcm16: bytes, rate: int, *, out_rate: int | None = None,
                channels: int = 1) -> int:
    """Write mono PCM16 in the format ``path`` names (``output_format``),
    resampled to ``out_rate`` and copied to ``channels``; returns the rate written."""
    fmt, subtype = output_format(path, out_rate or rate, channels)
    samples = np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768.0
    if out_rate and out_rate != rate:
        samples, rate = soxr.resample(samples, rate, out_rate).astype(np.float32), out_rate
    frames = np.repeat(samples[:, None], channels, axis=1) if channels > 1 else samples
    try:
        sf.write(path, frames, rate, format=fmt, subtype=subtype)
    except (sf.LibsndfileError, RuntimeError, OSError, ValueError) as e:
        raise AudioFileError(f"cannot write {path}: {getattr(e, 'error_string', None) or e}") from None
    return rate


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

    written = write_audio(args.out, result.audio, out_rate, out_rate=args.out_rate,
                          channels=args.out_channels)
    stopped = _seen(client, "input_audio_buffer.speech_stopped")
    ref_t = manual_t if manual_t is not None else (stopped or {}).get("_recv_t", start)
    # Where the user's speech ended on this clock: the audio streamed at real
    # time, so the VAD's audio_end_ms after the start of sending.
    speech_end_t = None
    if stopped is not None and manual_t is None and not args.no_realtime:
        speech_end_t = start + stopped.get("audio_end_ms", 0) / 1000
    _report(result, user, ref_t, len(pcm) / 2 / in_rate, out_rate, manual_t is not None, speech_end_t)
    print(f"wrote {args.out} ({written} Hz, {args.out_channels} channel"
          f"{'s' if args.out_channels > 1 else ''})")
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
            in_s: float, out_rate: int, manual: bool, speech_end_t: float | None = None) -> None:
    if user is not None:
        print(f"user:      {user.get('transcript', '')}")
    print(f"assistant: {result.transcript or result.text}")
    done_t = result.done["_recv_t"]
    first = next((e for e in result.events if e.get("type") in
                  ("response.output_audio.delta", "response.audio.delta")), None)
    out_s = len(result.audio) / 2 / out_rate
    ref = "commit" if manual else "speech_stopped"
    ttfa = f"{(first['_recv_t'] - ref_t) * 1000:.0f} ms" if first else "n/a (no audio)"
    if first is not None and speech_end_t is not None:
        # What a user notices: the silence after their last word (the turn
        # decision included, which TTFA from speech_stopped leaves out).
        print(f"turn gap (end of speech -> first audio): {(first['_recv_t'] - speech_end_t) * 1000:.0f} ms")
    print(f"TTFA ({ref} -> first audio): {ttfa}")
    # What the gap waited on, as the server measured it (segment by segment).
    path = ((result.done.get("response") or {}).get("metadata") or {}).get("duplex_critical_path")
    if path:
        print(f"critical path (server, ms): {path}")
    # The first word of the reply: the LLM's time to first token as the client sees it.
    word = next((e for e in result.events if e.get("type") in _TEXT_DELTAS), None)
    if word is not None:
        print(f"LLM TTFT ({ref} -> first reply text): {(word['_recv_t'] - ref_t) * 1000:.0f} ms")
    print(f"end of input ({ref}) -> response.done: {(done_t - ref_t) * 1000:.0f} ms")
    print(f"audio in: {in_s:.2f} s, out: {out_s:.2f} s")
    if out_s > 0:  # < 1 means the reply was produced faster than it plays
        print(f"real-time factor (response time / reply audio): {(done_t - ref_t) / out_s:.3f}")


def run_talk(args: argparse.Namespace) -> int:
    try:  # the files first: a bad one should fail before any connection is made
        samples, wav_rate = read_audio(args.audio)
        output_format(args.out, args.out_rate, args.out_channels)
    except AudioFileError as e:
        print(f"error: {e}", file=sys.stderr)
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
    except AudioFileError as e:
        print(f"error: {e}", file=sys.stderr)
    return 1
