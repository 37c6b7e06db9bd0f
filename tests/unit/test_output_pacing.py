"""Paced output and adaptive interruptions, through the session core with a
virtual clock: the test is the runner -- it carries out ``ArmTimer`` by
handing the core ``TimerFired`` at the armed time, and reads what the client
would get and when."""

from __future__ import annotations

import numpy as np
import pytest
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.interruption import PACED, Interruption, OutputPacing, is_backchannel
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import (
    AudioOut,
    GenerationDone,
    SpeechDone,
    StageOutput,
    TextDelta,
    TranscriptFinal,
    TranscriptPartial,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.session_config import AudioFormat, SessionConfig, TurnDetection
from vllm_duplex.models.cascade import CascadePolicy
from vllm_duplex.session.core import SessionCore
from vllm_duplex.session.effects import ArmTimer, CancelTimer, Emit, TimerFired
from vllm_duplex.session.pacing import FRAME_MS

RATE = 16000
AUDIO = "response.output_audio.delta"


class Client:
    """The session core plus what a runner and a socket would do: timers on
    a virtual clock, and every event with the time it was sent."""

    def __init__(self, **config) -> None:
        # paced unless a test says otherwise: what a call whose audio the
        # server plays gets (a socket's default is unpaced, as OpenAI's)
        config.setdefault("pacing", PACED)
        n = iter(range(1, 10_000))
        self.core = SessionCore(
            # output at the TTS rate: no resampler holding back milliseconds
            "s", config=SessionConfig(model="m", policy="cascade",
                                      output_format=AudioFormat(rate=RATE), **config),
            policy=CascadePolicy(), stage_names=("vad", "asr", "llm", "tts"), metrics=Metrics(),
            now=0.0, make_id=lambda prefix: f"{prefix}_{next(n)}")
        self.now = 0.0
        self.timers: dict[str, float] = {}
        self.sent: list[tuple[float, ev.ServerEvent]] = []

    def _apply(self, effects) -> None:
        for e in effects:
            if isinstance(e, Emit):
                self.sent.append((self.now, e.envelope.event))
            elif isinstance(e, ArmTimer):
                assert e.at >= self.now
                self.timers[e.name] = e.at
            elif isinstance(e, CancelTimer):
                self.timers.pop(e.name, None)

    def handle(self, message) -> None:
        self._apply(self.core.handle(message, self.now))

    def stage(self, payload, stage: str) -> None:
        fence = self.core.fence
        self.handle(StageOutput(fence, fence.request_id("x"), stage, payload))

    def advance(self, to: float) -> None:
        """Move time to ``to``, firing each timer when it is due."""
        while self.timers and min(self.timers.values()) <= to:
            name = min(self.timers, key=self.timers.__getitem__)
            self.now = max(self.now, self.timers.pop(name))
            self.handle(TimerFired(name))
        self.now = to

    def audio(self) -> list[tuple[float, int]]:
        """(time sent, ms of audio) of each audio delta (PCM16 16 kHz out)."""
        return [(t, len(e.delta) * 1000 // (2 * RATE)) for t, e in self.sent
                if isinstance(e, ev.OutputAudioDelta)]

    def types(self, since: int = 0) -> list[str]:
        return [e.type for _, e in self.sent[since:]]


def speak(client: Client, seconds: float, text: str) -> str:
    """A reply whose TTS made ``seconds`` of audio at once (faster than real time)."""
    client.handle(cmd.ResponseCreate())
    rid = client.core.shown.id
    client.stage(TextDelta(rid, text), "llm")
    client.stage(AudioOut(rid, np.full(int(RATE * seconds), 1000, np.int16), RATE, text), "tts")
    client.stage(GenerationDone(rid, "stop"), "llm")
    client.stage(SpeechDone(rid), "tts")
    return rid


def test_audio_goes_out_at_real_time_with_a_bounded_lead():
    client = Client(pacing=OutputPacing("realtime", lead_ms=300))
    speak(client, 3.0, "one two three four five six seven eight nine ten")
    # the lead went out at once; the rest waits for the player
    assert sum(ms for _, ms in client.audio()) == 300
    assert "response.done" not in client.types()
    t = 0.0
    while t < 4.0:
        t += 0.01
        client.advance(t)
        sent_ms = sum(ms for when, ms in client.audio())
        # the client never holds more than the lead (+ one frame) unplayed
        assert sent_ms - t * 1000 <= 300 + FRAME_MS
    times = [when for when, _ in client.audio()]
    assert sum(ms for _, ms in client.audio()) == 3000
    assert times[-1] == pytest.approx(3.0 - 0.3, abs=FRAME_MS / 1000)  # real time, not at once
    done = [when for when, e in client.sent if e.type == "response.done"]
    assert done == [times[-1]]  # response.done right after the last audio delta


def test_unpaced_output_goes_out_as_fast_as_it_is_made():
    client = Client(pacing=OutputPacing("none"))
    speak(client, 3.0, "one two three")
    assert sum(ms for _, ms in client.audio()) == 3000 and not client.timers
    assert client.types()[-1] == "response.done"


def test_a_backchannel_is_dismissed_and_the_reply_resumes_where_it_was_heard():
    client = Client()  # adaptive, paced 300 ms: a call's defaults
    rid = speak(client, 3.0, "one two three four five six seven eight nine ten")
    client.advance(1.0)
    mark = len(client.sent)
    client.stage(VadSpeechStarted(audio_ms=1000), "vad")
    # speech_started at once, and nothing more goes out while it lasts
    assert client.types(mark) == ["input_audio_buffer.speech_started"]
    heard_at_pause = client.core.shown.pacer.heard_ms(client.now)
    assert heard_at_pause == 1000  # exact: 1 s played since the first delta
    client.advance(1.3)
    client.stage(TranscriptPartial("Okay."), "asr")
    client.stage(TranscriptPartial("Okay."), "asr")
    client.stage(VadSpeechStopped(audio_ms=1400), "vad")
    client.advance(1.5)
    assert client.audio()[-1][0] <= 1.0  # paused
    client.stage(TranscriptFinal("Okay."), "asr")
    resumed = [e for _, e in client.sent if isinstance(e, ev.OutputAudioResumed)]
    assert len(resumed) == 1 and resumed[0].response_id == rid
    assert (resumed[0].reason, resumed[0].transcript) == ("backchannel", "Okay.")
    assert resumed[0].audio_start_ms == heard_at_pause  # frame boundary at the heard point
    # no user turn, no cancel: the same response goes on to its end
    assert "input_audio_buffer.committed" not in client.types(mark)
    assert "response.done" not in client.types(mark)
    client.advance(5.0)
    done = [e for _, e in client.sent if isinstance(e, ev.ResponseDone)]
    assert [d.response["status"] for d in done] == ["completed"]
    after = [ms for when, ms in client.audio() if when >= 1.5]
    assert sum(after) == 3000 - heard_at_pause  # the unheard rest, sent once more
    assert client.core.metrics.barge_ins.get(outcome="dismissed") == 1


def test_noise_is_dismissed_too():
    client = Client()
    speak(client, 2.0, "one two three")
    client.advance(0.5)
    client.stage(VadSpeechStarted(audio_ms=500), "vad")
    client.advance(0.7)
    client.stage(VadSpeechStopped(audio_ms=700), "vad")
    client.stage(TranscriptFinal(""), "asr")
    [resumed] = [e for _, e in client.sent if isinstance(e, ev.OutputAudioResumed)]
    assert resumed.reason == "noise" and resumed.audio_start_ms == 500


def test_real_words_interrupt_and_keep_the_heard_part():
    client = Client()
    speak(client, 3.0, "one two three four five six seven eight nine ten")
    client.advance(1.0)
    client.stage(VadSpeechStarted(audio_ms=1000), "vad")
    client.advance(1.2)
    mark = len(client.sent)
    client.stage(TranscriptPartial("what is the"), "asr")
    client.stage(TranscriptPartial("what is the time"), "asr")
    types = client.types(mark)
    assert "response.done" in types and "duplex.output_audio.resumed" not in types
    done = next(e for _, e in client.sent if isinstance(e, ev.ResponseDone))
    assert done.response["status_details"]["reason"] == "turn_detected"
    truncated = next(e for _, e in client.sent if isinstance(e, ev.ConversationItemTruncated))
    assert truncated.audio_end_ms == 1000  # what was heard when it paused, not 1200
    assert not client.timers  # the pacing and barge-in timers died with the reply
    # the turn goes on as usual: committed at speech end, answered at the final
    client.stage(VadSpeechStopped(audio_ms=1900), "vad")
    client.stage(TranscriptFinal("What is the time?"), "asr")
    assert client.types(mark).count("response.created") == 1
    assert client.core.metrics.barge_ins.get(outcome="interrupted") == 1


def test_long_speech_interrupts_without_words():
    """The VAD says speech ended only after its silence window (500 ms), so
    a backchannel is "speaking" for its length + 500 ms: the timer allows it."""
    client = Client(interruption=Interruption(min_speech_ms=600))
    speak(client, 3.0, "one two three")
    client.advance(1.0)
    client.stage(VadSpeechStarted(audio_ms=1000), "vad")
    client.advance(2.0)  # 400 ms of speech + the VAD's 500 ms: not yet long speech
    assert "response.done" not in client.types()
    client.advance(2.11)  # 600 ms + 500 ms without speech_stopped: long speech, no words
    done = [e for _, e in client.sent if isinstance(e, ev.ResponseDone)]
    assert [d.response["status_details"]["reason"] for d in done] == ["turn_detected"]


def test_a_final_with_real_words_interrupts_commits_and_answers():
    client = Client()
    speak(client, 3.0, "one two three")
    client.advance(1.0)
    client.stage(VadSpeechStarted(audio_ms=1000), "vad")
    client.handle(cmd.AudioAppend(audio=bytes(48 * 300)))  # the user's 300 ms, buffered
    client.advance(1.3)
    client.stage(VadSpeechStopped(audio_ms=1300), "vad")
    mark = len(client.sent)
    client.stage(TranscriptFinal("Stop."), "asr")
    types = client.types(mark)
    assert types.index("response.done") < types.index("input_audio_buffer.committed") \
        < types.index("response.created")
    user = [i for i in client.core.items if i.role.value == "user"]
    assert user[-1].text() == "Stop."  # the commit took the transcript that came first


def test_immediate_mode_cancels_at_onset():
    client = Client(interruption=Interruption("immediate"))
    speak(client, 3.0, "one two three")
    client.advance(1.0)
    mark = len(client.sent)
    client.stage(VadSpeechStarted(audio_ms=1000), "vad")
    assert client.types(mark)[0] == "input_audio_buffer.speech_started"
    assert "response.done" in client.types(mark)


@pytest.mark.parametrize(("text", "expected"), [
    ("Okay.", True), ("mm-hmm", True), ("Mm hmm.", True), ("yeah, right", True), ("I see.", True),
    ("okay stop", False), ("", False), ("what is that", False), ("uh-huh uh-huh", True),
    # hums as Whisper writes them (heard from Flite's "Mm-hmm.", "Mhm.", "Hmm.")
    ("MMHMM", True), ("M-HM", True), ("m m h m m m", True), ("hmm.", True), ("Hm, okay.", True),
    ("H.", False), ("hmm what", False), ("M and H and M", False), ("him", False), ("ham", False),
])
def test_backchannel_matching(text, expected):
    assert is_backchannel(text, Interruption().backchannels) is expected


def test_under_semantic_vad_a_pause_being_judged_is_not_long_speech():
    # semantic_vad holds the VAD's end of speech while it judges the pause:
    # the barge-in timer must not take that silence for speech going on.
    client = Client(turn_detection=TurnDetection(type="semantic_vad", eagerness="auto"))
    rid = speak(client, 4.0, "one two three four five six seven eight nine ten")
    client.advance(1.0)
    client.stage(VadSpeechStarted(audio_ms=1000), "vad")
    client.advance(1.3)
    client.stage(VadSpeechStopped(audio_ms=1300), "vad")  # "okay", then silence
    client.advance(2.6)  # past min_speech_ms + the silence window, the pause still judged
    assert "response.done" not in client.types()
    client.advance(3.5)  # the cap: semantic_vad lets the pause end the speech
    client.stage(TranscriptFinal("Okay."), "asr")
    [resumed] = [e for _, e in client.sent if isinstance(e, ev.OutputAudioResumed)]
    assert (resumed.response_id, resumed.reason) == (rid, "backchannel")
    client.advance(9.0)
    done = [e for _, e in client.sent if isinstance(e, ev.ResponseDone)]
    assert [d.response["status"] for d in done] == ["completed"]


def unpaced_reply_in_the_making(client: Client) -> str:
    """An unpaced reply whose TTS has made its first second of audio so far."""
    client.handle(cmd.ResponseCreate())
    rid = client.core.shown.id
    client.stage(TextDelta(rid, "one two three four"), "llm")
    client.stage(AudioOut(rid, np.full(RATE, 1000, np.int16), RATE, "one two"), "tts")
    return rid


def test_unpaced_audio_made_while_speech_is_judged_is_not_sent_and_a_cut_drops_it():
    # The client stops playing at speech_started (OpenAI clients do): audio
    # sent after it would play on over the user.
    client = Client(pacing=OutputPacing("none"))
    rid = unpaced_reply_in_the_making(client)
    client.advance(0.5)
    client.stage(VadSpeechStarted(audio_ms=500), "vad")
    mark = len(client.sent)
    client.stage(AudioOut(rid, np.full(RATE, 1000, np.int16), RATE, "three four"), "tts")
    assert client.types(mark) == []  # made, not sent
    client.advance(0.7)
    client.stage(TranscriptPartial("what is the time"), "asr")
    client.stage(TranscriptPartial("what is the time"), "asr")
    types = client.types(mark)
    assert "response.done" in types and AUDIO not in types  # cut: never sent
    assert sum(ms for _, ms in client.audio()) == 1000
    truncated = next(e for _, e in client.sent if isinstance(e, ev.ConversationItemTruncated))
    assert truncated.audio_end_ms <= 1000


def test_unpaced_audio_held_while_a_backchannel_is_judged_follows_the_resume():
    client = Client(pacing=OutputPacing("none"))
    rid = unpaced_reply_in_the_making(client)
    client.advance(0.5)
    client.stage(VadSpeechStarted(audio_ms=500), "vad")
    mark = len(client.sent)
    client.stage(AudioOut(rid, np.full(RATE, 1000, np.int16), RATE, "three four"), "tts")
    client.stage(GenerationDone(rid, "stop"), "llm")
    client.stage(SpeechDone(rid), "tts")
    client.advance(0.8)
    client.stage(VadSpeechStopped(audio_ms=800), "vad")
    assert AUDIO not in client.types(mark) and "response.done" not in client.types(mark)
    client.stage(TranscriptFinal("Okay."), "asr")
    types = client.types(mark)
    resumed = types.index("duplex.output_audio.resumed")
    # the held second follows the resume, then the reply ends as usual
    assert types[resumed + 1:].count(AUDIO) >= 1 and types[-1] == "response.done"
    [r] = [e for _, e in client.sent if isinstance(e, ev.OutputAudioResumed)]
    assert (r.response_id, r.audio_start_ms) == (rid, 1000)  # where the sent audio ended
    assert sum(ms for _, ms in client.audio()) == 2000  # each second once
    done = [e for _, e in client.sent if isinstance(e, ev.ResponseDone)]
    assert [d.response["status"] for d in done] == ["completed"]


def _restarts(client: Client) -> list[float]:
    """When the client's player, having run dry, started again: the echo's
    delay moves by the client's jitter at each (session/pacing.py)."""
    play_end, restarts = None, []
    for t, ms in client.audio():
        if play_end is not None and t > play_end + 1e-9:
            restarts.append(t)
        play_end = max(t, play_end if play_end is not None else t) + ms / 1000
    return restarts


def _stalled_reply(client: Client, stall_s: float) -> tuple[str, float]:
    """0.5 s of a reply, its next words ``stall_s`` late, 0.5 s more, the end.
    Returns the id and when the late words were made."""
    client.handle(cmd.ResponseCreate())
    rid = client.core.shown.id
    client.stage(TextDelta(rid, "one two"), "llm")
    client.stage(AudioOut(rid, np.full(RATE // 2, 1000, np.int16), RATE, "one two"), "tts")
    late = 0.5 + stall_s
    client.advance(late)
    client.stage(TextDelta(rid, " three four"), "llm")
    client.stage(AudioOut(rid, np.full(RATE // 2, 2000, np.int16), RATE, " three four"), "tts")
    client.stage(GenerationDone(rid, "stop"), "llm")
    client.stage(SpeechDone(rid), "tts")
    client.advance(late + 2.0)
    return rid, late


def test_with_the_servers_echo_cancellation_a_late_reply_keeps_the_players_delay():
    client = Client(pacing=OutputPacing("realtime", lead_ms=300), echo_cancellation="server")
    _, late = _stalled_reply(client, 1.0)
    assert _restarts(client) == []  # silence kept the player going through the stall
    deltas = [(t, e) for t, e in client.sent if isinstance(e, ev.OutputAudioDelta)]
    pcm = [np.frombuffer(e.delta, "<i2") for _, e in deltas]
    filler = [t for (t, _), x in zip(deltas, pcm) if not x.any()]
    assert filler and min(filler) >= 0.5 - 0.06 and max(filler) < late
    words = [t for (t, _), x in zip(deltas, pcm) if x.size and x[0] == 2000]
    assert words[0] == pytest.approx(late)  # the late words go out as they come ...
    played = sum(ms for t, ms in client.audio() if t < late)
    assert played - late * 1000 <= 60  # ... and wait for at most 60 ms of silence
    # the silence is the item's audio: the reply's audio is all of it, and it completes
    assert sum(x.size for x in pcm) == RATE + len(filler) * RATE * 20 // 1000
    assert client.types()[-1] == "response.done" and not client.timers
    assert [e.response["status"] for _, e in client.sent
            if e.type == "response.done"] == ["completed"]


def test_without_it_a_late_reply_lets_the_player_run_dry():
    client = Client(pacing=OutputPacing("realtime", lead_ms=300))
    _, late = _stalled_reply(client, 1.0)
    assert _restarts(client) == [pytest.approx(late)]
    assert sum(ms for _, ms in client.audio()) == 1000  # no silence of ours in the reply


def test_a_stall_longer_than_the_filler_holds_runs_dry_once():
    client = Client(pacing=OutputPacing("realtime", lead_ms=300), echo_cancellation="server")
    _, late = _stalled_reply(client, 4.0)
    assert _restarts(client) == [pytest.approx(late)]
    assert sum(ms for _, ms in client.audio()) == 1000 + 2000  # two seconds of silence at most


def test_no_silence_goes_out_while_speech_over_the_reply_pauses_it():
    """Someone speaks in the stall: the reply pauses (the client stopped its
    player), and no silence is sent to a player that is not playing; the
    speech dismissed, the reply resumes and is kept fed again."""
    client = Client(pacing=OutputPacing("realtime", lead_ms=300), echo_cancellation="server")
    client.handle(cmd.ResponseCreate())
    rid = client.core.shown.id
    client.stage(TextDelta(rid, "one two"), "llm")
    client.stage(AudioOut(rid, np.full(RATE // 2, 1000, np.int16), RATE, "one two"), "tts")
    client.advance(0.7)  # in the stall, silence going out
    mark = len(client.sent)
    client.stage(VadSpeechStarted(audio_ms=700), "vad")
    client.advance(1.3)
    assert client.types(mark) == ["input_audio_buffer.speech_started"]  # nothing else
    client.stage(TranscriptPartial("Okay."), "asr")
    client.stage(VadSpeechStopped(audio_ms=1300), "vad")
    client.stage(TranscriptFinal("Okay."), "asr")
    resumed = len(client.sent)
    assert any(isinstance(e, ev.OutputAudioResumed) for _, e in client.sent[mark:])
    client.advance(1.8)
    assert [ms for t, ms in client.audio() if t > 1.3 + 0.06]  # fed again after the resume
    client.stage(AudioOut(rid, np.full(RATE // 2, 2000, np.int16), RATE, " three four"), "tts")
    client.stage(GenerationDone(rid, "stop"), "llm")
    client.stage(SpeechDone(rid), "tts")
    client.advance(3.0)
    assert client.types()[-1] == "response.done" and not client.timers
    assert len(client.sent) > resumed
