"""What a lagging session may merge: adjacent text or audio deltas of one
request, fence and stage -- nothing else."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    AudioOut,
    GenerationDone,
    StageOutput,
    TextDelta,
    TranscriptDelta,
)
from vllm_duplex.session.coalesce import merge_outputs, merge_queued

F = Fence("s")


def out(payload, *, fence: Fence = F, role: str = "llm", stage: str = "llm") -> StageOutput:
    return StageOutput(fence, fence.request_id(role), stage, payload)


def test_text_deltas_of_one_request_become_one():
    merged = merge_outputs(out(TextDelta("r", "Hello ")), out(TextDelta("r", "there")))
    assert merged == out(TextDelta("r", "Hello there"))


def test_audio_continues_a_segment_but_never_starts_one():
    a = out(AudioOut("r", np.arange(3, dtype=np.int16), 24000, "Hello."), stage="tts")
    b = out(AudioOut("r", np.arange(3, 5, dtype=np.int16), 24000, ""), stage="tts")
    merged = merge_outputs(a, b)
    assert merged is not None and merged.payload.text == "Hello." and merged.payload.rate == 24000
    assert merged.payload.pcm.tolist() == [0, 1, 2, 3, 4]
    starts_a_sentence = dataclasses.replace(b, payload=dataclasses.replace(b.payload, text="Bye."))
    assert merge_outputs(a, starts_a_sentence) is None
    other_rate = dataclasses.replace(b, payload=dataclasses.replace(b.payload, rate=16000))
    assert merge_outputs(a, other_rate) is None


@pytest.mark.parametrize("newer", [
    out(TextDelta("r", "x"), fence=F.next_epoch()),  # another fence: the gate judges each
    out(TextDelta("r", "x"), role="other"),  # another request
    out(TextDelta("r", "x"), stage="omni"),  # another stage
    out(TextDelta("r2", "x")),  # another response
    out(GenerationDone("r", "stop")),  # not a delta
])
def test_anything_else_stays_apart(newer):
    assert merge_outputs(out(TextDelta("r", "a")), newer) is None


def test_transcripts_are_never_merged():
    t = out(TranscriptDelta("what "), stage="asr")
    assert merge_outputs(t, out(TranscriptDelta("is"), stage="asr")) is None


def test_a_merged_entry_keeps_the_older_arrival_time():
    merged = merge_queued((1.0, out(TextDelta("r", "a"))), (2.0, out(TextDelta("r", "b"))))
    assert merged == (1.0, out(TextDelta("r", "ab")))
