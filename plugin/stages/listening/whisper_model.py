"""One Whisper transcription of one utterance, with the settings measured best
on this CPU (``bench/speech_models.py``).

faster-whisper's ``transcribe`` always pads the log-mel input to Whisper's 30 s
window, so a 2 s question costs a 30 s encoder pass (1.3 s for base on one
core). The encoder takes shorter inputs, so an utterance is encoded in a
window of ``max(min_window_s, duration + window_pad_s)``: 10 s for short
questions (0.25 s for base). Windows under about 6 s make Whisper repeat
itself, hence the 10 s floor. The decoder is CTranslate2's ``generate`` (beam
search), called the way faster-whisper calls it, with its two safeguards:

- no speech: the no-speech gate (``no_speech.py``: the no-speech
  probability, known hallucinations, the log-probability) says the window is
  silence or noise (Whisper would otherwise write "you" or "Thank you." for
  it): the transcript is empty. A shortened window makes Whisper doubt short
  real speech: people's short phrases (FSDD's 8 kHz digits, "eight zero",
  "three one four") scored a no-speech probability of 0.3-0.7 in a 10 s window
  and 0.1-0.4 in its own 30 s one, where every noise of ``bench/no_speech.py``
  stays at 0.64 or more. So with ``recheck_window_s`` (the stage's finals) the
  gate's "silence" in a shorter window is only believed once the same audio,
  decoded again in that window, is silence to that window's gate too
  (``no_speech.WHOLE_WINDOW_GATE``; issue 42, ``bench/real_hearing.py``): the
  second decode costs only what the gate would have dropped, noise the VAD
  let through and such short phrases;
- repetition: a transcript that compresses too well (gzip ratio > 2.4) is
  decoded again with sampling at rising temperatures. A short one never
  compresses that well, loop or not, so a transcript that says a run of two or
  more words again right after itself (``looped``: tiny.en greedy heard "Tell
  me about the Eiffel Tower" in Flite's awb voice as "Tell me about the Eiffel
  tour Tell me about the Eiffel tour Tell me about the E", average
  log-probability -0.16) is decoded again the same way -- unless the loop
  runs to the end (``tail_loop``: the utterance said again into the silence
  after it, as above), which is cut where it starts and kept (``suspect``):
  sampling is seeded per process, so a decode that reached it gave another
  transcript on every run (a real speaker's "I'm Abigail Claflin", eight
  runs, seven answers). A transcript that
  fails these checks at every temperature is marked (``suspect``): the best of
  them is kept, cut where its loop starts, and never taken as a sure answer.

Longer utterances (window over 30 s) go through faster-whisper's own
long-form ``transcribe`` (30 s windows that follow the timestamps), so
nothing is cut. CTranslate2 runs without the GIL (measured: a Python thread
spinning beside a decode keeps 97% of its rate); loaded models are shared by
every stage of the process (``load``), and ``generate`` is thread-safe.
"""

from __future__ import annotations

import dataclasses
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from vllm_duplex.domain.devices import CPU, Device
from vllm_duplex.domain.words import spoken, written_words
from vllm_duplex.stages.listening.no_speech import DEFAULT_GATE, WHOLE_WINDOW_GATE, NoSpeechGate

SAMPLE_RATE = 16000
MAX_WINDOW_S = 30.0  # Whisper's positional embeddings end here
HOP = 160  # samples per log-mel frame
_FALLBACK_TEMPERATURES = (0.4, 0.8)


@dataclass(frozen=True)
class DecodeOptions:
    """How one utterance is decoded (the defaults are the measured best)."""

    beam_size: int = 5
    min_window_s: float = 10.0
    window_pad_s: float = 1.0
    gate: NoSpeechGate = DEFAULT_GATE
    compression_ratio_threshold: float = 2.4
    language: str = "en"
    max_tokens_per_s: float = 12.0  # a bound on runaway output (speech is ~3-5 tokens/s)
    # The gate's "no speech" in a shorter window is checked in this one, by
    # ``recheck_gate``, before the words are dropped (the module docstring);
    # None: believed at once.
    recheck_window_s: float | None = None
    recheck_gate: NoSpeechGate = WHOLE_WINDOW_GATE

    def __post_init__(self) -> None:
        if self.beam_size < 1 or not 1.0 <= self.min_window_s <= MAX_WINDOW_S or self.window_pad_s < 0:
            raise ValueError("beam_size must be >= 1, min_window_s within 1..30 s, "
                             "window_pad_s >= 0")


@dataclass(frozen=True)
class Transcription:
    text: str
    no_speech_prob: float = 0.0
    avg_logprob: float = 0.0
    window_s: float = 0.0  # the encoder window used (30 per window in long form)
    suspect: bool = False  # a loop: cut at its start, never a sure answer
    silenced: str | None = None  # why the no-speech gate dropped the words (no_speech.py)
    dropped: str = ""  # the words it dropped


def loop_start(text: str) -> int | None:
    """Where the words first say a run of two or more again right after itself
    (compared as spoken: ``domain/words.py``), as a count of ``text``'s written
    words: Whisper's decoder caught in a loop -- or the rare user who says a
    phrase twice (every temperature then hears it twice, and it is kept once:
    the meaning stays). None: no such run."""
    words = [spoken(w) for w in written_words(text)]
    for end in range(4, len(words) + 1):  # the earliest repeat to end wins
        for u in range(2, end // 2 + 1):
            if words[end - 2 * u:end - u] == words[end - u:end]:
                return end - u
    return None


def looped(text: str) -> bool:
    return loop_start(text) is not None


def tail_loop(text: str) -> bool:
    """The loop runs to the end: after its first run the words only say that
    run again (the last time cut short, perhaps) -- Whisper writing the
    utterance again into the window's silence after the speech ended, as it
    does for short real phrases ("3, 1, 4, 3, 1, 4,"; "I'm Abigail ... You can
    call me Abby. I'm Abigail ..."). The first run is what it heard."""
    words = [spoken(w) for w in written_words(text)]
    for end in range(4, len(words) + 1):  # loop_start's run
        for u in range(2, end // 2 + 1):
            run = words[end - 2 * u:end - u]
            if run == words[end - u:end]:
                rest, again = words[end - u:], (run * (len(words) // u + 1))
                # (max_length may stop it mid-word: "Tell me about the Eiff")
                return (rest[:-1] == again[:len(rest) - 1]
                        and again[len(rest) - 1].startswith(rest[-1]))
    return False


def unlooped(text: str) -> str:
    """``text`` up to where its loop starts (all of it when it has none)."""
    cut = loop_start(text)
    return text if cut is None else " ".join(written_words(text)[:cut])


def compression_ratio(text: str) -> float:
    data = text.encode()
    return len(data) / len(zlib.compress(data)) if data else 0.0


class WhisperModel:
    """A loaded CTranslate2 Whisper model; ``transcribe`` is synchronous and
    thread-safe (run it on a worker thread, never on the event loop)."""

    def __init__(self, model_dir: Path, *, threads: int = 1, workers: int = 1,
                 compute_type: str = "int8", device: Device = CPU) -> None:
        from faster_whisper import WhisperModel as FasterWhisper
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self.model_dir = model_dir
        self.device = device
        self._fw = FasterWhisper(str(model_dir), device=device.kind, device_index=device.index,
                                 compute_type=compute_type, cpu_threads=threads,
                                 num_workers=workers, local_files_only=True)
        self.multilingual = bool(self._fw.model.is_multilingual)
        self.languages = frozenset(self._fw.supported_languages)  # ["en"] for a .en model
        self._tokenizers: dict[str, Any] = {}
        self._tokenizer_cls = Tokenizer
        self._suppressed = get_suppressed_tokens
        self._lock = threading.Lock()
        self._warm = threading.Event()

    def warm_up(self) -> None:
        """Decode once (idempotent): a model's first decode is 2-3x slower,
        and must not be a caller's first turn."""
        if not self._warm.is_set():
            noise = (np.random.default_rng(0).standard_normal(SAMPLE_RATE) * 300).astype(np.int16)
            self.transcribe(noise)
            self._warm.set()

    def _tokenizer(self, language: str) -> Any:
        with self._lock:
            tok = self._tokenizers.get(language)
            if tok is None:
                tok = self._tokenizer_cls(self._fw.hf_tokenizer, self.multilingual,
                                          task="transcribe",
                                          language=language if self.multilingual else None)
                self._tokenizers[language] = tok
            return tok

    def transcribe(self, pcm: np.ndarray, options: DecodeOptions = DecodeOptions(),
                   prompt: str | None = None) -> Transcription:
        """int16 (or float32 in -1..1) mono 16 kHz audio -> its words.
        ``prompt``: text the audio follows (the session's transcription
        prompt: names, spellings, a style), given to Whisper as its previous
        text, as OpenAI's transcription ``prompt`` is."""
        audio = np.asarray(pcm).ravel()
        audio = audio.astype(np.float32) / 32768.0 if audio.dtype == np.int16 else audio.astype(np.float32)
        if audio.size == 0 or not np.any(audio):
            return Transcription("", no_speech_prob=1.0)  # digital silence: nothing to hear
        duration = audio.size / SAMPLE_RATE
        window = max(options.min_window_s, duration + options.window_pad_s)
        if window > MAX_WINDOW_S:
            return self._long_form(audio, options, prompt)
        return self._short_form(audio, window, options, prompt)

    def _short_form(self, audio: np.ndarray, window: float, options: DecodeOptions,
                    prompt_text: str | None = None) -> Transcription:
        import ctranslate2

        frames = int(np.ceil(window * SAMPLE_RATE / HOP))
        padded = np.zeros(frames * HOP, np.float32)
        padded[: audio.size] = audio
        features = self._fw.feature_extractor(padded)[:, :frames]
        features = ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None]))
        tokenizer = self._tokenizer(options.language)
        previous = tokenizer.encode(" " + prompt_text.strip()) if prompt_text else []
        prompt = self._fw.get_prompt(tokenizer, previous, without_timestamps=True)
        max_new = int(16 + options.max_tokens_per_s * audio.size / SAMPLE_RATE)
        suppress = self._suppressed(tokenizer, [-1])
        best = None
        for temperature in (0.0, *_FALLBACK_TEMPERATURES):
            sampling = ({"beam_size": options.beam_size} if temperature == 0.0 else
                        {"beam_size": 1, "sampling_topk": 0, "sampling_temperature": temperature})
            result = self._fw.model.generate(
                features, [prompt], max_length=min(448, len(prompt) + max_new),
                return_scores=True, return_no_speech_prob=True, suppress_blank=True,
                suppress_tokens=list(suppress), **sampling)[0]
            tokens = result.sequences_ids[0]
            avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
            text = tokenizer.decode(tokens).strip()
            candidate = Transcription(text, result.no_speech_prob, avg_logprob, window)
            why = options.gate.silence(candidate)
            if why is not None:
                recheck = options.recheck_window_s
                if recheck is not None and window < recheck:
                    again = self._short_form(
                        audio, recheck, dataclasses.replace(options, gate=options.recheck_gate),
                        prompt_text)
                    if again.silenced is None:
                        return again
                return Transcription("", result.no_speech_prob, avg_logprob, window,
                                     silenced=why, dropped=text)
            if compression_ratio(text) <= options.compression_ratio_threshold and not looped(text):
                return candidate
            if temperature == 0.0 and tail_loop(text):
                # The beam's words, once: sampling again at a temperature
                # would answer differently on every run (CTranslate2 seeds it
                # per process) and no better. Never taken as a sure answer.
                return dataclasses.replace(candidate, text=unlooped(text), suspect=True)
            best = best if best is not None and best.avg_logprob >= avg_logprob else candidate
        assert best is not None
        return dataclasses.replace(best, text=unlooped(best.text), suspect=True)

    def _long_form(self, audio: np.ndarray, options: DecodeOptions,
                   prompt: str | None = None) -> Transcription:
        segments, _info = self._fw.transcribe(
            audio, language=options.language, initial_prompt=prompt or None,
            beam_size=options.beam_size, condition_on_previous_text=False, vad_filter=False,
            no_speech_threshold=None, compression_ratio_threshold=options.compression_ratio_threshold)
        # Each 30 s window's words pass the same gate as a short utterance's.
        kept = [s.text.strip() for s in segments
                if options.gate.silence(_Segment(s.text, s.no_speech_prob, s.avg_logprob)) is None]
        return Transcription(" ".join(t for t in kept if t), window_s=MAX_WINDOW_S)


@dataclass(frozen=True)
class _Segment:
    text: str
    no_speech_prob: float
    avg_logprob: float


def supported_compute_types(device: Device = CPU) -> frozenset[str]:
    """What CTranslate2 computes on ``device`` of this machine (its int8
    kernels need AVX2 or better on x86)."""
    import ctranslate2

    return frozenset(ctranslate2.get_supported_compute_types(device.kind, device.index))


_loaded: dict[tuple[str, int, int, str, Device], WhisperModel] = {}
_load_lock = threading.Lock()


def load(model_dir: Path, *, threads: int = 1, workers: int = 1,
         compute_type: str = "int8", device: Device = CPU) -> WhisperModel:
    """The process's one instance of this model with these settings (loading
    takes 0.3-0.6 s and ~100 MB; every stage and test shares it)."""
    key = (str(Path(model_dir).resolve()), threads, workers, compute_type, device)
    with _load_lock:
        model = _loaded.get(key)
        if model is None:
            model = _loaded[key] = WhisperModel(Path(model_dir), threads=threads, workers=workers,
                                                compute_type=compute_type, device=device)
        return model
