"""The Whisper ASR stage on real audio: questions spoken by Flite and eSpeak NG
are transcribed right; partials arrive while the audio streams; silence and
noise give no words; very quiet, clipped and long utterances get a correct
transcript; decoding runs on the stage's worker threads.

The models load once per test session (``whisper_model.load`` shares them).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import threading
from typing import Any

import numpy as np
import pytest
import soxr
from vllm_duplex.assets.files import AssetError
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    AsrConfig,
    AudioIn,
    EndOfUtterance,
    StageInput,
    TranscriptFinal,
    TranscriptPartial,
    UserPaused,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.stages.listening.whisper import WhisperAsrStage
from vllm_duplex.stages.listening.whisper_model import loop_start, looped, tail_loop, unlooped
from vllm_duplex.stages.speech.subprocess_tts import parse_wav
from vllm_duplex.testing import noise

pytestmark = pytest.mark.skipif(
    shutil.which("flite") is None or shutil.which("espeak-ng") is None,
    reason="needs the flite and espeak-ng binaries")

RATE = 16000
FENCE = Fence("s1")


def synth(argv: list[str], stdin: bytes | None = None) -> np.ndarray:
    out = subprocess.run(argv, input=stdin, capture_output=True, check=True, timeout=30).stdout
    pcm, rate = parse_wav(out)
    return soxr.resample(pcm, rate, RATE).astype(np.int16) if rate != RATE else pcm


def flite(text: str, voice: str = "slt") -> np.ndarray:
    return synth(["flite", "-voice", voice, "-t", text, "-o", "/dev/stdout"])


def espeak(text: str, voice: str = "en-us+f3") -> np.ndarray:
    return synth(["espeak-ng", "--stdout", "-v", voice], text.encode())


def padded(pcm: np.ndarray, lead_ms: int = 300, tail_ms: int = 600) -> np.ndarray:
    return np.concatenate([np.zeros(lead_ms * 16, np.int16), pcm, np.zeros(tail_ms * 16, np.int16)])


def spoken(text: str) -> list[str]:
    return re.sub(r"[^\w' ]", " ", text.lower()).split()


def item(payload: Any) -> StageInput:
    return StageInput(FENCE, FENCE.request_id("in"), payload)


@pytest.fixture(scope="module")
def stage():
    s = WhisperAsrStage(clock=MonotonicClock())
    yield s
    s.shutdown_workers()


async def transcribe(stage: WhisperAsrStage, pcm: np.ndarray, *, chunk_ms: int = 20,
                     vad: tuple[int, int] | None = None, paced: bool = True,
                     pause: bool = False, prompt: str | None = None,
                     language: str | None = None) -> list[Any]:
    """Stream ``pcm`` into a port (chunk by chunk, each processed before the
    next: a worker keeping up with real time), end the utterance (VAD events
    at ``vad`` = (onset_ms, end_ms), or ``EndOfUtterance``; with ``pause``,
    semantic_vad's ``UserPaused`` at end_ms first), return the outputs."""
    port = stage.port("s1")
    await port.open(FENCE)
    outputs: list[Any] = []

    async def read() -> None:
        async for out in port.outputs():
            outputs.append(out.payload)

    reader = asyncio.create_task(read())
    if prompt is not None or language is not None:
        await port.submit(item(AsrConfig(prompt, language)))
    n = chunk_ms * RATE // 1000
    for i in range(0, len(pcm), n):
        if vad is not None and i // 16 == vad[0] + 200:  # the VAD speaks after the onset
            await port.submit(item(VadSpeechStarted(vad[0])))
        await port.submit(item(AudioIn(pcm[i:i + n], i // 16)))
        if paced:
            await port.drained()
    if pause and vad is not None:
        await port.submit(item(UserPaused(vad[1])))
    await port.submit(item(VadSpeechStopped(vad[1]) if vad is not None else EndOfUtterance()))
    await port.drained()
    await port.close()
    await reader
    return outputs


def final_text(outputs: list[Any]) -> str:
    finals = [o for o in outputs if isinstance(o, TranscriptFinal)]
    assert len(finals) == 1, outputs
    return finals[0].text


async def test_the_sessions_prompt_spells_the_names_it_holds(stage):
    """OpenAI's transcription ``prompt``: a name Whisper cannot know is heard
    as written there -- in the partials and the final alike."""
    pcm = padded(flite("Send a message to Siobhan saying I will be late."))
    plain = await transcribe(stage, pcm)
    assert "siobhan" not in spoken(final_text(plain))
    prompted = await transcribe(stage, pcm, prompt="Siobhan")
    assert "siobhan" in spoken(final_text(prompted))
    assert "siobhan" in spoken([o.text for o in prompted if isinstance(o, TranscriptPartial)][-1])


async def test_the_sessions_language_is_the_one_whisper_decodes_in(stage):
    """``transcription.language`` on a multilingual model: French heard as
    French (without it, the stage's English decodes it as English sounds).
    With English-only partials (tiny.en) the stage hears English only."""
    assert stage.languages() == frozenset({"en"})  # whisper-base finals, tiny.en partials
    base = WhisperAsrStage(clock=MonotonicClock(), model="whisper-base", partial_model=None)
    try:
        assert {"en", "fr", "de", "ja"} <= base.languages()
        pcm = padded(synth(["espeak-ng", "--stdout", "-v", "fr+f3", "-s", "120"],
                           "Quelle est la capitale de la France ?".encode()))
        english = spoken(final_text(await transcribe(base, pcm)))
        french = spoken(final_text(await transcribe(base, pcm, language="fr")))
        assert {"capitale", "france"} <= set(french), french
        assert "capitale" not in english, english
    finally:
        base.shutdown_workers()


async def test_a_flite_question_is_transcribed_right_with_partials_first(stage):
    outputs = await transcribe(stage, padded(flite("What is the capital of France?")))
    assert spoken(final_text(outputs)) == ["what", "is", "the", "capital", "of", "france"]
    partials = [o.text for o in outputs if isinstance(o, TranscriptPartial)]
    assert partials and isinstance(outputs[-1], TranscriptFinal)
    assert all(a != b for a, b in zip(partials, partials[1:]))  # only when it changed
    assert "capital" in spoken(partials[-1])


async def test_an_espeak_voice_after_the_vad_is_decoded_from_the_onset(stage):
    """The VAD's speech_started comes after the onset it names (200 ms
    here, after a second of silence): the utterance starts at that onset,
    so the first words are heard and nothing is lost from either end. (eSpeak NG's
    en-us+f3 says "legs" in a way Whisper base hears as "lines" or "lens",
    depending on the CPU's GEMM kernels -- MKL or oneDNN, AVX2 or AVX-512:
    and its "have" as "head": a model's error, not the stage's, so only the
    onset's words, the question's subject and its length are pinned.)"""
    speech = espeak("How many legs does a spider have?")
    pcm = padded(speech, lead_ms=1000)
    outputs = await transcribe(stage, pcm, vad=(700, 1000 + len(speech) // 16))
    words = spoken(final_text(outputs))
    assert words[:2] == ["how", "many"] and "spider" in words and len(words) >= 6, words


async def test_a_pause_is_answered_with_every_word_up_to_it():
    """semantic_vad judges a pause on the words up to it. Here the scheduled
    partials stop after the first one (a tiny budget: each decode pushes the
    next one far out, as on a busy CPU; the early partial at a word's end
    stays within one interval of that schedule, so it never comes either):
    the answer to the pause still hears the whole question."""
    late = WhisperAsrStage(clock=MonotonicClock(), partial_budget=0.001)
    try:
        speech = flite("What is the capital of France?")
        end_ms = 300 + len(speech) * 1000 // RATE
        outputs = await transcribe(late, padded(speech, tail_ms=200), vad=(300, end_ms), pause=True)
    finally:
        late.shutdown_workers()
    partials = [o for o in outputs if isinstance(o, TranscriptPartial)]
    answer = partials[-1]
    assert answer.at_pause and not any(p.at_pause for p in partials[:-1])
    assert "france" not in spoken(" ".join(p.text for p in partials[:-1]))
    assert spoken(answer.text) == ["what", "is", "the", "capital", "of", "france"]
    assert isinstance(outputs[-1], TranscriptFinal) and spoken(final_text(outputs)) == spoken(answer.text)


async def test_a_decoder_loop_is_neither_shown_nor_taken_for_the_final(stage):
    """tiny.en greedy hears Flite's awb "Tell me about the Eiffel Tower." cut
    100 ms after its last loud sample as "Tell me about the Eiffel tour Tell
    me about the Eiffel tour Tell me about the Eiff" (average log-probability
    -0.16: "sure"; the soak showed such finals two and three times over)."""
    speech = flite("Tell me about the Eiffel Tower.", voice="awb")
    loud = np.nonzero(np.abs(speech) > 300)[0]
    cut = speech[:loud[-1] + 100 * RATE // 1000]
    heard = stage.partial_text(cut)
    assert not looped(heard.text) and spoken(heard.text)[:5] == ["tell", "me", "about", "the", "eiffel"]
    end_ms = 300 + len(cut) * 1000 // RATE
    outputs = await transcribe(stage, padded(cut, tail_ms=400), vad=(300, end_ms), pause=True)
    for text in [o.text for o in outputs if isinstance(o, TranscriptPartial)] + [final_text(outputs)]:
        assert not looped(text), outputs
    # (Which decode gives the final depends on the partials' schedule, which
    # follows the CPU: Whisper may hear "Eiffel" otherwise in another span.)
    assert spoken(final_text(outputs))[:4] == ["tell", "me", "about", "the"]


async def test_silence_and_noise_give_no_words(stage):
    rng = np.random.default_rng(3)
    noise = np.clip(rng.standard_normal(2 * RATE) * 3000, -32768, 32767).astype(np.int16)
    hum = (np.sin(np.arange(2 * RATE) * 2 * np.pi * 50 / RATE) * 2000).astype(np.int16)
    for pcm in (np.zeros(2 * RATE, np.int16), noise, hum):
        assert final_text(await transcribe(stage, pcm, chunk_ms=100, paced=False)) == ""


async def test_no_kind_of_noise_at_any_level_becomes_words(stage):
    """A manual turn (the whole buffer decoded, no VAD to filter it) of a
    fan, crowd babble, music, typing or a phone line's hiss, quiet to loud:
    neither a partial nor the final says a word (bench/no_speech.py measures
    these and the margins on both ISAs)."""
    talkers = [flite(t, v) for t, v in (
        ("The weather was lovely so we went down to the river.", "slt"),
        ("I told him the meeting had moved to Thursday.", "awb"),
        ("She bought apples and bread at the corner shop.", "rms"),
        ("Could you pass me the salt and the pepper please.", "kal16"),
        ("We should leave early tomorrow to avoid the traffic.", "slt"),
        ("My cousin is coming to visit us next summer.", "awb"))]
    for kind, make in noise.makers(talkers).items():
        for db in (-50, -30, -15):
            outputs = await transcribe(stage, make(2.0, db), chunk_ms=100, paced=False)
            said = [o.text for o in outputs if isinstance(o, (TranscriptPartial, TranscriptFinal))]
            assert not any(t.strip() for t in said), (kind, db, said)


async def test_very_quiet_and_clipped_speech_is_still_heard(stage):
    speech = flite("Please turn on the kitchen lights.")
    quiet = (speech.astype(np.float32) * 10 ** (-40 / 20)).astype(np.int16)  # 40 dB down
    clipped = np.clip(speech.astype(np.int32) * 8, -32768, 32767).astype(np.int16)
    for pcm in (quiet, clipped):
        words = spoken(final_text(await transcribe(stage, padded(pcm), chunk_ms=100)))
        assert {"kitchen", "lights"} <= set(words), words


async def test_a_long_utterance_is_not_truncated():
    """Over Whisper's 30 s window: decoded in 30 s windows, first word to last."""
    stage = WhisperAsrStage(clock=MonotonicClock(), partial_model=None, beam_size=1)  # (faster)
    sentences = ["The first thing I did this morning was to feed the cat.",
                 "Then I walked to the bakery on the corner for some bread.",
                 "The baker told me about the storm that is coming tonight.",
                 "On the way home I met my neighbour who was washing his car.",
                 "We talked about football and the weather for a while.",
                 "After lunch I read a book about the history of Rome.",
                 "In the evening my sister called to ask about the holidays.",
                 "My brother sent a photo of his new garden with yellow roses.",
                 "Finally I cooked pasta with tomatoes and went to bed early."]
    pcm = np.concatenate([padded(flite(s), 200, 400) for s in sentences])
    assert len(pcm) > 33 * RATE
    try:
        words = spoken(final_text(await transcribe(stage, pcm, chunk_ms=500, paced=False)))
    finally:
        await stage.close()
    assert words[:4] == ["the", "first", "thing", "i"], words
    assert {"bakery", "storm", "football", "rome", "sister", "garden", "pasta", "bed"} <= set(words), words


async def test_decoding_runs_on_the_stage_threads_not_the_loop(stage, monkeypatch):
    threads: set[str] = set()
    original = stage.final_text

    def spy(pcm: np.ndarray, prompt: str | None = None) -> str:
        threads.add(threading.current_thread().name)
        return original(pcm, prompt)

    monkeypatch.setattr(stage, "final_text", spy)
    port = stage.port("s1")
    await port.open(FENCE)
    await port.submit(item(AudioIn(flite("Hello there."), 0)))
    await port.submit(item(EndOfUtterance()))
    await port.drained()
    await port.close()
    assert threads and all(t.startswith("duplex-asr") for t in threads), threads


def test_a_model_that_is_not_there_stops_the_stage(tmp_path):
    with pytest.raises(AssetError, match="is not a CTranslate2 Whisper model directory"):
        WhisperAsrStage(clock=MonotonicClock(), model=tmp_path)


async def test_any_faster_whisper_directory_loads(stage):
    """The prepared tiny.en directory, named by path as a user would name their own."""
    path = stage.partial_model.model_dir
    other = WhisperAsrStage(clock=MonotonicClock(), model=str(path), partial_model=None,
                            warm_up=False)
    try:
        text = final_text(await transcribe(other, padded(flite("Good morning.")), chunk_ms=100))
    finally:
        await other.close()
    assert spoken(text) == ["good", "morning"]


def test_a_loop_is_found_and_cut_where_it_starts():
    loop = "Tell me about the Eiffel tour Tell me about the Eiffel tour Tell me about the Eiff"
    assert loop_start(loop) == 6 and unlooped(loop) == "Tell me about the Eiffel tour"
    assert unlooped("What is the capital? What is the capital?") == "What is the capital?"
    for fine in ("What is the capital of France?", "no no no", "bye bye, see you", ""):
        assert not looped(fine) and unlooped(fine) == fine


def test_a_loop_to_the_end_is_the_utterance_said_again_into_the_silence():
    # Whisper on short real phrases: the first run is what it heard (kept, cut there)
    assert tail_loop("3, 1, 4, 3, 1, 4,") and unlooped("3, 1, 4, 3, 1, 4,") == "3, 1, 4,"
    assert tail_loop("Tell me about the Eiffel tour Tell me about the Eiffel tour Tell me about the Eiff")
    # words after the loop that are not the run again: a decoder lost, decoded again
    assert not tail_loop("the the cat the the cat sat on the mat today")
    assert not tail_loop("What is the capital of France?") and not tail_loop("no no no")
