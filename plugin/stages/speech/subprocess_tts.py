"""Text-to-speech stages that run a synthesizer binary per sentence.

``FliteTtsStage`` (Debian ``flite``: clearer voices) and ``EspeakTtsStage``
(``espeak-ng``) share one port: text deltas are buffered per response, cut
into pieces -- the reply's first phrase (its first clause mark or its first
``first_words`` words), then sentences, long ones cut into clauses -- and
each piece is synthesized by a subprocess as soon as it is complete; a
cancel kills the running one. Text goes to the binary as one argv element or
on stdin, never through a shell.

The subprocess is started and waited for on the stage's worker threads
(``subprocess.Popen``, which vforks), never on the event loop: under uvloop
(what ``vllm-duplex serve`` runs) ``asyncio.create_subprocess_exec`` forks
the whole server on the loop thread with the GIL held, 80-250 ms per start
on the 2-core CPU, which stalled every session at once (issue 21).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import soxr
from vllm_duplex.core.clock import Clock
from vllm_duplex.core.payloads import (
    INTERNAL_RATE,
    AudioOut,
    EndOfText,
    GenerationDone,
    SpeechDone,
    StageInput,
    TextDelta,
)
from vllm_duplex.stages.port import FencedPort, StageBase, StagePort
from vllm_duplex.stages.scheduler import CARRIERS, Urgency, cpu_scheduler

log = logging.getLogger(__name__)

# A synthesizer that hangs must not hold a response forever. Real time, not
# the injected Clock: this guards an OS process, not the session's timeline.
SYNTH_TIMEOUT_S = 30.0
_FLUSH: Any = object()  # "no more text" marker in a speech's work queue

# Terminal punctuation (and closing quotes/brackets) followed by whitespace:
# waiting for the whitespace keeps "3.5" and "e.g" in one piece.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*\s+")
_WORD = re.compile(r"\S+\s+")
_CLAUSE_PUNCT = (",", ";", ":", "-", "\u2013", "\u2014")


def first_piece(buffer: str, first_words: int, clause_words: int, *, final: bool = False) -> int:
    """Length of the reply's first piece in ``buffer`` (0: none yet): up to its
    first sentence end, or first clause mark with 2+ words before it, else its first
    ``first_words`` complete words -- so the first audio waits for a few words,
    never for the whole first sentence. ``first_words`` 0: no early cut (the
    first piece is cut like the others, ``next_piece``)."""
    if first_words <= 0:
        return next_piece(buffer, clause_words, final=final)
    words = list(_WORD.finditer(buffer))
    for i, w in enumerate(words[:first_words]):
        if _SENTENCE_END.search(w.group()):  # "Yes. ...": a short sentence is a phrase
            return w.end()
        if i >= 1 and w.group().rstrip().endswith(_CLAUSE_PUNCT):
            return w.end()
    if len(words) >= first_words:
        return words[first_words - 1].end()
    return len(buffer) if final else 0


def next_piece(buffer: str, clause_words: int, *, final: bool = False) -> int:
    """Length of the leading part of ``buffer`` that is ready to speak (0: none yet).

    A sentence is ready at its end punctuation. A long one (``clause_words``
    complete words or more) is cut earlier, after its last clause
    punctuation (comma, semicolon, colon, dash) that has 3+ words before it;
    without any, at ``2 * clause_words`` words. ``final``: the text is over,
    so whatever is left is ready.
    """
    m = _SENTENCE_END.search(buffer)
    end = m.end() if m else (len(buffer) if final else 0)
    region = buffer[:end] if end else buffer
    words = list(_WORD.finditer(region))
    if len(words) >= clause_words:
        cuts = [w.end() for i, w in enumerate(words[:-1])
                if i >= 2 and w.group().rstrip().endswith(_CLAUSE_PUNCT)]
        if cuts:
            return cuts[-1]
    if end:
        return end
    if len(words) >= 2 * clause_words:
        return words[-1].end()
    return 0


def sanitize(text: str) -> str:
    """What the synthesizer may see: no control/format characters (they can
    switch modes in some engines or end an argument), whitespace collapsed."""
    cleaned = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in text)
    return " ".join(cleaned.split())


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


@dataclass
class _Speech:
    """The text of one response that TTS is turning into audio."""

    response_id: str
    buffer: str = ""
    pieces: int = 0  # pieces cut so far (the first is cut early)
    finished: bool = False  # GenerationDone / EndOfText received
    work: asyncio.Queue[tuple[StageInput, Any]] = field(default_factory=asyncio.Queue)


class SubprocessTtsStage(StageBase):
    """``TextDelta`` / ``GenerationDone`` / ``EndOfText`` in; ``AudioOut``
    chunks (``text`` = the piece they speak, on its first chunk) and one
    ``SpeechDone`` per response out."""

    accepted = (TextDelta, GenerationDone, EndOfText)
    binary: ClassVar[str] = ""

    def __init__(self, name: str, *, clock: Clock, rate: int = INTERNAL_RATE,
                 chunk_ms: int = 100, clause_words: int = 12, first_words: int = 4,
                 workers: int = CARRIERS) -> None:
        super().__init__(name, clock)
        if rate <= 0 or chunk_ms <= 0 or clause_words < 4 or not 0 <= first_words <= 64:
            raise ValueError("rate and chunk_ms must be > 0, clause_words >= 4, "
                             "first_words in 0..64")
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"TTS binary {self.binary!r} is not installed")
        self.rate = rate
        self.chunk_ms = chunk_ms
        self.clause_words = clause_words
        self.first_words = first_words  # the first piece's length in words (0: a sentence)
        self.killed_processes = 0  # synthesizers killed by cancel/close
        self.synthesized = 0  # pieces synthesized
        self.scheduler = cpu_scheduler()
        # Threads that wait for a CPU slot, start synthesizers and wait for
        # them (one per piece being made, all sessions together; threads
        # start on first use). How many pieces are made at once, and whose
        # first, is the CPU scheduler's.
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"duplex-{name}")

    def command(self, text: str, wav_path: str) -> tuple[list[str], bytes | None]:
        """argv, and what to write to its stdin (None: nothing)."""
        raise NotImplementedError

    def port(self, session_id: str) -> StagePort:
        return _SynthPort(self, session_id)

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

    def shutdown_workers(self) -> None:
        """Stop the worker threads (idempotent; ports must be closed first).
        Synchronous, for owners outside an event loop."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def close(self) -> None:  # Lifecycle: what Runtime.stop awaits
        self.shutdown_workers()

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


class _SynthPort(FencedPort):
    _stage: SubprocessTtsStage

    def __init__(self, stage: SubprocessTtsStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._speeches: dict[str, _Speech] = {}
        self._finished: dict[str, None] = {}  # recent ended responses (ordered, bounded)

    async def _handle(self, item: StageInput) -> None:
        payload = item.payload
        rid: str = payload.response_id
        speech = self._speeches.get(rid)
        if speech is None and rid in self._finished:
            return  # a late EndOfText after GenerationDone: one SpeechDone only
        if speech is None:
            speech = self._speeches[rid] = _Speech(rid)
            # One worker per response keeps its pieces in order; tracked under
            # the fence of the first text, so a cancel of that fence kills it.
            task = self._spawn(item, lambda: self._speak(speech))
            task.add_done_callback(lambda _t: self._forget(rid, speech))
        if speech.finished:
            return
        final = not isinstance(payload, TextDelta)
        if not final:
            speech.buffer += payload.text
        stage = self._stage
        while speech.buffer and (n := (
                first_piece(speech.buffer, stage.first_words, stage.clause_words, final=final)
                if speech.pieces == 0 else next_piece(speech.buffer, stage.clause_words,
                                                      final=final))):
            speech.work.put_nowait((item, speech.buffer[:n]))
            speech.buffer = speech.buffer[n:]
            speech.pieces += 1
        if final:
            speech.finished = True
            self._finished[rid] = None
            while len(self._finished) > 64:
                del self._finished[next(iter(self._finished))]
            speech.work.put_nowait((item, _FLUSH))

    def _forget(self, rid: str, speech: _Speech) -> None:
        if self._speeches.get(rid) is speech:
            del self._speeches[rid]

    async def _speak(self, speech: _Speech) -> None:
        stage = self._stage
        rid = speech.response_id
        chunk = max(1, stage.rate * stage.chunk_ms // 1000)
        carry = ""  # text of pieces with nothing to say ("..."), told with the next audio
        # The reply's first sound is what an ending turn waits on; each piece
        # after it is due when the audio before it has played (from the first
        # audio on, at real time: the pacing of output.py), on the scheduler's timer.
        sounding_since: float | None = None
        said_s = 0.0
        while True:
            item, piece = await speech.work.get()
            if piece is _FLUSH:
                if carry:  # keep the concatenated AudioOut.text exact
                    await self._emit(item.fence, item.request_id,
                                     AudioOut(rid, np.zeros(0, np.int16), stage.rate, carry))
                await self._emit(item.fence, item.request_id, SpeechDone(rid))
                return
            text = sanitize(piece)
            pcm = None
            if any(c.isalnum() for c in text):
                if sounding_since is None:
                    urgency, due_in_s = Urgency.TURN_END, 0.0
                else:
                    urgency = Urgency.SPEECH_DUE
                    due_in_s = sounding_since + said_s - stage.scheduler.now()
                pcm = await stage.synthesize(text, urgency=urgency, due_in_s=due_in_s)
            if pcm is None or pcm.size == 0:
                carry += piece
                continue
            if sounding_since is None:
                sounding_since = stage.scheduler.now()
            said_s += len(pcm) / stage.rate
            label, carry = carry + piece, ""
            for i, begin in enumerate(range(0, len(pcm), chunk)):
                if i:
                    await self._clock.sleep(0)  # a cancel can land between chunks
                out = AudioOut(rid, pcm[begin : begin + chunk], stage.rate, label if i == 0 else "")
                await self._emit(item.fence, item.request_id, out)
