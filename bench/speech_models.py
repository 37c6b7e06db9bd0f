"""Speech models benchmark: the embedded ASR and TTS options side by side, and
the spoken QA of the new default against the old one, in one run.

    python bench/speech_models.py [--parts asr,partials,tts,prompt,qa] [--questions 20]
                                  [--qa-questions 36] [--qa-voices 3] [--fast] [--json out.json]

Parts (all on the CPU, models from the installed packages, audio from Flite
and eSpeak NG; see ``lib/speech_corpus.py`` for the texts and voices):

asr       every ASR option on 20 questions x 6 voices: word error rate per voice
          and overall, real-time factor (decode time / audio), end-of-utterance
          latency (Whisper decodes the utterance when it ends; PocketSphinx
          streams, so its latency is ``end_utt``). Whisper variants show why the
          defaults are what they are (window, beam, threads; the default
          final is tiny.en beam 5, heard at the pause); the last row is the
          final before it (tiny.en greedy's answer at the pause when it was
          sure of it, else base). Run again on the held-out part
          (``speech_corpus.HELD_OUT_*``: sentences and voices no setting was
          chosen on), reported apart.
partials  the streaming first pass, PocketSphinx against Whisper tiny.en
          re-decodes on the stage's budget, each followed by the default's
          final: partial WER, how many of the final's words were pushed early,
          how often the final revised a pushed word (a rollback) and how often the
          pushed text is a prefix of the final (the vLLM fast path), CPU per
          audio second, and the event-loop lag of a Python loop running beside it
          (the GIL).
tts       Piper (en_US-joe-medium) against Flite (slt): time to the first audio
          of a 12-word sentence and of a short first clause, real-time factor,
          and intelligibility: Whisper base's WER on what each says.
prompt    the QA set typed (no audio) through the vLLM stage with each candidate
          instruction: how the default instructions were chosen.
qa        the spoken QA set over several voices, through the realtime socket at
          real time, on the new default (configs/cascade-cpu.yaml) and the old one
          (configs/cascade-cpu-light.yaml), one vLLM engine: answer right rate,
          transcript exact rate, turn gap (speech_stopped -> first audio), and
          the memory of each pipeline (process tree RSS).

Targets (reported, never asserted): ASR WER <= 10 % overall and <= 15 % per
voice; spoken QA right >= 80 % on the new default; TTS intelligibility WER
<= 3 %; first audio of a short first clause <= 100 ms after it is ready.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

# ruff: noqa: E402
import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine
from lib.speech_corpus import (
    ASR_QUESTIONS,
    HELD_OUT_SENTENCES,
    HELD_OUT_VOICES,
    QA,
    QA_VOICES,
    RATE,
    VOICES,
    WerCount,
    ms,
    pct,
)
from vllm_duplex.assets.locate import whisper_model_dir
from vllm_duplex.models.cascade.transcript import Utterance, same_words, words
from vllm_duplex.stages.listening.pocketsphinx import DecoderPool, clean_hypothesis
from vllm_duplex.stages.listening.whisper_model import DecodeOptions, load
from vllm_duplex.stages.listening.whisper_stream import (
    CONFIDENT_LOGPROB,
    PartialSchedule,
    WhisperListener,
)

LEAD_MS, TAIL_MS = 300, 300  # around each utterance, as the stage passes it (prefix padding, tail)


def padded(pcm: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros(LEAD_MS * 16, np.int16), pcm, np.zeros(TAIL_MS * 16, np.int16)])


def corpus(questions: int) -> list[tuple[str, str, np.ndarray]]:
    """(voice, text, int16 16 kHz audio) for every voice and question."""
    return [(v.name, q, padded(v.speak(q))) for v in VOICES for q in ASR_QUESTIONS[:questions]]


def held_out_corpus() -> list[tuple[str, str, np.ndarray]]:
    """The held-out part (speech_corpus.py): never used to choose a setting."""
    return [(v.name, q, padded(v.speak(q))) for v in HELD_OUT_VOICES for q in HELD_OUT_SENTENCES]


# ---- ASR ------------------------------------------------------------------------------------


def sphinx_stream(pool: DecoderPool, pcm: np.ndarray, partial_every: int = 3200
                  ) -> tuple[str, float, float, list[tuple[int, str]]]:
    """PocketSphinx as the stage runs it: 20 ms chunks, a hypothesis every
    200 ms. (final text, decode CPU s, end_utt s, [(sample, partial)])."""
    decoder = pool.acquire()
    partials: list[tuple[int, str]] = []
    try:
        decoder.start_utt()
        cpu = 0.0
        for i in range(0, len(pcm), 320):
            t = time.perf_counter()
            decoder.process_raw(pcm[i:i + 320].tobytes(), False, False)
            if (i + 320) % partial_every == 0:
                hyp = decoder.hyp()
                text = clean_hypothesis(hyp.hypstr) if hyp is not None else ""
                if text and (not partials or partials[-1][1] != text):
                    partials.append((i + 320, text))
            cpu += time.perf_counter() - t
        t = time.perf_counter()
        decoder.end_utt()
        hyp = decoder.hyp()
        end = time.perf_counter() - t
        return (clean_hypothesis(hyp.hypstr) if hyp is not None else ""), cpu + end, end, partials
    finally:
        pool.release(decoder)


WHISPER_OPTIONS = (  # (label, model, beam, window, threads)
    ("whisper base b5 w10 t1 (final before)", "whisper-base", 5, 10.0, 1),
    ("whisper base b5 w10 t2", "whisper-base", 5, 10.0, 2),
    ("whisper base b1 w10 t2", "whisper-base", 1, 10.0, 2),
    ("whisper base b5 w30 t2 (30 s window)", "whisper-base", 5, 30.0, 2),
    ("whisper base b5 w5 t2 (5 s window)", "whisper-base", 5, 5.0, 2),
    ("whisper tiny.en b5 w10 t1 (default final)", "whisper-tiny.en", 5, 10.0, 1),
    ("whisper tiny.en b3 w10 t1", "whisper-tiny.en", 3, 10.0, 1),
    ("whisper tiny.en b1 w10 t1 (partials)", "whisper-tiny.en", 1, 10.0, 1),
)


def part_asr(items: list[tuple[str, str, np.ndarray]]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    audio_s = sum(len(p) for _, _, p in items) / RATE

    def report(label: str, per_voice: dict[str, WerCount], cpu: float, latencies: list[float]) -> None:
        total = WerCount(sum(w.errors for w in per_voice.values()), sum(w.words for w in per_voice.values()))
        lat = sorted(latencies)
        results[label] = {"wer": total.wer, "per_voice": {v: w.wer for v, w in per_voice.items()},
                          "rtf": cpu / audio_s, "eou_median_s": statistics.median(lat),
                          "eou_p90_s": lat[int(0.9 * (len(lat) - 1))]}
        voices = "  ".join(f"{v.split()[-1]} {pct(w.wer)}" for v, w in per_voice.items())
        print(f"  {label:42s} WER {pct(total.wer)}  RTF {cpu / audio_s:5.3f}  end of utterance "
              f"{ms(statistics.median(lat))} (p90 {ms(results[label]['eou_p90_s'])})  | {voices}",
              flush=True)

    pool = DecoderPool(max_idle=1)
    per_voice: dict[str, WerCount] = {}
    cpu, lat = 0.0, []
    for voice, text, pcm in items:
        hyp, c, end, _ = sphinx_stream(pool, pcm)
        per_voice.setdefault(voice, WerCount()).add(text, hyp)
        cpu += c
        lat.append(end)
    report("pocketsphinx (streaming)", per_voice, cpu, lat)
    for label, name, beam, window, threads in WHISPER_OPTIONS:
        model = load(whisper_model_dir(name), threads=threads)
        model.warm_up()
        options = DecodeOptions(beam_size=beam, min_window_s=window)
        per_voice, cpu, lat = {}, 0.0, []
        for voice, text, pcm in items:
            t = time.perf_counter()
            hyp = model.transcribe(pcm, options).text
            dt = time.perf_counter() - t
            per_voice.setdefault(voice, WerCount()).add(text, hyp)
            cpu += dt
            lat.append(dt)
        report(label, per_voice, cpu, lat)
    # The final before (as the stage made it): tiny.en greedy's answer at the
    # pause when it was confident (no second decode), else Whisper base.
    tiny, base = (load(whisper_model_dir(n), threads=1) for n in ("whisper-tiny.en", "whisper-base"))
    per_voice, cpu, lat, confident = {}, 0.0, [], 0
    for voice, text, pcm in items:
        t = time.perf_counter()
        heard = tiny.transcribe(pcm, DecodeOptions(beam_size=1, min_window_s=10.0))
        if heard.avg_logprob >= CONFIDENT_LOGPROB:
            hyp, confident = heard.text, confident + 1
        else:
            hyp = base.transcribe(pcm, DecodeOptions(beam_size=5, min_window_s=10.0)).text
        dt = time.perf_counter() - t
        per_voice.setdefault(voice, WerCount()).add(text, hyp)
        cpu += dt
        lat.append(dt)
    report("gated final (tiny.en if sure, else base): before", per_voice, cpu, lat)
    results["gated final (tiny.en if sure, else base): before"]["tiny_confident"] = confident / len(items)
    print(f"  {'':42s} tiny.en was sure of {confident} of {len(items)} (no base decode)")
    return results


# ---- streaming first pass -------------------------------------------------------------------


@dataclasses.dataclass
class FirstPass:
    partial_wer: WerCount = dataclasses.field(default_factory=WerCount)
    cpu_s: float = 0.0
    audio_s: float = 0.0
    final_words: int = 0
    pushed_words: int = 0
    rollbacks_while_speaking: int = 0
    revised_at_final: int = 0
    fast_path: int = 0
    utterances: int = 0
    first_partial_ms: list[float] = dataclasses.field(default_factory=list)

    def policy(self, partials: list[str], final: str) -> None:
        """What the cascade policy does with these partials and this final."""
        utt = Utterance()
        for p in partials:
            hyp = words(p)
            stable = utt.update(hyp)
            if utt.pushed and utt.revised(hyp):
                self.rollbacks_while_speaking += 1
                utt.pushed = list(stable)
            elif same_words(stable[: len(utt.pushed)], utt.pushed):
                utt.pushed = utt.pushed + stable[len(utt.pushed):]
        fw = words(final)
        self.utterances += 1
        self.final_words += len(fw)
        if utt.pushed and utt.revised(fw):
            self.revised_at_final += 1
        else:
            self.pushed_words += len(utt.pushed)
            # The vLLM stage's fast path: the text it holds is a prefix of the final turn.
            self.fast_path += final.startswith(" ".join(utt.pushed))

    def row(self) -> dict[str, Any]:
        n = max(1, self.utterances)
        return {"partial_wer": self.partial_wer.wer, "cpu_per_audio_s": self.cpu_s / self.audio_s,
                "pushed_of_final_words": self.pushed_words / max(1, self.final_words),
                "rollbacks_while_speaking_per_utt": self.rollbacks_while_speaking / n,
                "final_revised_pushed_words": self.revised_at_final / n,
                "fast_path": self.fast_path / n,
                "first_partial_median_ms": statistics.median(self.first_partial_ms or [float("nan")])}


def loop_lag(work: Any) -> tuple[float, float]:
    """Run ``work()`` in a thread while an asyncio loop ticks every 5 ms here:
    (p99, max) lateness of the ticks -- what a decode holding the GIL costs
    every session's event loop."""
    late: list[float] = []

    async def tick(done: threading.Event) -> None:
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            late.append(time.perf_counter() - t - 0.005)

    async def main() -> None:
        done = threading.Event()
        thread = threading.Thread(target=lambda: (work(), done.set()))
        ticker = asyncio.create_task(tick(done))
        thread.start()
        await ticker
        thread.join()

    asyncio.run(main())
    late.sort()
    return late[int(0.99 * (len(late) - 1))], late[-1]


def part_partials(items: list[tuple[str, str, np.ndarray]]) -> dict[str, Any]:
    tiny = load(whisper_model_dir("whisper-tiny.en"), threads=1)
    tiny.warm_up()
    tiny_opts, final_opts = DecodeOptions(beam_size=1), DecodeOptions(beam_size=5)
    finals = [tiny.transcribe(p, final_opts).text for _, _, p in items]  # the default's final
    pool = DecoderPool(max_idle=1)
    sphinx, whisper = FirstPass(), FirstPass()
    for (voice, text, pcm), final in zip(items, finals):
        _, cpu, _, parts = sphinx_stream(pool, pcm)
        sphinx.cpu_s += cpu
        sphinx.audio_s += len(pcm) / RATE
        sphinx.partial_wer.add(text, parts[-1][1] if parts else "")
        if parts:
            sphinx.first_partial_ms.append((parts[0][0] - LEAD_MS * 16) / 16)
        sphinx.policy([p for _, p in parts], final)

        got: list[tuple[int, str]] = []
        cost = [0.0]

        def partial(audio: np.ndarray) -> str:
            t = time.perf_counter()
            out = tiny.transcribe(audio, tiny_opts).text
            cost[0] += time.perf_counter() - t
            return out

        lis = WhisperListener(lambda a: "", partial, schedule=PartialSchedule(), vad_gated=False)
        for i in range(0, len(pcm), 320):
            for out in lis.audio(pcm[i:i + 320], i // 16):
                if out.text:
                    got.append((i + 320, out.text))
        whisper.cpu_s += cost[0]
        whisper.audio_s += len(pcm) / RATE
        whisper.partial_wer.add(text, got[-1][1] if got else "")
        if got:
            whisper.first_partial_ms.append((got[0][0] - LEAD_MS * 16) / 16)
        whisper.policy([p for _, p in got], final)
    sample = [p for _, _, p in items[:6]]
    lags = {"pocketsphinx": loop_lag(lambda: [sphinx_stream(pool, p) for p in sample]),
            "whisper tiny.en partial": loop_lag(lambda: [tiny.transcribe(p, tiny_opts) for p in sample]),
            "whisper tiny.en final": loop_lag(lambda: [tiny.transcribe(p, final_opts) for p in sample])}
    results = {"pocketsphinx": sphinx.row(), "whisper tiny.en re-decodes": whisper.row(),
               "loop_lag_s": {k: {"p99": a, "max": b} for k, (a, b) in lags.items()}}
    for name, row in (("pocketsphinx", results["pocketsphinx"]),
                      ("whisper tiny.en re-decodes", results["whisper tiny.en re-decodes"])):
        print(f"  {name:28s} partial WER {pct(row['partial_wer'])}  CPU/audio "
              f"{row['cpu_per_audio_s']:5.3f}  pushed {pct(row['pushed_of_final_words'])} of the "
              f"final's words  final revised a pushed word {pct(row['final_revised_pushed_words'])}  "
              f"fast path {pct(row['fast_path'])}  rollbacks while speaking "
              f"{row['rollbacks_while_speaking_per_utt']:.2f}/utt  first partial "
              f"{row['first_partial_median_ms']:.0f} ms after onset", flush=True)
    for name, (p99, worst) in lags.items():
        print(f"  event loop beside {name:24s}: tick lateness p99 {ms(p99)}, max {ms(worst)}")
    return results


# ---- TTS ------------------------------------------------------------------------------------

TTS_SENTENCES = (
    "The capital of France is Paris, a city known for its art and food.",  # 12 words +
    "A spider has eight legs.",
    "Sure, the answer is four.",
    "The largest ocean on Earth is the Pacific Ocean.",
    "I can set a timer for ten minutes if you like.",
    "Mars is called the red planet because of its rusty soil.",
    "Honey is made by bees from the nectar of flowers.",
    "The opposite of hot is cold.",
    "William Shakespeare wrote Romeo and Juliet.",
    "It will be sunny tomorrow, with a light breeze in the afternoon.",
)
TWELVE = "I think the weather will be sunny and warm for the whole weekend."
SHORT_CLAUSE = "Sure, the answer is four,"


async def part_tts() -> dict[str, Any]:
    from vllm_duplex.domain.clock import MonotonicClock
    from vllm_duplex.stages.speech.piper import PiperTtsStage
    from vllm_duplex.stages.speech.subprocess_tts import FliteTtsStage

    base = load(whisper_model_dir("whisper-base"), threads=2)
    base.warm_up()
    results: dict[str, Any] = {}
    texts = (*TTS_SENTENCES, *ASR_QUESTIONS)
    for label, stage in (("piper en_US-joe-medium", PiperTtsStage(clock=MonotonicClock())),
                         ("flite slt", FliteTtsStage(clock=MonotonicClock()))):
        for _ in range(3):  # warm: first runs of the graph and of the binary are slower
            await stage.synthesize("Hello there.")
        first12, first_clause, synth_s, audio_s = [], [], 0.0, 0.0
        for _ in range(5):
            t = time.perf_counter()
            await stage.synthesize(TWELVE)
            first12.append(time.perf_counter() - t)
            t = time.perf_counter()
            await stage.synthesize(SHORT_CLAUSE)
            first_clause.append(time.perf_counter() - t)
        wer = WerCount()
        for text in texts:
            t = time.perf_counter()
            pcm = await stage.synthesize(text)
            synth_s += time.perf_counter() - t
            audio_s += len(pcm) / 16000
            wer.add(text, base.transcribe(pcm).text)
        results[label] = {"first_audio_12_words_s": statistics.median(first12),
                          "first_audio_short_clause_s": statistics.median(first_clause),
                          "rtf": synth_s / audio_s, "intelligibility_wer": wer.wer}
        print(f"  {label:24s} first audio: 12-word sentence {ms(statistics.median(first12))}, "
              f"short first clause {ms(statistics.median(first_clause))}  RTF {synth_s / audio_s:5.3f}  "
              f"Whisper base WER on its speech {pct(wer.wer)} ({len(texts)} texts)", flush=True)
        close = getattr(stage, "close", None)
        if close is not None:
            close()
    return results


# ---- main -----------------------------------------------------------------------------------


async def with_llm(args: argparse.Namespace, results: dict[str, Any]) -> None:
    from vllm_duplex.stages.vllm.llm import VllmLlmStage

    stage = VllmLlmStage()
    await stage.start()
    try:
        from lib.speech_qa import INSTRUCTIONS, part_prompt, part_qa

        if "prompt" in args.parts:
            print("[prompt] the QA set typed, per instruction candidate", flush=True)
            chosen = {k: v for k, v in INSTRUCTIONS.items()
                      if not args.candidates or k in args.candidates}
            results["prompt"] = await part_prompt(stage, chosen)
        if "qa" in args.parts:
            results["qa"] = await part_qa(stage, ["cascade-cpu", "cascade-cpu-light"], args.qa_voices,
                                          args.qa_questions, args.fast, args.instructions)
    finally:
        await stage.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="asr,partials,tts,qa",
                        type=lambda s: set(s.split(",")))
    parser.add_argument("--questions", type=int, default=len(ASR_QUESTIONS))
    parser.add_argument("--qa-questions", type=int, default=len(QA))
    parser.add_argument("--qa-voices", type=int, default=len(QA_VOICES))
    parser.add_argument("--instructions", default=None, help="override the configs' instructions")
    parser.add_argument("--candidates", default=None, type=lambda s: set(s.split(",")),
                        help="prompt: only these instruction candidates")
    parser.add_argument("--fast", action="store_true", help="qa: send audio faster than real time")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print(machine.line(), flush=True)
    results: dict[str, Any] = {}
    if args.parts & {"asr", "partials"}:
        items = corpus(args.questions)
        print(f"{len(items)} utterances, {sum(len(p) for *_, p in items) / RATE:.0f} s of audio",
              flush=True)
        if "asr" in args.parts:
            print("[asr] the tuned part", flush=True)
            results["asr"] = part_asr(items)
            held_out = held_out_corpus()
            print(f"[asr] the held-out part: {len(held_out)} utterances", flush=True)
            results["asr_held_out"] = part_asr(held_out)
        if "partials" in args.parts:
            print("[partials] streaming first pass, then the final (tiny.en beam 5)", flush=True)
            results["partials"] = part_partials(items)
    if "tts" in args.parts:
        print("[tts]", flush=True)
        results["tts"] = asyncio.run(part_tts())
    if args.parts & {"prompt", "qa"}:
        asyncio.run(with_llm(args, results))
    print(f"load at the end: {os.getloadavg()[0]:.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
