"""semantic_vad through the session core, on a virtual timeline.

A ``SessionCore`` with the real cascade policy is driven with the stage
outputs a real pipeline makes (VAD pauses, ASR partials, the LLM's
``TurnEndProbability``) at chosen times; the core's ``ArmTimer`` effects are
the only clock it has, and ``TimerFired`` is delivered when the test says
the time has come -- so "a complete question commits after 200 ms" is
checked exactly, not with sleeps and tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.session_core import Ids, types
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain.contracts import InputMode
from vllm_duplex.domain.conversation import ContentPart, ConversationItem, ItemType, Role
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.interruption import OutputPacing
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import (
    AudioOut,
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    ResetContext,
    SpeechDone,
    StageOutput,
    TextDelta,
    TextIn,
    TranscriptFinal,
    TranscriptPartial,
    TurnEndProbability,
    UserPaused,
    VadConfig,
    VadPaused,
    VadResumed,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.session_config import SessionConfig, SessionPatch, TurnDetection
from vllm_duplex.models.cascade import CascadePolicy
from vllm_duplex.models.scripted import ScriptedPolicy
from vllm_duplex.session.core import SessionCore
from vllm_duplex.session.effects import (
    ArmTimer,
    Cancel,
    CancelTimer,
    Emit,
    Submit,
    TimerFired,
)
from vllm_duplex.session.turn_end import (
    EAGERNESS_TIMING,
    PAUSE_DETECT_MS,
    TIMER,
    needed_silence_ms,
)

SECOND = bytes(2 * 24000)  # one second of PCM16 24 kHz
COMPLETE, UNFINISHED = 0.9, 0.0004  # SmolLM2's P(end) after "...of france" / "...capital of"


class Timeline:
    """A core and the timer it has armed; ``at(t, payload)`` hands it a stage output."""

    def __init__(self, eagerness: str = "auto", policy=None) -> None:
        policy = policy or CascadePolicy()
        td = TurnDetection(type="semantic_vad", eagerness=eagerness)
        # Unpaced output: these tests are about when the turn ends and what a
        # speculation holds (pacing has its own, test_output_pacing.py).
        self.core = SessionCore("s", config=SessionConfig(model="m", policy=policy.name,
                                                          turn_detection=td,
                                                          pacing=OutputPacing(type="none")),
                                policy=policy, stage_names=("vad", "asr", "llm", "tts"),
                                metrics=Metrics(), now=0.0, make_id=Ids())
        self.timer: ArmTimer | None = None
        self.words = ""  # what the user said (speak)
        self.effects = self._track(self.core.start("tok", 0.0))

    def _track(self, effects):
        for e in effects:
            if isinstance(e, ArmTimer) and e.name == TIMER:
                self.timer = e
            elif isinstance(e, CancelTimer) and e.name == TIMER:
                self.timer = None
        return effects

    def at(self, t: float, payload, stage: str) -> list:
        fence = self.core.fence
        return self._track(self.core.handle(StageOutput(fence, fence.request_id(stage), stage,
                                                        payload), t))

    def audio(self, t: float) -> list:
        return self._track(self.core.handle(cmd.AudioAppend(audio=SECOND), t))

    def fire(self) -> list:
        timer, self.timer = self.timer, None
        assert timer is not None, "no timer armed"
        return self._track(self.core.handle(TimerFired(timer.name), timer.at))

    def speak(self, words: str, t: float = 1.0) -> None:
        """Speech onset, then the ASR's partials as a user says ``words``."""
        self.audio(t)
        self.at(t, VadSpeechStarted(audio_ms=0), "vad")
        self.words = words
        ws = words.split()
        for n in range(1, len(ws) + 1):
            self.at(t + 0.1 * n, TranscriptPartial(" ".join(ws[:n])), "asr")

    def pause(self, t: float, audio_ms: int, heard: str | None = None) -> list:
        """The VAD's pause at ``t``, then the ASR's answer to it: every word up
        to the pause (``heard``; by default what was spoken)."""
        effects = self.at(t, VadSpeechStopped(audio_ms=audio_ms), "vad")
        asked = [e for e in effects if isinstance(e, Submit) and isinstance(e.payload, UserPaused)]
        assert [(e.stage, e.payload.audio_ms) for e in asked] == [("asr", audio_ms)]
        heard = self.words if heard is None else heard
        return effects + self.at(t, TranscriptPartial(heard, at_pause=True), "asr")


# The VAD reports a pause PAUSE_DETECT_MS into it: the speech ended at 2.0 s.
PAUSED = 2.0 + PAUSE_DETECT_MS / 1000


def pushed(effects) -> list[str]:
    return [e.payload.text for e in effects if isinstance(e, Submit) and isinstance(e.payload, TextIn)]


# ---- the rule ---------------------------------------------------------------------


def test_the_silence_needed_falls_with_p_end_from_the_cap_to_the_fast_silence():
    for eagerness, t in EAGERNESS_TIMING.items():
        assert needed_silence_ms(None, eagerness) == t.cap_ms  # not judged yet: the cap
        assert needed_silence_ms(UNFINISHED, eagerness) == t.cap_ms
        assert needed_silence_ms(COMPLETE, eagerness) == t.fast_ms
        ladder = [needed_silence_ms(p, eagerness) for p in (0.001, 0.005, 0.02, 0.05, 0.1)]
        assert ladder == sorted(ladder, reverse=True) and len(set(ladder)) == 5
    assert 150 <= needed_silence_ms(COMPLETE, "auto") <= 250
    assert 150 <= needed_silence_ms(COMPLETE, "high") <= 250
    assert 1500 <= needed_silence_ms(UNFINISHED, "low") <= 3000
    assert needed_silence_ms(UNFINISHED, "high") > 900  # a 900 ms thinking pause keeps the turn


# ---- decisions through the core, at each eagerness ----------------------------------


def test_start_sets_the_vad_to_report_short_pauses():
    tl = Timeline()
    [vad] = [e for e in tl.effects if isinstance(e, Submit)]
    assert vad.payload == VadConfig(silence_duration_ms=PAUSE_DETECT_MS)
    wire = tl.core.session_object()["audio"]["input"]["turn_detection"]
    assert wire == {"type": "semantic_vad", "eagerness": "auto", "create_response": True,
                    "interrupt_response": True}


@pytest.mark.parametrize("eagerness", ["low", "medium", "high", "auto"])
@pytest.mark.parametrize(("p", "complete"), [(COMPLETE, True), (UNFINISHED, False)])
def test_a_pause_ends_the_turn_after_the_silence_its_words_need(eagerness, p, complete):
    tl = Timeline(eagerness)
    tl.speak("what is the capital of france")
    # The VAD reports the pause PAUSE_DETECT_MS after it began (at t=2.0).
    effects = tl.at(2.0 + PAUSE_DETECT_MS / 1000, VadSpeechStopped(audio_ms=1000), "vad")
    # Not the end of the turn yet: nothing for the client; the last word
    # (held back as still being heard) goes to the model to be judged, and
    # the ASR is asked for every word up to the pause.
    assert "input_audio_buffer.speech_stopped" not in types(effects)
    assert [e.payload for e in effects if isinstance(e, Submit)] == [TextIn("france"),
                                                                     UserPaused(audio_ms=1000)]
    cap = EAGERNESS_TIMING[eagerness].cap_ms
    assert tl.timer.at == pytest.approx(2.0 + cap / 1000)  # no words judged yet: the cap
    # Its answer says the same words: nothing more to push.
    effects = tl.at(2.11, TranscriptPartial("what is the capital of france", at_pause=True), "asr")
    assert pushed(effects) == []
    assert tl.timer.at == pytest.approx(2.0 + cap / 1000)
    tl.at(2.12, TurnEndProbability(p, "what is the capital of france"), "llm")
    needed = needed_silence_ms(p, eagerness)
    assert tl.timer.at == pytest.approx(2.0 + needed / 1000)
    effects = tl.fire()
    # Then exactly what server VAD does at its end of speech: the ASR is told
    # (it finalizes the transcript) and the turn commits.
    assert types(effects)[:5] == ["input_audio_buffer.speech_stopped", "Forward",
                                  "input_audio_buffer.committed", "conversation.item.added",
                                  "conversation.item.done"]
    assert effects[0].envelope.event.audio_end_ms == 1000
    assert effects[1].output.payload == VadSpeechStopped(audio_ms=1000)
    m = tl.core.metrics
    reason = "semantic" if complete else "silence"
    assert m.turn_end_decisions.get(eagerness=eagerness, reason=reason) == 1
    assert list(m.turn_end_silence.samples) == [pytest.approx(needed / 1000)]
    assert list(m.turn_end_probability.samples) == [p]
    assert tl.core.pause.last.wire() == {
        "p_end": p, "text": "what is the capital of france", "silence_ms": needed,
        "needed_ms": needed, "eagerness": eagerness, "reason": reason}
    if complete:
        assert needed <= 400
    else:
        assert needed >= 1200


@pytest.mark.parametrize("eagerness", ["low", "medium", "high", "auto"])
def test_a_thinking_pause_inside_a_phrase_does_not_take_the_turn(eagerness):
    tl = Timeline(eagerness)
    tl.speak("what is the capital of")
    tl.pause(PAUSED, 1000)
    tl.at(2.2, TurnEndProbability(UNFINISHED, "what is the capital of"), "llm")
    armed = tl.timer
    # The user goes on after 900 ms: the pause is dropped, the client never heard of it.
    effects = tl.at(2.9, VadSpeechStarted(audio_ms=1900), "vad")
    assert types(effects) == ["CancelTimer"]
    assert tl.timer is None
    # A timer that was already queued when the speech came is stale.
    assert tl.core.handle(TimerFired(armed.name), armed.at) == []
    assert tl.core.metrics.turn_end_resumed.get(eagerness=eagerness) == 1
    # The words go on into the same turn, and its end commits it once.
    tl.at(3.0, TranscriptPartial("what is the capital of france"), "asr")
    tl.pause(3.2, 2200, heard="what is the capital of france")
    tl.at(3.22, TurnEndProbability(COMPLETE, "what is the capital of france"), "llm")
    effects = tl.fire()
    assert types(effects).count("input_audio_buffer.committed") == 1
    assert effects[0].envelope.event.audio_end_ms == 2200


def test_a_probability_that_comes_after_the_deadline_commits_at_once():
    tl = Timeline("high")
    tl.speak("tell me a joke")
    tl.pause(PAUSED, 1000)
    # The model was slow (a busy CPU): by the time it says "complete", the
    # fast silence has long passed.
    effects = tl.at(2.5, TurnEndProbability(COMPLETE, "tell me a joke"), "llm")
    assert "input_audio_buffer.committed" in types(effects)
    assert tl.core.pause.last.silence_ms == 500


def test_a_hypothesis_that_missed_the_last_word_neither_ends_the_turn_nor_starts_the_reply():
    """A busy CPU's ASR had not heard the last word when the pause came (CI:
    "what is the capital of your standards" for "...of France?"). Those words
    look complete, but the pause is judged on the ASR's words up to it."""
    tl = Timeline("low")
    cap, fast = EAGERNESS_TIMING["low"].cap_ms, EAGERNESS_TIMING["low"].fast_ms
    tl.speak("what is the capital of your standards")
    assert pushed(tl.at(PAUSED, VadSpeechStopped(audio_ms=1000), "vad")) == ["standards"]
    effects = tl.at(2.2, TurnEndProbability(COMPLETE, "what is the capital of your standards"), "llm")
    assert tl.timer.at == pytest.approx(2.0 + cap / 1000)  # not judged: the ASR is still hearing
    assert not [e for e in effects if isinstance(e, Submit)]  # and no reply started on them
    # The ASR's answer revises a pushed word: the model gets the words heard.
    effects = tl.at(2.3, TranscriptPartial("what is the capital of France?", at_pause=True), "asr")
    assert pushed(effects) == ["what is the capital of France"]
    assert tl.timer.at == pytest.approx(2.0 + cap / 1000)
    effects = tl.at(2.45, TurnEndProbability(COMPLETE, "what is the capital of France"), "llm")
    # Past the fast silence already: the reply starts on those words, and the turn commits.
    [req] = [e for e in effects if isinstance(e, Submit) and isinstance(e.payload, GenerateRequest)]
    assert req.payload.context[-1] == ContextMessage("user", "what is the capital of France")
    assert emits(effects)[:2] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert "response.created" not in emits(effects)  # held until the final confirms the words
    assert "response.created" in emits(tl.at(2.5, TranscriptFinal("What is the capital of France?"), "asr"))
    last = tl.core.pause.last
    assert (last.reason, last.text, last.silence_ms) == ("semantic", "what is the capital of France", 450)
    assert last.needed_ms == fast


def test_a_probability_of_fewer_words_than_were_heard_does_not_judge_the_pause():
    tl = Timeline("auto")
    tl.speak("tell me a joke")  # the ASR had not heard "about cats" yet
    effects = tl.pause(PAUSED, 1000, heard="tell me a joke about cats")
    assert pushed(effects) == ["joke", "about cats"]  # the last word held back, then the rest
    # The model's judgement of the first push, still on its way.
    effects = tl.at(2.13, TurnEndProbability(COMPLETE, "tell me a joke"), "llm")
    assert tl.timer.at == pytest.approx(2.0 + EAGERNESS_TIMING["auto"].cap_ms / 1000)
    assert not [e for e in effects if isinstance(e, Submit)]
    tl.at(2.16, TurnEndProbability(COMPLETE, "tell me a joke about cats"), "llm")
    assert tl.timer.at == pytest.approx(2.0 + EAGERNESS_TIMING["auto"].fast_ms / 1000)
    assert tl.core.floor.reply.answers == "tell me a joke about cats"


def test_silence_alone_ends_the_turn_at_the_cap():
    tl = Timeline("low")
    tl.speak("so um")
    tl.pause(PAUSED, 1000)  # no P(end) ever comes
    assert tl.timer.at == pytest.approx(2.0 + EAGERNESS_TIMING["low"].cap_ms / 1000)
    assert "input_audio_buffer.committed" in types(tl.fire())
    assert tl.core.pause.last.reason == "silence" and tl.core.pause.last.p is None


def test_server_vad_commits_on_the_vads_silence_and_ignores_probabilities():
    tl = Timeline()
    tl.core.handle(cmd.SessionUpdate(patch=SessionPatch(turn_detection=TurnDetection())), 0.5)
    tl.speak("what is the capital of france")
    assert tl.at(2.0, TurnEndProbability(COMPLETE, "x"), "llm") == []
    effects = tl.at(2.5, VadSpeechStopped(audio_ms=1000), "vad")
    assert "input_audio_buffer.committed" in types(effects) and tl.timer is None


def test_a_policy_without_semantic_turns_runs_it_as_server_vad_and_says_so():
    policy = ScriptedPolicy()
    core = SessionCore("s", config=SessionConfig(model="m", policy=policy.name), policy=policy,
                       stage_names=("vad", "llm", "tts"), metrics=Metrics(), now=0.0)
    patch = SessionPatch(turn_detection=TurnDetection(type="semantic_vad", eagerness="low"),
                         instructions="be brief")
    effects = core.handle(cmd.SessionUpdate(patch=patch), 0.0)
    assert types(effects) == ["Submit", "session.updated"]
    assert effects[0].payload.silence_duration_ms == 1000
    session = effects[1].envelope.event.session
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert session["instructions"] == "be brief"  # the rest of the update applies


def test_stale_probabilities_die_at_the_gate():
    tl = Timeline()
    tl.speak("what is the capital of france")
    tl.at(PAUSED, VadSpeechStopped(audio_ms=1000), "vad")
    old = Fence("s")
    tl.core.execute(CascadePolicy().plan_append(tl.core, cmd.DuplexInput(
        mode=InputMode.REENCODE_CONTEXT)))
    before = tl.timer
    tl.core.handle(StageOutput(old, old.request_id("llm"), "llm",
                               TurnEndProbability(COMPLETE, "x")), 2.2)
    assert tl.timer == before and tl.core.metrics.stale_dropped.get(stage="llm") == 1


# ---- speculative replies ------------------------------------------------------------


def emits(effects) -> list[str]:
    return [e.envelope.event.type for e in effects if isinstance(e, Emit)]


def speculate(tl: Timeline, words: str = "what is the capital of france"):
    """A complete question and a pause: the reply starts, held."""
    tl.speak(words)
    tl.pause(PAUSED, 1000)
    effects = tl.at(2.12, TurnEndProbability(COMPLETE, words), "llm")
    [req] = [e for e in effects if isinstance(e, Submit) and isinstance(e.payload, GenerateRequest)]
    assert req.payload.context[-1] == ContextMessage("user", words)
    assert emits(effects) == []  # nothing of it for the client
    rid = req.payload.response_id
    # Its text goes to the TTS now, its audio into the held buffer.
    text = tl.at(2.15, TextDelta(rid, "The capital of France is Paris."), "llm")
    assert types(text) == ["Forward"]
    assert tl.at(2.3, AudioOut(rid, np.zeros(8000, np.int16), text="The capital"), "tts") == []
    assert tl.core.metrics.speculations.get(outcome="started") == 1
    return rid, req


def test_a_speculation_is_released_the_moment_the_final_transcript_confirms_its_words():
    tl = Timeline("auto")
    rid, req = speculate(tl)
    effects = tl.fire()  # 200 ms after the pause began
    # The commit; the reply waits for the words to be confirmed.
    assert emits(effects) == [
        "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
        "conversation.item.added", "conversation.item.done"]
    assert tl.core.shown is None
    # The ASR's final says the same words (in its spelling): at once the reply
    # with what was held, and no second request.
    effects = tl.at(2.35, TranscriptFinal("What is the capital of France?"), "asr")
    assert emits(effects) == [
        "conversation.item.input_audio_transcription.completed", "response.created",
        "response.output_item.added", "conversation.item.added", "response.content_part.added",
        "response.output_audio_transcript.delta", "response.output_audio.delta"]
    assert [e for e in effects if isinstance(e, (Submit, Cancel))] == []
    assert tl.core.shown.id == rid
    assert tl.core.metrics.speculations.get(outcome="used") == 1
    # The rest streams as any reply's.
    assert "response.output_audio.delta" in emits(
        tl.at(2.4, AudioOut(rid, np.zeros(8000, np.int16), text="is Paris."), "tts"))
    tl.at(2.4, GenerationDone(rid, "stop"), "llm")
    assert "response.done" in emits(tl.at(2.9, SpeechDone(rid), "tts"))


def test_a_speculation_is_discarded_when_the_user_goes_on_and_nothing_of_it_reaches_the_client():
    tl = Timeline("low")  # a slow commit: the user goes on before it
    rid, req = speculate(tl, "what is the capital of france")
    effects = tl.at(2.6, VadSpeechStarted(audio_ms=1600), "vad")
    f1 = Fence("s").next_epoch()
    # One epoch bump (its vLLM request aborted), the model given the user's
    # words again, and no event at all.
    assert emits(effects) == []
    assert Cancel(f1) in effects and tl.core.fence == f1
    assert isinstance(effects[-2].payload, ResetContext) and effects[-1].payload == TextIn(
        "what is the capital of france")
    assert tl.core.metrics.speculations.get(outcome="discarded") == 1
    # What it still produces dies at the gate.
    late = tl.core.handle(StageOutput(req.fence, req.fence.request_id("tts"), "tts",
                                      AudioOut(rid, np.zeros(800, np.int16), text="Paris.")), 2.7)
    assert late == []
    # The turn goes on and its own reply is asked for afresh.
    tl.at(3.0, TranscriptPartial("what is the capital of france and of spain"), "asr")
    tl.pause(3.5, 2500, heard="what is the capital of france and of spain")
    tl.at(3.6, TurnEndProbability(UNFINISHED, "what is the capital of france and of spain"), "llm")
    tl.fire()
    effects = tl.at(5.0, TranscriptFinal("What is the capital of France and of Spain?"), "asr")
    [new] = [e for e in effects if isinstance(e, Submit) and isinstance(e.payload, GenerateRequest)]
    assert new.payload.response_id != rid and "response.output_audio.delta" not in emits(effects)


def test_a_speculation_whose_words_the_final_revised_is_discarded_unseen_and_the_final_answered():
    """Tiny.en's "Where is the iphoton" must not be shown, then cancelled, when
    Whisper base hears "Eiffel Tower": a reply waits for the final's words."""
    tl = Timeline("auto")
    rid, _ = speculate(tl, "what is the capital of france")
    tl.fire()
    assert tl.core.shown is None
    effects = tl.at(2.4, TranscriptFinal("What is the capital of Spain?"), "asr")
    assert "response.done" not in emits(effects)  # nothing the client saw is taken back
    [new] = [e for e in effects if isinstance(e, Submit) and isinstance(e.payload, GenerateRequest)]
    assert new.payload.context[-1].text == "What is the capital of Spain?"
    assert new.payload.response_id != rid and tl.core.shown.id == new.payload.response_id
    m = tl.core.metrics
    assert m.speculations.get(outcome="discarded") == 1 and m.visible_revisions.get() == 0
    # What the discarded one still makes dies at the gate.
    assert tl.at(2.5, AudioOut(rid, np.zeros(800, np.int16)), "tts") == []


def test_a_speculation_the_conversation_moved_under_is_discarded_when_the_reply_is_asked_for():
    tl = Timeline("auto")
    rid, _ = speculate(tl)
    typed = ConversationItem(id="", type=ItemType.MESSAGE, role=Role.USER,
                             content=[ContentPart("input_text", text="hello")])
    tl.core.handle(cmd.ItemCreate(item=typed), 2.16)
    assert "response.created" not in emits(tl.fire())
    effects = tl.at(2.35, TranscriptFinal("What is the capital of France?"), "asr")
    [new] = [e for e in effects if isinstance(e, Submit) and isinstance(e.payload, GenerateRequest)]
    assert new.payload.response_id != rid  # it answers the conversation as it is now
    assert tl.core.metrics.speculations.get(outcome="discarded") == 1


@pytest.mark.parametrize("create", [
    {"tools": [{"type": "function", "name": "lookup", "description": "Look it up",
                "parameters": {"type": "object", "properties": {}}}]},
    {"conversation": "none", "input": ()},
])
def test_a_response_the_client_asks_for_in_its_own_way_voids_the_held_reply(create):
    """A ``response.create`` with its own tools (or outside the conversation)
    cannot use the reply held at the pause: it is dropped -- one epoch bump,
    its request cancelled -- rather than left to run unseen, its text still
    going to the TTS and the new request queued behind it."""
    tl = Timeline("low")
    rid, req = speculate(tl)
    effects = tl.core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(**{
        k: v for k, v in create.items() if k != "tools"},
        tools=tuple(create.get("tools", ())) or None)), 2.4)
    f1 = Fence("s").next_epoch()
    assert Cancel(f1) in effects and tl.core.fence == f1
    assert tl.core.floor.reply.id != rid  # the one reply is the new one, shown
    assert tl.core.metrics.speculations.get(outcome="discarded") == 1
    [new] = [e for e in effects if isinstance(e, Submit) and isinstance(e.payload, GenerateRequest)]
    assert new.fence == f1 and new.payload.response_id != rid
    assert tl.core.shown.id == new.payload.response_id
    # What the held one still makes dies at the gate.
    assert tl.at(2.5, AudioOut(rid, np.zeros(800, np.int16), text="Paris."), "tts") == []


def test_in_a_pause_whispers_closing_guess_is_not_pushed_as_the_users_words():
    """Whisper closes the sentence at the end of what it heard ("capital of?"):
    pushed to the model, that "?" would make an unfinished phrase look complete."""
    tl = Timeline()
    tl.speak("What is the capital of?")
    assert pushed(tl.pause(PAUSED, 1000)) == ["of"]
    assert pushed(tl.at(2.3, TranscriptPartial("What is the capital of France?"), "asr")) == ["France"]


def test_the_next_turn_is_not_judged_on_the_last_turns_words():
    tl = Timeline()
    tl.speak("what is the capital of france")
    tl.pause(PAUSED, 1000)
    tl.at(2.12, TurnEndProbability(COMPLETE, "what is the capital of france"), "llm")
    tl.fire()
    # A new turn whose words the ASR has not written yet: its pause waits for the cap.
    tl.audio(5.0)
    tl.at(5.0, VadSpeechStarted(audio_ms=4000), "vad")
    tl.at(5.4 + PAUSE_DETECT_MS / 1000, VadSpeechStopped(audio_ms=4400), "vad")
    assert tl.timer.at == pytest.approx(5.4 + EAGERNESS_TIMING["auto"].cap_ms / 1000)


# ---- server_vad: the reply is prepared while its silence accrues ---------------------


def server_vad(tl: Timeline) -> None:
    effects = tl.core.handle(cmd.SessionUpdate(patch=SessionPatch(turn_detection=TurnDetection())), 0.5)
    [vad] = [e.payload for e in effects if isinstance(e, Submit)]
    assert (vad.silence_duration_ms, vad.pause_ms) == (500, PAUSE_DETECT_MS)


def test_under_server_vad_the_reply_starts_in_the_pause_and_goes_out_when_the_final_confirms_it():
    tl = Timeline()
    server_vad(tl)
    tl.speak("what is the capital of france")
    effects = tl.at(2.1, VadPaused(audio_ms=1000), "vad")
    # The client hears of no pause, only of the last word, no longer being heard.
    assert emits(effects) == ["conversation.item.input_audio_transcription.delta"]
    # Nothing pushed (nothing is judged under server_vad): the ASR is asked
    # for every word up to the pause (told the turn lasts the VAD's silence:
    # time to hear them again with the audio after them), and the reply
    # carries the last one.
    assert [e.payload for e in effects if isinstance(e, Submit)] == [
        UserPaused(audio_ms=1000, turn_end_silence_ms=500)]
    effects = tl.at(2.2, TranscriptPartial("What is the capital of France?", at_pause=True), "asr")
    # Heard: the reply starts at once, no P(end) needed (the VAD's silence ends the turn).
    [req] = [e for e in effects if isinstance(e, Submit) and isinstance(e.payload, GenerateRequest)]
    assert req.payload.context[-1] == ContextMessage("user", "What is the capital of France?")
    rid = req.payload.response_id
    assert types(tl.at(2.3, TextDelta(rid, "Paris."), "llm")) == ["Forward"]
    assert tl.at(2.45, AudioOut(rid, np.zeros(8000, np.int16), text="Paris."), "tts") == []
    effects = tl.at(2.5, VadSpeechStopped(audio_ms=1000), "vad")  # 500 ms of silence
    assert emits(effects) == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                              "conversation.item.added", "conversation.item.done"]
    effects = tl.at(2.51, TranscriptFinal("What is the capital of France?"), "asr")
    assert emits(effects)[:2] == ["conversation.item.input_audio_transcription.completed",
                                  "response.created"]
    assert "response.output_audio.delta" in emits(effects) and tl.core.shown.id == rid
    assert [e for e in effects if isinstance(e, Submit)] == []
    assert tl.core.metrics.speculations.get(outcome="used") == 1


def test_under_server_vad_an_answer_that_revises_a_pushed_word_rolls_back_before_the_reply():
    """The partials said "how many days we are in"; the ASR's words up to the
    pause are "how many days are in a week": the model is given the heard words
    first (a rollback), so the reply started in the pause answers them and the
    final finds nothing left to revise."""
    tl = Timeline()
    server_vad(tl)
    tl.speak("how many days we are in a week")
    tl.at(2.1, VadPaused(audio_ms=1000), "vad")
    effects = tl.at(2.2, TranscriptPartial("How many days are in a week?", at_pause=True), "asr")
    subs = [e.payload for e in effects if isinstance(e, Submit)]
    assert isinstance(subs[0], ResetContext) and subs[1] == TextIn("How many days are in a week")
    [req] = [p for p in subs if isinstance(p, GenerateRequest)]
    rid = req.response_id
    tl.at(2.3, TextDelta(rid, "A week"), "llm")
    tl.at(2.5, VadSpeechStopped(audio_ms=1000), "vad")
    effects = tl.at(2.51, TranscriptFinal("How many days are in a week?"), "asr")
    assert tl.core.shown.id == rid  # the reply started in the pause is the one answered
    assert tl.core.metrics.speculations.get(outcome="used") == 1


def test_a_reply_held_under_an_older_fence_is_never_claimed():
    """A bump of the fence (here the final's rollback: it revised words the
    model held) cancels the reply started in the pause with everything else:
    the response that follows must ask for a new one, or it would wait
    forever for outputs the gate drops."""
    tl = Timeline()
    server_vad(tl)
    tl.speak("what is the capital of france")
    tl.at(2.1, VadPaused(audio_ms=1000), "vad")
    effects = tl.at(2.2, TranscriptPartial("What is the capital of France?", at_pause=True), "asr")
    assert any(isinstance(e, Submit) and isinstance(e.payload, GenerateRequest) for e in effects)
    # A late hypothesis revises a word the model holds: a rollback, a new incarnation.
    effects = tl.at(2.3, TranscriptPartial("What was the capital of France?"), "asr")
    assert any(isinstance(e, Submit) and isinstance(e.payload, ResetContext) for e in effects)
    # One move (the plan's), counted once; the held reply it voided adds none.
    m = tl.core.metrics
    assert (m.epoch_bumps.get(), m.incarnation_bumps.get()) == (1, 1)
    tl.at(2.5, VadSpeechStopped(audio_ms=1000), "vad")
    # The final says the words the held reply answers -- but that reply is cancelled.
    effects = tl.at(2.51, TranscriptFinal("What is the capital of France?"), "asr")
    [req] = [e.payload for e in effects if isinstance(e, Submit)
             and isinstance(e.payload, GenerateRequest)]
    assert tl.core.shown.id == req.response_id
    assert tl.core.metrics.speculations.get(outcome="discarded") == 1


def test_under_server_vad_speech_after_the_pause_discards_the_reply_it_started():
    tl = Timeline()
    server_vad(tl)
    tl.speak("what is the capital of")
    tl.at(2.1, VadPaused(audio_ms=1000), "vad")
    effects = tl.at(2.2, TranscriptPartial("what is the capital of", at_pause=True), "asr")
    assert any(isinstance(e, Submit) and isinstance(e.payload, GenerateRequest) for e in effects)
    effects = tl.at(2.3, VadResumed(audio_ms=1300), "vad")
    f1 = Fence("s").next_epoch()
    assert emits(effects) == [] and Cancel(f1) in effects
    # The model is given the words pushed so far again (the last one, never
    # pushed under server_vad, comes with the next partials), the turn goes on.
    assert isinstance(effects[-2].payload, ResetContext)
    assert effects[-1].payload == TextIn("what is the capital")
    assert tl.core.metrics.speculations.get(outcome="discarded") == 1


# ---- a reply shown while the user's words are revised -----------------------------


def test_a_revision_of_the_pushed_words_waits_for_the_reply_the_client_asked_for():
    """The client asks for a response (its own instructions) while the user's
    turn is still open; then the ASR revises a word it had pushed. Rolling the
    live request back then would void the response's outputs at the gate with
    no ``response.done`` ever (the client waits forever: seen through the real
    runner at load 35). The rollback waits for the final, and the response
    completes."""
    tl = Timeline("low")
    tl.speak("what is the capital of france")
    effects = tl.core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(
        instructions="Say hello.")), 1.8)
    [req] = [e for e in effects if isinstance(e, Submit) and isinstance(e.payload, GenerateRequest)]
    rid = req.payload.response_id
    fence = tl.core.fence
    revised = tl.at(1.9, TranscriptPartial("what is the capitol of france"), "asr")
    assert tl.core.fence == fence and not [e for e in revised if isinstance(e, Cancel)]
    tl.at(2.0, TextDelta(rid, "Hello!"), "llm")
    tl.at(2.1, GenerationDone(rid, "stop"), "llm")
    done = tl.at(2.2, SpeechDone(rid), "tts")
    [end] = [e.envelope.event for e in done if isinstance(e, Emit)
             and e.envelope.event.type == "response.done"]
    assert end.response["status"] == "completed"
    # Once it is done, the revised words rebuild the live request (here the
    # words at the pause; else the final transcript's).
    later = tl.pause(PAUSED, 1000, heard="what is the capitol of france")
    later += tl.at(2.5, TranscriptFinal("What is the capitol of France?"), "asr")
    assert tl.core.fence.incarnation == fence.incarnation + 1
    assert sum(isinstance(e, Cancel) for e in later) == 1


def test_a_fence_move_while_a_reply_is_shown_ends_it_for_the_client():
    """A plan that moves the fence voids every output under way: the reply
    shown cannot go on, so it ends -- ``response.done``, cut to what was heard
    -- instead of waiting forever for outputs the gate now drops (here the
    client rebuilds the model's context mid-reply)."""
    tl = Timeline("low")
    effects = tl.core.handle(cmd.ResponseCreate(), 1.0)
    [req] = [e for e in effects if isinstance(e, Submit) and isinstance(e.payload, GenerateRequest)]
    rid = req.payload.response_id
    tl.at(1.1, TextDelta(rid, "The capital"), "llm")
    before = tl.core.fence
    rebuilt = tl.core.handle(cmd.DuplexInput(mode=InputMode.REENCODE_CONTEXT), 1.2)
    [end] = [e.envelope.event for e in rebuilt if isinstance(e, Emit)
             and e.envelope.event.type == "response.done"]
    assert end.response["id"] == rid and end.response["status"] == "cancelled"
    assert tl.core.shown is None
    assert sum(isinstance(e, Cancel) for e in rebuilt) == 1  # one fence move, one cancel
    late = StageOutput(before, before.request_id("llm"), "llm", TextDelta(rid, " of France"))
    assert tl.core.handle(late, 1.3) == []  # dies at the gate
