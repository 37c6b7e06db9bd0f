"""A Piper voice run directly: espeak-ng phonemes -> phoneme ids -> the VITS
ONNX graph on onnxruntime -> float PCM at the voice's rate.

This is what the ``piper-tts`` package does, written here because that
package is GPL-3 (never installed nor imported): the voice's ``.onnx.json``
maps each phoneme (a Unicode code point of espeak-ng's IPA output, after NFD
decomposition) to ids; an utterance is ``^ _ p1 _ p2 _ ... pn _ $`` (begin,
pad between phonemes, end); the graph takes the ids, their count and three
scales (noise, length, noise width) and returns the waveform.

Phonemes come from the ``espeak-ng`` program (a separate process: the
library is GPL-3 too, and a process is killable). It writes one line per
clause and drops the punctuation that ended it, which Piper voices were
trained with (it shapes the prosody: a question rises), so ``ipa_with_punctuation``
puts it back where the clause count allows.
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from vllm_duplex.domain.devices import CPU, Device

BOS, EOS, PAD = "^", "$", "_"
# espeak-ng ends a clause at these when whitespace (or the end) follows.
_MARK = r"([.,;:!?])[.,;:!?\"')\]]*"  # a clause mark, and what may close around it
_CLAUSE_END = re.compile(_MARK + r"(?=\s|$)")
_ENDS_MARKED = re.compile(_MARK + r"$")


def espeak_argv(voice: str) -> list[str]:
    """The phonemizer command: text on stdin (UTF-8), IPA on stdout, no audio."""
    return ["espeak-ng", "-q", "--ipa", "-b", "1", "-v", voice]


def ipa_with_punctuation(text: str, espeak_output: str) -> str:
    """espeak-ng's IPA lines for ``text`` joined into one phoneme string, each
    clause followed by the punctuation that ended it in ``text``."""
    lines = [line.strip() for line in espeak_output.splitlines() if line.strip()]
    if not lines:
        return ""
    stripped = text.strip()
    found = list(_CLAUSE_END.finditer(stripped))
    marks = [m.group(1) for m in found]
    ends_marked = bool(found) and found[-1].end() == len(stripped)
    if len(marks) == len(lines) or (len(marks) == len(lines) - 1 and not ends_marked):
        return " ".join(line + (marks[i] if i < len(marks) else "") for i, line in enumerate(lines))
    # espeak cut elsewhere than we can tell (abbreviations, numbers): keep its
    # clause breaks as commas and the text's own last mark.
    last = marks[-1] if marks and ends_marked else ""
    return ", ".join(lines) + last


def continued(text: str) -> str:
    """``text`` as a clause that goes on: a piece cut before its sentence ended
    (the reply's first two words, a long sentence's clause) gets a comma. With
    no mark Piper speaks it as a whole sentence -- the pitch falls, the last
    syllable is drawn out -- and the seam to the next piece is heard as other
    words ("A week | has seven days" as "at week as 7 days"): Whisper's WER on
    replies spoken from a two-word first piece was 9.1% against 5.6% from a
    four-word one; with the comma, 6.5% for both (bench/first_phrase.py)."""
    text = text.rstrip()
    return text if _ENDS_MARKED.search(text) else text + ","


@dataclass(frozen=True)
class VoiceConfig:
    sample_rate: int
    espeak_voice: str
    id_map: dict[str, list[int]]
    noise_scale: float
    length_scale: float
    noise_w: float
    speakers: int

    @classmethod
    def load(cls, path: Path) -> VoiceConfig:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("phoneme_type", "espeak") != "espeak":
            raise ValueError(f"{path}: phoneme_type {raw.get('phoneme_type')!r} is not supported "
                             "(only espeak voices)")
        inference = raw.get("inference") or {}
        return cls(sample_rate=int(raw["audio"]["sample_rate"]),
                   espeak_voice=str((raw.get("espeak") or {}).get("voice") or "en-us"),
                   id_map={k: list(v) for k, v in raw["phoneme_id_map"].items()},
                   noise_scale=float(inference.get("noise_scale", 0.667)),
                   length_scale=float(inference.get("length_scale", 1.0)),
                   noise_w=float(inference.get("noise_w", 0.8)),
                   speakers=int(raw.get("num_speakers", 1)))


class PiperVoice:
    """A loaded voice. ``synthesize`` is synchronous and thread-safe (one ONNX
    session shared by all callers, as onnxruntime allows); ``cancel`` stops a
    run in progress from another thread."""

    def __init__(self, onnx_path: Path, config_path: Path, *, threads: int = 1,
                 length_scale: float | None = None, device: Device = CPU) -> None:
        import onnxruntime as ort

        self.config = VoiceConfig.load(config_path)
        self.length_scale = length_scale or self.config.length_scale
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(onnx_path), options,
                                             providers=device.onnx_providers())
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._ort = ort
        self._warm = threading.Event()

    def warm_up(self) -> None:
        """Run the graph once (idempotent): its first run is several times slower."""
        if not self._warm.is_set():
            self.synthesize("hˈɛloʊ.")
            self._warm.set()

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    def phoneme_ids(self, phonemes: str) -> list[int]:
        ids = self.config.id_map
        out = [*ids[BOS], *ids[PAD]]
        for ph in unicodedata.normalize("NFD", phonemes):
            if ph in ids:  # anything the voice was not trained on is skipped
                out += ids[ph] + ids[PAD]
        return out + ids[EOS]

    def new_run(self) -> Any:
        """A handle for one ``synthesize``; ``cancel(handle)`` aborts it."""
        return self._ort.RunOptions()

    @staticmethod
    def cancel(run: Any) -> None:
        run.terminate = True

    def synthesize(self, phonemes: str, run: Any | None = None) -> np.ndarray:
        """Phonemes -> float32 PCM in -1..1 at ``sample_rate`` (empty for none)."""
        ids = self.phoneme_ids(phonemes)
        if len(ids) <= 3:  # only the begin/pad/end symbols: nothing to say
            return np.zeros(0, np.float32)
        feeds: dict[str, np.ndarray] = {
            "input": np.array([ids], np.int64),
            "input_lengths": np.array([len(ids)], np.int64),
            "scales": np.array([self.config.noise_scale, self.length_scale, self.config.noise_w],
                               np.float32),
        }
        if "sid" in self._inputs:
            feeds["sid"] = np.array([0], np.int64)
        audio = self._session.run(None, feeds, run)[0]
        return np.clip(np.asarray(audio, np.float32).ravel(), -1.0, 1.0)
