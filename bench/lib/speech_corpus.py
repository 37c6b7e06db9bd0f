"""The speech benchmark's material: spoken questions, synthetic voices, the
spoken QA set with known one-word answers, and word error rate.

Used by ``bench/speech_models.py``. Everything is synthesized on the spot by
the Debian ``flite`` / ``espeak-ng`` programs (no recordings, no model hub).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

import numpy as np
import soxr

RATE = 16000

# 20 questions and requests a voice assistant hears, no digits (Whisper writes
# numbers as digits; the scorer maps digits back, but the set avoids relying on it).
ASR_QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What color is the sky on a clear day?",
    "Can you tell me a joke about cats?",
    "What is the weather like in London today?",
    "Please turn off the lights in the kitchen.",
    "Who wrote the play Romeo and Juliet?",
    "How far is the moon from the earth?",
    "What time does the museum open tomorrow?",
    "Play some relaxing music for me.",
    "What is the largest ocean in the world?",
    "Remind me to call my mother this evening.",
    "How do you make a cup of green tea?",
    "Which planet is known as the red planet?",
    "What is the opposite of hot?",
    "Translate good morning into Spanish.",
    "Why do leaves change color in the autumn?",
    "Tell me something interesting about elephants.",
    "How many days are there in a leap year?",
    "What should I cook for dinner tonight?",
)


@dataclass(frozen=True)
class Voice:
    name: str
    argv: tuple[str, ...]  # the text goes on stdin (espeak) or after -t (flite)
    stdin: bool

    def speak(self, text: str) -> np.ndarray:
        """``text`` in this voice, int16 16 kHz mono."""
        from vllm_duplex.stages.speech.subprocess_tts import parse_wav

        argv = [*self.argv] if self.stdin else [*self.argv, "-t", text, "-o", "/dev/stdout"]
        wav = subprocess.run(argv, input=text.encode() if self.stdin else None,
                             capture_output=True, check=True, timeout=60).stdout
        pcm, rate = parse_wav(wav)
        return soxr.resample(pcm, rate, RATE).astype(np.int16) if rate != RATE else pcm


def flite(voice: str) -> Voice:
    return Voice(f"flite {voice}", ("flite", "-voice", voice), False)


def espeak(voice: str) -> Voice:
    return Voice(f"espeak {voice}", ("espeak-ng", "--stdout", "-v", voice), True)


VOICES = (flite("slt"), flite("awb"), flite("rms"), flite("kal16"),
          espeak("en-us+f3"), espeak("en-gb"))

# The held-out part (issue 29): sentences and voices no default was tuned on.
# Written before any decode of them was measured; report them apart and never
# choose a setting by them -- they say whether a choice made on the part
# above carries over to speech it has not met. Voices: Flite's 8 kHz diphone
# voice, a fast Flite talker, and eSpeak NG accents the tuned set lacks.
HELD_OUT_VOICES = (
    flite("kal"),
    Voice("flite awb fast", ("flite", "-voice", "awb", "--setf", "duration_stretch=0.8"), False),
    espeak("en-gb-scotland"),
    espeak("en-us-nyc+m3"),
)
HELD_OUT_SENTENCES = (
    "Set a timer for fifteen minutes.",
    "What is the weather going to be like on Saturday?",
    "Add milk and eggs to my shopping list.",
    "How long does it take to boil an egg?",
    "Send a message to Sarah saying I will be late.",
    "What is the population of Canada?",
    "Turn the volume down a little.",
    "Who painted the Mona Lisa?",
    "Book a table for two at eight o'clock.",
    "How do I get to the nearest train station?",
    "What does the word curious mean?",
    "Wake me up at seven thirty tomorrow morning.",
)
QA_VOICES = (flite("slt"), flite("awb"), espeak("en-us+f3"))


# Spoken QA: questions with a known one-word answer (any of the listed forms
# in the reply counts as right).
QA = (
    ("What is the capital of France?", ("paris",)),
    ("What is the capital of Japan?", ("tokyo",)),
    ("What is the capital of Italy?", ("rome",)),
    ("What is the capital of England?", ("london",)),
    ("What is the capital of Germany?", ("berlin",)),
    ("What is the capital of Spain?", ("madrid",)),
    ("What is the capital of Russia?", ("moscow",)),
    ("What is the capital of Egypt?", ("cairo",)),
    ("What color is the sky on a clear day?", ("blue",)),
    ("What color is grass?", ("green",)),
    ("What color is snow?", ("white",)),
    ("What color is a ripe banana?", ("yellow",)),
    ("How many legs does a spider have?", ("eight", "8")),
    ("How many days are in a week?", ("seven", "7")),
    ("How many legs does a dog have?", ("four", "4")),
    ("What is two plus two?", ("four", "4")),
    ("How many wheels does a bicycle have?", ("two", "2")),
    ("Which planet is known as the red planet?", ("mars",)),
    ("What planet do we live on?", ("earth",)),
    ("What is the largest ocean on Earth?", ("pacific",)),
    ("What animal says moo?", ("cow", "cows")),
    ("What animal barks?", ("dog", "dogs")),
    ("What is frozen water called?", ("ice",)),
    ("What do bees make?", ("honey",)),
    ("What is the opposite of hot?", ("cold",)),
    ("What is the opposite of up?", ("down",)),
    ("What star is at the center of our solar system?", ("sun",)),
    ("What is the largest animal in the world?", ("whale", "whales")),
    ("Which animal is known as the king of the jungle?", ("lion", "lions")),
    ("What is the tallest animal in the world?", ("giraffe", "giraffes")),
    ("What language is spoken in Spain?", ("spanish",)),
    ("What is the first month of the year?", ("january",)),
    ("What season comes after winter?", ("spring",)),
    ("What do you call a baby cat?", ("kitten", "kittens")),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)),
    ("What is the closest planet to the sun?", ("mercury",)),
)


# ---- scoring --------------------------------------------------------------------------------

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
# Whisper writes "Mr." where LibriSpeech and LibriVox spell out "mister": one word.
_SPELLING = {"colour": "color", "favourite": "favorite", "neighbour": "neighbor",
             "grey": "gray", "ok": "okay", "mum": "mom", "mr": "mister"}


def _number(n: int) -> list[str]:
    if n < 20:
        return [_ONES[n]]
    if n < 100:
        return [_TENS[n // 10 - 2]] + ([_ONES[n % 10]] if n % 10 else [])
    return [str(n)]


def normalize(text: str) -> list[str]:
    """Lowercase words without punctuation; numbers under 100 as words; a few
    British spellings as American and "Mr" as "mister" (what the references
    use)."""
    text = re.sub(r"(\d)-(\d)", r"\1 \2", text.lower()).replace("-", " ")
    out: list[str] = []
    for w in re.sub(r"[^\w' ]", " ", text).split():
        w = w.strip("'")
        if w.isdigit():
            out += _number(int(w))
        elif w:
            out.append(_SPELLING.get(w, w))
    return out


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)]


@dataclass
class WerCount:
    errors: int = 0
    words: int = 0

    def add(self, ref: str, hyp: str) -> None:
        r = normalize(ref)
        self.errors += edit_distance(r, normalize(hyp))
        self.words += len(r)

    @property
    def wer(self) -> float:
        return self.errors / self.words if self.words else 0.0


def right_answer(reply: str, answers: tuple[str, ...]) -> bool:
    words = set(normalize(reply))
    return any(set(normalize(a)) <= words for a in answers)


def pct(x: float) -> str:
    return f"{100 * x:5.1f} %"


def ms(x: float) -> str:
    return f"{1000 * x:6.0f} ms"
