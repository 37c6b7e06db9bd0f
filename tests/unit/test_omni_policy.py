"""The omni policy is pure: drive it with a fake session view, 20 ms audio
chunks, camera frames and typed stage outputs, and check the units it forms
and the steps it answers outputs with."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from support.policy_steps import kinds, plan_of
from support.policy_views import PolicyView
from vllm_duplex.domain.commands import DuplexInput, ResponseOptions
from vllm_duplex.domain.contracts import (
    AppendPlan,
    CommitTurn,
    FinishReply,
    ForwardTo,
    InputMode,
    Interrupt,
    InterruptReason,
    Respond,
    Show,
    TurnCommitted,
)
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.omni import OmniInstructions, OmniUnit
from vllm_duplex.domain.payloads import (
    AudioIn,
    AudioOut,
    GenerationDone,
    SpeechDone,
    StageOutput,
    TextDelta,
    TextIn,
    VadConfig,
    VadSpeechStarted,
    VadSpeechStopped,
    VideoFrame,
)
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.models.omni import OmniPolicy
from vllm_duplex.models.omni.policy import OmniState
from vllm_duplex.models.omni.units import UnitBuilder, tile_frames, units_of_turn
from vllm_duplex.policy import load_policy

CHUNK = 320  # 20 ms at 16 kHz


@dataclass
class View(PolicyView):
    config: SessionConfig = field(default_factory=lambda: SessionConfig(
        model="m", policy="omni", instructions="Be brief.", output_modalities=("text",)))
    policy_state: OmniState = field(default_factory=lambda: OmniPolicy().new_state())


def with_state(policy: OmniPolicy, view: View) -> tuple[OmniPolicy, View]:
    """The view of a session of ``policy`` (its state follows the policy's options)."""
    view.policy_state = policy.new_state()
    return policy, view


def manual_view(**kw: Any) -> View:
    v = View(**kw)
    v.config = dataclasses.replace(v.config, turn_detection=None)
    return v


def out(payload: Any, stage: str = "vad") -> StageOutput:
    return StageOutput(Fence("s"), Fence("s").request_id("in"), stage, payload)


def frame(w: int, h: int, ts: int = 0, value: int = 0, source: str = "frame") -> VideoFrame:
    return VideoFrame(np.full((h, w, 3), value, np.uint8), ts, source)


def units(plans: list[Any]) -> list[OmniUnit]:
    return [s.payload for p in plans if p is not None for s in p.submissions
            if s.stage == "omni" and isinstance(s.payload, OmniUnit)]


def decide(policy: OmniPolicy, view: View, payload: Any) -> Any:
    """The policy's steps for a VAD event; the user speaks from an onset the
    session shows to the end it shows (``view.user_speaking``, as the session's)."""
    steps = policy.decide_output(view, out(payload))
    if Show() in steps and isinstance(payload, (VadSpeechStarted, VadSpeechStopped)):
        view.user_speaking = isinstance(payload, VadSpeechStarted)
    return steps


class Feeder:
    """Audio in 20 ms chunks on a continuous timeline, frames between them."""

    def __init__(self, policy: OmniPolicy, view: View) -> None:
        self.policy, self.view, self.ms, self.plans = policy, view, 0, []

    def audio(self, ms: int, *, fps: float = 0.0, size: tuple[int, int] = (64, 48)) -> None:
        interval = 1000.0 / fps if fps else None
        next_frame = self.ms if interval else None
        for _ in range(ms // 20):
            if next_frame is not None and self.ms >= next_frame:
                self.plans.append(self.policy.plan_append(self.view, frame(*size, ts=self.ms, value=self.ms % 251)))
                next_frame += interval
            pcm = np.full(CHUNK, 1000, np.int16)
            self.plans.append(self.policy.plan_append(self.view, AudioIn(pcm, self.ms)))
            self.ms += 20

    def event(self, payload: Any) -> Any:
        steps = decide(self.policy, self.view, payload)
        self.plans.append(plan_of(steps))
        return steps


# ---- registration and capabilities ------------------------------------------------


def test_registered_through_the_entry_point():
    assert isinstance(load_policy("omni"), OmniPolicy)


def test_capabilities_take_audio_video_image_and_text():
    caps = OmniPolicy().capabilities()
    assert caps.input_modalities == {"audio", "video", "image", "text"}
    assert caps.supports(InputMode.APPEND_AUDIO_CHUNK)
    assert caps.supports(InputMode.REPLACE_LATEST_CHUNK)
    assert caps.supports(InputMode.TURN_COMMIT_ONLY)
    assert caps.supports(InputMode.APPEND_TOKENS)
    assert not caps.supports(InputMode.ROLLBACK_TO_CHECKPOINT)
    assert not caps.supports(InputMode.REENCODE_CONTEXT)
    assert caps.wire()["input_modalities"] == ["audio", "image", "text", "video"]


def test_unsupported_modes_are_capability_errors():
    with pytest.raises(DuplexError) as err:
        OmniPolicy().plan_append(View(), DuplexInput(mode=InputMode.ROLLBACK_TO_CHECKPOINT))
    assert err.value.code == "capability_unsupported"


@pytest.mark.parametrize("options", [{"audio_out": "loud"}, {"unit_ms": 5}, {"frames_per_unit": 0},
                                     {"max_tokens": 0}, {"tile_cell": [0, 10]}, {"typo": 1}])
def test_bad_options_fail_at_load(options):
    with pytest.raises((ValueError, TypeError)):
        OmniPolicy(**options)


def test_sampling_uses_the_policy_default_unless_asked():
    policy = OmniPolicy(max_tokens=77)
    assert policy.configure_sampling_params(View(), ResponseOptions()).max_tokens == 77
    assert policy.configure_sampling_params(View(), ResponseOptions(max_output_tokens=5)).max_tokens == 5


# ---- units --------------------------------------------------------------------------


def test_server_vad_units_from_20ms_chunks():
    policy, view = with_state(OmniPolicy(), View())
    f = Feeder(policy, view)
    f.audio(200)  # silence before the turn (pre-roll)
    f.event(VadSpeechStarted(audio_ms=100))
    f.audio(2500)
    stopped = f.event(VadSpeechStopped(audio_ms=2600))
    got = units(f.plans)
    # 100..2700 ms: two complete 1 s units while speaking, the rest flushed at stop.
    assert [u.duration_ms for u in got] == [1000, 1000, 600]
    assert [u.start_ms for u in got] == [100, 1100, 2100]
    assert [u.final for u in got] == [False, False, True]
    assert all(u.audio.dtype == np.int16 for u in got)
    assert kinds(stopped) == [Show, AppendPlan, CommitTurn, Respond]
    # Every audio chunk also reached the VAD, first in its plan.
    audio_plans = [p for p in f.plans if p is not None and p.submissions and p.submissions[0].stage == "vad"]
    assert len(audio_plans) == (200 + 2500) // 20


def test_units_do_not_depend_on_chunking():
    def run(chunk: int) -> list[tuple[int, int]]:
        policy, view = with_state(OmniPolicy(unit_ms=500), View())
        decide(policy, view, VadSpeechStarted(0))
        plans, ms = [], 0
        while ms < 1730:
            n = min(chunk, 1730 - ms)
            plans.append(policy.plan_append(view, AudioIn(np.arange(n * 16, dtype=np.int16), ms)))
            ms += n
        plans.append(plan_of(decide(policy, view, VadSpeechStopped(1730))))
        return [(u.start_ms, u.samples) for u in units(plans)]

    assert run(20) == run(7) == run(333) == [(0, 8000), (500, 8000), (1000, 8000), (1500, 3680)]


def test_silence_between_turns_never_reaches_the_model():
    policy, view = with_state(OmniPolicy(), View())
    f = Feeder(policy, view)
    f.audio(5000)
    assert units(f.plans) == []
    # ... and the pre-roll is bounded (prefix padding + slack).
    st = view.policy_state
    assert st.idle_samples <= (300 + 1000 + 20) * 16


@pytest.mark.parametrize("fps, expected", [(1, 1), (2, 1), (5, 1), (30, 1), (0.5, None)])
def test_one_frame_per_unit_keeps_the_newest(fps, expected):
    policy, view = with_state(OmniPolicy(), View())
    f = Feeder(policy, view)
    f.event(VadSpeechStarted(0))
    f.audio(4000, fps=fps)
    f.event(VadSpeechStopped(4000))
    got = units(f.plans)
    assert len(got) == 4
    counts = [len(u.frames) for u in got]
    if expected is None:  # one frame every 2 s: every other unit has one
        assert counts == [1, 0, 1, 0]
    else:
        assert counts == [expected] * 4
    for i, u in enumerate(got):
        for ts in u.frame_ms:  # the frame was seen during the unit...
            assert i * 1000 <= ts < (i + 1) * 1000
        if fps >= 1 and u.frame_ms:  # ... and it is the newest one seen
            assert u.frame_ms[-1] >= (i + 1) * 1000 - 1000 / fps - 20


def test_a_newer_frame_replaces_the_older_in_the_same_unit():
    policy, view = with_state(OmniPolicy(), View())
    decide(policy, view, VadSpeechStarted(0))
    policy.plan_append(view, AudioIn(np.zeros(CHUNK, np.int16), 0))
    first = policy.plan_append(view, frame(64, 48, ts=20, value=1))
    second = policy.plan_append(view, frame(64, 48, ts=40, value=2))
    assert first.mode is InputMode.APPEND_AUDIO_CHUNK and not first.submissions
    assert second.mode is InputMode.REPLACE_LATEST_CHUNK and not second.submissions
    plan = plan_of(decide(policy, view, VadSpeechStopped(60)))
    (unit,) = units([plan])
    assert len(unit.frames) == 1 and unit.frames[0][0, 0, 0] == 2 and unit.frame_ms == (40,)


def test_frames_per_unit_samples_slots():
    policy, view = with_state(OmniPolicy(frames_per_unit=2), View())
    f = Feeder(policy, view)
    f.event(VadSpeechStarted(0))
    f.audio(2000, fps=10)
    got = units(f.plans)
    assert [len(u.frames) for u in got] == [2, 2]
    # The newest frame of each half second.
    assert got[0].frame_ms == (400, 900) and got[1].frame_ms == (1400, 1900)


def test_tile_stacks_a_units_frames_into_one_image():
    policy, view = with_state(OmniPolicy(frames_per_unit=4, tile=True), View())
    f = Feeder(policy, view)
    f.event(VadSpeechStarted(0))
    f.audio(1000, fps=4, size=(64, 48))
    (unit,) = units(f.plans)
    assert len(unit.frames) == 1
    assert unit.frames[0].shape == (96, 128, 3)  # a 2x2 grid of 64x48
    assert unit.frame_ms == (760,)  # the newest (frames at 0, 260, 500, 760 ms)


def test_tile_frames_grid_and_cell():
    frames = [np.full((48, 64, 3), v, np.uint8) for v in (10, 20, 30)]
    grid = tile_frames(frames)
    assert grid.shape == (96, 128, 3)
    assert grid[0, 0, 0] == 10 and grid[0, 64, 0] == 20 and grid[48, 0, 0] == 30
    assert grid[48, 64, 0] == 0  # the empty cell is black
    assert tile_frames(frames[:1]) is frames[0]
    assert tile_frames(frames, cell=(32, 24)).shape == (48, 64, 3)


def test_the_newest_frame_before_speech_opens_the_turn():
    policy, view = with_state(OmniPolicy(), View())
    f = Feeder(policy, view)
    f.audio(400)
    f.plans.append(policy.plan_append(view, frame(64, 48, ts=100, value=1)))
    replaced = policy.plan_append(view, frame(32, 24, ts=300, value=2))
    assert replaced.mode is InputMode.REPLACE_LATEST_CHUNK
    f.event(VadSpeechStarted(100))
    f.audio(1000)
    got = units(f.plans)
    assert got[0].start_ms == 100 and got[0].frames[0].shape == (24, 32, 3)
    # After the turn, the next one starts without the old frame.
    f.event(VadSpeechStopped(1400))
    f.event(VadSpeechStarted(1400))
    f.audio(1000)
    assert units(f.plans)[-1].frames == ()


def test_flush_at_end_of_turn_carries_frames_only_when_no_audio_is_left():
    policy, view = with_state(OmniPolicy(), View())
    f = Feeder(policy, view)
    f.event(VadSpeechStarted(0))
    f.audio(1000)
    f.plans.append(policy.plan_append(view, frame(8, 8, ts=1000)))
    f.event(VadSpeechStopped(1000))
    got = units(f.plans)
    assert [u.samples for u in got] == [16000, 0]
    assert got[1].final and len(got[1].frames) == 1 and got[1].start_ms == 1000


def test_nothing_pending_at_stop_plans_nothing():
    policy, view = with_state(OmniPolicy(), View())
    decide(policy, view, VadSpeechStarted(0))
    assert list(decide(policy, view, VadSpeechStopped(0))) == [Show(), CommitTurn(),
                                                                          Respond()]


def test_instructions_lead_the_first_submission_and_follow_changes():
    policy, view = with_state(OmniPolicy(unit_ms=100), View())
    f = Feeder(policy, view)
    f.event(VadSpeechStarted(0))
    f.audio(200)
    subs = [s.payload for p in f.plans if p is not None for s in p.submissions if s.stage == "omni"]
    assert isinstance(subs[0], OmniInstructions) and subs[0].text == "Be brief."
    assert sum(isinstance(s, OmniInstructions) for s in subs) == 1
    view.config = dataclasses.replace(view.config, instructions="Be verbose.")
    plan = policy.plan_append(view, AudioIn(np.zeros(1600, np.int16), 200))
    assert [type(s.payload) for s in plan.submissions] == [AudioIn, OmniInstructions, OmniUnit]
    assert plan.submissions[1].payload.text == "Be verbose."


def test_typed_text_follows_what_was_heard():
    policy, view = with_state(OmniPolicy(), View())
    decide(policy, view, VadSpeechStarted(0))
    policy.plan_append(view, AudioIn(np.zeros(4800, np.int16), 0))
    plan = policy.plan_append(view, TextIn("and this"))
    assert plan.mode is InputMode.APPEND_TOKENS
    payloads = [s.payload for s in plan.submissions]
    assert isinstance(payloads[-2], OmniUnit) and payloads[-2].duration_ms == 300
    assert payloads[-1] == TextIn("and this")


def test_an_input_image_goes_to_the_model_at_once():
    policy, view = with_state(OmniPolicy(), View())
    plan = policy.plan_append(view, frame(10, 20, ts=5, source="image"))
    (unit,) = units([plan])
    assert unit.samples == 0 and unit.frames[0].shape == (20, 10, 3)


def test_vad_config_goes_to_the_vad():
    plan = OmniPolicy().plan_append(View(), VadConfig())
    assert [s.stage for s in plan.submissions] == ["vad"]


# ---- turn_commit_only (no turn detection) ------------------------------------------


def test_manual_turns_stream_nothing_until_commit():
    policy, view = with_state(OmniPolicy(), manual_view())
    f = Feeder(policy, view)
    f.audio(2500, fps=2)
    assert all(p.mode is InputMode.TURN_COMMIT_ONLY or p.mode is InputMode.REPLACE_LATEST_CHUNK
               or p.mode is InputMode.APPEND_AUDIO_CHUNK for p in f.plans)
    assert all(not p.submissions for p in f.plans)
    audio = np.ones(2500 * 16, np.int16)
    plan = policy.plan_append(view, TurnCommitted("item_1", audio))
    got = units([plan])
    assert [u.duration_ms for u in got] == [1000, 1000, 500]
    assert [len(u.frames) for u in got] == [1, 1, 1]
    assert got[0].frame_ms == (500,) and got[2].frame_ms == (2000,)
    assert got[-1].final and not got[0].final
    # The next turn starts afresh.
    assert units([policy.plan_append(view, TurnCommitted("item_2", np.ones(160, np.int16)))])[0].frames == ()


def test_manual_commit_uses_the_buffers_audio():
    """A cleared input buffer stays cleared: the committed audio is what counts."""
    policy, view = with_state(OmniPolicy(), manual_view())
    Feeder(policy, view).audio(3000)
    got = units([policy.plan_append(view, TurnCommitted("item_1", np.ones(8000, np.int16)))])
    assert [u.duration_ms for u in got] == [500]


def test_units_of_turn_puts_late_frames_in_the_last_unit():
    b = UnitBuilder(1000)
    got = units_of_turn(b, np.ones(32000, np.int16), 0, [(40000, frame(4, 4, ts=9))])
    assert [len(u.frames) for u in got] == [0, 1] and got[-1].final


# ---- outputs ----------------------------------------------------------------------


def test_barge_in_interrupts_the_active_response():
    policy, view = with_state(OmniPolicy(), View(active_response_id="resp_1"))
    barge_in = [Show(), Interrupt(InterruptReason.TURN_DETECTED)]
    assert list(decide(policy, view, VadSpeechStarted(0))) == barge_in
    quiet = View(active_response_id=None)
    assert list(decide(policy, quiet, VadSpeechStarted(0))) == [Show()]
    no_barge = View(active_response_id="resp_1")
    no_barge.config = dataclasses.replace(no_barge.config, turn_detection=dataclasses.replace(
        no_barge.config.turn_detection, interrupt_response=False))
    assert list(decide(policy, no_barge, VadSpeechStarted(0))) == [Show()]


def test_preroll_units_wait_for_the_next_chunk_after_a_barge_in():
    policy, view = with_state(OmniPolicy(unit_ms=100), View(active_response_id="resp_1"))
    Feeder(policy, view).audio(400)
    d = decide(policy, view, VadSpeechStarted(0))
    assert plan_of(d) is None  # the interrupt runs first ...
    plan = policy.plan_append(view, AudioIn(np.zeros(CHUNK, np.int16), 400))
    assert len(units([plan])) == 4  # ... then the pre-roll's complete units go


def test_vad_events_without_turn_detection_are_dropped():
    policy, view = with_state(OmniPolicy(), manual_view())
    assert not decide(policy, view, VadSpeechStarted(0))
    assert not decide(policy, view, VadSpeechStopped(0))


def test_create_response_follows_turn_detection():
    policy, view = with_state(OmniPolicy(), View())
    view.config = dataclasses.replace(view.config, turn_detection=dataclasses.replace(
        view.config.turn_detection, create_response=False))
    decide(policy, view, VadSpeechStarted(0))
    assert list(decide(policy, view, VadSpeechStopped(0))) == [Show(), CommitTurn()]


def test_text_reply_finishes_with_generation_done():
    policy, view = with_state(OmniPolicy(), View())
    assert list(policy.decide_output(view, out(TextDelta("r", "hi"), "omni"))) == [Show()]
    done = policy.decide_output(view, out(GenerationDone("r", "stop"), "omni"))
    assert list(done) == [Show(), FinishReply()]


def test_spoken_reply_goes_through_tts_and_finishes_with_speech_done():
    policy, view = with_state(OmniPolicy(), View())
    view.config = dataclasses.replace(view.config, output_modalities=("audio",))
    spoken = [Show(), ForwardTo("tts")]
    assert list(policy.decide_output(view, out(TextDelta("r", "hi"), "omni"))) == spoken
    done = policy.decide_output(view, out(GenerationDone("r", "stop"), "omni"))
    assert list(done) == spoken  # the reply finishes when its speech does
    audio = policy.decide_output(view, out(AudioOut("r", np.zeros(10, np.int16)), "tts"))
    assert list(audio) == [Show()]
    assert list(policy.decide_output(view, out(SpeechDone("r"), "tts"))) == [Show(), FinishReply()]


def test_native_audio_out_keeps_text_from_the_tts():
    policy, view = with_state(OmniPolicy(audio_out="native"), View())
    view.config = dataclasses.replace(view.config, output_modalities=("audio",))
    assert list(policy.decide_output(view, out(TextDelta("r", "hi"), "omni"))) == [Show()]
    done = policy.decide_output(view, out(GenerationDone("r", "stop"), "omni"))
    assert list(done) == [Show()]
    assert list(policy.decide_output(view, out(SpeechDone("r"), "omni"))) == [Show(), FinishReply()]


def test_it_declares_its_stages_and_its_state_follows_its_options():
    policy = OmniPolicy(unit_ms=500, frames_per_unit=2)
    assert policy.stage_needs().names == ("omni", "vad")  # tts only for spoken replies
    state = policy.new_state()
    assert isinstance(state, OmniState) and state is not policy.new_state()
    assert (state.builder.unit_ms, state.builder.frames_per_unit) == (500, 2)
