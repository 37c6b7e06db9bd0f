"""Real voices for the speech bench: recordings of people, with the words
they said (``bench/real_voices/``: the FLAC files, SOURCES.md naming each
source, its licence and commit; ``make.py`` how the files were made).

Issue 42: the speech bench had synthetic voices only (Flite, eSpeak NG,
Piper), and the streaming path lost a third against the same models'
offline decode on real recordings. These are 22 speakers: read audiobooks
(LibriSpeech, LibriVox, LJ Speech), a president's speech with its pauses
(JFK), a meeting's headset microphone (AMI), CMU's close-talking command
recordings (among them the issue's "five five"), six people's spoken digits
at 8 kHz (FSDD: US, Belgian-French, Greek and German accents), strung into
short number phrases the way a caller says them, and six more people's
single digits, recorded quietly (peaks at 1-4 % of full scale; AudioMNIST:
German and Syrian-Arabic accents): one short word alone, the turn a
no-speech gate is most tempted to drop.

Two parts, as the synthetic bench has: ``tune`` (the settings are chosen on
it) and ``held-out`` (other speakers, never used to choose a setting;
reported apart), assigned by speaker before any was decoded. Everything
loads from the repository: no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

RATE = 16000
AUDIO = Path(__file__).resolve().parents[1] / "real_voices" / "audio"
DIGITS = "zero one two three four five six seven eight nine".split()
DIGIT_GAP_S = 0.15  # between the digits of a number phrase (FSDD's files are trimmed)


@dataclass(frozen=True)
class Recording:
    name: str
    part: str  # "tune" or "held-out"
    speaker: str
    kind: str  # "read", "speech", "meeting", "command", "digits"
    text: str
    files: tuple[str, ...]  # played one after another, DIGIT_GAP_S apart

    def audio(self) -> np.ndarray:
        """int16 16 kHz mono."""
        parts: list[np.ndarray] = []
        for i, f in enumerate(self.files):
            pcm, rate = sf.read(AUDIO / f"{f}.flac", dtype="float32")
            if rate != RATE:
                pcm = soxr.resample(pcm, rate, RATE)
            if i:
                parts.append(np.zeros(int(DIGIT_GAP_S * RATE), np.float32))
            parts.append(pcm)
        return (np.clip(np.concatenate(parts), -1, 1) * 32767).astype(np.int16)


def _one(name: str, part: str, speaker: str, kind: str, text: str) -> Recording:
    return Recording(name, part, speaker, kind, text, (name,))


_READ = [
    # CMU's close-talking command recordings (pocketsphinx test data)
    *[_one(f"cmu-cards-00{i}", "tune", "cmu-cards", "command", t) for i, t in enumerate((
        "ten of clubs", "four queen of clubs", "seven of clubs", "five five",
        "eight of spades four of clubs seven of hearts"), 1)],
    _one("cmu-goforward", "held-out", "cmu-goforward", "command", "go forward ten meters"),
    # LibriVox, Sense and Sensibility ch. 1 (pocketsphinx test data)
    *[_one(f"librivox-sense-{n}", "tune", "librivox-sense", "read", t) for n, t in (
        ("0870", "and mister john dashwood had then leisure to consider how much there might "
                 "be prudently in his power to do for them"),
        ("0880", "he was not an ill disposed young man"),
        ("0890", "unless to be rather cold hearted and rather selfish is to be ill disposed"),
        ("0920", "had he married a more a amiable woman he might have been made still more "
                 "respectable than he was"),
        ("0930", "he might even have been made amiable himself"))],
    _one("jfk-inaugural", "tune", "jfk", "speech",
         "and so my fellow americans ask not what your country can do for you "
         "ask what you can do for your country"),
    _one("ls-1089-134686-0001", "tune", "ls-1089", "read",
         "after early nightfall the yellow lamps would light up here and there the squalid "
         "quarter of the brothels"),
    _one("ls-1221-135766-0001", "held-out", "ls-1221", "read",
         "god as a direct consequence of the sin which man thus punished had given her a "
         "lovely child whose place was on that same dishonoured bosom to connect her parent "
         "for ever with the race and descent of mortals and to be finally a blessed soul in "
         "heaven"),
    _one("ls-1221-135766-0002", "held-out", "ls-1221", "read",
         "yet these thoughts affected hester prynne less with hope than apprehension"),
    _one("ls-2412-153948-0000", "held-out", "ls-2412", "read",
         "if the reader will excuse me i will say nothing of my antecedents nor of the "
         "circumstances which led me to leave my native country the narrative would be "
         "tedious to him and painful to myself"),
    _one("lj-LJ002-0020", "held-out", "lj", "read", "in eighteen thirteen"),
    _one("lj-LJ002-0035", "held-out", "lj", "read", "eight the press yard"),
    _one("ami-ES2011a-headset0", "held-out", "ami-es2011a", "meeting",
         "i'm abigail claflin you can call me abbie"),
    # LibriSpeech dev-clean 1272-128104-0000 (Picovoice Leopard's test audio)
    _one("ls-1272-128104-0000", "tune", "ls-1272", "read",
         "mister quilter is the apostle of the middle classes and we are glad to welcome "
         "his gospel"),
]

# AudioMNIST: one digit from each of six speakers, a file each (make.py
# AUDIOMNIST_TAKES): (speaker, accent, digit, take, part).
_AUDIOMNIST = (("01", "German", 0, 0, "tune"), ("02", "German", 5, 10, "tune"),
               ("08", "German", 2, 8, "held-out"), ("42", "Syrian-Arabic", 9, 10, "held-out"),
               ("51", "German", 3, 37, "held-out"), ("56", "German", 6, 49, "held-out"))
_SINGLE_DIGITS = [_one(f"audiomnist-{d}_{s}_{t}", part, f"audiomnist-{s}", "digits", DIGITS[d])
                  for s, _, d, t, part in _AUDIOMNIST]

# FSDD: (speaker, accent, part); each says four number phrases made of its
# own takes (bench/real_voices/make.py FSDD_TAKES).
_FSDD_SPEAKERS = (("jackson", "US", "tune"), ("nicolas", "Belgian-French", "tune"),
                  ("george", "Greek", "tune"), ("theo", "US", "held-out"),
                  ("yweweler", "German", "held-out"), ("lucas", "German", "held-out"))
_PHRASES = (((5, 0), (5, 1)), ((7, 2),), ((3, 3), (1, 4), (4, 5)), ((8, 6), (0, 7)))


def _digits(speaker: str, part: str) -> list[Recording]:
    return [Recording(f"fsdd-{speaker}-{''.join(str(d) for d, _ in takes)}", part,
                      f"fsdd-{speaker}", "digits", " ".join(DIGITS[d] for d, _ in takes),
                      tuple(f"fsdd-{d}_{speaker}_{t}" for d, t in takes))
            for takes in _PHRASES]


RECORDINGS: tuple[Recording, ...] = (
    *_READ, *[r for s, _, part in _FSDD_SPEAKERS for r in _digits(s, part)], *_SINGLE_DIGITS)
ACCENTS = {**{f"fsdd-{s}": a for s, a, _ in _FSDD_SPEAKERS},
           **{f"audiomnist-{s}": a for s, a, *_ in _AUDIOMNIST}}


def part(name: str) -> list[Recording]:
    return [r for r in RECORDINGS if r.part == name]
