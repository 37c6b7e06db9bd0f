"""``OutputPacer``: a reply's audio goes to the client at playback speed
plus a bounded lead, instead of as fast as TTS makes it.

Sans-I/O: the core pushes ``AudioOut`` frames in, asks which are ``due`` at
a time, and arms a timer for ``next_at``. The pacer models the client's
player: audio sent at ``t`` plays from ``max(t, end of what it holds)``, so
``play_end`` is when the client runs dry and ``play_end - now`` is the lead
it holds. A frame goes out while that lead is under ``lead_s``: the client
never holds more than ``lead_s`` unplayed (one frame, if a frame is longer), and what it has
*heard* at any time is exact (``heard_ms``) -- what a barge-in keeps.

Pausing (speech over the reply, ``pause``): a client that stopped its
playback at ``speech_started`` dropped what it held (OpenAI clients do), so
the pacer's model of its player is emptied at the heard point, and
``heard_ms`` stays there; ``resume`` sends again from the frame holding it.
Whether the reply is paused is the turn's phase (``BARGE_PAUSED``), not the
pacer's: the floor sends nothing in that phase. Positions are the item's audio milliseconds, counted
as ``ResponseRecord.on_audio`` counts them.

Keeping the player fed (``keep_fed``; with the server's echo cancellation,
``audio.input.echo_cancellation``): while the reply is still being made and
its next audio is late (the LLM and TTS slower than real time, mostly early
in a reply), the client's player would run dry and start again when the
audio comes -- at the client's time, which the server only knows to within
its network's and player's jitter (a device's output period, a late event
loop: 5-30 ms). The echo comes that much earlier or later against the
reference from then on, and the cancellers have to learn the room again:
over a live socket at 0 dB that is what made a session's first reply
interrupt itself (bench/echo_live.py: the reference the server placed
against what the client played moved 16 ms at a restart; with the delay
kept, the same recording did not). So the pacer sends silence, ``FILL_MS``
at a time, to hold ``FILL_AHEAD_MS`` ahead of the client's player: the
player plays on and the echo keeps its delay. The silence is the item's
audio like any other (the client's ``audio_end_ms`` counts it); the next
words wait for at most ``FILL_AHEAD_MS`` of it; a gap longer than
``FILL_MAX_MS`` (a slow tool) is let run dry. Never once the reply is
complete, nor before its first audio, nor while paused.

``new_pacer`` makes a reply's pacer from the session's setting (None:
unpaced, audio goes out as it is made), and ``due_frames`` is what the
session core asks at each message and at each ``pacing`` timer: the frames
to send now and the timer for the next (``ArmTimer``; None once drained
and nothing to keep fed).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_duplex.domain.interruption import OutputPacing
from vllm_duplex.domain.payloads import AudioOut
from vllm_duplex.session.effects import ArmTimer

PACING = "pacing"  # the timer of the next frame
FRAME_MS = 100  # longer TTS chunks are cut to this, so the lead bound is tight
FILL_MS = 20  # keep_fed: silence goes out this much at a time ...
# ... whenever the client would hold less than this: more than a busy event
# loop's lateness on a loaded 2-core machine, and all the next words can wait
FILL_AHEAD_MS = 60
FILL_MAX_MS = 2000  # a gap longer than this runs dry (a slow tool, a stalled stage)
_REFILL_S = (FILL_AHEAD_MS - FILL_MS) / 1000.0  # topped up once it holds this little
_EPS = 1e-6  # timers fire at float times: "due at t" must hold at t


@dataclass
class Frame:
    start_ms: int
    end_ms: int
    audio: AudioOut
    events: list[Any] = field(default_factory=list)  # what it rendered to (resent on resume)

    @property
    def seconds(self) -> float:
        return (self.end_ms - self.start_ms) / 1000.0


class OutputPacer:
    def __init__(self, lead_ms: int, *, keep_fed: bool = False) -> None:
        self.lead_s = lead_ms / 1000.0
        self.keep_fed = keep_fed
        self._filled_ms = 0  # silence sent in this gap
        self._last: AudioOut | None = None  # the last audio made: the filler's id and rate
        self._queue: deque[Frame] = deque()  # made, not yet sent
        self._sent: deque[Frame] = deque()  # sent, maybe not yet heard
        self._made_ms = 0  # item position after the last frame made
        self._sent_end_ms = 0  # item position after the last frame sent
        self.play_end: float | None = None  # when the client's player runs dry

    # ---- in ---------------------------------------------------------------

    def push(self, audio: AudioOut) -> None:
        """A TTS chunk: queued as frames of at most ``FRAME_MS``."""
        step = max(1, audio.rate * FRAME_MS // 1000)
        pcm = audio.pcm
        self._last = audio
        for i, begin in enumerate(range(0, max(1, pcm.size), step)):
            piece = AudioOut(audio.response_id, pcm[begin:begin + step], audio.rate,
                             audio.text if i == 0 else "")
            # the same rounding as ResponseRecord.on_audio: positions agree
            end = self._made_ms + int(round(piece.pcm.size * 1000 / piece.rate))
            self._queue.append(Frame(self._made_ms, end, piece))
            self._made_ms = end
        self._filled_ms = 0

    # ---- out --------------------------------------------------------------

    @property
    def drained(self) -> bool:
        return not self._queue

    def lead(self, now: float) -> float:
        """Seconds of sent audio the client holds unplayed at ``now``."""
        return 0.0 if self.play_end is None else max(0.0, self.play_end - now)

    def due(self, now: float, more_coming: bool = False) -> list[Frame]:
        """The frames to send now; ``more_coming``: the reply is still being
        made (with ``keep_fed``, a gap in it is filled with silence)."""
        if self._fills(more_coming) and self.lead(now) <= _REFILL_S + _EPS:
            self._fill(now)
        out: list[Frame] = []
        while self._queue and self._may_send(self._queue[0], now):
            frame = self._queue.popleft()
            start = now if self.play_end is None else max(self.play_end, now)
            self.play_end = start + (frame.end_ms - frame.start_ms) / 1000.0
            self._sent_end_ms = frame.end_ms
            self._sent.append(frame)
            out.append(frame)
        self._forget_heard(now)
        return out

    def _may_send(self, frame: Frame, now: float) -> bool:
        """Whether the client may take ``frame`` now: it still holds at most
        the lead once the frame is in, or it has run dry (a frame longer
        than the lead goes out when the player needs it)."""
        lead = self.lead(now)
        return lead + frame.seconds <= self.lead_s + _EPS or lead <= _EPS

    def _fills(self, more_coming: bool) -> bool:
        return (self.keep_fed and more_coming and not self._queue and self.play_end is not None
                and self._last is not None and self._filled_ms < FILL_MAX_MS)

    def _fill(self, now: float) -> None:
        """Silence up to ``FILL_AHEAD_MS`` ahead of the player, queued as frames."""
        last = self._last
        assert last is not None and self.play_end is not None
        while self.lead(now) + (self._made_ms - self._sent_end_ms) / 1000.0 \
                < FILL_AHEAD_MS / 1000.0 - _EPS and self._filled_ms < FILL_MAX_MS:
            n = last.rate * FILL_MS // 1000
            end = self._made_ms + int(round(n * 1000 / last.rate))
            silence = AudioOut(last.response_id, np.zeros(n, last.pcm.dtype), last.rate, "")
            self._queue.append(Frame(self._made_ms, end, silence))
            self._made_ms = end
            self._filled_ms += end - self._queue[-1].start_ms

    def next_at(self, now: float, more_coming: bool = False) -> float | None:
        """When the next queued frame may go, or (``keep_fed``, more coming)
        the next silence (None: nothing to wait for)."""
        if self._fills(more_coming):
            assert self.play_end is not None
            return max(now, self.play_end - _REFILL_S)
        if not self._queue or self.play_end is None:
            return None
        room = max(0.0, self.lead_s - self._queue[0].seconds)
        return max(now, self.play_end - room)

    def heard_ms(self, now: float) -> int:
        """The item position the client has played up to (while paused: where
        it stopped, its player being empty)."""
        return max(0, self._sent_end_ms - int(round(self.lead(now) * 1000)))

    def _forget_heard(self, now: float) -> None:
        heard = self.heard_ms(now)
        while self._sent and self._sent[0].end_ms <= heard:
            self._sent.popleft()

    # ---- barge-in -----------------------------------------------------------

    def pause(self, now: float) -> None:
        """The client stopped its playback and dropped what it held: its
        player is empty at the heard point, which stays the heard point
        until ``resume`` (nothing is sent meanwhile)."""
        self._sent_end_ms = self.heard_ms(now)
        self.play_end = None

    def resume(self, now: float) -> int:
        """Send again from the frame holding the heard point; returns its
        item position (where the client's playback resumes)."""
        heard = self.heard_ms(now)
        unheard = [f for f in self._sent if f.end_ms > heard]
        self._sent.clear()
        self._queue.extendleft(reversed(unheard))
        start = self._queue[0].start_ms if self._queue else self._sent_end_ms
        self._sent_end_ms = start
        self.play_end = None  # the client's player is empty again
        return start


def new_pacer(pacing: OutputPacing, *, keep_fed: bool = False) -> OutputPacer | None:
    return OutputPacer(pacing.lead_ms, keep_fed=keep_fed) if pacing.type == "realtime" else None


def due_frames(pacer: OutputPacer, now: float,
               more_coming: bool = False) -> tuple[list[Frame], ArmTimer | None]:
    """The frames to send at ``now``, and the wake-up for the next one (None:
    nothing queued, nothing to keep fed)."""
    frames = pacer.due(now, more_coming)
    at = pacer.next_at(now, more_coming)
    return frames, ArmTimer(PACING, at) if at is not None else None
