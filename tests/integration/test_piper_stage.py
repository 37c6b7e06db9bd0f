"""The Piper TTS stage: the packaged neural voice speaks, Whisper hears it
right, a reply is spoken clause by clause (the first audio before the text is
complete), output comes at the asked rate, a cancel stops the piece in
progress. Phonemes and ids are checked on their own too.

The voice and the Whisper model load once per test session.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import re
import shutil
import subprocess
import threading
from typing import Any

import numpy as np
import pytest
import uvloop
from vllm_duplex.assets.files import AssetError
from vllm_duplex.assets.locate import whisper_model_dir
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    AudioOut,
    EndOfText,
    SpeechDone,
    StageInput,
    TextDelta,
)
from vllm_duplex.stages.listening.whisper_model import load
from vllm_duplex.stages.speech.piper import PiperTtsStage
from vllm_duplex.stages.speech.phonemizer import MARKER, EspeakPhonemizer, PhonemizerError
from vllm_duplex.stages.speech.piper_voice import continued, espeak_argv, ipa_with_punctuation

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="needs the espeak-ng binary (Piper's phonemizer)")

FENCE = Fence("s1")


def item(payload: Any, fence: Fence = FENCE) -> StageInput:
    return StageInput(fence, fence.request_id("tts"), payload)


def spoken(text: str) -> list[str]:
    return re.sub(r"[^\w' ]", " ", text.lower()).split()


@pytest.fixture(scope="module")
def stage():
    s = PiperTtsStage(clock=MonotonicClock())
    yield s
    s.shutdown_workers()


@pytest.fixture(scope="module")
def whisper():
    return load(whisper_model_dir("whisper-base"), threads=2)


class Speech:
    """A port and what it said, read in the background."""

    def __init__(self, stage: PiperTtsStage) -> None:
        self.port = stage.port("s1")
        self.outputs: list[Any] = []
        self.changed = asyncio.Event()

    async def __aenter__(self) -> Speech:
        await self.port.open(FENCE)
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        async for out in self.port.outputs():
            self.outputs.append(out.payload)
            self.changed.set()

    async def wait(self, kind: type, timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while not any(isinstance(o, kind) for o in self.outputs):
                self.changed.clear()
                await self.changed.wait()

    async def __aexit__(self, *exc: Any) -> None:
        await self.port.close()
        await self._reader

    def audio(self) -> np.ndarray:
        return np.concatenate([o.pcm for o in self.outputs if isinstance(o, AudioOut)])


async def say(stage: PiperTtsStage, text: str) -> Speech:
    async with Speech(stage) as speech:
        await speech.port.submit(item(TextDelta("r1", text)))
        await speech.port.submit(item(EndOfText("r1")))
        await speech.wait(SpeechDone)
    return speech


def word_errors(ref: list[str], hyp: list[str]) -> int:
    """Substitutions, deletions and insertions that turn ``ref`` into ``hyp``."""
    ops = difflib.SequenceMatcher(None, ref, hyp, autojunk=False).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in ops if op != "equal")


HEARD = ("Paris is the capital of France, and it is known for the Eiffel Tower.",
         "The weather today is sunny with a light breeze from the west.",
         "Please remind me to call my mother this evening.",
         "How many legs does a spider have?")


async def test_the_voice_is_heard_right_by_whisper(stage, whisper):
    """A word error rate, not an exact match: the voice samples its prosody
    (VITS noise), and Whisper base mishears a few words of some takes. In 20
    runs of these 42 words, 0-4 errors: "Paris is" heard as "terraces" in 3,
    "a light" as "the light", "have" as "half". A broken voice (wrong rate,
    wrong phonemes, noise) is heard as nothing like the text."""
    errors = words = 0
    for text in HEARD:
        speech = await say(stage, text)
        assert isinstance(speech.outputs[-1], SpeechDone)
        pcm = speech.audio()
        n = len(text.split())
        assert 0.15 * n < len(pcm) / 16000 < 0.5 * n + 1.0  # speech at a speaking rate
        errors += word_errors(spoken(text), spoken(whisper.transcribe(pcm).text))
        words += len(spoken(text))
    assert errors / words <= 0.2, f"{errors} word errors in {words}"


async def test_a_reply_is_spoken_clause_by_clause_before_its_text_ends(stage):
    async with Speech(stage) as speech:
        for word in "Sure thing, the answer is four, and that is all I know about it.".split(" "):
            await speech.port.submit(item(TextDelta("r1", word + " ")))
        await speech.wait(AudioOut)  # the first phrase is spoken: the reply is not over
        first = next(o for o in speech.outputs if isinstance(o, AudioOut))
        assert first.text == "Sure thing, "  # its first clause mark, two words in
        await speech.port.submit(item(EndOfText("r1")))
        await speech.wait(SpeechDone)
    pieces = [o.text for o in speech.outputs if isinstance(o, AudioOut) and o.text]
    assert pieces[0] == "Sure thing, " and len(pieces) >= 2
    assert "".join(pieces) == "Sure thing, the answer is four, and that is all I know about it. "


async def test_output_comes_at_the_session_rate():
    stage24 = PiperTtsStage(clock=MonotonicClock(), rate=24000, warm_up=False)
    try:
        speech = await say(stage24, "Hello there.")
    finally:
        stage24.shutdown_workers()
    chunks = [o for o in speech.outputs if isinstance(o, AudioOut)]
    assert chunks and all(o.rate == 24000 for o in chunks)
    assert 0.4 < sum(len(o.pcm) for o in chunks) / 24000 < 2.0


async def test_cancel_stops_the_piece_in_progress(stage, monkeypatch):
    long = " ".join(["This sentence goes on and on without any end in sight"] * 8) + "."
    phonemized = asyncio.Event()
    original = stage.phonemize
    loop = asyncio.get_running_loop()

    def spy(text: str) -> str:  # on the stage's worker thread
        ipa = original(text)
        if len(text.split()) > 40:  # the long second piece: its ONNX run starts now
            loop.call_soon_threadsafe(phonemized.set)
        return ipa

    monkeypatch.setattr(stage, "phonemize", spy)
    runs = stage.cancelled_runs
    async with Speech(stage) as speech:
        await speech.port.submit(item(TextDelta("r1", long)))
        await speech.port.submit(item(EndOfText("r1")))
        # The first piece is spoken and the second one is being synthesized
        # (seconds of ONNX work): a cancel now lands inside that run. Polling
        # the outputs instead can land between the first piece's chunks.
        await asyncio.wait_for(phonemized.wait(), 30)
        assert any(isinstance(o, AudioOut) for o in speech.outputs)
        await speech.port.cancel(FENCE.next_epoch())
        count = len(speech.outputs)
        await asyncio.sleep(0.3)
        assert len(speech.outputs) == count  # nothing after the cancel returned
    assert not any(isinstance(o, SpeechDone) for o in speech.outputs)
    assert stage.cancelled_runs == runs + 1  # the ONNX run was stopped, not left to finish


def test_an_unknown_voice_is_refused(tmp_path):
    with pytest.raises(AssetError, match="neither a pinned voice"):
        PiperTtsStage(clock=MonotonicClock(), voice=str(tmp_path / "nope.onnx"))


def test_phoneme_ids_follow_the_voice_map(stage):
    ids = stage.voice.phoneme_ids("ab")
    id_map = stage.voice.config.id_map
    assert ids == [*id_map["^"], *id_map["_"], *id_map["a"], *id_map["_"], *id_map["b"],
                   *id_map["_"], *id_map["$"]]
    assert stage.voice.phoneme_ids("a\u2603") == stage.voice.phoneme_ids("a")  # unknown: skipped


def test_a_piece_cut_before_its_sentence_ends_is_spoken_as_going_on(stage):
    """The reply's first two words ("A week") are voiced as a clause that
    goes on (a comma), not as a sentence that ends there."""
    assert continued("A week") == "A week,"
    assert continued("Sure thing, ") == "Sure thing,"
    for done in ("It is Paris.", "Really?", 'He said "hi."', "Wait (really)!"):
        assert continued(done) == done
    # On the stage's worker threads, as it phonemizes.
    assert stage._executor.submit(stage.phonemize, "A week").result().endswith(",")
    assert stage._executor.submit(stage.phonemize, "A week has seven days.").result().endswith(".")


def test_clause_punctuation_is_put_back():
    assert ipa_with_punctuation("Hello, world. How are you?", "a\nb\nc\n") == "a, b. c?"
    assert ipa_with_punctuation("Hello there", "a\n") == "a"
    assert ipa_with_punctuation("Sure, the answer", "a\nb\n") == "a, b"
    # espeak-ng split elsewhere (numbers, abbreviations): its breaks become commas
    assert ipa_with_punctuation("It costs 3.5 dollars; e.g. cheap!", "x\ny\n") == "x, y!"
    assert ipa_with_punctuation("...", "") == ""


# Forks seen by os.register_at_fork (a hook cannot be removed: it records only
# while a test asks). uvloop's subprocess start runs these hooks (it forks the
# whole process, on the loop thread, with the GIL held); subprocess.Popen's
# vfork does not.
FORKS: list[int] | None = None


def _record_fork() -> None:
    if FORKS is not None:
        FORKS.append(threading.get_ident())


os.register_at_fork(before=_record_fork)


def test_speaking_never_forks_the_server(stage):
    """Under uvloop (the server's loop) a process started per piece forked the
    server on the event loop: 80-250 ms of every session frozen per piece
    (issue 21). The phonemes now come from espeak-ng processes that stay up."""
    global FORKS
    text = ("Paris is the capital of France. It is known for the Eiffel Tower, the Louvre, "
            "and its cafes. Many people visit it every year.")

    async def speak_twice() -> int:
        for _ in range(2):
            speech = await say(stage, text)
            assert isinstance(speech.outputs[-1], SpeechDone)
        return threading.get_ident()

    FORKS = []
    synthesized = stage.synthesized
    try:
        loop_thread = uvloop.run(speak_twice())
        forks = FORKS
    finally:
        FORKS = None
    assert stage.synthesized >= synthesized + 6  # several pieces, twice
    assert loop_thread not in forks and forks == []
    starts = [p.starts for p in stage._phonemizers]
    assert 1 <= len(starts) <= 2 and all(n == 1 for n in starts)  # one per piece at once, kept up


def test_a_phonemizer_that_dies_is_started_again(stage):
    phonemizer = EspeakPhonemizer(espeak_argv(stage.espeak_voice), timeout_s=5)
    try:
        first = phonemizer.phonemize("The capital of France is Paris.")
        assert first == "ðə kˈæpɪɾəl ʌv fɹˈæns ɪz pˈæɹɪs\n"
        assert phonemizer.phonemize(f"Hello, {MARKER} there.") == "həlˈoʊ\nðˈɛɹ\n"
        assert phonemizer.phonemize("...") == "" and phonemizer.phonemize("  ") == ""
        assert phonemizer._proc is not None
        phonemizer._proc.kill()
        phonemizer._proc.wait()
        assert phonemizer.phonemize("The capital of France is Paris.") == first
        assert phonemizer.starts == 2
    finally:
        phonemizer.close()
    assert phonemizer._proc is None


def test_a_phonemizer_that_hangs_fails_in_time_and_is_stopped():
    phonemizer = EspeakPhonemizer(["sleep", "30"], timeout_s=0.5)
    with pytest.raises(PhonemizerError, match="no answer within 0.5 s"):
        phonemizer.phonemize("Hello there.")
    assert phonemizer._proc is None  # killed, not left behind


def test_the_phonemes_are_those_of_espeak_run_on_the_text_alone(stage):
    texts = ["Hello there, how are you?", "It costs $3.50 e.g. today.",
             "Dr. Smith lives on St. James St.", "1999 was a good year; 2000 too.", "OK."]
    phonemizer = EspeakPhonemizer(espeak_argv(stage.espeak_voice))
    try:
        for text in texts:
            alone = subprocess.run(espeak_argv(stage.espeak_voice), input=text.encode(),
                                   capture_output=True, check=True).stdout.decode()
            assert phonemizer.phonemize(text) == alone
    finally:
        phonemizer.close()
