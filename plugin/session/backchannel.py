"""``Backchannels``: when the engine says "Mm-hmm." while the user talks at
length (duplex extension ``session.audio.output.backchannels``, off by
default; its settings: ``domain/backchanneling.py``).

A listener's acknowledgement belongs in a pause of a long turn that is not
over -- never over the user's words, never where the turn ends (a question's
end wants an answer, not a hum). So one is said only

* at a pause the VAD heard (its end of speech, held under ``semantic_vad``
  while the pause is judged: ``pauses.py``), ``pause_ms`` into the silence:
  the user is not mid-word;
* in a turn that has gone on for ``after_speech_ms`` of input audio and
  ``min_words`` words;
* once the semantic end of turn has judged the words up to that pause
  (``turn_end.py``'s ``TurnEndDecider``: the LLM's ``P(end)``) *unfinished*:
  ``P(end)`` under ``MAX_P``, where no reply is started in the pause
  (``speculation.py``), and the words do not end with a question mark;
* with no reply under way (held or shown) and ``min_interval_ms`` since the
  last one;
* and only if the pause still holds when the clip is back (speech in the
  meantime, or the turn's end, voids it).

It is no response and no conversation item: the clip comes from the TTS
stage (``BackchannelText`` -> ``BackchannelAudio``, made once per voice and
kept: the core asks for each phrase when the setting is turned on, so the
one said costs nothing) and goes out as one ``OutputAudioBackchannel``
event. The LLM never sees it and the user's turn goes on as one item.

Sans-I/O: the core calls it with the session's time and what it knows
(``core.py``), and carries out the effects and events it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.backchanneling import Backchanneling
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import BackchannelAudio, BackchannelText
from vllm_duplex.domain.session_config import AudioFormat, SessionConfig
from vllm_duplex.media.audio import AudioEncoder
from vllm_duplex.domain.words import spoken_words
from vllm_duplex.session.asks import Steps
from vllm_duplex.session.effects import ArmTimer, CancelTimer, Submit
from vllm_duplex.session.speculation import SPECULATE_P
from vllm_duplex.session.turn_end import PAUSE_DETECT_MS

TIMER = "backchannel"  # the session's timer, ``pause_ms`` into a pause
STAGE = "tts"  # the stage that makes the clips
ROLE = "backchannel"  # its requests' role (request ids name it)
# At or above: the words up to the pause may be a whole turn, and the reply
# starts in the pause -- the engine answers rather than hums.
MAX_P = SPECULATE_P
# A judgement later than this past ``pause_ms`` comes too late: the user may
# be about to go on.
LATE_MS = 600


@dataclass
class _Pause:
    """The pause a backchannel may fill."""

    silent_from: float  # session time the silence began
    audio_ms: int  # where in the input audio
    due: bool = False  # ``pause_ms`` of silence have passed
    judged: tuple[float, str] | None = None  # P(end) of the words up to the pause, and them
    asked: str | None = None  # the phrase whose clip was asked for


class Backchannels:
    def __init__(self, make_id: Callable[[str], str], metrics: Metrics | None = None) -> None:
        self._make_id = make_id
        self._metrics = metrics
        self._onset_ms: int | None = None  # where the user's turn began in the input audio
        self._pause: _Pause | None = None
        self._last_at: float | None = None  # when the last one was said
        self._next = 0  # the phrase said next (in turn)
        self.said = 0
        self.skipped: dict[str, int] = {}  # pauses heard but not filled, by reason

    @property
    def pending(self) -> bool:
        """A pause is being considered (or its clip awaited)."""
        return self._pause is not None

    # ---- what the session hears ------------------------------------------------

    def speech_started(self, audio_ms: int) -> Steps:
        """The VAD heard speech: a turn begins, or goes on after a pause."""
        if self._onset_ms is None:
            self._onset_ms = audio_ms
        return self._drop("speech")

    def paused(self, audio_ms: int, now: float, settings: Backchanneling | None) -> Steps:
        """The VAD's end of speech at ``audio_ms``, heard ``PAUSE_DETECT_MS``
        into the silence."""
        steps = self._drop("superseded")  # never two at once
        if settings is None or self._onset_ms is None:
            return steps
        if audio_ms - self._onset_ms < settings.after_speech_ms:
            self._skip("short_turn")
            return steps
        silent_from = now - PAUSE_DETECT_MS / 1000.0
        self._pause = _Pause(silent_from, audio_ms)
        return [*steps, ArmTimer(TIMER, silent_from + settings.pause_ms / 1000.0)]

    def judged(self, p: float, text: str, now: float, *, settings: Backchanneling | None,
               replying: bool, fence: Fence) -> Steps:
        """The semantic end of turn judged the words up to the pause."""
        pause = self._pause
        if pause is None or pause.judged is not None:
            return []
        pause.judged = (p, text)
        return self._ask(now, settings, replying, fence)

    def due(self, now: float, *, settings: Backchanneling | None, replying: bool,
            fence: Fence) -> Steps:
        """The timer fired: ``pause_ms`` of silence."""
        pause = self._pause
        if pause is None or pause.due:
            return []
        pause.due = True
        return self._ask(now, settings, replying, fence)

    def clip(self, clip: BackchannelAudio, output_format: AudioFormat, *,
             replying: bool) -> Steps:
        """A clip is back from the TTS: said if its pause still holds."""
        pause = self._pause
        if pause is None or pause.asked != clip.text:
            return []  # voided meanwhile (speech, the turn's end)
        self._pause = None
        if replying:
            self._skip("replying")
            return []
        self._last_at = pause.silent_from  # the interval runs from the pause it filled
        self.said += 1
        if self._metrics is not None:
            self._metrics.backchannels.inc(outcome="said")
        return [ev.OutputAudioBackchannel(backchannel_id=self._make_id("bc"), audio=_encoded(clip, output_format),
                                          transcript=clip.text, audio_start_ms=pause.audio_ms,
                                          duration_ms=clip.pcm.size * 1000 // clip.rate)]

    def turn_ended(self) -> Steps:
        """The turn was committed (or cleared): the next speech begins another."""
        self._onset_ms = None
        return self._drop("turn_end")

    # ---- the decision -----------------------------------------------------------

    def _ask(self, now: float, settings: Backchanneling | None, replying: bool,
             fence: Fence) -> Steps:
        pause = self._pause
        assert pause is not None
        if not pause.due or pause.judged is None or pause.asked is not None:
            return []  # both are needed: the silence, and the judgement
        reason = self._refusal(pause, now, settings, replying)
        if reason is not None:
            self._pause = None
            self._skip(reason)
            return []
        assert settings is not None
        phrase = settings.phrases[self._next % len(settings.phrases)]
        self._next += 1
        pause.asked = phrase
        return [Submit(STAGE, fence, ROLE, BackchannelText(phrase))]

    def _refusal(self, pause: _Pause, now: float, settings: Backchanneling | None,
                 replying: bool) -> str | None:
        """Why this pause gets no backchannel; None: it gets one."""
        if settings is None:
            return "off"
        assert pause.judged is not None
        p, text = pause.judged
        if p >= MAX_P:
            return "turn_may_end"
        if text.rstrip().endswith("?"):
            return "question"
        if len(spoken_words(text)) < settings.min_words:
            return "few_words"
        if replying:
            return "replying"
        if (self._last_at is not None
                and pause.silent_from - self._last_at < settings.min_interval_ms / 1000.0):
            return "too_soon"
        if now - pause.silent_from > (settings.pause_ms + LATE_MS) / 1000.0:
            return "late"
        return None

    def _drop(self, reason: str) -> Steps:
        """The pause being considered is over (``reason``)."""
        if self._pause is None:
            return []
        if self._pause.asked is None:
            self._skip(reason)
        else:
            self._skip(f"{reason}_before_clip")
        self._pause = None
        return [CancelTimer(TIMER)]

    def _skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if self._metrics is not None:
            self._metrics.backchannels.inc(outcome=reason)


# ---- the setting, as the core checks and prepares it ---------------------------------


def check(config: SessionConfig, says_clips: bool) -> None:
    """A pipeline whose TTS stage makes no clips (or that has none) cannot
    say one: the setting is refused."""
    if config.backchannels is not None and not says_clips:
        raise DuplexError("capability_unsupported", "this pipeline has no TTS stage to say "
                          "backchannels with", param="session.audio.output.backchannels")


def prepare(old: Backchanneling | None, config: SessionConfig, fence: Fence) -> Steps:
    """Turned on (or given other phrases): the TTS makes the clips now, so
    the one said costs nothing then."""
    new = config.backchannels
    if new is None or (old is not None and old.phrases == new.phrases):
        return []
    return [Submit(STAGE, fence, ROLE, BackchannelText(phrase, play=False))
            for phrase in new.phrases]


def _encoded(clip: BackchannelAudio, fmt: AudioFormat) -> bytes:
    encoder = AudioEncoder(fmt, in_rate=clip.rate)
    return encoder.encode(clip.pcm) + encoder.flush()
