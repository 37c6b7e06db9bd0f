"""No-speech bench: silence and noise never become words; quiet speech does.

    python bench/no_speech.py [--isas native,avx2] [--seconds 3] [--json out.json]

For each kind of sound (``vllm_duplex.testing.noise``: silence, fan, babble,
music, keyboard, line hiss, at -50 / -35 / -25 / -15 dBFS, two seeds) and each
Whisper model the default loads (tiny.en greedy: the partials and the sure
final; base beam 5: the final), it prints Whisper's no-speech probability,
its average log-probability, the words it wrote and the gate's verdict
(``stages/listening/no_speech.py``); then the same for real speech that must
get through (questions at -40 dB, "Thank you.", "You.", "Okay.", a
question over each noise at +10 dB SNR, and the speech bench's 20 questions
in its six voices, misheard ones included), and how much of each noise Silero
VAD calls speech (its verdict gates what Whisper hears on a live session).

Each ISA runs in its own process under ``scripts/isa-cap.sh``: ``native`` as
the machine is, ``avx2`` with MKL, oneDNN and CTranslate2 capped at AVX2 (the
int8 kernels of an AVX2 machine, whose decodes differ), each also with
``/onednn``: CTranslate2's GEMMs through oneDNN, as on AMD CPUs. So both
instruction sets and both GEMM libraries are measured in one run on one
machine. The summary per ISA: noise windows with words before
the gate (faster-whisper's rule) and after it, speech windows lost, and the
margins (the lowest no-speech probability of noise, the highest of speech).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402
import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine
from lib.speech_corpus import ASR_QUESTIONS, VOICES, espeak, flite
from vllm_duplex.testing import noise

LEVELS = (-50, -35, -25, -15)
SEEDS = (0, 1)
REPO = Path(__file__).resolve().parent.parent

BABBLE_LINES = (
    (flite("slt"), "The weather was lovely so we went down to the river for a picnic."),
    (flite("awb"), "I told him the meeting had moved to Thursday afternoon."),
    (flite("rms"), "She bought apples, bread and a newspaper at the corner shop."),
    (flite("kal16"), "Could you pass me the salt and the pepper please."),
    (espeak("en-us"), "We should leave early tomorrow to avoid the traffic."),
    (espeak("en-gb"), "My cousin is coming to visit us next summer from Canada."),
    (espeak("en-us+m3"), "The children were playing football in the park all day."),
)
SPEECH = (  # (voice, text, gain in dB)
    (flite("slt"), "Please turn on the kitchen lights.", -40),
    (espeak("en-us+f3"), "What time is it in Tokyo?", -40),
    (flite("awb"), "Thank you.", 0),
    (flite("slt"), "Thank you.", -30),
    (flite("rms"), "You.", 0),
    (espeak("en-us"), "Okay.", 0),
    (flite("kal16"), "So what is the plan?", 0),
)
OVER_NOISE = (flite("slt"), "What is the capital of France?")


def sounds(seconds: float) -> tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]]]:
    """(noise cases, speech cases): (label, int16 16 kHz)."""
    makers = noise.makers([v.speak(t) for v, t in BABBLE_LINES])
    noises = [("silence", noise.silence(seconds))]
    for kind, make in makers.items():
        for db in LEVELS:
            for seed in SEEDS:
                pcm = make(seconds, db) if seed == 0 else _seeded(kind, seconds, db, seed, makers)
                noises.append((f"{kind} {db} dBFS s{seed}", pcm))
    pad = np.zeros(4800, np.int16)
    speech = []
    for voice, text, gain in SPEECH:
        pcm = (voice.speak(text).astype(np.float64) * 10 ** (gain / 20)).astype(np.int16)
        speech.append((f"{text!r} {voice.name} {gain:+d} dB", np.concatenate([pad, pcm, pad])))
    question = OVER_NOISE[0].speak(OVER_NOISE[1])
    q_db = 20 * np.log10(np.sqrt(np.mean(question.astype(np.float64) ** 2)) / 32768)
    for kind, make in makers.items():
        bed = make(seconds, q_db - 10)
        padded = np.concatenate([pad, question, pad])
        speech.append((f"question over {kind} +10 dB SNR", noise.mixed(padded, bed)))
    return noises, speech


def _seeded(kind: str, seconds: float, db: float, seed: int, makers: dict[str, Any]) -> np.ndarray:
    if kind == "babble":
        voices = [v.speak(t) for v, t in BABBLE_LINES]
        return noise.babble(voices, seconds, db, seed=seed)
    return {"fan": noise.fan, "music": noise.music, "keyboard": noise.keyboard,
            "line_hiss": noise.line_hiss}[kind](seconds, db, seed=seed)


def silero_speech_ms(pcm: np.ndarray) -> int:
    """How much of ``pcm`` Silero VAD (the stage's settings) calls speech."""
    from vllm_duplex.domain.payloads import VadSpeechStarted, VadSpeechStopped
    from vllm_duplex.stages.listening.silero_vad import SileroVad, load_model

    vad = SileroVad(load_model())
    total, start = 0, None
    for i in range(0, len(pcm), 320):
        for e in vad.feed(pcm[i:i + 320], i // 16):
            if isinstance(e, VadSpeechStarted):
                start = e.audio_ms
            elif isinstance(e, VadSpeechStopped) and start is not None:
                total, start = total + e.audio_ms - start, None
    return total + (len(pcm) // 16 - start if start is not None else 0)


def measure(seconds: float) -> dict[str, Any]:
    """One ISA, this process: every case through both models."""
    from vllm_duplex.assets.locate import whisper_model_dir
    from vllm_duplex.stages.listening.whisper_model import DecodeOptions, load

    models = {"tiny.en b1": (load(whisper_model_dir("whisper-tiny.en"), threads=1),
                             DecodeOptions(beam_size=1)),
              "base b5": (load(whisper_model_dir("whisper-base"), threads=1),
                          DecodeOptions(beam_size=5))}
    noises, speech = sounds(seconds)
    pad = np.zeros(4800, np.int16)
    corpus = [(f"{q!r} {v.name}", np.concatenate([pad, v.speak(q), pad]))
              for v in VOICES for q in ASR_QUESTIONS]
    rows = []
    for group, cases in (("noise", noises), ("speech", speech), ("corpus", corpus)):
        for label, pcm in cases:
            vad_ms = silero_speech_ms(pcm)
            for name, (model, options) in models.items():
                t = model.transcribe(pcm, options)
                words = t.text or t.dropped
                old_rule = bool(words) and not (t.no_speech_prob > 0.6 and t.avg_logprob < -1.0)
                rows.append({"group": group, "case": label, "model": name, "vad_ms": vad_ms,
                             "no_speech": round(t.no_speech_prob, 3),
                             "logprob": round(t.avg_logprob, 3), "words": words,
                             "kept": t.text, "gate": t.silenced, "old_rule_kept": old_rule})
    return {"machine": machine.info(), "rows": rows}


def summary(isa: str, result: dict[str, Any]) -> None:
    rows = result["rows"]
    noise_rows = [r for r in rows if r["group"] == "noise"]
    speech_rows = [r for r in rows if r["group"] != "noise"]
    print(f"\n[{isa}] {result['machine']['summary']}")
    for r in rows:
        if r["group"] == "corpus" and r["kept"]:
            continue  # the speech bench's 120 utterances: only a lost one is shown
        verdict = "kept" if r["kept"] else (f"dropped ({r['gate']})" if r["gate"] else "no words")
        print(f"  {r['group']:6} {r['case']:44s} {r['model']:10s} vad {r['vad_ms']:5d} ms  "
              f"p(no speech) {r['no_speech']:.2f}  logprob {r['logprob']:6.2f}  "
              f"{verdict:22s} {r['words'][:40]!r}")
    old = sum(r["old_rule_kept"] for r in noise_rows)
    new = sum(bool(r["kept"]) for r in noise_rows)
    lost = [r for r in speech_rows if not r["kept"]]
    print(f"  noise windows with words: {old}/{len(noise_rows)} under faster-whisper's rule, "
          f"{new}/{len(noise_rows)} after the gate")
    print(f"  speech windows lost by the gate: {len(lost)}/{len(speech_rows)}"
          + "".join(f"\n    {r['case']} {r['model']}: {r['gate']}" for r in lost))
    print(f"  margins: lowest p(no speech) of noise {min(r['no_speech'] for r in noise_rows):.2f}, "
          f"highest of speech {max(r['no_speech'] for r in speech_rows):.2f}")
    vad_noise = [r for r in noise_rows if r["model"] == "base b5" and r["vad_ms"] > 0]
    print(f"  Silero called speech in {len(vad_noise)} of "
          f"{len(noise_rows) // 2} noise windows: " + ", ".join(sorted({r['case'].split()[0] for r in vad_noise})))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--isas", default="native,avx2,native/onednn,avx2/onednn",
                   help="comma-separated LEVEL[/onednn] of scripts/isa-cap.sh")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--json", help="write every row here")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: this ISA only
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.seconds)))
        return 0
    print(machine.line(), flush=True)
    results = {}
    for isa in args.isas.split(","):
        level, _, onednn = isa.partition("/")
        cap = ["bash", str(REPO / "scripts/isa-cap.sh"), level, *(["--onednn"] if onednn else [])]
        out = subprocess.run([*cap, sys.executable, __file__, "--one", "--seconds", str(args.seconds)],
                             capture_output=True, text=True, check=True).stdout
        results[isa] = json.loads(out.strip().splitlines()[-1])
        summary(isa, results[isa])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
