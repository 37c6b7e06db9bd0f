"""The cascade policy is pure: drive it with a fake session view and typed
stage outputs, and check its plans and the steps it answers with."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from support.policy_steps import plan_of, render_of, shown
from support.policy_views import CascadeView
from vllm_duplex.domain.commands import DuplexInput, ResponseOptions
from vllm_duplex.domain.contracts import (
    CommitTurn,
    Dismiss,
    FenceBump,
    FinishReply,
    ForwardTo,
    InputMode,
    Interrupt,
    InterruptReason,
    PauseReply,
    Respond,
)
from vllm_duplex.domain.conversation import ContentPart, ConversationItem, ItemType, Role
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.interruption import Interruption
from vllm_duplex.domain.payloads import (
    AudioIn,
    GenerationDone,
    ResetContext,
    SceneDescription,
    SpeechDone,
    StageOutput,
    TextDelta,
    TextIn,
    TranscriptDelta,
    TranscriptFinal,
    TranscriptPartial,
    UserPaused,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.session_config import SessionConfig, TurnDetection
from vllm_duplex.models.cascade import CascadePolicy
from vllm_duplex.models.cascade.policy import CascadeState
from vllm_duplex.models.cascade.transcript import stable_prefix
from vllm_duplex.policy import load_policy


def out(payload: Any, stage: str = "asr") -> StageOutput:
    return StageOutput(Fence("s"), Fence("s").request_id("in"), stage, payload)


def llm_payloads(plan) -> list[Any]:
    return [s.payload for s in plan.submissions if s.stage == "llm"]


policy = CascadePolicy()


def test_registered_through_the_entry_point():
    assert isinstance(load_policy("cascade"), CascadePolicy)


def test_audio_goes_to_vad_and_asr_under_server_vad():
    plan = policy.plan_append(CascadeView(), AudioIn(np.zeros(320, np.int16), 0))
    assert plan.mode is InputMode.APPEND_AUDIO_CHUNK
    assert [s.stage for s in plan.submissions] == ["vad", "asr"]


def test_with_echo_cancellation_the_vad_hears_the_residual_turned_down_the_asr_the_words():
    words = np.full(320, 900, np.int16)
    gated = np.full(320, 30, np.int16)
    plan = policy.plan_append(CascadeView(), AudioIn(words, 40, vad_pcm=gated))
    heard = {s.stage: s.payload for s in plan.submissions}
    assert np.array_equal(heard["vad"].pcm, gated) and heard["vad"].start_ms == 40
    assert np.array_equal(heard["asr"].pcm, words) and heard["asr"].start_ms == 40


def test_stable_prefix_excludes_the_word_still_being_heard():
    assert stable_prefix([], ["what"]) == []
    assert stable_prefix(["what", "is"], ["what", "is", "the"]) == ["what", "is"]
    assert stable_prefix(["what", "is", "the"], ["what", "is", "the"]) == ["what", "is"]
    assert stable_prefix(["what", "was"], ["what", "is", "the"]) == ["what"]


def test_stable_words_become_deltas_and_are_pushed_to_the_live_request():
    view = CascadeView(items=[ConversationItem("u0", ItemType.MESSAGE, Role.USER,
                                        content=[ContentPart("input_text", text="hi")])])
    policy.decide_output(view, out(VadSpeechStarted(0), "vad"))
    d1 = policy.decide_output(view, out(TranscriptPartial("what is")))
    assert not shown(d1) and plan_of(d1) is None  # nothing stable yet
    d2 = policy.decide_output(view, out(TranscriptPartial("what is the")))
    assert render_of(d2) == TranscriptDelta("what is")
    reset, words = llm_payloads(plan_of(d2))
    assert isinstance(reset, ResetContext)  # the turn starts on exactly the history
    assert [m.text for m in reset.context] == ["Be brief.", "hi"]
    assert words == TextIn("what is") and plan_of(d2).mode is InputMode.APPEND_TOKENS
    d3 = policy.decide_output(view, out(TranscriptPartial("what is the capital of")))
    assert render_of(d3) == TranscriptDelta(" the")  # "capital" was not in the last hypothesis
    assert llm_payloads(plan_of(d3)) == [TextIn("the")]  # no second reset


@pytest.mark.parametrize("mode", ["semantic_vad", "server_vad"])
def test_a_pause_pushes_the_last_word_only_where_the_words_are_judged(mode):
    """semantic_vad: the model judges the whole phrase at the pause (its
    P(end) comes from that push). server_vad ends the turn on silence alone:
    the reply started in the pause carries the last words with its assistant
    prefix, one vLLM step where a push first was two."""
    view = CascadeView()
    view.config = dataclasses.replace(view.config, turn_detection=TurnDetection(type=mode))
    policy.decide_output(view, out(VadSpeechStarted(0), "vad"))
    policy.decide_output(view, out(TranscriptPartial("what is the")))
    policy.decide_output(view, out(TranscriptPartial("What is the capital of France?")))
    paused = policy.decide_output(view, out(UserPaused(1900), "vad"))
    asked = [s for s in plan_of(paused).submissions if s.stage == "asr"]
    assert [type(s.payload) for s in asked] == [UserPaused]  # every word up to the pause
    answer = policy.decide_output(view, out(TranscriptPartial("What is the capital of France?",
                                                              at_pause=True)))
    pushed = [p for d in (paused, answer) if plan_of(d) is not None
              for p in llm_payloads(plan_of(d)) if isinstance(p, TextIn)]
    if mode == "semantic_vad":
        assert pushed == [TextIn("capital of France")]
    else:
        assert pushed == []
    assert render_of(answer) is None  # shown once, at the pause
    assert render_of(paused) == TranscriptDelta(" capital of France")


@pytest.mark.parametrize("mode", ["semantic_vad", "server_vad"])
def test_the_asr_learns_whether_the_turn_can_end_at_the_pause(mode):
    """server_vad ends the turn only after its silence: the ASR is told so,
    and hears the words again with the audio after them while it accrues
    (its final is not cut at the last loud frame); under semantic_vad the
    turn may end at once, and the answer at the pause stays the final."""
    view = CascadeView()
    view.config = dataclasses.replace(
        view.config, turn_detection=TurnDetection(type=mode, silence_duration_ms=700))
    policy.decide_output(view, out(VadSpeechStarted(0), "vad"))
    paused = policy.decide_output(view, out(UserPaused(1900), "vad"))
    [asked] = [s.payload for s in plan_of(paused).submissions if s.stage == "asr"]
    assert asked == UserPaused(1900, turn_end_silence_ms=700 if mode == "server_vad" else None)


def test_a_revised_pushed_word_rolls_back_to_the_turn_start():
    view = CascadeView()
    policy.decide_output(view, out(VadSpeechStarted(0), "vad"))
    policy.decide_output(view, out(TranscriptPartial("what is the")))
    policy.decide_output(view, out(TranscriptPartial("what is the capitol")))  # pushed: what is the
    d = policy.decide_output(view, out(TranscriptPartial("what was the capital of")))
    assert plan_of(d).mode is InputMode.ROLLBACK_TO_CHECKPOINT
    assert plan_of(d).bump is FenceBump.INCARNATION
    reset, words = llm_payloads(plan_of(d))
    assert isinstance(reset, ResetContext) and words == TextIn("what")


def test_speech_stopped_commits_and_the_final_transcript_answers():
    view = CascadeView()
    policy.decide_output(view, out(VadSpeechStarted(0), "vad"))
    stopped = policy.decide_output(view, out(VadSpeechStopped(900), "vad"))
    assert CommitTurn() in stopped and Respond() not in stopped and (ForwardTo("asr") in stopped)
    final = policy.decide_output(view, out(TranscriptFinal("what is the capital of france")))
    assert shown(final) and Respond() in final


@pytest.mark.parametrize("text", ["", "   "])
def test_noise_without_words_gets_no_reply(text):
    view = CascadeView()
    policy.decide_output(view, out(VadSpeechStarted(0), "vad"))
    policy.decide_output(view, out(VadSpeechStopped(300), "vad"))
    assert Respond() not in policy.decide_output(view, out(TranscriptFinal(text)))


def test_speech_during_a_reply_interrupts_it_in_immediate_mode():
    view = CascadeView(active_response_id="resp_1", config=SessionConfig(
        model="m", policy="cascade", interruption=Interruption("immediate")))
    d = policy.decide_output(view, out(VadSpeechStarted(0), "vad"))
    assert Interrupt(InterruptReason.TURN_DETECTED) in d and PauseReply() not in d


def test_adaptive_speech_over_a_reply_pauses_then_words_decide():
    view = CascadeView(active_response_id="resp_1")  # adaptive is the default
    d = policy.decide_output(view, out(VadSpeechStarted(0), "vad"))
    assert PauseReply() in d and Interrupt(InterruptReason.TURN_DETECTED) not in d
    view.output_paused = True
    # a backchannel: the commit waits for the final, which dismisses it
    d = policy.decide_output(view, out(TranscriptPartial("Okay."), "asr"))
    d = policy.decide_output(view, out(TranscriptPartial("Okay."), "asr"))
    assert Interrupt(InterruptReason.TURN_DETECTED) not in d
    d = policy.decide_output(view, out(VadSpeechStopped(400), "vad"))
    assert CommitTurn() not in d
    d = policy.decide_output(view, out(TranscriptFinal("Okay."), "asr"))
    assert list(d) == [Dismiss("backchannel")]
    # real words: the stable ones interrupt at once
    policy.decide_output(view, out(VadSpeechStarted(900), "vad"))
    policy.decide_output(view, out(TranscriptPartial("wait what"), "asr"))
    d = policy.decide_output(view, out(TranscriptPartial("wait what is"), "asr"))
    assert Interrupt(InterruptReason.TURN_DETECTED) in d


def test_adaptive_final_decides_when_partials_did_not():
    view = CascadeView(active_response_id="resp_1", output_paused=True)
    policy.decide_output(view, out(VadSpeechStarted(0), "vad"))
    policy.decide_output(view, out(VadSpeechStopped(300), "vad"))
    d = policy.decide_output(view, out(TranscriptFinal("stop"), "asr"))
    assert Interrupt(InterruptReason.TURN_DETECTED) in d and CommitTurn() in d and Respond() in d
    policy.decide_output(view, out(VadSpeechStarted(1000), "vad"))
    policy.decide_output(view, out(VadSpeechStopped(1200), "vad"))
    assert list(policy.decide_output(view, out(TranscriptFinal(""), "asr"))) == [Dismiss("noise")]


def test_reply_text_streams_to_tts_and_speech_done_finishes():
    view = CascadeView()
    assert ForwardTo("tts") in policy.decide_output(view, out(TextDelta("r", "Paris."), "llm"))
    assert FinishReply() not in policy.decide_output(view, out(GenerationDone("r", "stop"), "llm"))
    assert FinishReply() in policy.decide_output(view, out(SpeechDone("r"), "tts"))
    text_only = CascadeView(config=SessionConfig(model="m", policy="cascade", output_modalities=("text",)))
    assert FinishReply() in policy.decide_output(text_only, out(GenerationDone("r", "stop"),
                                                                  "llm"))


def test_reencode_rebuilds_the_context_in_a_new_incarnation():
    plan = policy.plan_append(CascadeView(), DuplexInput(mode=InputMode.REENCODE_CONTEXT))
    assert plan.bump is FenceBump.INCARNATION
    assert isinstance(llm_payloads(plan)[0], ResetContext)
    with pytest.raises(DuplexError) as info:
        policy.plan_append(CascadeView(), DuplexInput(mode=InputMode.REPLACE_LATEST_CHUNK))
    assert info.value.code == "capability_unsupported"


def test_sampling_caps_spoken_replies():
    sampling = policy.configure_sampling_params(CascadeView(), ResponseOptions())
    assert sampling.max_tokens == 96
    assert policy.configure_sampling_params(CascadeView(), ResponseOptions(max_output_tokens=5)).max_tokens == 5


def test_it_declares_its_stages_and_keeps_its_memory_per_session():
    assert CascadePolicy().stage_needs().names == ("llm", "vad", "asr", "tts")
    assert CascadePolicy(vision=True).stage_needs().names == ("llm", "vad", "asr", "tts", "vision")
    one, two = policy.new_state(), policy.new_state()
    assert isinstance(one, CascadeState) and one is not two and one.utterance is not two.utterance
    a, b = CascadeView(policy_state=one), CascadeView(policy_state=two)
    policy.decide_output(a, out(SceneDescription("a red door", 0), stage="vision"))
    assert one.scene == "a red door" and two.scene is None  # sessions do not share it
    assert policy.shape_context(b, ()) == ()
