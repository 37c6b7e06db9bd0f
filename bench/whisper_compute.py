"""Whisper's compute type and threads on this CPU: speed and words of each.

    .venv/bin/python bench/whisper_compute.py [--questions 10] [--isas native,avx2]

Every compute type CTranslate2 offers on this CPU (int8, int8_float32,
int16, float32) at one and two threads, for the final (base, beam 5) and the
partials' model (tiny.en, greedy), over the speech bench's questions in
three voices: decode time per utterance (median), real-time factor and word
error rate. Each ISA (``scripts/isa-cap.sh`` levels) runs in its own
process. The setting the engine chooses on this machine (``domain/machine.py``)
is marked ``<- machine``. Nothing is asserted.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine
from lib.speech_corpus import ASR_QUESTIONS, RATE, VOICES, WerCount

REPO = Path(__file__).resolve().parent.parent
MODELS = (("whisper-base", 5), ("whisper-tiny.en", 1))


def measure(questions: int) -> dict:
    from vllm_duplex.assets.locate import whisper_model_dir
    from vllm_duplex.domain.machine import choose, detect
    from vllm_duplex.stages.listening.whisper_model import (
        DecodeOptions,
        WhisperModel,
        supported_compute_types,
    )

    types = sorted(supported_compute_types())
    chosen = choose(detect(), {}, compute_types=frozenset(types))
    pad = np.zeros(RATE // 4, np.int16)
    items = [(q, np.concatenate([pad, v.speak(q), pad]))
             for v in VOICES[:3] for q in ASR_QUESTIONS[:questions]]
    audio_s = sum(len(p) for _, p in items) / RATE
    rows = []
    for name, beam in MODELS:
        for compute in types:
            for threads in (1, 2):
                model = WhisperModel(whisper_model_dir(name), threads=threads, compute_type=compute)
                model.warm_up()
                wer, times = WerCount(), []
                for text, pcm in items:
                    t = time.perf_counter()
                    heard = model.transcribe(pcm, DecodeOptions(beam_size=beam)).text
                    times.append(time.perf_counter() - t)
                    wer.add(text, heard)
                mine = (compute == chosen.whisper_compute_type.value and
                        threads == (chosen.whisper_threads.value if name == "whisper-base" else 1))
                rows.append({"model": name, "beam": beam, "compute_type": compute,
                             "threads": threads, "ms": statistics.median(times) * 1000,
                             "rtf": sum(times) / audio_s, "wer": wer.wer, "machine": mine})
    return {"machine": machine.info(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", type=int, default=10)
    p.add_argument("--isas", default="native,avx2")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.questions)))
        return 0
    print(machine.line(), flush=True)
    for isa in args.isas.split(","):
        level, _, onednn = isa.partition("/")
        cap = ["bash", str(REPO / "scripts/isa-cap.sh"), level, *(["--onednn"] if onednn else [])]
        out = subprocess.run([*cap, sys.executable, __file__, "--one", "--questions",
                              str(args.questions)], capture_output=True, text=True, check=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        print(f"\n[{isa}] {result['machine']['summary']}")
        base = {r["model"]: r for r in result["rows"] if r["compute_type"] == "int8" and r["threads"] == 1}
        for r in result["rows"]:
            ref = base.get(r["model"], r)
            print(f"  {r['model']:16s} b{r['beam']} {r['compute_type']:13s} t{r['threads']}  "
                  f"{r['ms']:6.0f} ms/utterance ({r['ms'] / ref['ms']:4.2f}x int8 t1)  "
                  f"RTF {r['rtf']:.3f}  WER {r['wer'] * 100:5.1f}%"
                  + ("  <- machine" if r["machine"] else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
