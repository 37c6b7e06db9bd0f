"""The real speech stages: Silero VAD, PocketSphinx ASR, Flite / eSpeak NG TTS.

Speech is synthesized here with the installed TTS binaries, so the stages are
tested on real audio with known boundaries, and no model is downloaded.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    AudioIn,
    AudioOut,
    GenerationDone,
    SpeechDone,
    StageInput,
    TextDelta,
    TranscriptFinal,
    TranscriptPartial,
    UserPaused,
    VadConfig,
    VadPaused,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.stages.listening.pocketsphinx import (
    EndOfUtterance,
    PocketSphinxAsrStage,
    clean_hypothesis,
)
from vllm_duplex.stages.listening.silero_vad import (
    SUGGESTED_QUIET_DBFS,
    WINDOW,
    SileroVad,
    SileroVadStage,
    load_model,
)
from vllm_duplex.stages.port import StagePort
from vllm_duplex.stages.speech.pieces import next_piece
from vllm_duplex.stages.speech.subprocess_tts import (
    EspeakTtsStage,
    FliteTtsStage,
    SubprocessTtsStage,
    parse_wav,
)

pytestmark = pytest.mark.skipif(
    shutil.which("flite") is None or shutil.which("espeak-ng") is None,
    reason="needs the flite and espeak-ng binaries")

RATE = 16000
PHRASE = "what is the capital of france"
PAD_MS = 500
SESSION = "s1"
FENCE = Fence(SESSION)


# ---- audio fixtures --------------------------------------------------------


def synth(argv: list[str], stdin: bytes | None = None) -> np.ndarray:
    out = subprocess.run(argv, input=stdin, capture_output=True, check=True, timeout=30).stdout
    pcm, rate = parse_wav(out)
    if rate != RATE:
        import soxr

        pcm = soxr.resample(pcm, rate, RATE)
    return pcm


def speech_bounds_ms(pcm: np.ndarray) -> tuple[int, int]:
    """First and last 10 ms frame louder than -50 dBFS: the true speech extent."""
    frames = pcm[: len(pcm) // 160 * 160].reshape(-1, 160).astype(np.float64)
    loud = np.nonzero(np.sqrt((frames**2).mean(axis=1)) > 32768 * 10 ** (-50 / 20))[0]
    return int(loud[0]) * 10, int(loud[-1] + 1) * 10


def padded(pcm: np.ndarray) -> np.ndarray:
    """0.5 s of silence before; 1 s after, so the VAD's 500 ms of silence
    to end a turn fits whatever window grid the speech ends on."""
    ms = RATE // 1000
    return np.concatenate([np.zeros(PAD_MS * ms, np.int16), pcm.astype(np.int16),
                           np.zeros(2 * PAD_MS * ms, np.int16)])


@pytest.fixture(scope="module")
def flite_speech() -> tuple[np.ndarray, tuple[int, int]]:
    raw = synth(["flite", "-voice", "slt", "-t", PHRASE, "-o", "/dev/stdout"])
    start, end = speech_bounds_ms(raw)
    return padded(raw), (start + PAD_MS, end + PAD_MS)


@pytest.fixture(scope="module")
def espeak_speech() -> tuple[np.ndarray, tuple[int, int]]:
    raw = synth(["espeak-ng", "--stdout", "-v", "en-us"], PHRASE.encode())
    start, end = speech_bounds_ms(raw)
    return padded(raw), (start + PAD_MS, end + PAD_MS)


def chunks(pcm: np.ndarray, ms: int) -> list[AudioIn]:
    n = ms * RATE // 1000
    return [AudioIn(pcm[i : i + n], start_ms=i * 1000 // RATE) for i in range(0, len(pcm), n)]


# ---- port helpers ----------------------------------------------------------


class Collector:
    """Reads a port's outputs in the background until the port closes."""

    def __init__(self, port: StagePort) -> None:
        self.port = port
        self.items: list[Any] = []
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for out in self.port.outputs():
            self.items.append(out)
            self._changed.set()

    @property
    def payloads(self) -> list[Any]:
        return [o.payload for o in self.items]

    async def until(self, pred: Callable[[list[Any]], bool], timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while not pred(self.payloads):
                self._changed.clear()
                await self._changed.wait()

    async def close(self) -> None:
        await self.port.close()
        await self._task


async def opened(stage: Any) -> tuple[Any, Collector]:
    port = stage.port(SESSION)
    await port.open(FENCE)
    return port, Collector(port)


def item(payload: Any, fence: Fence = FENCE) -> StageInput:
    return StageInput(fence, fence.request_id("in"), payload)


# ---- Silero VAD ------------------------------------------------------------


def vad_events(pcm: np.ndarray, chunk_sizes: list[int], config: VadConfig,
               **options: Any) -> list[Any]:
    vad = SileroVad(load_model("onnx"), config=config, **options)
    events, pos, k = [], 0, 0
    while pos < len(pcm):
        n = chunk_sizes[k % len(chunk_sizes)]
        events += vad.feed(pcm[pos : pos + n], pos // 16)
        pos, k = pos + n, k + 1
    return events


@pytest.fixture
async def vad_stage():
    stage = SileroVadStage(clock=MonotonicClock())
    yield stage
    stage.shutdown_workers()


async def run_vad(stage: SileroVadStage, pcm: np.ndarray, chunk_ms: int,
                  config: VadConfig | None = None) -> list[Any]:
    port, coll = await opened(stage)
    if config is not None:
        await port.submit(item(config))
    for c in chunks(pcm, chunk_ms):
        await port.submit(item(c))
    await port.drained()
    await coll.close()
    return coll.payloads


async def test_silero_finds_the_one_utterance_and_its_boundaries(vad_stage, flite_speech):
    pcm, (start, end) = flite_speech
    config = VadConfig(prefix_padding_ms=0, silence_duration_ms=500)
    events = await run_vad(vad_stage, pcm, 20, config)
    assert [type(e) for e in events] == [VadSpeechStarted, VadSpeechStopped]
    assert abs(events[0].audio_ms - start) <= 150
    assert abs(events[1].audio_ms - end) <= 150
    assert vad_stage.completed_requests == len(chunks(pcm, 20))


async def test_silero_prefix_padding_and_espeak_voice(vad_stage, espeak_speech):
    pcm, (start, end) = espeak_speech
    events = await run_vad(vad_stage, pcm, 20)  # defaults: 300 ms padding
    assert [type(e) for e in events] == [VadSpeechStarted, VadSpeechStopped]
    assert abs(events[0].audio_ms - (start - 300)) <= 150
    assert abs(events[1].audio_ms - end) <= 150


async def test_silero_ignores_silence_and_white_noise(vad_stage):
    rng = np.random.default_rng(7)
    noise = rng.standard_normal(3 * RATE) * 32768 * 10 ** (-30 / 20)  # RMS -30 dBFS
    assert await run_vad(vad_stage, np.zeros(3 * RATE, np.int16), 20) == []
    assert await run_vad(vad_stage, np.clip(noise, -32768, 32767).astype(np.int16), 20) == []


def test_silero_hears_the_pause_as_the_voice_stops(flite_speech):
    """Silero's state lags the audio (the window after the last word still
    scores ~1): with ``quiet_dbfs``, once speaking, a window quieter than
    -50 dBFS is silence, so the pause and the end of speech are where the
    voice stopped."""
    pcm, (_, end) = flite_speech
    config = VadConfig(pause_ms=100)
    gated = vad_events(pcm, [320], config, quiet_dbfs=SUGGESTED_QUIET_DBFS)
    silero_alone = vad_events(pcm, [320], config)
    assert [type(e) for e in gated] == [VadSpeechStarted, VadPaused, VadSpeechStopped]
    assert abs(gated[1].audio_ms - end) <= 40 and gated[2].audio_ms == gated[1].audio_ms
    assert silero_alone[1].audio_ms - end >= 60  # what the gate saves
    assert gated[0] == silero_alone[0]  # the onset is Silero's alone


def test_silero_alone_judges_the_end_over_noise_louder_than_the_quiet_floor(flite_speech):
    pcm, _ = flite_speech
    rng = np.random.default_rng(1)
    noise = rng.standard_normal(len(pcm)) * 32768 * 10 ** (-45 / 20)
    noisy = np.clip(pcm + noise, -32768, 32767).astype(np.int16)
    config = VadConfig(pause_ms=100)
    events = vad_events(noisy, [320], config, quiet_dbfs=SUGGESTED_QUIET_DBFS)
    assert [type(e) for e in events] == [VadSpeechStarted, VadPaused, VadSpeechStopped]
    assert events == vad_events(noisy, [320], config)


class ScriptedSilero:
    """Silero's interface with the probabilities of a script, one per window."""

    def __init__(self, probabilities: list[float]) -> None:
        self.probabilities = iter(probabilities)

    def new_state(self) -> np.ndarray:
        return np.zeros(1, np.float32)

    def infer(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        return next(self.probabilities, 0.0), state


@pytest.mark.parametrize(("script", "onset_window"), [
    ([0.0, 0.9, 0.9, 0.9], 1),  # sure: speech starts on its first window (32 ms)
    ([0.0, 0.6, 0.9, 0.9], 1),  # unsure: a second voiced window confirms it (64 ms)
    ([0.0, 0.6, 0.0, 0.6, 0.0, 0.58, 0.0], None),  # lone unsure windows (a key's click) are not speech
])
def test_silero_starts_speech_on_one_window_only_when_it_is_sure(script, onset_window):
    # one onset phase: the script is the main windows' (a second phase would read it too)
    vad = SileroVad(ScriptedSilero(script), config=VadConfig(prefix_padding_ms=0), onset_phases=1)
    heard: list[tuple[int, Any]] = []
    for k in range(len(script)):  # one window a chunk: which window the event came with
        heard += [(k, e) for e in vad.feed(np.zeros(WINDOW, np.int16), k * 32)]
    started = [(k, e) for k, e in heard if isinstance(e, VadSpeechStarted)]
    if onset_window is None:
        assert started == []
    else:
        sure = script[onset_window] >= 0.8
        assert started == [(onset_window + (0 if sure else 1), VadSpeechStarted(audio_ms=onset_window * 32))]


async def test_silero_events_do_not_depend_on_chunking(vad_stage, flite_speech):
    pcm, _ = flite_speech
    small = await run_vad(vad_stage, pcm, 20)
    assert small == await run_vad(vad_stage, pcm, 100)
    assert len(small) == 2


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(1, 4000), min_size=1, max_size=8))
def test_silero_streaming_equals_batch(sizes, flite_speech):
    pcm, _ = flite_speech
    config = VadConfig()
    assert vad_events(pcm, sizes, config) == vad_events(pcm, [len(pcm)], config)


async def test_silero_jit_backend_agrees(flite_speech):
    pytest.importorskip("torch")
    pcm, _ = flite_speech
    stage = SileroVadStage(clock=MonotonicClock(), backend="jit")
    try:
        assert await run_vad(stage, pcm, 20) == vad_events(pcm, [320], VadConfig())
    finally:
        stage.shutdown_workers()


async def test_silero_inference_runs_off_the_event_loop(vad_stage, flite_speech):
    threads: set[str] = set()
    model = vad_stage.model

    class Spy:
        def new_state(self) -> np.ndarray:
            return model.new_state()

        def infer(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
            threads.add(threading.current_thread().name)
            return model.infer(x, state)

    vad_stage.model = Spy()
    await run_vad(vad_stage, flite_speech[0][:RATE], 20)
    assert threads and all(name.startswith("duplex-vad") for name in threads)


# ---- PocketSphinx ASR ------------------------------------------------------


@pytest.fixture(scope="module")
def asr_stage():
    stage = PocketSphinxAsrStage(clock=MonotonicClock())
    yield stage
    stage.shutdown_workers()


async def test_asr_streams_partials_then_the_final(asr_stage, flite_speech):
    pcm, _ = flite_speech
    port, coll = await opened(asr_stage)
    for c in chunks(pcm, 20):
        await port.submit(item(c))
    await port.submit(item(EndOfUtterance()))
    await coll.until(lambda ps: any(isinstance(p, TranscriptFinal) for p in ps))
    await coll.close()
    out = coll.payloads
    assert isinstance(out[-1], TranscriptFinal) and sum(isinstance(p, TranscriptFinal) for p in out) == 1
    partials = [p.text for p in out if isinstance(p, TranscriptPartial)]
    assert partials, out
    assert all(a != b for a, b in zip(partials, partials[1:]))  # only when it changed
    assert "capital" in out[-1].text and "france" in out[-1].text


async def test_asr_after_the_vad_decodes_from_the_onset(asr_stage, vad_stage, flite_speech):
    """Placed after the VAD: audio goes to both, VAD events are forwarded to
    the ASR as they appear (later than the audio they describe)."""
    pcm, _ = flite_speech
    vad, vad_out = await opened(vad_stage)
    asr, asr_out = await opened(asr_stage)
    forwarded = 0

    async def forward() -> None:
        nonlocal forwarded
        for out in vad_out.items[forwarded:]:
            await asr.submit(StageInput(out.fence, out.request_id, out.payload))
            forwarded += 1

    for c in chunks(pcm, 20):
        await vad.submit(item(c))
        await asr.submit(item(c))
        if c.start_ms % 100 == 0:  # a VAD keeping up with real time, ~100 ms behind
            await vad.drained()
        await forward()
    await vad.drained()
    await forward()
    await asr_out.until(lambda ps: any(isinstance(p, TranscriptFinal) for p in ps))
    await vad_out.close()
    await asr_out.close()
    assert forwarded == 2
    finals = [p for p in asr_out.payloads if isinstance(p, TranscriptFinal)]
    assert finals == [TranscriptFinal(PHRASE)]  # the prefix before the VAD event is decoded


async def test_asr_answers_a_pause_with_every_word_so_far(asr_stage, flite_speech):
    """semantic_vad's pause: the words up to it, at once and even when no
    partial changed; the utterance stays open for its final."""
    pcm, _ = flite_speech
    port, coll = await opened(asr_stage)
    for c in chunks(pcm, 20):
        await port.submit(item(c))
    await port.submit(item(UserPaused(audio_ms=len(pcm) * 1000 // RATE)))
    await port.submit(item(UserPaused(audio_ms=len(pcm) * 1000 // RATE)))
    await port.submit(item(EndOfUtterance()))
    await coll.until(lambda ps: any(isinstance(p, TranscriptFinal) for p in ps))
    await coll.close()
    answers = [p for p in coll.payloads if isinstance(p, TranscriptPartial) and p.at_pause]
    final = coll.payloads[-1]
    assert isinstance(final, TranscriptFinal) and len(answers) == 2
    assert answers[0] == answers[1] and answers[0].text == final.text == PHRASE


async def test_asr_end_without_audio_gives_an_empty_final_and_reuses_decoders(asr_stage, flite_speech):
    port, coll = await opened(asr_stage)
    await port.submit(item(EndOfUtterance()))
    for _ in range(2):
        for c in chunks(flite_speech[0][: RATE // 2], 100):
            await port.submit(item(c))
        await port.submit(item(EndOfUtterance()))
    await port.drained()
    await coll.close()
    finals = [p for p in coll.payloads if isinstance(p, TranscriptFinal)]
    assert len(finals) == 3 and finals[0] == TranscriptFinal("")
    assert asr_stage.pool.created <= 2  # one per concurrent utterance, not per utterance


def test_clean_hypothesis_strips_fillers():
    assert clean_hypothesis("<s> What <sil> [NOISE] the(2) ++UH++ France </s>") == "what the france"


# ---- TTS -------------------------------------------------------------------


def test_next_piece_cuts_sentences_and_long_clauses():
    assert next_piece("Hello there. How", 12) == len("Hello there. ")
    assert next_piece("It costs 3.5 dollars", 12) == 0  # no whitespace after the dot yet
    assert next_piece("No end yet", 12) == 0 and next_piece("No end yet", 12, final=True) == 10
    long = "one two three four five, six seven eight nine ten eleven twelve thirteen "
    assert next_piece(long, 12) == len("one two three four five, ")
    words = " ".join(["word"] * 24) + " "
    assert next_piece(words, 12) == len(words)


def test_parse_wav_tolerates_pipe_sizes():
    pcm = np.arange(-5, 5, dtype=np.int16)
    header = (b"RIFF" + (0x7FFFFFFF).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
              + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (22050).to_bytes(4, "little")
              + (44100).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
              + b"data" + (0x7FFFFFFF).to_bytes(4, "little"))
    out, rate = parse_wav(header + pcm.tobytes())
    assert rate == 22050 and np.array_equal(out, pcm)


def test_unknown_voices_are_refused():
    with pytest.raises(ValueError, match="unknown flite voice"):
        FliteTtsStage(clock=MonotonicClock(), voice="nobody")
    with pytest.raises(ValueError, match="unknown espeak-ng voice"):
        EspeakTtsStage(clock=MonotonicClock(), voice="nobody")


@pytest.mark.parametrize("make", [
    lambda: FliteTtsStage(clock=MonotonicClock()),
    lambda: FliteTtsStage(clock=MonotonicClock(), voice="kal", rate=24000),  # 8 kHz voice, resampled
    lambda: EspeakTtsStage(clock=MonotonicClock(), wpm=200),  # 22.05 kHz, resampled
])
async def test_tts_speaks_the_first_sentence_before_the_reply_ends(make):
    stage: SubprocessTtsStage = make()
    port, coll = await opened(stage)
    deltas = ["Hello there. ", "How are", " you today?"]
    await port.submit(item(TextDelta("r1", deltas[0])))
    await coll.until(lambda ps: any(isinstance(p, AudioOut) for p in ps))  # early audio
    for d in deltas[1:]:
        await port.submit(item(TextDelta("r1", d)))
    await port.submit(item(GenerationDone("r1", "stop")))
    await coll.until(lambda ps: any(isinstance(p, SpeechDone) for p in ps))
    await coll.close()
    out = coll.payloads
    assert isinstance(out[-1], SpeechDone) and out[-1].response_id == "r1"
    audio = [p for p in out if isinstance(p, AudioOut)]
    assert "".join(a.text for a in audio) == "".join(deltas)
    assert all(a.rate == stage.rate and a.response_id == "r1" for a in audio)
    pcm = np.concatenate([a.pcm for a in audio]).astype(np.float64)
    assert np.sqrt((pcm**2).mean()) > 300  # speech, not silence
    assert max(a.pcm.size for a in audio) <= stage.rate // 10  # ~100 ms chunks
    assert stage.synthesized == 2 and stage.completed_requests == 1


class SlowTts(SubprocessTtsStage):
    """A synthesizer that never finishes: only a kill ends it. It touches
    ``started`` first, so a test knows the process is running."""

    binary = "sh"
    started = ""

    def command(self, text: str, wav_path: str) -> tuple[list[str], bytes | None]:
        return ["sh", "-c", 'touch "$0" && exec sleep 30', self.started], None


async def test_cancel_kills_the_running_synthesizer(tmp_path):
    stage = SlowTts("tts", clock=MonotonicClock())
    stage.started = str(tmp_path / "started")
    port, coll = await opened(stage)
    await port.submit(item(TextDelta("r1", "This never ends. ")))
    async with asyncio.timeout(10):
        while not os.path.exists(stage.started):  # the subprocess is running now
            await asyncio.sleep(0.01)
    async with asyncio.timeout(2):
        await port.cancel(FENCE.next_epoch())
    assert stage.killed_processes == 1 and stage.aborted_requests == 1
    await coll.close()
    assert coll.payloads == []


async def test_cancel_stops_flite_audio_of_the_old_fence():
    stage = FliteTtsStage(clock=MonotonicClock())
    port, coll = await opened(stage)
    text = " ".join(f"Sentence number {i} is here to keep the synthesizer busy." for i in range(20))
    await port.submit(item(TextDelta("r1", text + " ")))
    await coll.until(lambda ps: any(isinstance(p, AudioOut) for p in ps))
    new = FENCE.next_epoch()
    await port.cancel(new)
    seen = len(coll.items)
    await asyncio.sleep(0.5)  # long enough for several more sentences
    assert len(coll.items) == seen  # nothing of the old fence after cancel returned
    await port.submit(item(TextDelta("r2", "Fresh start. "), new))
    await port.submit(item(GenerationDone("r2", "stop"), new))
    await coll.until(lambda ps: any(isinstance(p, SpeechDone) for p in ps))
    await coll.close()
    assert all(o.fence == new for o in coll.items[seen:])
    assert not any(isinstance(p, SpeechDone) and p.response_id == "r1" for p in coll.payloads)


def test_flite_synthesizes_under_uvloop():
    """The CLI server runs on uvloop, whose child processes get a socket, not a
    pipe, as stdout: /dev/stdout cannot be opened there (a real bug we had)."""
    import uvloop
    from vllm_duplex.domain.clock import MonotonicClock

    async def speak() -> np.ndarray:
        return await FliteTtsStage(clock=MonotonicClock()).synthesize("Hello there.")

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        pcm = runner.run(speak())
    assert pcm.size > 8000 and np.abs(pcm).max() > 1000


# Forks seen by os.register_at_fork (a hook cannot be removed: it records only
# while a test asks). uvloop's subprocess start runs these hooks -- it forks the
# whole process on the loop thread, GIL held -- while subprocess.Popen's vfork
# does not.
FORKS: list[int] | None = None


def _record_fork() -> None:
    if FORKS is not None:
        FORKS.append(threading.get_ident())


os.register_at_fork(before=_record_fork)


@pytest.mark.parametrize("make", [lambda: FliteTtsStage(clock=MonotonicClock()),
                                  lambda: EspeakTtsStage(clock=MonotonicClock())])
def test_synthesizers_start_off_the_event_loop(make):
    """A synthesizer started on the loop forked the server there: 80-250 ms of
    every session frozen per sentence under uvloop (issue 21)."""
    import uvloop

    global FORKS
    stage: SubprocessTtsStage = make()

    async def speak() -> int:
        for text in ("Hello there.", "How are you today?", "Fine, thanks."):
            assert (await stage.synthesize(text)).size > 4000
        return threading.get_ident()

    FORKS = []
    try:
        loop_thread = uvloop.run(speak())
        forks = FORKS
    finally:
        FORKS = None
    assert loop_thread not in forks
    stage.shutdown_workers()
