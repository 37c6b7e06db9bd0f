"""How long each stage of a turn took, on the server's clock (sans-I/O).

The session core reports what happened and when (the handled message's
time; input audio by when it arrived); this observes the per-stage
histogram (``duplex_turn_latency_seconds``) and gives each response its own
figures, which ``response.done`` carries in its ``metadata`` (strings, as
the GA type requires; docs/clients.md "Latency figures").

Each figure, by its ``stage`` label:

* ``vad_onset``: the audio at the speech onset arrived -> ``speech_started``
  (the VAD's window and decision).
* ``end_of_turn``: the audio at the end of speech arrived -> the turn was
  committed (the silence waited for, and the decision).
* ``asr_final``: the turn was committed -> its final transcript.
* ``llm_ttft``: the response was created -> its first words or tool call.
* ``tts_first_audio``: its first words -> its first audio.
* ``turn_gap``: the audio at the end of the user's speech arrived -> the
  reply's first audio was sent (a manual commit counts as the end).

Arrival is when the ``input_audio_buffer.append`` entered the mailbox, so
queueing in the server is counted and the network before it is not.

Beside these, each turn's *critical path* (``critical_path.py``): which
stage the turn gap waited on, segment by segment, observed in
``duplex_turn_critical_path_seconds{segment}`` and carried by
``response.done`` as ``duplex_critical_path`` (the whole path, in order:
``"vad 120, asr_pause 210, ..."``, whole ms) and ``duplex_first_phrase_tokens_ms`` (when each
token of the first phrase came).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vllm_duplex.domain.metrics import Histogram
from vllm_duplex.session.critical_path import TurnTrace, describe


@dataclass
class ResponseTimes:
    created_at: float
    turn_end_at: float | None  # the end of the user's turn it answers, if any
    words_at: float | None = None
    audio_at: float | None = None
    # seconds by stage: the turn's (shared with the tracker until its
    # transcript is final) and the response's own
    turn: dict[str, float] = field(default_factory=dict)
    own: dict[str, float] = field(default_factory=dict)
    trace: TurnTrace = field(default_factory=TurnTrace)
    path: list[tuple[str, float]] = field(default_factory=list)  # known at the first audio

    def metadata(self) -> dict[str, str]:
        """``response.done``'s figures: ``duplex_<stage>_ms`` -> whole ms, and
        the critical path."""
        out = {f"duplex_{stage}_ms": str(round(s * 1000))
               for stage, s in {**self.turn, **self.own}.items()}
        if self.path:
            # one key for the whole path: metadata holds at most 16 pairs (OpenAI's limit)
            out["duplex_critical_path"] = describe(self.path)
            out["duplex_first_phrase_tokens_ms"] = ",".join(map(str, self.trace.first_phrase_ms()))
        return out


_PAUSE_STEPS = ("speech_end", "vad", "asr_pause", "p_end")


class TurnLatency:
    def __init__(self, histogram: Histogram, critical: Histogram | None = None,
                 window: int = 4096) -> None:
        self._hist = histogram
        self._critical = critical
        self.trace = TurnTrace()  # the turn being heard
        self._committed_trace: TurnTrace | None = None
        self._final_trace: TurnTrace | None = None  # the committed turn awaiting its final
        # (end of a chunk on the input timeline in ms, when it arrived); a
        # window of recent chunks is enough: an onset is looked up when found.
        self._arrivals: deque[tuple[int, float]] = deque(maxlen=window)
        self._turn: dict[str, float] = {}  # the turn being heard
        self._speech_end_at: float | None = None
        self._committed: dict[str, float] | None = None  # the next response answers it
        self._committed_end_at: float | None = None
        self._asr_for: tuple[dict[str, float], float] | None = None  # (turn, committed at)

    def _observe(self, into: dict[str, float], stage: str, seconds: float) -> None:
        seconds = max(0.0, seconds)
        into[stage] = seconds
        self._hist.observe(seconds, stage=stage)

    def audio_arrived(self, end_ms: int, at: float) -> None:
        self._arrivals.append((end_ms, at))

    def _arrival(self, audio_ms: int) -> float | None:
        """When the chunk holding ``audio_ms`` arrived (None: too old or not seen)."""
        found = None
        for end_ms, at in reversed(self._arrivals):
            if end_ms < audio_ms:
                break
            found = at
        return found

    # ---- the user's turn ---------------------------------------------------

    def speech_started(self, audio_ms: int, now: float) -> None:
        self._turn, self._speech_end_at = {}, None
        self.trace = TurnTrace()
        if (at := self._arrival(audio_ms)) is not None:
            self._observe(self._turn, "vad_onset", now - at)

    def speech_stopped(self, audio_ms: int, now: float) -> None:
        self._speech_end_at = self._arrival(audio_ms)
        self.paused(audio_ms, now, again=False)

    def paused(self, audio_ms: int, now: float, *, again: bool = True) -> None:
        """The VAD heard the speech end at ``audio_ms`` (a pause being judged,
        or server VAD's end of speech)."""
        if (end := self._arrival(audio_ms)) is not None:
            self.trace.stamp("speech_end", end, again=again)
        self.trace.stamp("vad", now, again=again)

    def pause_resumed(self) -> None:
        """The user spoke on: the next pause starts the decision's path again."""
        for step in _PAUSE_STEPS:
            self.trace.at.pop(step, None)

    def step(self, step: str, now: float) -> None:
        """A step of the turn being heard (``asr_pause``, ``p_end``: the newest counts)."""
        self.trace.stamp(step, now, again=True)

    def committed(self, now: float) -> None:
        end = self._speech_end_at
        if end is not None:
            self._observe(self._turn, "end_of_turn", now - end)
        self._committed, self._committed_end_at = self._turn, now if end is None else end
        self._asr_for = (self._turn, now)
        self.trace.stamp("decision", now)
        if end is not None:
            self.trace.stamp("speech_end", end)
        self._committed_trace = self._final_trace = self.trace
        self._turn, self._speech_end_at = {}, None
        self.trace = TurnTrace()

    def transcript_final(self, now: float) -> None:
        if self._asr_for is not None:
            turn, committed_at = self._asr_for
            self._observe(turn, "asr_final", now - committed_at)
            self._asr_for = None
        if self._final_trace is not None:
            self._final_trace.stamp("asr_final", now)
            self._final_trace = None

    # ---- a reply's request ----------------------------------------------------

    def reply_started(self, response_id: str, now: float,
                      trace: TurnTrace | None = None) -> TurnTrace:
        """The request of reply ``response_id`` went to the LLM: the trace its
        outputs are stamped in (``trace``: the response's; by default the turn
        being heard: a reply started at a pause). The reply keeps it."""
        trace = trace if trace is not None else self.trace
        trace.reply_started(response_id, now)
        return trace

    # ---- the response ------------------------------------------------------

    def response_created(self, now: float) -> ResponseTimes:
        """A response answers the turn committed last, once."""
        times = ResponseTimes(created_at=now, turn_end_at=self._committed_end_at,
                              turn=self._committed if self._committed is not None else {},
                              trace=self._committed_trace or TurnTrace())
        times.trace.stamp("release", now)
        self._committed = self._committed_end_at = self._committed_trace = None
        return times

    def first_words(self, times: ResponseTimes, now: float) -> None:
        if times.words_at is None:
            times.words_at = now
            self._observe(times.own, "llm_ttft", now - times.created_at)

    def first_audio(self, times: ResponseTimes, now: float) -> None:
        if times.audio_at is not None:
            return
        times.audio_at = now
        if times.words_at is not None:
            self._observe(times.own, "tts_first_audio", now - times.words_at)
        if times.turn_end_at is not None:
            self._observe(times.own, "turn_gap", now - times.turn_end_at)
        times.trace.stamp("pacing", now)
        times.path = times.trace.path()
        if self._critical is not None:
            for step, seconds in times.path:
                self._critical.observe(seconds, segment=step)
