"""Whisper decodes of several sessions in one CTranslate2 call, against one
call each: is the machine faster so?

    .venv/bin/python bench/whisper_batch.py [--reps 3]

The speech bench's questions in three voices, each padded as an utterance,
decoded the way the stage decodes them (10 s encoder window; tiny.en greedy
for partials, base beam 5 for finals) at one and two threads: B utterances
(1, 2, 4) one call each, then in one batched ``generate`` call -- the same
texts, checked. Printed per B: the time of the B decodes one after another,
of the one batched call, their ratio (the CPU saved), and when the first of
them is done (the latency a waiting user sees: one call each finishes the
first decode after one decode's time; the batch finishes them all at once).
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import machine  # noqa: E402
import numpy as np  # noqa: E402
from lib.speech_corpus import ASR_QUESTIONS, RATE, VOICES  # noqa: E402

MODELS = (("whisper-tiny.en", 1), ("whisper-base", 5))
WINDOW_S = 10.0


def main(argv: list[str] | None = None) -> int:
    import ctranslate2
    from vllm_duplex.assets.locate import whisper_model_dir
    from vllm_duplex.stages.listening.whisper_model import HOP, WhisperModel

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    print(machine.line(), flush=True)
    pad = np.zeros(RATE // 4, np.int16)
    items = [np.concatenate([pad, VOICES[i % 3].speak(q), pad]) for i, q in enumerate(ASR_QUESTIONS[:8])]
    print("\n| model | threads | B | one call each (ms) | one batched call (ms) | ratio "
          "| first done, each / batched (ms) | same text |")
    print("|---|---|---|---|---|---|---|---|")
    for name, beam in MODELS:
        for threads in (1, 2):
            model = WhisperModel(whisper_model_dir(name), threads=threads, compute_type="int8")
            model.warm_up()
            fw = model._fw
            tokenizer = model._tokenizer("en")
            prompt = fw.get_prompt(tokenizer, [], without_timestamps=True)
            frames = int(np.ceil(WINDOW_S * RATE / HOP))

            def features(pcm: np.ndarray) -> np.ndarray:
                padded = np.zeros(frames * HOP, np.float32)
                padded[:pcm.size] = pcm.astype(np.float32) / 32768.0
                return fw.feature_extractor(padded)[:, :frames]

            feats = [features(x) for x in items]

            def generate(batch: list[np.ndarray]) -> list[str]:
                x = ctranslate2.StorageView.from_array(np.ascontiguousarray(np.stack(batch)))
                out = fw.model.generate(x, [prompt] * len(batch), max_length=100, beam_size=beam)
                return [tokenizer.decode(r.sequences_ids[0]) for r in out]

            for b in (1, 2, 4):
                each, batched, first = [], [], []
                same = True
                for _ in range(args.reps):
                    for k in range(0, len(feats), b):
                        group = feats[k:k + b]
                        t = time.perf_counter()
                        one = []
                        for f in group:
                            one += generate([f])
                            if len(one) == 1:
                                first.append(time.perf_counter() - t)
                        each.append(time.perf_counter() - t)
                        t = time.perf_counter()
                        together = generate(group)
                        batched.append(time.perf_counter() - t)
                        same = same and together == one
                e, g = statistics.median(each) * 1000, statistics.median(batched) * 1000
                print(f"| {name} (beam {beam}) | {threads} | {b} | {e:.0f} | {g:.0f} | {g / e:.2f} "
                      f"| {statistics.median(first) * 1000:.0f} / {g:.0f} | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
