"""One session's listening state for the Whisper stage (sans-I/O, synchronous).

Whisper is not a streaming recognizer: it transcribes a whole stretch of
audio. So this keeps the audio of the utterance in progress and asks two
decoders for text:

- the *final* one (Whisper base, beam 5) once per utterance, when the VAD says
  the speech stopped (or ``EndOfUtterance`` ends a manual turn): that is the
  ``TranscriptFinal`` of the turn -- and of every pause the VAD reports, since
  each ``VadSpeechStopped`` closes one utterance;
- the *partial* one (Whisper tiny.en, greedy) while the user speaks, re-decoding
  the utterance so far on the audio grid (every ``interval_ms`` of audio), and
  up to one interval early when the audio goes quiet after speech (the first
  40 ms of a pause: the VAD's pause report then finds the words up to it
  already heard), within a budget: at most ``budget`` of real time spent on partials, none while the
  worker is behind (``backlog``), none over audio that added no speech (the
  trailing silence before ``speech_stopped``, so the final never waits behind a
  useless partial), none past ``max_partial_s`` (re-decoding a long monologue
  costs more than it tells). Each changed hypothesis is a ``TranscriptPartial``;
- and at a pause ``semantic_vad`` is judging (``UserPaused``), the partial one
  again, at once and outside the schedule, when the last partial did not hear
  the speech up to its end (it ran before the last word, or the budget skipped
  it; quiet audio after it does not count): the session decides whether the turn ended from these words, so they
  must be all of them (up to ``max_partial_s`` of utterance: past that, the
  last partial's). The answer is a ``TranscriptPartial(at_pause=True)``, sent
  even when it says nothing new.

Which decoder a partial asks says who waits on it: ``partial`` for one on
the audio grid in the middle of an utterance (nobody waits on it yet: the
CPU scheduler may run it late, or drop it -- the decoder then answers None,
and the listener goes on as if the budget had skipped it), ``partial_now``
for the words a turn that may be ending waits on (the audio went quiet, or
a pause is being judged); ``partial_now`` defaults to ``partial``.
``now_is_final``: ``partial_now`` decodes as the final decoder does (the
same model and beam), so its answer at a pause *is* the final transcript of
speech that ended there -- one decode per pause, made before the VAD's
pause report when the audio went quiet, and none at the end of speech.

The final decoder stays off the turn's critical path when it can: the
at-pause answer heard every word up to the pause, so when the partial
decoder was *confident* of it (its average log-probability at least
``confident_logprob``, and not a loop it could not get out of; measured on
the speech bench's voices: tiny.en's confident answers are as right as
base's) and the speech ended there, it is
the utterance's final transcript -- sent at the end of speech at once,
without a second decode on the CPU the reply needs. When it was not, the
final decoder runs on the pause's audio right after the answer went out
(``final_at_pause``), while the silence accrues, and its text is the final if
the speech ended there; speech that goes on makes both void.

Utterance boundaries follow the PocketSphinx stage's rules (see
``pocketsphinx.py``): ``VadSpeechStarted(onset)`` opens one at ``onset`` (the
last ``prebuffer_ms`` of audio are kept for that, since the event comes after
the audio it describes); ``VadSpeechStopped(end)`` closes it (plus up to ``tail_ms``
of what followed, when it has arrived: a soft last consonant is not cut, and
nothing waits for more audio); without a VAD, audio opens one and
``EndOfUtterance`` closes it. ``vad_gated``: True = only VAD events open
utterances, False = audio does too, None = audio does until the first VAD
event (whose onset then restarts the utterance). An utterance keeps at most
its last ``max_utterance_s`` of audio, so memory stays bounded even when
nothing ever ends it.

Positions are sample indexes on the session's input timeline (``start_ms``
based), never a clock; only the partial budget reads a timer, because it is
about CPU time.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from vllm_duplex.domain.payloads import INTERNAL_RATE, TranscriptFinal, TranscriptPartial

log = logging.getLogger(__name__)

SPMS = INTERNAL_RATE // 1000  # samples per ms
_FRAME = 320  # 20 ms: the unit of the "did this audio add speech?" check
_ENDING_QUIET_MS = 40  # this much quiet after speech: it may have ended (decode at once)
# An at-pause answer of the partial decoder at least this sure (its average
# log-probability) is the final transcript: on the speech bench's voices,
# tiny.en's answers this sure are as right as base's (bench/speech_models.py,
# "gated final").
CONFIDENT_LOGPROB = -0.3

Transcribe = Callable[[np.ndarray], str]  # int16 16 kHz mono -> words


class Heard(Protocol):
    """A partial decoder's answer with its confidence (``whisper_model.Transcription``)."""

    text: str
    avg_logprob: float
    suspect: bool  # a loop the decoder could not get out of: never sure


# A plain str: no confidence known; None: the decode was dropped (the CPU
# had no room for it in time: stages/scheduler.py), nothing was heard.
HearPartial = Callable[[np.ndarray], "str | Heard | None"]


@dataclass
class _AtPause:
    """What the listener heard at a pause: up to ``end`` (a sample position)."""

    end: int
    text: str
    confident: bool
    final: str | None = None  # the final decoder's text of the same audio, once decoded


@dataclass(frozen=True)
class PartialSchedule:
    """When the partial decoder may run (see the module docstring)."""

    interval_ms: int = 400
    budget: float = 0.5  # fraction of real time
    first_after_ms: int = 300  # of utterance audio before the first partial
    max_partial_s: float = 20.0
    max_backlog: int = 3  # inputs waiting behind this one
    quiet_ratio: float = 0.1  # new audio below this x the utterance's loudest frame: no speech

    def __post_init__(self) -> None:
        if self.interval_ms <= 0 or not 0 < self.budget <= 1 or self.max_partial_s <= 0:
            raise ValueError("interval_ms must be > 0, budget within (0, 1], max_partial_s > 0")


def _frame_peak(pcm: np.ndarray) -> float:
    """RMS of the loudest 20 ms frame of ``pcm`` (0 for less than a frame)."""
    n = len(pcm) // _FRAME
    if n == 0:
        return 0.0
    frames = pcm[: n * _FRAME].astype(np.float32).reshape(n, _FRAME)
    return float(np.sqrt(np.max(np.mean(frames * frames, axis=1))))


class WhisperListener:
    def __init__(self, final: Transcribe, partial: HearPartial | None = None, *,
                 partial_now: HearPartial | None = None, schedule: PartialSchedule = PartialSchedule(), prebuffer_ms: int = 2000,
                 tail_ms: int = 300, max_utterance_s: float = 120.0,
                 vad_gated: bool | None = None,
                 confident_logprob: float | None = CONFIDENT_LOGPROB,
                 now_is_final: bool = False,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self._final = final
        self._partial = partial
        self._partial_now = partial_now or partial
        self._now_is_final = now_is_final and partial_now is not None
        self._confident_logprob = confident_logprob  # None: the final decoder always runs
        self._schedule = schedule
        self._prebuffer = prebuffer_ms * SPMS
        self._tail = tail_ms * SPMS
        self._max_samples = int(max_utterance_s * INTERNAL_RATE)
        self._gated = vad_gated
        self._timer = timer
        self._chunks: deque[tuple[int, np.ndarray]] = deque()  # (start sample, pcm), in order
        self._end: int | None = None  # end sample of the newest audio
        self._onset: int | None = None  # start sample of the open utterance
        self._opened_by_vad = False
        self._next_partial = 0  # sample position at which a partial may run
        self._partial_from = 0  # audio after this position is new since the last partial
        self._peak = 0.0
        self._last_partial = ""
        self._last_logprob: float | None = None  # of the last partial (None: not known)
        self._last_is_final = False  # the last partial came from a decode as good as the final's
        self._at_pause: _AtPause | None = None
        self.partials_decoded = 0
        self.partials_skipped = 0
        self.partials_shed = 0  # dropped by the decoder (the CPU had no room in time)
        self.finals_from_pause = 0  # finals that needed no decode at the end of speech

    @property
    def in_utterance(self) -> bool:
        return self._onset is not None

    # ---- inputs ------------------------------------------------------------

    def audio(self, pcm: np.ndarray, start_ms: int, *, backlog: int = 0) -> list[Any]:
        pcm = np.asarray(pcm, dtype=np.int16).ravel()
        start = start_ms * SPMS
        if self._end is not None and self._end - SPMS < start <= self._end:
            start = self._end  # contiguous: start_ms is whole ms, it trails by < 1 ms
        elif self._end is not None and start <= self._end - SPMS:
            # Rewound: a new audio stream; what we hold is not before it.
            self._chunks.clear()
            if self._onset is not None and not self._opened_by_vad:
                self._onset = None
        self._chunks.append((start, pcm))
        self._end = start + len(pcm)
        if self._onset is None and not self._gated:
            self._open(start, by_vad=False)
        self._trim()
        if self._onset is None:
            return []
        self._peak = max(self._peak, _frame_peak(pcm))
        return self._maybe_partial(backlog)

    def speech_started(self, onset_ms: int) -> list[Any]:
        first_vad_event = self._gated is None
        if self._gated is None:
            self._gated = True
        if self._onset is not None:
            if not (first_vad_event and not self._opened_by_vad):
                return []  # already listening to this speech
            self._onset = None  # audio-opened before we knew a VAD was there
        onset = onset_ms * SPMS
        self._open(onset, by_vad=True)
        self._peak = _frame_peak(self._span(onset, self._end or onset))
        return []

    def speech_stopped(self, end_ms: int) -> list[Any]:
        if self._gated is None:
            self._gated = True
        if self._onset is None:
            return []
        return self._finish(max(end_ms * SPMS, self._onset) + self._tail)

    def pause(self, end_ms: int, *, final_can_wait: bool = False) -> list[Any]:
        """A pause after speech that ended at ``end_ms`` (see the module docstring).
        ``final_can_wait``: the turn cannot end for a while (server_vad's
        silence): the final is not the answer made as the audio went quiet
        (40 ms into the quiet: a soft last consonant below the quiet bar is
        cut off -- "Americans" was heard "American" on a real speech), but the
        final decoder's hearing of everything held now (``final_at_pause``),
        which the end of speech takes."""
        self._at_pause = None
        if self._onset is None:
            return [TranscriptPartial("", at_pause=True)]
        assert self._end is not None
        end = max(end_ms * SPMS, self._onset)
        # Stale: speech the last partial did not hear. The VAD's end runs a
        # frame or two past the last loud one (Silero's probability decays),
        # and the partial made as the audio went quiet stopped there: quiet
        # audio after it adds no word, and re-decoding it cost every pause
        # 200-350 ms on the reply's critical path.
        stale = self._partial_from < end and not self._quiet(self._partial_from, end)
        if stale and self._end - self._onset <= self._schedule.max_partial_s * INTERNAL_RATE:
            # The hypothesis is older than the speech's end: hear it all now
            # (the final's decoder when partials are off).
            heard = self._decode(self._partial_now or self._final)
            assert heard is not None, "a partial a turn waits on is never dropped"
            self._last_partial, self._last_logprob = heard
        if not stale or self._partial_from >= end:  # the answer heard the speech to its end
            if self._partial is None or self._last_is_final:  # heard as the final hears: it is
                self._at_pause = _AtPause(end, self._last_partial, False, self._last_partial)
            else:
                limit = self._confident_logprob
                confident = (limit is not None and bool(self._last_partial)
                             and self._last_logprob is not None and self._last_logprob >= limit)
                self._at_pause = _AtPause(end, self._last_partial, confident)
            at = self._at_pause
            if final_can_wait and self._partial_from < self._end:
                # Heard before the audio after the words came: hear it all again.
                at.final, at.confident = None, False
        return [TranscriptPartial(self._last_partial, at_pause=True)]

    @property
    def final_pending(self) -> bool:
        """The last pause's answer was not confident, and the final decoder
        has not heard that audio yet (``final_at_pause``)."""
        at = self._at_pause
        return at is not None and not at.confident and at.final is None and self._onset is not None

    def final_at_pause(self) -> None:
        """Decode the pause's audio with the final decoder now, while the
        silence accrues; the end of speech there takes it as its final."""
        at = self._at_pause
        if at is not None and self._onset is not None:
            audio = self._utterance_audio(self._end if self._end is not None else at.end)
            at.final = self._final(audio) if len(audio) else ""

    def end_of_utterance(self) -> list[Any]:
        """Manual end of turn: exactly one ``TranscriptFinal``, empty without audio."""
        if self._onset is None:
            return [TranscriptFinal("")]
        return self._finish(self._end if self._end is not None else self._onset)

    # ---- internals ---------------------------------------------------------

    def _open(self, onset: int, *, by_vad: bool) -> None:
        self._at_pause = None
        self._last_logprob = None
        self._last_is_final = False
        self._onset = onset
        self._opened_by_vad = by_vad
        self._next_partial = onset + self._schedule.first_after_ms * SPMS
        self._partial_from = onset
        self._peak = 0.0
        self._last_partial = ""

    def _trim(self) -> None:
        """Keep the open utterance's audio (its last ``max_utterance_s``: memory
        stays bounded even when nothing ever ends it) and ``prebuffer_ms`` before now."""
        assert self._end is not None
        keep_from = self._end - self._prebuffer
        if self._onset is not None:
            keep_from = min(keep_from, max(self._onset, self._end - self._max_samples))
        while self._chunks and self._chunks[0][0] + len(self._chunks[0][1]) <= keep_from:
            self._chunks.popleft()

    def _span(self, begin: int, end: int) -> np.ndarray:
        """The audio held between two positions (gaps are skipped, not filled)."""
        parts = []
        for start, pcm in self._chunks:
            lo, hi = max(begin, start), min(end, start + len(pcm))
            if lo < hi:
                parts.append(pcm[lo - start: hi - start])
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)

    def _utterance_audio(self, end: int) -> np.ndarray:
        assert self._onset is not None
        if end - self._onset > self._max_samples:
            log.warning("utterance of %.0f s: transcribing its last %.0f s",
                        (end - self._onset) / INTERNAL_RATE, self._max_samples / INTERNAL_RATE)
        return self._span(max(self._onset, end - self._max_samples), end)

    def _maybe_partial(self, backlog: int) -> list[Any]:
        s = self._schedule
        assert self._onset is not None and self._end is not None
        if self._partial is None:
            return []
        # Up to one interval early (within the budget, still) when the speech seems to end.
        early = self._end >= self._next_partial - s.interval_ms * SPMS and self._speech_just_ended()
        if self._end < self._next_partial and not early:
            return []
        if (backlog > s.max_backlog or self._end - self._onset > s.max_partial_s * INTERNAL_RATE
                or _frame_peak(self._span(self._partial_from, self._end)) <= s.quiet_ratio * self._peak):
            self.partials_skipped += 1
            self._next_partial = self._end + s.interval_ms * SPMS
            return []
        heard = self._decode(self._partial_now if early else self._partial)
        if heard is None:  # dropped: nothing heard; the next one hears more
            self.partials_shed += 1
            self._next_partial = self._end + s.interval_ms * SPMS
            return []
        text, logprob = heard
        self._last_logprob = logprob
        if text == self._last_partial:
            return []
        self._last_partial = text
        return [TranscriptPartial(text)]

    def _quiet(self, begin: int, end: int) -> bool:
        """No frame between two positions is loud enough to be speech."""
        return _frame_peak(self._span(begin, end)) <= self._schedule.quiet_ratio * self._peak

    def _speech_just_ended(self) -> bool:
        """The newest audio went quiet after speech the last partial did not
        hear: decode now, off the grid -- the VAD reports the pause a moment
        later (``PAUSE_DETECT_MS``), and its answer is then ready (the
        partial is the words up to the pause, unless the user goes on)."""
        s = self._schedule
        assert self._onset is not None and self._end is not None
        quiet_from = self._end - _ENDING_QUIET_MS * SPMS
        if quiet_from - self._onset < s.first_after_ms * SPMS or quiet_from <= self._partial_from:
            return False
        return (self._quiet(quiet_from, self._end)
                and not self._quiet(self._partial_from, quiet_from))

    def _decode(self, transcribe: HearPartial) -> tuple[str, float | None] | None:
        """A partial decode of the utterance so far, and the next one scheduled
        (None: the decoder dropped it)."""
        assert self._end is not None
        s = self._schedule
        started = self._timer()
        heard = transcribe(self._utterance_audio(self._end))
        if heard is None:
            return None
        cost = self._timer() - started
        self.partials_decoded += 1
        self._last_is_final = self._now_is_final and transcribe is self._partial_now
        # The next partial waits for more audio than this one cost to decode,
        # divided by the budget: partials never take more than their share.
        wait = max(s.interval_ms * SPMS, int(cost / s.budget * INTERNAL_RATE))
        self._partial_from = self._end
        self._next_partial = self._end + wait
        if isinstance(heard, str):
            return heard, None
        return heard.text, (None if heard.suspect else heard.avg_logprob)

    def _finish(self, end: int) -> list[Any]:
        at, self._at_pause = self._at_pause, None
        assert self._onset is not None
        onset_ms = self._onset // SPMS
        if at is not None and end - self._tail <= at.end:  # the speech ended at the pause
            if at.confident:
                self._onset = None
                self.finals_from_pause += 1
                return [TranscriptFinal(at.text, onset_ms)]
            if at.final is not None:
                self._onset = None
                return [TranscriptFinal(at.final, onset_ms)]
        audio = self._utterance_audio(end)  # what has arrived of it
        self._onset = None
        return [TranscriptFinal(self._final(audio) if len(audio) else "", onset_ms)]
