"""Text-to-speech stages that run a synthesizer binary per piece.

``FliteTtsStage`` (Debian ``flite``: clearer voices) and ``EspeakTtsStage``
(``espeak-ng``) speak a reply piece by piece as every TTS stage does
(``streaming_tts.py``; the cutting is ``pieces.py``): each piece is
synthesized by a subprocess as soon as it is complete; a cancel kills the
running one. Text goes to the binary as one argv element or on stdin, never
through a shell.

The subprocess is started and waited for on the stage's worker threads
(``subprocess.Popen``, which vforks), never on the event loop: under uvloop
(what ``vllm-duplex serve`` runs) ``asyncio.create_subprocess_exec`` forks
the whole server on the loop thread with the GIL held, 80-250 ms per start
on the 2-core CPU, which stalled every session at once (issue 21).
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import tempfile
from typing import Any

import numpy as np
import soxr
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.payloads import INTERNAL_RATE
from vllm_duplex.stages.scheduler import Urgency
from vllm_duplex.stages.speech.streaming_tts import StreamingTtsStage

# A synthesizer that hangs must not hold a response forever. Real time, not
# the injected Clock: this guards an OS process, not the session's timeline.
SYNTH_TIMEOUT_S = 30.0


def parse_wav(data: bytes) -> tuple[np.ndarray, int]:
    """PCM16 mono WAV bytes -> (samples, rate). Tolerates the bogus sizes of
    a WAV written to a pipe (espeak-ng says 2 GiB): data runs to the end."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("synthesizer output is not a WAV file")
    pos, rate, fmt_ok = 12, 0, False
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        body = pos + 8
        if cid == b"fmt ":
            tag, channels = (int.from_bytes(data[body + i : body + i + 2], "little") for i in (0, 2))
            rate = int.from_bytes(data[body + 4 : body + 8], "little")
            bits = int.from_bytes(data[body + 14 : body + 16], "little")
            fmt_ok = tag == 1 and channels == 1 and bits == 16
        elif cid == b"data":
            if not fmt_ok or rate <= 0:
                raise ValueError("synthesizer output is not 16-bit mono PCM")
            raw = data[body : min(len(data), body + size)]
            return np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2").astype(np.int16), rate
        pos = body + size + (size & 1)
    raise ValueError("synthesizer output has no data chunk")


class SubprocessTtsStage(StreamingTtsStage):
    """A ``StreamingTtsStage`` whose pieces are made by running ``binary``
    (``command``) once per piece."""

    def __init__(self, name: str, *, clock: Clock, **kwargs: Any) -> None:
        super().__init__(name, clock=clock, **kwargs)
        self.killed_processes = 0  # synthesizers killed by cancel/close

    def command(self, text: str, wav_path: str) -> tuple[list[str], bytes | None]:
        """argv, and what to write to its stdin (None: nothing)."""
        raise NotImplementedError

    async def run_binary(self, argv: list[str], stdin: bytes | None) -> bytes:
        """Run ``argv`` (``stdin`` written to it; None: nothing) and return its
        stdout; a cancel (barge-in) or the timeout kills it at once. Started
        and awaited on the worker threads (see the module docstring)."""
        loop = asyncio.get_running_loop()
        started = loop.run_in_executor(self._executor, functools.partial(
            subprocess.Popen, argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        try:
            proc = await asyncio.shield(started)
        except asyncio.CancelledError:  # it starts anyway: stop it
            proc = await started
            self._kill(proc)
            await loop.run_in_executor(self._executor, proc.communicate)  # reap it
            raise
        finished = loop.run_in_executor(self._executor, proc.communicate, stdin, SYNTH_TIMEOUT_S)
        try:
            out, err = await asyncio.shield(finished)
        except BaseException as exc:  # cancelled (barge-in) or timed out: stop it now
            self._kill(proc)
            try:
                await finished  # after a cancel: the waiting thread ends with the process
            except subprocess.TimeoutExpired:  # it gave up first: reap and drain it now
                await loop.run_in_executor(self._executor, proc.communicate)
            except Exception:
                pass
            if isinstance(exc, subprocess.TimeoutExpired):
                raise TimeoutError(f"{argv[0]} gave no audio within {SYNTH_TIMEOUT_S:g} s") from None
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited with {proc.returncode}: "
                               f"{err.decode(errors='replace').strip()[:200]}")
        return out

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.kill()
            self.killed_processes += 1

    async def synthesize(self, text: str, *, urgency: Urgency = Urgency.TURN_END,
                         due_in_s: float = 0.0) -> np.ndarray:
        """``text`` (already sanitized) -> int16 PCM at ``self.rate``.
        ``urgency`` / ``due_in_s``: who waits on it, and when it must be
        ready (the CPU scheduler's order; ``stages/scheduler.py``)."""
        fd, wav_path = tempfile.mkstemp(prefix="duplex-tts-", suffix=".wav")
        os.close(fd)
        try:
            async with self.scheduler.holding(self._executor, urgency, self.name,
                                              due_in_s=due_in_s):
                out = await self.run_binary(*self.command(text, wav_path))
            if os.path.getsize(wav_path):  # the synthesizer wrote the file, not stdout
                with open(wav_path, "rb") as f:
                    out = f.read()
        finally:
            os.unlink(wav_path)
        pcm, rate = parse_wav(out)
        self.synthesized += 1
        if rate != self.rate and pcm.size:
            pcm = soxr.resample(pcm, rate, self.rate)
        return pcm


class FliteTtsStage(SubprocessTtsStage):
    """Flite. ``voice``: a built-in voice (``flite -lv``: slt, rms, kal16,
    awb, ...) or a path to a ``.flitevox`` file."""

    binary = "flite"

    def __init__(self, name: str = "tts", *, clock: Clock, voice: str = "slt",
                 rate: int = INTERNAL_RATE, **kwargs: Any) -> None:
        super().__init__(name, clock=clock, rate=rate, **kwargs)
        if voice not in flite_voices() and not (voice.endswith(".flitevox") and os.path.isfile(voice)):
            raise ValueError(f"unknown flite voice {voice!r}; available: {', '.join(flite_voices())}")
        self.voice = voice

    def command(self, text: str, wav_path: str) -> tuple[list[str], bytes | None]:
        # -t takes the next argument as text even when it starts with "-".
        # A file, not /dev/stdout: under uvloop a child's stdout is a socket,
        # which /dev/stdout cannot open ("-o -" writes a file named "-").
        return ["flite", "-voice", self.voice, "-t", text, "-o", wav_path], None


@functools.cache
def flite_voices() -> tuple[str, ...]:
    out = subprocess.run(["flite", "-lv"], capture_output=True, text=True, timeout=10).stdout
    return tuple(out.split(":", 1)[1].split()) if ":" in out else ()


class EspeakTtsStage(SubprocessTtsStage):
    """eSpeak NG. ``voice``: anything ``espeak-ng -v`` takes (``en-us``,
    ``en-gb``, ``en-us+f3``, ...); probed at construction. ``wpm``: speed."""

    binary = "espeak-ng"

    def __init__(self, name: str = "tts", *, clock: Clock, voice: str = "en-us",
                 rate: int = INTERNAL_RATE, wpm: int = 175, **kwargs: Any) -> None:
        super().__init__(name, clock=clock, rate=rate, **kwargs)
        if not 80 <= wpm <= 500:
            raise ValueError(f"wpm must be within 80..500 (espeak-ng's range), got {wpm}")
        if voice.startswith("-") or not espeak_voice_ok(voice):
            raise ValueError(f"unknown espeak-ng voice {voice!r}; see `espeak-ng --voices`")
        self.voice = voice
        self.wpm = wpm

    def command(self, text: str, wav_path: str) -> tuple[list[str], bytes | None]:
        # Text on stdin (-b 1: UTF-8), so no text can ever be read as an option;
        # the WAV on stdout (wav_path stays empty).
        return (["espeak-ng", "--stdout", "-b", "1", "-v", self.voice, "-s", str(self.wpm)],
                text.encode())


@functools.cache
def espeak_voice_ok(voice: str) -> bool:
    """A voice is what the binary can actually speak with (mbrola voices
    are listed even when mbrola is missing), so ask it."""
    proc = subprocess.run(["espeak-ng", "-q", "-v", voice, "x"], capture_output=True, timeout=10)
    return proc.returncode == 0 and b"does not exist" not in proc.stderr
