"""The turn's phase: one value, moved only along its table, and always true
to the reply it describes.

A ``SessionCore`` with the real cascade policy is driven by random walks of
what a session meets -- speech, pauses, words, ``P(end)``, a reply's text
and audio and its end, the client's ``response.create`` (with and without
its own tools) and ``response.cancel``, truncation, timers firing, the turn
detection switched mid-turn -- on a virtual clock. Whatever the order, no
move off the table happens (it would be an ``internal_error`` event), and
after every message the phase agrees with the floor: no reply in
``listening``/``paused``, a held one in ``answer_held``, a shown one in
``responding``/``barge_paused``, ``paused`` exactly while a pause's end of
speech is held with no reply.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain.interruption import Interruption, OutputPacing
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import (
    AudioOut,
    GenerationDone,
    SpeechDone,
    StageOutput,
    TextDelta,
    TranscriptFinal,
    TranscriptPartial,
    TurnEndProbability,
    VadPaused,
    VadResumed,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.session_config import SessionConfig, SessionPatch, TurnDetection
from vllm_duplex.models.cascade import CascadePolicy
from vllm_duplex.session.core import SessionCore
from vllm_duplex.session.effects import ArmTimer, CancelTimer, Emit, TimerFired
from vllm_duplex.session.phase import TRANSITIONS, Phase, TurnPhase

WORDS = ("what is the capital of france", "tell me a joke", "so um", "what is the capital of")
TOOLS = ({"type": "function", "name": "lookup", "description": "Look it up",
          "parameters": {"type": "object", "properties": {}}},)
MODES = (TurnDetection(type="semantic_vad", eagerness="auto"),
         TurnDetection(type="semantic_vad", eagerness="high"),
         TurnDetection(type="server_vad", silence_duration_ms=500))


def test_every_phase_is_reached_and_left_along_the_table():
    phases = set(Phase)
    assert {a for a, _ in TRANSITIONS} == phases and {b for _, b in TRANSITIONS} == phases
    phase = TurnPhase()
    phase.to(Phase.PAUSED)
    phase.to(Phase.ANSWER_HELD)
    phase.to(Phase.RESPONDING)
    assert phase.why == TRANSITIONS[(Phase.ANSWER_HELD, Phase.RESPONDING)]
    with pytest.raises(AssertionError, match="no move from responding to answer_held"):
        phase.to(Phase.ANSWER_HELD)


class Walk:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        policy = CascadePolicy()
        pacing = OutputPacing("none") if self.rng.random() < 0.5 else OutputPacing()
        mode = "immediate" if self.rng.random() < 0.3 else "adaptive"
        config = SessionConfig(model="m", policy=policy.name, turn_detection=self.rng.choice(MODES),
                               pacing=pacing, interruption=Interruption(mode))
        self.core = SessionCore("s", config=config, policy=policy,
                                stage_names=("vad", "asr", "llm", "tts"), metrics=Metrics(),
                                now=0.0)
        self.now = 0.0
        self.audio_ms = 0
        self.timers: dict[str, float] = {}
        self.errors: list[str] = []
        self.track(self.core.start("tok", 0.0))

    def track(self, effects: list) -> None:
        for e in effects:
            if isinstance(e, ArmTimer):
                self.timers[e.name] = e.at
            elif isinstance(e, CancelTimer):
                self.timers.pop(e.name, None)
            elif isinstance(e, Emit) and e.envelope.event.type == "error":
                error = e.envelope.event.error
                if error.code == "internal_error":
                    self.errors.append(error.message)

    def out(self, stage: str, payload: object) -> None:
        fence = self.core.fence
        self.track(self.core.handle(StageOutput(fence, fence.request_id(stage), stage, payload),
                                    self.now))

    def command(self, c: object) -> None:
        self.track(self.core.handle(c, self.now))

    def step(self) -> None:
        rng, core = self.rng, self.core
        self.now += rng.choice((0.01, 0.05, 0.1, 0.3))
        if self.timers and rng.random() < 0.3:  # the earliest armed timer fires
            name = min(self.timers, key=self.timers.__getitem__)
            self.now = max(self.now, self.timers.pop(name))
            self.track(core.handle(TimerFired(name), self.now))
            return
        reply = core.floor.reply
        rid = reply.id if reply is not None and rng.random() < 0.9 else "resp_other"
        words = rng.choice(WORDS)
        self.audio_ms += 100
        choice = rng.randrange(17)
        if choice == 0:
            self.command(cmd.AudioAppend(audio=bytes(4800)))
        elif choice == 1:
            self.out("vad", VadSpeechStarted(audio_ms=self.audio_ms))
        elif choice == 2:
            self.out("vad", VadSpeechStopped(audio_ms=self.audio_ms))
        elif choice == 3:
            self.out("vad", VadPaused(audio_ms=self.audio_ms))
        elif choice == 4:
            self.out("vad", VadResumed(audio_ms=self.audio_ms))
        elif choice == 5:
            self.out("asr", TranscriptPartial(words, at_pause=rng.random() < 0.5))
        elif choice == 6:
            self.out("asr", TranscriptFinal(words))
        elif choice == 7:
            self.out("llm", TurnEndProbability(rng.choice((0.0004, 0.02, 0.9)), words))
        elif choice == 8:
            self.out("llm", TextDelta(rid, "Paris is the capital."))
        elif choice == 9:
            self.out("tts", AudioOut(rid, np.zeros(rng.choice((800, 4800, 24000)), np.int16),
                                     text="Paris"))
        elif choice == 10:
            self.out("llm", GenerationDone(rid, "stop"))
        elif choice == 11:
            self.out("tts", SpeechDone(rid))
        elif choice == 12:
            own = rng.random() < 0.5
            self.command(cmd.ResponseCreate(options=cmd.ResponseOptions(
                tools=TOOLS if own else None)))
        elif choice == 13:
            self.command(cmd.ResponseCancel())
        elif choice == 14:
            shown = core.shown
            if shown is not None and shown.record is not None and shown.record.part.audio_ms:
                self.command(cmd.ItemTruncate(item_id=shown.record.item.id, content_index=0,
                                              audio_end_ms=shown.record.part.audio_ms // 2))
        elif choice == 15:
            self.command(cmd.SessionUpdate(patch=SessionPatch(turn_detection=rng.choice(MODES))))
        else:
            self.command(cmd.AudioCommit())

    def check(self) -> None:
        floor = self.core.floor
        phase, reply = floor.phase.value, floor.reply
        assert not self.errors, self.errors
        if phase in (Phase.LISTENING, Phase.PAUSED):
            assert reply is None
            assert (phase is Phase.PAUSED) == self.core.pause.pausing
        elif phase is Phase.ANSWER_HELD:  # held: the client has seen nothing of it
            assert reply is not None and reply.record is None
        else:  # shown: what the client sees of it is recorded
            assert reply is not None and reply.record is not None
        assert self.core.output_paused == (phase is Phase.BARGE_PAUSED)


@pytest.mark.parametrize("seed", range(300))
def test_a_random_walk_moves_the_phase_only_along_its_table_and_keeps_it_true(seed):
    walk = Walk(seed)
    for _ in range(150):
        walk.step()
        walk.check()
