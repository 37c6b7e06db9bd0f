"""The TTS stages' common base: a reply spoken piece by piece as its text streams in.

``StreamingTtsStage`` is what every TTS stage shares (Piper, ``piper.py``;
Flite and eSpeak NG, ``subprocess_tts.py``): text deltas are buffered per
response, cut into pieces as they complete (``pieces.py``: the reply's first
phrase, then sentences, long ones cut into clauses), and each piece is
synthesized on the stage's worker threads, holding a slot of the CPU
scheduler (``stages/scheduler.py``), as soon as it is complete; its audio goes
out in ``chunk_ms`` chunks, then one ``SpeechDone`` per response. A cancel
stops the piece being made (the subclass's ``synthesize`` is cancelled). How a
piece becomes audio is the subclass's ``synthesize``.

A ``BackchannelText`` ("Mm-hmm.") is answered with its whole clip
(``BackchannelAudio``), made once per stage -- one voice -- and kept, so the
engine's backchannels (session/backchannel.py) cost nothing when they are said.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.payloads import (
    INTERNAL_RATE,
    AudioOut,
    BackchannelAudio,
    BackchannelText,
    EndOfText,
    GenerationDone,
    SpeechDone,
    StageInput,
    TextDelta,
)
from vllm_duplex.stages.port import FencedPort, StageBase, StagePort
from vllm_duplex.stages.scheduler import CARRIERS, Urgency, cpu_scheduler
from vllm_duplex.stages.speech.pieces import first_piece, next_piece

log = logging.getLogger(__name__)

_FLUSH: Any = object()  # "no more text" marker in a speech's work queue


def sanitize(text: str) -> str:
    """What the synthesizer may see: no control/format characters (they can
    switch modes in some engines or end an argument), whitespace collapsed."""
    cleaned = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in text)
    return " ".join(cleaned.split())


@dataclass
class _Speech:
    """The text of one response that TTS is turning into audio."""

    response_id: str
    buffer: str = ""
    pieces: int = 0  # pieces cut so far (the first is cut early)
    finished: bool = False  # GenerationDone / EndOfText received
    work: asyncio.Queue[tuple[StageInput, Any]] = field(default_factory=asyncio.Queue)


class StreamingTtsStage(StageBase):
    """``TextDelta`` / ``GenerationDone`` / ``EndOfText`` in; ``AudioOut``
    chunks (``text`` = the piece they speak, on its first chunk) and one
    ``SpeechDone`` per response out."""

    accepted = (TextDelta, GenerationDone, EndOfText, BackchannelText)
    max_clips: ClassVar[int] = 256  # backchannel clips kept (sessions may name their own)
    # The program the stage runs, checked on PATH at construction so a missing
    # one fails the deployment at start, not the first reply: a synthesizer
    # binary, or Piper's phonemizer.
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
        self.synthesized = 0  # pieces synthesized
        self.scheduler = cpu_scheduler()
        # Threads that wait for a CPU slot and make the pieces (one per piece
        # being made, all sessions together; threads start on first use). How
        # many pieces are made at once, and whose first, is the CPU scheduler's.
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"duplex-{name}")
        self._clips: dict[str, asyncio.Task[np.ndarray]] = {}  # text -> its clip, made once

    def port(self, session_id: str) -> StagePort:
        return _SynthPort(self, session_id)

    async def synthesize(self, text: str, *, urgency: Urgency = Urgency.TURN_END,
                         due_in_s: float = 0.0) -> np.ndarray:
        """``text`` (already sanitized) -> int16 PCM at ``self.rate``.
        ``urgency`` / ``due_in_s``: who waits on it, and when it must be
        ready (the CPU scheduler's order; ``stages/scheduler.py``)."""
        raise NotImplementedError

    async def clip(self, text: str) -> np.ndarray:
        """``text``'s whole audio, made once (in the background: nobody waits
        on a clip made ahead) and kept; sessions asking at once share one
        synthesis, and a cancelled asker does not cancel it."""
        key = sanitize(text)
        task = self._clips.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            while len(self._clips) >= self.max_clips:
                del self._clips[next(iter(self._clips))]
            task = self._clips[key] = asyncio.ensure_future(
                self.synthesize(key, urgency=Urgency.BACKGROUND))
        return await asyncio.shield(task)

    def shutdown_workers(self) -> None:
        """Stop the worker threads (idempotent; ports must be closed first).
        Synchronous, for owners outside an event loop."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def close(self) -> None:  # Lifecycle: what Runtime.stop awaits
        self.shutdown_workers()


class _SynthPort(FencedPort):
    _stage: StreamingTtsStage

    def __init__(self, stage: StreamingTtsStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._speeches: dict[str, _Speech] = {}
        self._finished: dict[str, None] = {}  # recent ended responses (ordered, bounded)

    async def _handle(self, item: StageInput) -> None:
        payload = item.payload
        if type(payload) is BackchannelText:
            self._spawn(item, lambda: self._backchannel(item, payload))
            return
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

    async def _backchannel(self, item: StageInput, said: BackchannelText) -> None:
        """A backchannel's clip; one that cannot be made is no backchannel
        (logged, counted), never a failure of the reply the session may be
        about to make."""
        stage = self._stage
        try:
            pcm = await stage.clip(said.text)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("stage %s could not make the clip %r", self.name, said.text)
            stage.failed_requests += 1
            return
        if said.play and pcm.size:
            await self._emit(item.fence, item.request_id, BackchannelAudio(said.text, pcm, stage.rate))

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
        # audio on, at real time: the pacing of the session's floor, floor.py), on the scheduler's timer.
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
