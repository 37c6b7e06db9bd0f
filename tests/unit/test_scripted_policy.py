"""The scripted policy's steps, its registration, and the energy VAD."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.policy_views import PolicyView
from vllm_duplex.domain.commands import ResponseOptions
from vllm_duplex.domain.contracts import (
    CommitTurn,
    FinishReply,
    ForwardTo,
    InputMode,
    Interrupt,
    InterruptReason,
    PolicyStep,
    Respond,
    Show,
    StageSubmission,
    TurnCommitted,
)
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    AudioIn,
    AudioOut,
    GenerationDone,
    SpeechDone,
    StageFailed,
    StageOutput,
    TextDelta,
    TextIn,
    VadConfig,
    VadPaused,
    VadResumed,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.session_config import SessionConfig, TurnDetection
from vllm_duplex.models.scripted import ScriptedPolicy
from vllm_duplex.policy import NoState, available_policies, load_policy
from vllm_duplex.stages.listening.energy_vad import EnergyVad, energy_threshold_dbfs

F = Fence("s")
RATE = 16000


def out(payload: object) -> StageOutput:
    return StageOutput(F, F.request_id("x"), "stage", payload)


# ---- registration and capabilities -------------------------------------------


def test_registered_through_entry_points() -> None:
    assert "scripted" in available_policies()
    policy = load_policy("scripted", reply="hi", unknown_option=3)
    assert isinstance(policy, ScriptedPolicy)
    assert policy.name == "scripted" and policy.reply == "hi"


def test_capabilities() -> None:
    caps = ScriptedPolicy().capabilities()
    assert caps.input_modes == {
        InputMode.APPEND_AUDIO_CHUNK,
        InputMode.APPEND_TOKENS,
        InputMode.TURN_COMMIT_ONLY,
    }
    assert not caps.supports(InputMode.ROLLBACK_TO_CHECKPOINT)
    assert caps.turn_detection == {"server_vad"}
    assert caps.input_modalities == caps.output_modalities == {"audio", "text"}
    assert caps.early_output and not caps.tools


# ---- plan_append ---------------------------------------------------------------


def test_plan_append() -> None:
    policy = ScriptedPolicy()
    audio = AudioIn(np.zeros(320, np.int16), 0)
    plan = policy.plan_append(PolicyView(), audio)
    assert plan.mode is InputMode.APPEND_AUDIO_CHUNK
    assert [(s.stage, s.payload) for s in plan.submissions] == [("vad", audio)]
    manual = PolicyView(config=SessionConfig("m", "scripted", turn_detection=None))
    plan = policy.plan_append(manual, audio)
    assert plan.mode is InputMode.APPEND_AUDIO_CHUNK and plan.submissions == ()
    cfg = VadConfig(0.7, 100, 300)
    plan = policy.plan_append(PolicyView(), cfg)
    assert plan.submissions == (StageSubmission("vad", cfg, "vad-config"),)
    assert policy.plan_append(PolicyView(), TextIn("hi")).mode is InputMode.APPEND_TOKENS
    assert policy.plan_append(PolicyView(), TextIn("hi")).submissions == ()
    plan = policy.plan_append(PolicyView(), TurnCommitted("item_1"))
    assert plan.mode is InputMode.TURN_COMMIT_ONLY and plan.submissions == ()
    with pytest.raises(DuplexError) as err:
        policy.plan_append(PolicyView(), b"raw bytes")
    assert err.value.code == "capability_unsupported"


def test_sampling_params() -> None:
    policy = ScriptedPolicy()
    view = PolicyView(config=SessionConfig("m", "scripted", temperature=0.6, max_output_tokens=50))
    assert policy.configure_sampling_params(view, ResponseOptions()).max_tokens == 50
    sampling = policy.configure_sampling_params(view, ResponseOptions(max_output_tokens=7))
    assert (sampling.temperature, sampling.max_tokens) == (0.6, 7)
    assert policy.configure_sampling_params(PolicyView(), ResponseOptions()).max_tokens is None


# ---- decide_output ---------------------------------------------------------------

AUDIO = ("audio",)
TEXT = ("text",)
NO_INTERRUPT = TurnDetection(interrupt_response=False, create_response=False)


@pytest.mark.parametrize(
    ("payload", "modalities", "td", "active", "expected"),
    [
        (VadSpeechStarted(0), AUDIO, TurnDetection(), None, [Show()]),
        (
            VadSpeechStarted(0),
            AUDIO,
            TurnDetection(),
            "resp_1",
            [Show(), Interrupt(InterruptReason.TURN_DETECTED)],
        ),
        (VadSpeechStarted(0), AUDIO, NO_INTERRUPT, "resp_1", [Show()]),
        (VadSpeechStarted(0), AUDIO, None, "resp_1", []),
        (
            VadSpeechStopped(900),
            AUDIO,
            TurnDetection(),
            None,
            [Show(), CommitTurn(), Respond()],
        ),
        (
            VadSpeechStopped(900),
            AUDIO,
            NO_INTERRUPT,
            None,
            [Show(), CommitTurn()],
        ),
        (VadSpeechStopped(900), AUDIO, None, None, []),
        (TextDelta("r", "hi "), AUDIO, None, "r", [Show(), ForwardTo("tts")]),
        (TextDelta("r", "hi "), TEXT, None, "r", [Show()]),
        (GenerationDone("r", "stop"), AUDIO, None, "r", [Show(), ForwardTo("tts")]),
        (
            GenerationDone("r", "stop"),
            TEXT,
            None,
            "r",
            [Show(), FinishReply()],
        ),
        (
            AudioOut("r", np.zeros(10, np.int16)),
            AUDIO,
            None,
            "r",
            [Show()],
        ),
        (SpeechDone("r"), AUDIO, None, "r", [Show(), FinishReply()]),
        (
            StageFailed(DuplexError("stage_failed", "x")),
            AUDIO,
            None,
            "r",
            [Show()],
        ),
        (object(), AUDIO, None, None, []),
    ],
)
def test_decide_output(
    payload: object,
    modalities: tuple[str, ...],
    td: TurnDetection | None,
    active: str | None,
    expected: list[PolicyStep],
) -> None:
    config = SessionConfig("m", "scripted", output_modalities=modalities, turn_detection=td)
    view = PolicyView(config=config, active_response_id=active)
    assert list(ScriptedPolicy().decide_output(view, out(payload))) == expected


# ---- energy VAD ------------------------------------------------------------------


def sine(ms: int, dbfs: float = -20.0, freq: float = 440.0) -> np.ndarray:
    t = np.arange(RATE * ms // 1000) / RATE
    return np.round(32767 * 10 ** (dbfs / 20) * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def silence(ms: int) -> np.ndarray:
    return np.zeros(RATE * ms // 1000, np.int16)


def noise(ms: int, dbfs: float = -60.0, seed: int = 0) -> np.ndarray:
    rms = 32768 * 10 ** (dbfs / 20)
    x = np.random.default_rng(seed).normal(0.0, rms, RATE * ms // 1000)
    return np.round(x).astype(np.int16)


# Segment edges sit on the 20 ms frame grid, so the expected times are exact.
SCENE = np.concatenate(
    [
        silence(400),  # 0
        noise(300, seed=1),  # 400
        sine(400),  # 700: speech
        silence(400),  # 1100: long enough to end the turn
        sine(40),  # 1500: a 40 ms click, shorter than min_speech_ms
        noise(260, seed=2),  # 1540
        sine(600),  # 1800: speech
        noise(600, seed=3),  # 2400
    ]
)
SCENE_CONFIG = VadConfig(threshold=0.5, prefix_padding_ms=100, silence_duration_ms=300)
SCENE_EVENTS = [
    VadSpeechStarted(600),
    VadSpeechStopped(1100),
    VadSpeechStarted(1700),
    VadSpeechStopped(2400),
]


def run_vad(chunks: Sequence[int], start_ms: int = 0, config: VadConfig = SCENE_CONFIG) -> list[object]:
    """Feed SCENE in chunks of the given sizes (samples), the way a session
    does: each chunk stamped with its offset in whole ms."""
    vad = EnergyVad(config=config)
    events: list[object] = []
    pos = 0
    sizes = list(chunks)
    while pos < len(SCENE):
        size = sizes.pop(0) if sizes else len(SCENE) - pos
        piece = SCENE[pos : pos + size]
        events += vad.feed(piece, start_ms + pos * 1000 // RATE)
        pos += len(piece)
    return events


def test_threshold_mapping() -> None:
    assert energy_threshold_dbfs(0.0) == -70.0
    assert energy_threshold_dbfs(0.5) == -40.0
    assert energy_threshold_dbfs(1.0) == -10.0


def test_vad_scene_in_one_piece() -> None:
    assert run_vad([len(SCENE)]) == SCENE_EVENTS


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=5000), max_size=200))
def test_vad_streaming_equals_batch(sizes: list[int]) -> None:
    """The Moshi rule: chunking must not change the events."""
    assert run_vad(sizes) == SCENE_EVENTS


def test_vad_timestamps_follow_start_ms() -> None:
    shifted = run_vad([320] * 1000, start_ms=10_000)
    assert [e.audio_ms - 10_000 for e in shifted] == [e.audio_ms for e in SCENE_EVENTS]  # type: ignore[attr-defined]


def test_vad_prefix_padding_is_clamped_at_zero() -> None:
    vad = EnergyVad(config=VadConfig(prefix_padding_ms=300, silence_duration_ms=200))
    events = vad.feed(np.concatenate([silence(40), sine(200), silence(200)]), 0)
    assert events == [VadSpeechStarted(0), VadSpeechStopped(240)]


def test_vad_threshold_changes_what_counts_as_speech() -> None:
    quiet = np.concatenate([sine(200, dbfs=-45.0), silence(600)])
    assert EnergyVad(config=VadConfig(threshold=0.5)).feed(quiet, 0) == []
    sensitive = EnergyVad(config=VadConfig(threshold=0.2, prefix_padding_ms=0))
    assert sensitive.feed(quiet, 0) == [VadSpeechStarted(0), VadSpeechStopped(200)]


def test_vad_gap_counts_as_silence_and_rewind_resets() -> None:
    vad = EnergyVad(config=VadConfig(prefix_padding_ms=0, silence_duration_ms=500))
    assert vad.feed(sine(200), 0) == [VadSpeechStarted(0)]
    # the client skipped 600 ms of audio: the turn has ended in audio time
    # the client skipped 600 ms of audio: in audio time the turn ended, and
    # the speech after the gap is a new turn
    assert vad.feed(sine(100), 800) == [VadSpeechStopped(200), VadSpeechStarted(800)]
    assert vad.speaking
    vad.feed(silence(100), 0)  # a rewound timeline is a new stream
    assert vad.speaking is False


def test_it_declares_its_stages_and_keeps_no_state() -> None:
    policy = ScriptedPolicy()
    assert policy.stage_needs().names == ("llm", "vad", "tts")
    assert isinstance(policy.new_state(), NoState)
    assert policy.shape_context(PolicyView(), ()) == ()  # the conversation as it is


def test_vad_reports_a_pause_before_the_end_of_speech_and_speech_that_resumes() -> None:
    """``pause_ms``: the pause is reported while the end-of-speech silence
    still accrues (the session prepares the reply in it); speech before the
    end of speech resumes the same segment."""
    config = VadConfig(threshold=0.5, prefix_padding_ms=100, silence_duration_ms=300, pause_ms=100)
    pcm = np.concatenate([silence(400), sine(400), silence(200), sine(400), silence(400)])
    vad = EnergyVad(config=config)
    assert vad.feed(pcm, 0) == [VadSpeechStarted(300), VadPaused(800), VadResumed(1000),
                                VadPaused(1400), VadSpeechStopped(1400)]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=5000), max_size=200))
def test_vad_pauses_do_not_depend_on_chunking(sizes: list[int]) -> None:
    config = VadConfig(threshold=0.5, prefix_padding_ms=100, silence_duration_ms=300, pause_ms=100)
    whole = [e for e in run_vad([len(SCENE)], config=config)]
    assert [e for e in whole if not isinstance(e, (VadPaused, VadResumed))] == SCENE_EVENTS
    assert run_vad(sizes, config=config) == whole
