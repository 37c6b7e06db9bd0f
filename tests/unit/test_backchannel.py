"""The engine's own backchannels ("Mm-hmm." while the user talks at length;
``session/backchannel.py``), through the session core on a virtual timeline.

A ``SessionCore`` with the real cascade policy under ``semantic_vad`` is
handed the stage outputs a real pipeline makes (VAD onsets and pauses, the
ASR's words up to a pause, the LLM's ``P(end)``) at chosen times; its
``ArmTimer`` effects are its only clock, fired when the test says -- so
"said 400 ms into the pause, never twice within 5 s" is checked exactly.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from support.session_core import Ids
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.backchanneling import Backchanneling
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.interruption import OutputPacing
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import (
    BackchannelAudio,
    BackchannelText,
    GenerateRequest,
    StageOutput,
    TranscriptFinal,
    TranscriptPartial,
    TurnEndProbability,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.session_config import SessionConfig, SessionPatch, TurnDetection
from vllm_duplex.models.cascade import CascadePolicy
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.session import backchannel
from vllm_duplex.session.core import SessionCore
from vllm_duplex.session.effects import ArmTimer, CancelTimer, Emit, Submit, TimerFired

SECOND = bytes(2 * 24000)  # one second of PCM16 24 kHz
UNFINISHED, COMPLETE = 0.0004, 0.9  # SmolLM2's P(end) after "...and" / a whole question
CLIP = np.full(8_000, 1000, np.int16)  # half a second at 16 kHz (the stages' rate)

LONG = ("so yesterday i went down to the harbour with my brother and we were looking at "
        "the boats because he wants to buy one and")


class Timeline:
    """A core and the timers it armed; ``at(t, payload, stage)`` hands it a stage output."""

    def __init__(self, backchannels: Backchanneling | None = Backchanneling(), *,
                 stages=("vad", "asr", "llm", "tts")) -> None:
        policy = CascadePolicy()
        config = SessionConfig(model="m", policy=policy.name, backchannels=backchannels,
                               turn_detection=TurnDetection(type="semantic_vad"),
                               pacing=OutputPacing(type="none"))
        self.core = SessionCore("s", config=config, policy=policy, stage_names=stages,
                                metrics=Metrics(), now=0.0, make_id=Ids())
        self.timers: dict[str, float] = {}
        self.asked: list[Submit] = []  # backchannel clips asked of the TTS
        self.said: list[ev.OutputAudioBackchannel] = []
        self.events: list[ev.ServerEvent] = []
        self.start = self._track(self.core.start("tok", 0.0))

    def _track(self, effects):
        for e in effects:
            if isinstance(e, ArmTimer):
                self.timers[e.name] = e.at
            elif isinstance(e, CancelTimer):
                self.timers.pop(e.name, None)
            elif isinstance(e, Submit) and isinstance(e.payload, BackchannelText):
                self.asked.append(e)
            elif isinstance(e, Emit):
                self.events.append(e.envelope.event)
                if isinstance(e.envelope.event, ev.OutputAudioBackchannel):
                    self.said.append(e.envelope.event)
        return effects

    def at(self, t: float, payload, stage: str):
        fence = self.core.fence
        return self._track(self.core.handle(
            StageOutput(fence, fence.request_id(stage), stage, payload), t))

    def fire(self, name: str, upto: float | None = None) -> bool:
        """Fire ``name``'s timer if it is armed (and due by ``upto``)."""
        at = self.timers.get(name)
        if at is None or (upto is not None and at > upto):
            return False
        del self.timers[name]
        self._track(self.core.handle(TimerFired(name), at))
        return True

    def speak(self, t: float, audio_ms: int, words: str) -> None:
        """Speech (onset at ``audio_ms``) and the ASR's partials of ``words``."""
        self._track(self.core.handle(cmd.AudioAppend(audio=SECOND), t))
        self.at(t, VadSpeechStarted(audio_ms=audio_ms), "vad")
        self.at(t + 0.05, TranscriptPartial(words), "asr")

    def pause(self, t: float, audio_ms: int, heard: str, p: float) -> None:
        """The VAD's pause at ``t`` (100 ms into the silence), the ASR's words
        up to it, then the LLM's P(end) of them."""
        self.at(t, VadSpeechStopped(audio_ms=audio_ms), "vad")
        self.at(t, TranscriptPartial(heard, at_pause=True), "asr")
        self.at(t + 0.05, TurnEndProbability(p, heard), "llm")

    def clip_back(self, t: float) -> None:
        """The TTS answers the newest clip asked for."""
        asked = self.asked[-1]
        self.at(t, BackchannelAudio(asked.payload.text, CLIP), "tts")


def long_turn_with_a_pause(tl: Timeline, *, p: float = UNFINISHED, heard: str = LONG) -> None:
    """Five seconds of speech, then a pause at 5.6 s (the silence began at 5.5)."""
    tl.speak(0.5, 0, heard)
    tl.pause(5.6, 5000, heard, p)


def test_a_long_turn_gets_a_backchannel_in_its_pause_and_stays_one_turn():
    tl = Timeline()
    long_turn_with_a_pause(tl)
    assert tl.timers[backchannel.TIMER] == pytest.approx(5.9)  # 400 ms into the silence
    assert [a for a in tl.asked if a.payload.play] == []  # not before the silence has lasted
    tl.fire(backchannel.TIMER)
    [asked] = [a for a in tl.asked if a.payload.play]
    assert asked.stage == "tts" and asked.payload.text == "Mm-hmm."
    tl.clip_back(5.95)
    [said] = tl.said
    assert said.transcript == "Mm-hmm." and said.audio_start_ms == 5000
    assert tl.core.metrics.backchannels.get(outcome="said") == 1  # /metrics counts them
    # Half a second in the session's output format (PCM16 at 24 kHz).
    assert said.duration_ms == 500 and abs(len(said.audio) - 24_000) <= 96
    # It is no response and no item: nothing else reached the client.
    assert not [e for e in tl.events
                if e.type.startswith(("response.", "conversation.item.added", "conversation.item.done"))]
    # The user goes on and ends the turn: one user item, the reply once, after it.
    more = LONG + " i told him to get a small one"
    tl.speak(6.5, 6000, more)
    tl.pause(8.6, 8000, more, COMPLETE)
    tl.fire("turn_end")
    tl.at(8.9, TranscriptFinal(more), "asr")
    items = [e for e in tl.events if isinstance(e, ev.ConversationItemAdded)]
    assert [i.item["role"] for i in items] == ["user"]
    [done] = [e for e in tl.events if isinstance(e, ev.InputTranscriptionCompleted)]
    assert done.transcript == more
    assert len(tl.said) == 1


def test_the_clips_are_made_when_the_setting_is_turned_on():
    tl = Timeline()
    made = [a.payload for a in tl.asked]
    assert made == [BackchannelText(p, play=False) for p in Backchanneling().phrases]


def test_a_session_update_that_turns_them_on_makes_the_clips_once():
    tl = Timeline(backchannels=None)
    on = SessionPatch(backchannels=Backchanneling(phrases=("Uh-huh.",)))
    tl._track(tl.core.handle(cmd.SessionUpdate(patch=on), 1.0))
    assert [a.payload for a in tl.asked] == [BackchannelText("Uh-huh.", play=False)]
    [updated] = [e for e in tl.events if isinstance(e, ev.SessionUpdated)]
    assert updated.session["audio"]["output"]["backchannels"]["phrases"] == ["Uh-huh."]
    tl._track(tl.core.handle(cmd.SessionUpdate(patch=on), 2.0))  # the same phrases: made already
    assert len(tl.asked) == 1
    long_turn_with_a_pause(tl)
    tl.fire(backchannel.TIMER)
    tl.clip_back(5.95)
    assert [s.transcript for s in tl.said] == ["Uh-huh."]


def test_off_by_default_no_backchannel_and_no_clip():
    tl = Timeline(backchannels=None)
    long_turn_with_a_pause(tl)
    assert backchannel.TIMER not in tl.timers
    assert tl.asked == [] and tl.said == []
    wire = tl.core.session_object()["audio"]["output"]
    assert wire["backchannels"] is None


def test_a_question_gets_no_backchannel():
    # Judged complete: the reply starts in the pause instead.
    tl = Timeline()
    question = "so i was wondering about the harbour and the boats there what do they cost"
    long_turn_with_a_pause(tl, p=COMPLETE, heard=question)
    tl.fire(backchannel.TIMER)
    assert tl.said == [] and [a for a in tl.asked if a.payload.play] == []
    # A question mark where the model doubts it: none either.
    tl = Timeline()
    long_turn_with_a_pause(tl, heard=question + "?")
    tl.fire(backchannel.TIMER)
    assert tl.said == [] and tl.core.backchannels.skipped.get("question") == 1
    assert tl.core.metrics.backchannels.get(outcome="question") == 1


def test_speech_before_the_pause_has_lasted_gets_none():
    tl = Timeline()
    long_turn_with_a_pause(tl)
    tl.speak(5.8, 5300, LONG)  # the user goes on 300 ms into the silence
    assert backchannel.TIMER not in tl.timers
    assert [a for a in tl.asked if a.payload.play] == []


def test_a_clip_that_comes_back_after_the_user_went_on_is_not_said():
    tl = Timeline()
    long_turn_with_a_pause(tl)
    tl.fire(backchannel.TIMER)
    tl.speak(5.92, 5420, LONG)  # speech while the clip was being fetched
    tl.clip_back(5.95)
    assert tl.said == []


def test_a_short_turn_or_few_words_get_none():
    tl = Timeline()
    tl.speak(0.5, 0, "so i went")
    tl.pause(2.6, 2000, "so i went", UNFINISHED)  # two seconds: not a long turn
    assert backchannel.TIMER not in tl.timers
    tl = Timeline()
    tl.speak(0.5, 0, "so um and")
    tl.pause(5.6, 5000, "so um and", UNFINISHED)  # long, but three words
    tl.fire(backchannel.TIMER)
    assert tl.said == [] and tl.core.backchannels.skipped.get("few_words") == 1


def test_not_two_within_the_interval():
    tl = Timeline(Backchanneling(min_interval_ms=5000))
    long_turn_with_a_pause(tl)
    tl.fire(backchannel.TIMER)
    tl.clip_back(5.95)
    more = LONG + " we went"
    tl.speak(6.5, 6000, more)
    tl.pause(8.6, 8000, more, UNFINISHED)  # 3 s after the last: too soon
    tl.fire(backchannel.TIMER)
    assert len(tl.said) == 1 and tl.core.backchannels.skipped.get("too_soon") == 1
    more += " on and on"
    tl.speak(9.5, 9000, more)
    tl.pause(11.6, 11000, more, UNFINISHED)  # 6 s after: said, the next phrase
    tl.fire(backchannel.TIMER)
    tl.clip_back(11.95)
    assert [s.transcript for s in tl.said] == ["Mm-hmm.", "Right."]


def test_the_turns_end_cancels_a_pending_one():
    tl = Timeline(Backchanneling(pause_ms=2000))  # longer than the turn's own deadline
    long_turn_with_a_pause(tl, p=0.005)  # unfinished-looking, but the silence runs on
    tl.fire("turn_end")
    assert backchannel.TIMER not in tl.timers  # the commit voided it
    assert tl.said == []
    assert [type(e).__name__ for e in tl.events].count("InputAudioBufferCommitted") == 1


def test_none_while_a_reply_is_under_way_nor_when_the_judgement_comes_late():
    settings = Backchanneling()
    fence = Timeline().core.fence

    def part_at_a_pause() -> backchannel.Backchannels:
        part = backchannel.Backchannels(Ids())
        part.speech_started(0)
        part.paused(5000, 5.6, settings)
        return part

    part = part_at_a_pause()
    assert part.judged(UNFINISHED, LONG, 5.65, settings=settings, replying=True, fence=fence) == []
    assert part.due(5.9, settings=settings, replying=True, fence=fence) == []
    assert part.skipped == {"replying": 1} and not part.pending
    part = part_at_a_pause()
    assert part.due(5.9, settings=settings, replying=False, fence=fence) == []
    # P(end) a second into the silence: the user may be about to go on.
    assert part.judged(UNFINISHED, LONG, 6.6, settings=settings, replying=False,
                       fence=fence) == []
    assert part.skipped == {"late": 1}
    part = part_at_a_pause()
    part.due(5.9, settings=settings, replying=False, fence=fence)
    [asked] = part.judged(UNFINISHED, LONG, 5.95, settings=settings, replying=False, fence=fence)
    assert asked.payload == BackchannelText("Mm-hmm.")
    # A reply began while the clip was fetched: not said.
    assert part.clip(BackchannelAudio("Mm-hmm.", CLIP), Timeline().core.config.output_format,
                     replying=True) == []


def test_a_pipeline_without_a_tts_stage_refuses_the_setting():
    with pytest.raises(DuplexError) as err:
        Timeline(stages=("vad", "asr", "llm"))
    assert err.value.code == "capability_unsupported"
    assert err.value.param == "session.audio.output.backchannels"


def test_a_tts_stage_that_makes_no_clips_refuses_it_by_name():
    """The scripted pipeline's tone TTS takes no ``BackchannelText``: a session
    asking for backchannels there is refused, not failed at the first clip."""
    from vllm_duplex.session.runner import _says_clips
    from vllm_duplex.testing.stages import ToneTtsStage
    from vllm_duplex.stages.speech.streaming_tts import StreamingTtsStage

    class Named:
        def __init__(self, cls):
            self.name, self.accepted = "tts", cls.accepted

    assert _says_clips([Named(StreamingTtsStage)]) is True
    assert _says_clips([Named(ToneTtsStage)]) is False
    policy = CascadePolicy()
    config = SessionConfig(model="m", policy=policy.name, backchannels=Backchanneling())
    core = SessionCore("s", config=config, policy=policy, stage_names=("vad", "asr", "llm", "tts"),
                       metrics=Metrics(), now=0.0, make_id=Ids(), says_clips=False)
    with pytest.raises(DuplexError) as err:
        core.start("tok", 0.0)
    assert err.value.code == "capability_unsupported"


# ---- the wire ------------------------------------------------------------------------


def test_the_realtime_field_parses_with_defaults_and_refuses_bad_values():
    codec = RealtimeCodec(max_event_bytes=1 << 20)

    def update(value):
        frame = {"type": "session.update",
                 "session": {"type": "realtime", "audio": {"output": {"backchannels": value}}}}
        return codec.parse(json.dumps(frame)).patch.get("backchannels", "unset")

    assert update({}) == Backchanneling()
    assert update({"phrases": ["Uh-huh."], "min_interval_ms": 8000}) == Backchanneling(
        phrases=("Uh-huh.",), min_interval_ms=8000)
    assert update(None) is None  # off
    for bad, param in (({"phrases": []}, "phrases"), ({"phrases": ["..."]}, "phrases[0]"),
                       ({"pause_ms": 50}, "pause_ms"), ({"loud": True}, "loud"),
                       ("yes", None)):
        with pytest.raises(DuplexError) as err:
            update(bad)
        assert err.value.code == "invalid_value"
        assert err.value.param == "session.audio.output.backchannels" + (
            f".{param}" if param else "")


def test_the_realtime_event_renders_the_clip_in_base64():
    codec = RealtimeCodec(max_event_bytes=1 << 20)
    tl = Timeline()
    long_turn_with_a_pause(tl)
    tl.fire(backchannel.TIMER)
    tl.clip_back(5.95)
    [said] = tl.said
    env = Envelope(seq=7, fence=tl.core.fence, event=said)
    out = json.loads(codec.render(env))
    assert out["type"] == "duplex.output_audio.backchannel"
    assert base64.b64decode(out["audio"]) == said.audio
    assert out["transcript"] == "Mm-hmm." and out["audio_start_ms"] == 5000
