"""Room bench (issue 44): a reply played back into the microphone as echo, and
people interrupting over it, with server-side echo cancellation
(``audio.input.echo_cancellation``) against the same without it.

    python bench/room_echo.py [--replies 20] [--voices 9] [--part both|tune|held-out]
        [--filter-ms 250[,400...]] [--bands] [--warm] [--say-at 2.0] [--json out.json]
    python bench/room_echo.py --replay [--json out.json]   # the VAD's suppressor before / now
    python bench/room_echo.py --lags 60,300,500,700 [--lag-levels -10,0] [--replies 9]
        [--corpus-voices] [--json out.json]   # the echo later than the playback's model

Rooms are pyroomacoustics image-method shoeboxes (three sizes and
reverberation times, the speaker 0.5 / 1 / 2 m from the microphone), plus
the device's own output-to-input latency (60 ms); the echo is scaled so its
energy at the microphone is -20, -10, 0 or +6 dB against the reply as played
(the reference), with fan noise at -55 dBFS. The user is close to the
microphone, as loud there as the reply is at the speaker (their voice at the
microphone is 20 dB over the echo at -20 dB, 6 dB under it at +6 dB). Everything runs through
the product's input path, sans-I/O, on a virtual clock: the session's
``InputBuffer`` (24 kHz socket audio -> 16 kHz; with echo cancellation the
reference is modelled from reply deltas "sent" faster than real time, as
an unpaced socket sends them), Silero VAD at the stage's settings (what
makes ``speech_started``) and Whisper base, beam 5 (the final's model).

- **self-interruptions**: replies (Flite and eSpeak NG voices saying answers)
  played as echo alone: a reply with any Silero onset is one that would
  have interrupted itself. Each is a session's first reply (the canceller
  learns the room in it); ``--warm`` plays another reply before it in the
  same room and counts the onsets in the second.
- **words over the echo**: real people (``bench/real_voices/``) interrupting
  two seconds into a reply: WER of Whisper on the input over the words (what
  the session's ASR is given: Speex's linear canceller's output in the product,
  AEC3's in the variants before it), against the same words in the same room
  without the echo; the barge-in latency is the first Silero onset after the
  words begin (on what the session's VAD is given: with a residual
  suppressor, its output). With a suppressor and the ASR on AEC3's output
  the WER is also taken on the VAD's view, as the ASR heard it before the
  two were split (``before``).
- **CPU**: the input path's process time per second of audio (one session).

Each case runs four ways in the same process (``VARIANTS``): echo
cancellation off (the baseline), AEC3 alone (the canceller before its
residual echo suppressor; the ASR on its output), AEC3 with the broadband
suppressor and the ASR on AEC3's output (the code before), and the product:
the VAD's view the same, the ASR on Speex's linear filter and its residual echo
suppressor (``media/echo_linear.py``) -- one variant per ``--filter-ms`` length;
``--bands`` adds AEC3 with the per-band suppressor (measured beside it); the
summary adds self-interruptions by room and the WER by part of the real
voices (tune / held-out). The per-band suppressor's settings and the linear
filter's length were chosen on the tune recordings alone (``--part tune``;
the suppressor's on replies 0-9 too); replies 10-19 (the same texts in
other voices and rooms) and the held-out recordings never tuned them.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402
import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine
from lib.real_corpus import part
from lib.rooms import ROOMS, impulse
from lib.speech_corpus import VOICES as CORPUS_VOICES
from lib.speech_corpus import WerCount, espeak, flite
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.echo import EchoCanceller
from vllm_duplex.media.echo_linear import FILTER_MS
from vllm_duplex.session.effects import Emit
from vllm_duplex.session.input_buffer import InputBuffer
from vllm_duplex.testing import noise
from vllm_duplex.testing.room import Room

RATE = 16000  # the room and the bench's own audio
WIRE = 24000  # the socket's
CHUNK = 320  # 20 ms at 16 kHz
SENT_AT = 1.0  # the reply's deltas are sent from here, 100 ms of audio per ms
SAY_AT = 2.0  # an interruption starts this long into the reply
LEVELS = (-20, -10, 0, 6)
REPLIES = (
    "The capital of France is Paris, a city on the river Seine known for its museums.",
    "A spider has eight legs, and most spiders also have eight eyes.",
    "On a clear day the sky looks blue because air scatters blue light the most.",
    "Why did the cat sit on the computer? To keep an eye on the mouse.",
    "In London today it is cloudy with light rain and a high of twelve degrees.",
    "William Shakespeare wrote Romeo and Juliet near the end of the sixteenth century.",
    "The moon is about three hundred and eighty thousand kilometres from the earth.",
    "The museum opens at nine in the morning and closes at six in the evening.",
    "The Pacific is the largest ocean, covering about a third of the planet.",
    "To make green tea, heat water to about eighty degrees and steep for two minutes.",
)
VOICES = (flite("slt"), flite("awb"), espeak("en-us"), flite("rms"))
# echo cancellation off; AEC3 alone (the canceller before issue 44's residual
# suppressor); AEC3 and the broadband suppressor, the ASR on AEC3's output (the code
# before); the product: the same for the VAD, the ASR on Speex's linear canceller
# (``linear(ms)``); AEC3 and the per-band suppressor (media/echo_bands.py, beside it)
VARIANTS = ("off", "aec3", "aec3 + broadband")
BANDS = "aec3 + bands"
BEFORE = ", ASR on the VAD's view (before)"  # a case's suffix: the ASR heard the suppressor's output
RESIDUAL = {"aec3": None, "aec3 + broadband": "broadband", "aec3 + bands": "bands"}


def linear(ms: int) -> str:
    """The product's variant with a linear filter ``ms`` long: the ASR on its
    output and Speex's residual echo suppressor after it, the VAD on AEC3 and
    the broadband suppressor (judging the lower of the two outputs)."""
    return f"speex {ms} ms + aec3 + broadband"


# the VAD on the linear filter too (``LinearResidualSuppressor``): measured, not the default
VAD_ON_LINEAR = "speex 250 ms, VAD on it"


def canceller(variant: str) -> EchoCanceller:
    if variant.startswith("speex "):
        return EchoCanceller(residual="linear" if variant == VAD_ON_LINEAR else "broadband",
                             words="linear", filter_ms=int(variant.split()[1]))
    return EchoCanceller(residual=RESIDUAL[variant], words="aec3")


def run_input(mic: np.ndarray, reply: np.ndarray | None, variant: str,
              echo: EchoCanceller | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """``mic`` (16 kHz) through the session's input buffer at real time on a
    virtual clock, echo cancellation ``variant`` (``VARIANTS``; ``echo``: that
    canceller instead, ``--replay``'s); ``reply`` is sent at ``SENT_AT``.
    Returns the 16 kHz input the ASR gets, the one the VAD gets, and the
    process time spent in them."""
    clock = [0.0]
    buf = InputBuffer(AudioFormat(), max_ms=600_000, clock=lambda: clock[0])
    if variant != "off":
        buf.set_echo_cancellation("server", AudioFormat(), echo or canceller(variant))
    wire = soxr.resample(mic, RATE, WIRE).astype(np.int16)
    out, vad, sent, cpu = [], [], reply is None, 0.0
    step = WIRE * 20 // 1000
    for i in range(0, wire.size - step + 1, step):
        clock[0] = (i + step) / WIRE
        if not sent and clock[0] >= SENT_AT:
            pcm = soxr.resample(reply, RATE, WIRE).astype(np.int16)
            deltas = [Emit(Envelope(1, Fence("s"), ev.OutputAudioDelta(
                response_id="r", item_id="item", output_index=0, content_index=0,
                delta=pcm[j:j + 2400].astype("<i2").tobytes())))
                for j in range(0, pcm.size, 2400)]
            buf.sent(deltas, SENT_AT)
            sent = True
        t = time.process_time()
        chunk = buf.append(wire[i:i + step].astype("<i2").tobytes())
        cpu += time.process_time() - t
        if chunk is not None:
            out.append(chunk.pcm)
            vad.append(chunk.for_vad().pcm)
    return np.concatenate(out), np.concatenate(vad), cpu


def onsets_ms(vad_model: Any, pcm: np.ndarray, variant: str) -> list[int]:
    """Where Silero (the stage's settings) starts speech in ``pcm``: with echo
    cancellation on, a session's VAD decides onsets on its main windows alone
    (``VadConfig.half_window_onsets``)."""
    from vllm_duplex.domain.payloads import VadConfig, VadSpeechStarted
    from vllm_duplex.stages.listening.silero_vad import SileroVad

    vad = SileroVad(vad_model, config=VadConfig(half_window_onsets=variant == "off"))
    return [e.audio_ms for i in range(0, len(pcm), CHUNK)
            for e in vad.feed(pcm[i:i + CHUNK], i // 16) if isinstance(e, VadSpeechStarted)]


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.asarray(x, np.float64) ** 2))) or 1.0


def in_room(room: Room, n: int, voice: np.ndarray | None = None, at: float = 0.0) -> np.ndarray:
    said = np.zeros(n)
    if voice is not None:
        k = int(at * RATE)
        said[k:k + voice.size] = voice[:max(0, n - k)]
    return room.mic(0, n, said)


def measure(replies: int, voices: int, variants: tuple[str, ...] = VARIANTS,
            warm: bool = False, parts: tuple[str, ...] = ("held-out", "tune"),
            say_at: float = SAY_AT) -> dict[str, Any]:
    from vllm_duplex.assets.locate import whisper_model_dir
    from vllm_duplex.stages.listening.silero_vad import load_model
    from vllm_duplex.stages.listening.whisper_model import DecodeOptions, load

    vad_model = load_model()
    whisper = load(whisper_model_dir("whisper-base"), threads=2)
    options = DecodeOptions(beam_size=5)
    hum = noise.fan(30.0, -55).astype(np.float64)
    said_replies = [(VOICES[i % len(VOICES)].name,
                     VOICES[i % len(VOICES)].speak(REPLIES[i % len(REPLIES)]))
                    for i in range(replies)]
    people = [r for p in parts for r in part(p) if r.kind != "digits"][:voices]
    rows: list[dict[str, Any]] = []
    on = variants[1:]
    cpu_s = dict.fromkeys(on, 0.0)
    audio_s = 0.0
    for level in LEVELS:
        for r, room_spec in enumerate(ROOMS):
            ir = impulse(room_spec, level)
            # self-interruptions: a reply as echo alone
            for k, (voice, reply) in enumerate(said_replies):
                if k % len(ROOMS) != r:
                    continue  # each reply in one room per level
                counted_from = 0.0  # onsets from here count (s)
                if warm:  # the reply a session's second: another one played 2 s before it
                    # (longer than the VAD's silence window: its state starts afresh)
                    before = said_replies[(k + 1) % len(said_replies)][1]
                    reply = np.concatenate([before, np.zeros(2 * RATE), reply])
                    # (an onset's time may lead the audio a little: half the gap's slack)
                    counted_from = SENT_AT + (before.size + 2 * RATE) / RATE - 0.5
                n = int((SENT_AT + reply.size / RATE + 1.0) * RATE)
                room = Room(ir, RATE, seconds=n / RATE + 1, noise=hum)
                room.play(reply, int(SENT_AT * RATE))
                mic = in_room(room, n)
                for variant in variants:
                    _, vad_pcm, cpu = run_input(mic, reply, variant)
                    if variant in on:
                        cpu_s[variant] += cpu
                    if variant == on[0]:
                        audio_s += vad_pcm.size / RATE
                    onsets = [t for t in onsets_ms(vad_model, vad_pcm, variant)
                              if t >= counted_from * 1000]
                    rows.append({"kind": "echo", "level": level, "room": room_spec[0],
                                 "voice": voice, "variant": variant, "onsets": len(onsets)})
            # words over the echo
            for k, person in enumerate(people):
                if k % len(ROOMS) != r:
                    continue
                reply = said_replies[k % len(said_replies)][1]
                words = person.audio().astype(np.float64)
                words *= rms(reply) / rms(words)  # as loud as the reply
                reply = np.tile(reply, 1 + int((say_at + words.size / RATE + 1) * RATE) // reply.size)
                n = int((SENT_AT + say_at + words.size / RATE + 1.0) * RATE)
                cases = {}
                for echo in (False, True):
                    room = Room(ir, RATE, seconds=n / RATE + 1, noise=hum)
                    if echo:
                        room.play(reply, int(SENT_AT * RATE))
                    cases[echo] = in_room(room, n, words, SENT_AT + say_at)
                span = slice(int((SENT_AT + say_at - 0.3) * RATE), n)
                for label, mic, variant in (("no echo", cases[False], "off"),
                                            *(((f"echo, {v}", cases[True], v) for v in variants))):
                    pcm, vad_pcm, _ = run_input(mic, reply if label != "no echo" else None, variant)
                    later = [t for t in onsets_ms(vad_model, vad_pcm, variant)
                             if t >= (SENT_AT + say_at) * 1000 - 100]
                    row = {"kind": "words", "level": level, "room": room_spec[0],
                           "person": person.name, "part": person.part, "case": label,
                           "text": person.text, "heard": whisper.transcribe(pcm[span], options).text,
                           "onset_ms": later[0] - (SENT_AT + say_at) * 1000 if later else None}
                    rows.append(row)
                    if RESIDUAL.get(variant):  # the code before that: the ASR heard the VAD's view
                        rows.append({**row, "case": label + BEFORE,
                                     "heard": whisper.transcribe(vad_pcm[span], options).text})
    return {"machine": machine.info(), "rows": rows, "variants": list(variants),
            "cpu_pct": {v: 100 * cpu_s[v] / max(audio_s, 1e-9) for v in on}}


def _wer(rows: list[dict[str, Any]], case: str, **match: Any) -> float:
    count = WerCount()
    for r in rows:
        if r["kind"] == "words" and r["case"] == case and all(r[k] == v for k, v in match.items()):
            count.add(r["text"], r["heard"])
    return 100 * count.wer if count.words else float("nan")  # nan: no words (--voices 0)


def summary(result: dict[str, Any]) -> None:
    rows = result["rows"]
    variants = tuple(result["variants"])
    on = variants[1:]
    # the WER's cases: no reply, each variant (the ASR on AEC3's output), and each
    # suppressor's "before" (the ASR on the VAD's view, as the code before gave it)
    wer_cases = ("no echo", *(f"echo, {v}" for v in variants),
                 *(f"echo, {v}{BEFORE}" for v in on if RESIDUAL.get(v)))
    wer_names = ("no reply", *variants, *(f"{v} before" for v in on if RESIDUAL.get(v)))
    onset_cases = ("no echo", *(f"echo, {v}" for v in on))
    print(machine.line())
    print("input path with echo cancellation, % of a core per session (the buffer's decode, "
          "resampling, AEC3, its suppressor and the linear filter where there is one): "
          + ", ".join(f"{v} {p:.2f} %" for v, p in result["cpu_pct"].items()))
    print(f"| echo level | replies that interrupted themselves: {' / '.join(variants)} "
          f"| WER over the echo: {' / '.join(wer_names)} | onset p50 after the words "
          f"(no reply / {' / '.join(on)}) |")
    print("|---|---|---|---|")
    for level in LEVELS:
        echo = [r for r in rows if r["kind"] == "echo" and r["level"] == level]
        total = len(echo) // len(variants)
        selfs = [sum(r["onsets"] > 0 for r in echo if r["variant"] == v) for v in variants]
        onset = {}
        for case in onset_cases:
            cs = [r for r in rows if r["kind"] == "words" and r["level"] == level
                  and r["case"] == case]
            heard = sorted(r["onset_ms"] for r in cs if r["onset_ms"] is not None)
            onset[case] = (f"{heard[len(heard) // 2]:.0f} ms ({len(heard)}/{len(cs)})"
                           if heard else f"- (0/{len(cs)})")
        print(f"| {level:+d} dB | {' / '.join(map(str, selfs))} of {total} "
              f"| {' / '.join(f'{_wer(rows, c, level=level):.1f}' for c in wer_cases)} % "
              f"| {' / '.join(onset[c] for c in onset_cases)} |")
    room_cases = (wer_cases[0], *wer_cases[2:])
    print(f"\nby room: self-interruptions ({' / '.join(on)}) and WER over the echo "
          f"({' / '.join(n for n in wer_names if n != 'off')}) "
          f"at {' / '.join(f'{x:+d}' for x in LEVELS)} dB")
    for name, *_ in ROOMS:
        parts = []
        for level in LEVELS:
            echo = [r for r in rows if r["kind"] == "echo" and r["level"] == level
                    and r["room"] == name]
            n = len(echo) // len(variants)
            selfs = "/".join(str(sum(r["onsets"] > 0 for r in echo if r["variant"] == v))
                             for v in on)
            wer = "/".join(f"{_wer(rows, c, level=level, room=name):.0f}" for c in room_cases)
            parts.append(f"{selfs} of {n}, {wer} %")
        print(f"  {name}: " + "; ".join(parts))
    print("\nWER over the echo by part of the real voices "
          f"({' / '.join(n for n in wer_names if n != 'off')}):")
    for part_name in ("tune", "held-out"):
        print(f"  {part_name}: " + "; ".join(
            f"{level:+d} dB " + "/".join(f"{_wer(rows, c, level=level, part=part_name):.1f}"
                                        for c in room_cases)
            for level in LEVELS))


def replay_suppressor(replies: int, out: Path | None) -> int:
    from lib import suppressor_replay as replay
    from vllm_duplex.stages.listening.silero_vad import load_model

    vad_model = load_model()

    def through_aec3(mic: np.ndarray, reply: np.ndarray) -> tuple[np.ndarray, ...]:
        kept = replay.Kept()
        run_input(mic, reply, "aec3", echo=kept)
        return kept.signals()

    said = [VOICES[i % len(VOICES)].speak(REPLIES[i % len(REPLIES)]) for i in range(replies)]
    people = [r for r in part("tune") if r.kind != "digits"]
    result = replay.measure(said, people, LEVELS, through_aec3=through_aec3,
                            onsets=lambda pcm: onsets_ms(vad_model, pcm, "aec3"),
                            in_room=in_room, sent_at=SENT_AT, say_at=SAY_AT)
    if out:
        out.write_text(json.dumps(result, indent=1))
    replay.summary(result)
    return 0


def lag_table(lags: list[int], levels: list[float], replies: int,
              corpus_voices: bool = False) -> dict[str, Any]:
    """Self-interruptions when the client's speaker plays the reply later
    than the server's model of its playback (``plugin/session/echo.py``)
    says: the device's latency set to each lag, the product's canceller
    with the reference as it came (``align=False``, the code before) and
    held back to meet its echo (``plugin/media/echo_lag.py``), on the same
    microphone signals; the voices ``VOICES``, or ``lib/speech_corpus.py``'s
    nine (real recordings among them)."""
    from vllm_duplex.stages.listening.silero_vad import load_model

    vad_model = load_model()
    variant = linear(FILTER_MS)
    hum = noise.fan(30.0, -55).astype(np.float64)
    speakers = CORPUS_VOICES if corpus_voices else VOICES
    said = [speakers[i % len(speakers)].speak(REPLIES[i % len(REPLIES)]) for i in range(replies)]
    ways = {"as it came": False, "held back": True}
    rows = []
    for lag in lags:
        for level in levels:
            row: dict[str, Any] = {"lag_ms": lag, "level_db": level}
            for way, align in ways.items():
                row[way] = []
                for k, reply in enumerate(said):
                    n = int((SENT_AT + reply.size / RATE + 1.0) * RATE)
                    room = Room(impulse(ROOMS[k % len(ROOMS)], level, device_ms=lag), RATE,
                                seconds=n / RATE + 1, noise=hum)
                    room.play(reply, int(SENT_AT * RATE))
                    echo = EchoCanceller(filter_ms=FILTER_MS, align=align)
                    _, vad_pcm, _ = run_input(in_room(room, n), reply, variant, echo=echo)
                    if onsets_ms(vad_model, vad_pcm, variant):
                        row[way].append(f"{k} ({ROOMS[k % len(ROOMS)][0]})")
            rows.append(row)
            print(f"lag {lag} ms, echo {level:+.0f} dB: self-interruptions of {replies}: "
                  + ", ".join(f"{way} {len(row[way])} {row[way]}" for way in ways), flush=True)
    return {"machine": machine.info(), "replies": replies, "corpus_voices": corpus_voices,
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--replies", type=int, default=20, help="replies per echo level")
    ap.add_argument("--voices", type=int, default=9, help="real recordings interrupting")
    ap.add_argument("--part", choices=("both", "tune", "held-out"), default="both",
                    help="which real recordings (both: the held-out ones first)")
    ap.add_argument("--filter-ms", default=str(FILTER_MS),
                    help="the product's linear filter lengths, comma-separated: one variant each")
    ap.add_argument("--vad-on-linear", action="store_true",
                    help=f"also {VAD_ON_LINEAR!r}: the VAD's view from the linear filter "
                         "(residual='linear')")
    ap.add_argument("--bands", action="store_true",
                    help="also AEC3 with the per-band suppressor (media/echo_bands.py)")
    ap.add_argument("--warm", action="store_true",
                    help="each reply a session's second: another reply plays before it in the "
                         "same room (the canceller has learned the room); its onsets are counted")
    ap.add_argument("--replay", action="store_true",
                    help="the residual suppressor before and now, replayed on AEC3's and the "
                         "linear filter's outputs: each reply in every room, the tune "
                         "recordings 2 s into a reply and in its pauses "
                         "(lib/suppressor_replay.py)")
    ap.add_argument("--lags", help="self-interruptions alone, the echo this much later than "
                    "the playback's model (ms, comma-separated), the reference as it came and "
                    "held back (plugin/media/echo_lag.py)")
    ap.add_argument("--lag-levels", default="-10,0", help="--lags' echo levels (dB)")
    ap.add_argument("--corpus-voices", action="store_true",
                    help="--lags' replies in lib/speech_corpus.py's voices")
    ap.add_argument("--say-at", type=float, default=SAY_AT,
                    help="the people interrupt this long into the reply (s): 0.5 is early in "
                         "a session's first reply, while the cancellers still learn the room")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.replay:
        return replay_suppressor(args.replies, args.json)
    if args.lags:
        print(machine.line(), flush=True)
        table = lag_table([int(x) for x in args.lags.split(",")],
                          [float(x) for x in args.lag_levels.split(",")], args.replies,
                          args.corpus_voices)
        if args.json:
            args.json.write_text(json.dumps(table, indent=1))
        return 0
    products = tuple(linear(int(ms)) for ms in args.filter_ms.split(","))
    parts = ("held-out", "tune") if args.part == "both" else (args.part,)
    result = measure(args.replies, args.voices,
                     VARIANTS + products + ((VAD_ON_LINEAR,) if args.vad_on_linear else ())
                     + ((BANDS,) if args.bands else ()),
                     warm=args.warm, parts=parts, say_at=args.say_at)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
