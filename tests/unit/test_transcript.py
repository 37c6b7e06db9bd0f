"""Stable words and revisions when the ASR writes like Whisper (case and
punctuation that change between hypotheses), through the pure functions and
through the cascade policy that acts on them."""

from __future__ import annotations

from typing import Any

from support.policy_steps import plan_of, render_of
from support.policy_views import CascadeView
from vllm_duplex.domain.contracts import FenceBump, InputMode, Respond
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    StageOutput,
    TextIn,
    TranscriptDelta,
    TranscriptFinal,
    TranscriptPartial,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.models.cascade import CascadePolicy
from vllm_duplex.models.cascade.transcript import (
    Utterance,
    extends,
    same_words,
    spoken,
    stable_prefix,
    words,
)


def test_spoken_form_ignores_case_and_surrounding_punctuation_only():
    assert spoken("France?") == spoken("france") == "france"
    assert spoken('"Paris,"') == "paris"
    assert spoken("what's") == "what's" and spoken("3.5") == "3.5"
    assert spoken("...") == "" and spoken("capitol") != spoken("capital")


def test_words_drop_bare_punctuation():
    assert words("Well - I think... yes.") == ["Well", "I", "think...", "yes."]
    assert words("  ") == []


def test_a_word_whose_punctuation_changed_is_still_stable():
    previous = words("What is the capital?")
    current = words("What is the capital of France?")
    assert stable_prefix(previous, current) == ["What", "is", "the", "capital"]  # newest spelling
    assert stable_prefix(words("what was"), current) == ["What"]


def test_same_words_and_extends():
    assert same_words(words("What is the"), words("what is The"))
    assert not same_words(words("what is"), words("what is the"))
    assert extends(words("what is"), words("What is the capital"))
    assert not extends(words("what is"), words("what is"))
    assert not extends(words("what was"), words("what is the"))


def test_a_final_revises_pushed_words_only_when_a_spoken_word_differs():
    utt = Utterance(pushed=words("What is the capital"))
    assert not utt.revised(words("what is the capital of France?"))
    assert not utt.revised(words("What is the capital, of France?"))
    assert utt.revised(words("What is the capitol of France?"))
    assert utt.revised(words("What is"))  # a pushed word dropped


# ---- through the policy -------------------------------------------------------


def out(payload: Any, stage: str = "asr") -> StageOutput:
    return StageOutput(Fence("s"), Fence("s").request_id("in"), stage, payload)


def pushed_text(plan: Any) -> list[str]:
    return [s.payload.text for s in plan.submissions if isinstance(s.payload, TextIn)]


def speak(policy: CascadePolicy, view: CascadeView, *partials: str) -> list[Any]:
    policy.decide_output(view, out(VadSpeechStarted(0), "vad"))
    return [policy.decide_output(view, out(TranscriptPartial(p))) for p in partials]


def test_whisper_style_partials_keep_deltas_and_pushes_flowing():
    policy, view = CascadePolicy(), CascadeView()
    d = speak(policy, view, "What is the capital?", "What is the capital of France?",
              "What is the capital of France? And Spain")
    assert render_of(d[1]) == TranscriptDelta("What is the capital")
    assert pushed_text(plan_of(d[1])) == ["What is the capital"]
    assert render_of(d[2]) == TranscriptDelta(" of France?")
    assert pushed_text(plan_of(d[2])) == ["of France?"]
    assert plan_of(d[2]).mode is InputMode.APPEND_TOKENS


def test_a_final_that_agrees_with_the_pushed_words_answers_without_a_rollback():
    policy, view = CascadePolicy(), CascadeView()
    speak(policy, view, "what is the", "what is the capital of")  # pushed: what is the capital
    policy.decide_output(view, out(VadSpeechStopped(2000), "vad"))
    final = policy.decide_output(view, out(TranscriptFinal("What is the capital of France?")))
    assert plan_of(final) is None and Respond() in final


def test_a_final_that_heard_a_pushed_word_differently_rolls_back_first():
    """The first pass pushed "capitol"; the final (Whisper base) heard
    "capital": the model context is rebuilt, so it answers what the final says."""
    policy, view = CascadePolicy(), CascadeView()
    speak(policy, view, "What is the capitol", "What is the capitol of")
    policy.decide_output(view, out(VadSpeechStopped(2000), "vad"))
    final = policy.decide_output(view, out(TranscriptFinal("What is the capital of France?")))
    assert plan_of(final).mode is InputMode.ROLLBACK_TO_CHECKPOINT
    assert plan_of(final).bump is FenceBump.INCARNATION
    assert Respond() in final
