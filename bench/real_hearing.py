"""Real voices heard through the streaming path, against the same models'
offline decode of the same audio, in one process (issue 42).

Each recording (``lib/real_corpus.py``: people; and, beside them, a few of the
synthetic bench's Flite / eSpeak NG utterances) is streamed in 20 ms chunks
through the default pipeline's listening path -- the Silero VAD under
server VAD's settings (threshold 0.5, 300 ms prefix padding, 500 ms of
silence ends a turn, a pause reported at 100 ms), whose events reach the
Whisper stage as the session and the cascade policy forward them (the
pause as ``UserPaused``), and the Whisper stage built from
``configs/cascade-cpu.yaml`` (tiny.en partials, tiny.en beam 5 at each
pause and for each final) -- in virtual time: each chunk is processed
before the next is sent (a worker that keeps up with real time), so the
figures do not depend on the machine's load. Every final transcript of a
recording is kept, in order; their words joined are scored against what
was said. The offline side decodes the whole recording once with the
stage's final model and options (``WhisperModel.transcribe``), the way a
file is transcribed.

Reported per part (tune / held-out) and kind (real / synthetic): WER
offline and streamed and their ratio (issue 42's target: streamed <= 1.1 x
offline) with its 90 % interval over resamples of the recordings (how sure a
ratio of a few dozen errors is), the hearings streamed heard better / worse
than offline, empty finals (a turn the VAD heard that came back with no words),
lost recordings (no words at all), and split recordings (more than one
turn, with the WER of those). ``--show`` prints every recording;
``--diff`` prints each hearing whose streamed words differ from the offline
decode's: the errors of each against what was said, the words that differ,
and the VAD's cuts beside the finals they made (where a streamed loss comes
from: the segmentation, or the same audio heard elsewhere in the window).

    .venv/bin/python bench/real_hearing.py [--sides before@6d4a117 now] [--parts tune,held-out]
        [--leads 0.3,0.5,1.0] [--synthetic 4] [--show] [--diff]

``--sides``: the code each side runs (``now``: this tree; ``NAME@REF``: a
git worktree of REF, made for the run as ``fast_turns.py`` makes them,
imported in place of this tree in a child process that runs this file); the
corpus and the scoring are this tree's for every side.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import yaml  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine  # noqa: E402
from lib.real_corpus import RATE, RECORDINGS  # noqa: E402
from lib.speech_corpus import (  # noqa: E402
    ASR_QUESTIONS,
    normalize,
    HELD_OUT_SENTENCES,
    HELD_OUT_VOICES,
    VOICES,
    WerCount,
    pct,
)


def _older_trees_domain() -> None:
    """A tree from before issue 43 (``--sides before@6d4a117``) named its
    domain types ``vllm_duplex.core``, and its stages accept only those
    classes: the imports below take them from there."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("vllm_duplex.core") is None:
        return  # this tree: vllm_duplex.domain
    sys.modules["vllm_duplex.domain"] = importlib.import_module("vllm_duplex.core")
    for name in ("clock", "fence", "payloads", "session_config"):
        sys.modules[f"vllm_duplex.domain.{name}"] = importlib.import_module(f"vllm_duplex.core.{name}")


_older_trees_domain()
from vllm_duplex.domain.clock import MonotonicClock  # noqa: E402
from vllm_duplex.domain.fence import Fence  # noqa: E402
from vllm_duplex.domain.payloads import (  # noqa: E402
    AudioIn,
    StageInput,
    StageOutput,
    TranscriptFinal,
    UserPaused,
    VadConfig,
    VadPaused,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.session_config import SessionConfig, TurnDetection  # noqa: E402
from vllm_duplex.models.cascade import CascadePolicy  # noqa: E402
from vllm_duplex.stages.listening.silero_vad import SileroVad, load_model  # noqa: E402
from vllm_duplex.stages.listening.whisper import WhisperAsrStage  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# The microphone is open before and after the words. Whisper's hearing of a
# short phrase moves with where it sits in the window: the same recordings
# decoded offline with 0.1-1.0 s of silence before them scored 7.1-12.2 % WER
# (tune part, 2026-12-06), so each recording is heard at several leads and
# the figures pool them: one lead's luck does not decide a ratio.
LEADS_S, TAIL_S = (0.3, 0.5, 1.0), 1.5
CHUNK = 320  # 20 ms
# What a session under server_vad's defaults asks of its VAD (session/user_turn.py):
# 0.5, 300 ms padding, 500 ms of silence ends the turn, and a pause reported at
# 100 ms, which the cascade policy passes to the ASR as ``UserPaused`` (the
# words up to it are heard while the silence accrues).
SERVER_VAD = VadConfig(pause_ms=100)


@dataclass
class Heard:
    side: str
    name: str
    part: str
    kind: str  # "real" / "synthetic"
    text: str
    lead_s: float = LEADS_S[0]
    offline: str = ""
    finals: list[str] = field(default_factory=list)
    # The VAD's turns, (speech_started, speech_stopped) in ms of the padded
    # audio (stopped -1: never stopped): where the streamed finals were cut.
    cuts: list[list[int]] = field(default_factory=list)

    @property
    def streamed(self) -> str:
        return " ".join(f for f in self.finals if f.strip())

    @property
    def empty_finals(self) -> int:
        return sum(not f.strip() for f in self.finals)


@dataclass
class _View:
    """The read-only session view a policy decides with (``policy.SessionView``)."""

    config: SessionConfig
    items: list = field(default_factory=list)
    active_response_id: str | None = None
    user_speaking: bool = False
    policy_state: object = None
    fence: Fence = field(default_factory=lambda: Fence("bench"))
    output_paused: bool = False

    @property
    def output_modalities(self) -> tuple[str, ...]:
        return tuple(self.config.output_modalities)


class Policy:
    """The cascade policy on a server_vad session: what it sends the ASR stage
    for each output it decides (a VAD event forwarded, a pause's ``UserPaused``)."""

    def __init__(self, vad: VadConfig) -> None:
        self.policy = CascadePolicy()
        td = TurnDetection(type="server_vad", threshold=vad.threshold,
                           prefix_padding_ms=vad.prefix_padding_ms,
                           silence_duration_ms=vad.silence_duration_ms)
        config = SessionConfig(model="m", policy="cascade", turn_detection=td)
        self.view = _View(config, policy_state=self.policy.new_state())

    def route(self, payload: object, stage: str) -> list[object]:
        steps = self.policy.decide_output(
            self.view, StageOutput(self.view.fence, self.view.fence.request_id("in"), stage, payload))
        asked: list[object] = []
        if hasattr(steps, "forward"):  # an older tree's OutputDecision (``--sides NAME@REF``)
            asked += [payload] if steps.forward == "asr" else []
            steps = [steps.plan] if steps.plan is not None else []
        for step in steps:  # (by name: an older tree has no ForwardTo to import)
            kind = type(step).__name__
            if kind == "ForwardTo" and step.stage == "asr":
                asked.append(payload)
            elif kind == "AppendPlan":
                asked += [s.payload for s in step.submissions if s.stage == "asr"]
        return asked


def default_stage(config: Path = ROOT / "configs" / "cascade-cpu.yaml") -> WhisperAsrStage:
    """The Whisper stage as the default config builds it."""
    spec = next(s for s in yaml.safe_load(config.read_text())["stages"] if s["type"] == "whisper")
    options = {k: v for k, v in spec.items() if k != "type"}
    return WhisperAsrStage(clock=MonotonicClock(), warm_up=False, **options)


def padded(pcm: np.ndarray, lead_s: float) -> np.ndarray:
    return np.concatenate([np.zeros(int(lead_s * RATE), np.int16), pcm,
                           np.zeros(int(TAIL_S * RATE), np.int16)])


async def stream(stage: WhisperAsrStage, pcm: np.ndarray, session: str = "s1",
                 vad_config: VadConfig = SERVER_VAD, cuts: list[list[int]] | None = None) -> list[str]:
    """The final transcripts the listening path makes of ``pcm`` (int16 16 kHz,
    with its silences), streamed in 20 ms chunks; ``cuts`` gets the VAD's turns."""
    fence = Fence(session)
    vad = SileroVad(load_model(), config=vad_config)
    port = stage.port(session)
    await port.open(fence)
    finals: list[str] = []

    policy = Policy(vad_config)

    async def read() -> None:
        async for out in port.outputs():
            policy.route(out.payload, "asr")  # the policy sees every output, as in a session
            if isinstance(out.payload, TranscriptFinal):
                finals.append(out.payload.text)

    reader = asyncio.create_task(read())

    async def submit(payload: object) -> None:
        await port.submit(StageInput(fence, fence.request_id("in"), payload))

    for i in range(0, len(pcm), CHUNK):
        chunk, start_ms = pcm[i:i + CHUNK], i * 1000 // RATE
        events = vad.feed(chunk, start_ms)
        await submit(AudioIn(chunk, start_ms))  # the policy sends audio to both at once
        for event in events:  # the VAD's events reach the ASR after the session saw them
            if cuts is not None and isinstance(event, VadSpeechStarted):
                cuts.append([event.audio_ms, -1])
            elif cuts is not None and isinstance(event, VadSpeechStopped) and cuts:
                cuts[-1][1] = event.audio_ms
            # The session makes a pause report the policy's UserPaused (session/pauses.py).
            payload = UserPaused(event.audio_ms) if isinstance(event, VadPaused) else event
            for asked in policy.route(payload, "vad"):
                await submit(asked)
        await port.drained()
    await port.drained()
    await port.close()
    await reader
    return finals


def offline(stage: WhisperAsrStage, pcm: np.ndarray) -> str:
    return stage.model.transcribe(pcm, stage.options).text


def synthetic(n: int) -> list[tuple[str, str, str, np.ndarray]]:
    """(name, part, text, audio) of the synthetic bench's first ``n`` sentences
    in each of its voices (tuned and held-out)."""
    out = [(f"{v.name}: {t}", "tune", t, v.speak(t)) for v in VOICES for t in ASR_QUESTIONS[:n]]
    out += [(f"{v.name}: {t}", "held-out", t, v.speak(t))
            for v in HELD_OUT_VOICES for t in HELD_OUT_SENTENCES[:n]]
    return out


async def hear_all(stage: WhisperAsrStage, items: list[tuple[str, str, str, str, np.ndarray]],
                   leads: list[float], show: bool, side: str) -> list[Heard]:
    heard = []
    for n, (name, part, kind, text, pcm) in enumerate(items):
        for lead in leads:
            audio = padded(pcm, lead)
            h = Heard(side, name, part, kind, text, lead, offline=offline(stage, audio))
            h.finals = await stream(stage, audio, session=f"s{n}-{lead}", cuts=h.cuts)
            heard.append(h)
            if show:
                print(f"{side:6} {part:8} {lead:.1f} {name[:40]:40} offline {h.offline!r}\n"
                      f"{'':60} streamed {h.finals!r}", flush=True)
    return heard


def word_diff(a: str, b: str) -> str:
    """Where two transcripts' words differ (as scored): ``-offline +streamed``."""
    import difflib

    x, y = normalize(a), normalize(b)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=x, b=y, autojunk=False).get_opcodes():
        if op != "equal":
            out.append(f"-[{' '.join(x[i1:i2])}] +[{' '.join(y[j1:j2])}]")
    return "  ".join(out)


def diffs(heard: list[Heard]) -> None:
    """Every hearing whose streamed words differ from the offline decode's:
    the words each side got wrong, the words that differ, and the VAD's cuts
    beside the finals they made (the segmentation the streamed side heard)."""
    print("\nStreamed vs offline, hearing by hearing (errors against what was said; "
          "cuts: the VAD's turns in ms of the audio, its lead included):")
    for h in heard:
        if normalize(h.offline) == normalize(h.streamed):
            continue
        off, on = WerCount(), WerCount()
        off.add(h.text, h.offline)
        on.add(h.text, h.streamed)
        cuts = " ".join(f"{a}-{b if b >= 0 else 'open'}" for a, b in h.cuts)
        print(f"{h.side:6} {h.part:8} {h.kind:9} {h.lead_s:.1f} s {h.name[:38]:38} errors "
              f"{off.errors} -> {on.errors}  {word_diff(h.offline, h.streamed)}\n"
              f"{'':16} cuts {cuts}  finals {h.finals!r}")


def wer(rows: list[Heard], side: str) -> WerCount:
    count = WerCount()
    for h in rows:
        count.add(h.text, h.offline if side == "offline" else h.streamed)
    return count


def by_lead(rows: list[Heard]) -> str:
    """Each lead's offline / streamed WER: how far one lead's luck moves them."""
    leads = sorted({h.lead_s for h in rows})
    cells = []
    for lead in leads:
        some = [h for h in rows if h.lead_s == lead]
        cells.append(f"{lead:.1f} s: {pct(wer(some, 'offline').wer).strip()} / "
                     f"{pct(wer(some, 'streamed').wer).strip()}")
    return "; ".join(cells)


# Resamples of the recordings for a ratio's interval (``ratio_interval``).
BOOTSTRAP_DRAWS = 2000


def ratio_interval(pairs: list[tuple[int, int]], draws: int = BOOTSTRAP_DRAWS,
                   seed: int = 0) -> tuple[float, float]:
    """The 90 % interval of the streamed / offline error ratio over resamples
    of the recordings (``pairs``: each recording's offline and streamed
    errors, every lead's together: one recording's hearings are not
    independent). A recording's words move with where it sits in the window
    (``LEADS_S``), so a ratio of a few dozen errors is only as sure as the
    spread this shows: the bootstrap of a paired WER comparison (Bisani and
    Ney, ICASSP 2004). Seeded: the same rows give the same interval."""
    if not pairs:
        return (float("nan"), float("nan"))
    errors = np.asarray(pairs, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(errors), size=(draws, len(errors)))
    offline, streamed = errors[picks, 0].sum(axis=1), errors[picks, 1].sum(axis=1)
    ratios = np.divide(streamed, offline, out=np.full(draws, np.inf), where=offline > 0)
    low, high = np.quantile(ratios, [0.05, 0.95])
    return float(low), float(high)


def recording_errors(rows: list[Heard]) -> list[tuple[int, int]]:
    """Each recording's (offline, streamed) errors, its leads summed."""
    by_name: dict[str, list[int]] = {}
    for h in rows:
        off, on = WerCount(), WerCount()
        off.add(h.text, h.offline)
        on.add(h.text, h.streamed)
        pair = by_name.setdefault(h.name, [0, 0])
        pair[0] += off.errors
        pair[1] += on.errors
    return [(a, b) for a, b in by_name.values()]


def paired(rows: list[Heard]) -> str:
    """Hearings whose streamed words have fewer / more errors than offline's."""
    better = worse = 0
    for h in rows:
        off, on = WerCount(), WerCount()
        off.add(h.text, h.offline)
        on.add(h.text, h.streamed)
        better += on.errors < off.errors
        worse += on.errors > off.errors
    return f"{better} / {worse}"


def report(heard: list[Heard], sides: list[str]) -> None:
    print("\nEach recording heard once per lead; the figures pool every lead's words, the "
          "last column shows each lead's offline / streamed WER alone.")
    print("The ratio's interval: 90 % of resamples of the recordings (bootstrap); streamed "
          "better / worse: hearings with fewer / more errors than offline.")
    print("\n| part | voices | code | recordings x leads | WER offline | WER streamed | ratio "
          "| ratio, 90 % interval | streamed better / worse | empty finals | lost "
          "| split (WER streamed of those) | by lead |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for part in ("tune", "held-out"):
        for kind in ("real", "synthetic"):
            for side in sides:
                rows = [h for h in heard if h.part == part and h.kind == kind and h.side == side]
                if not rows:
                    continue
                off, on = wer(rows, "offline").wer, wer(rows, "streamed").wer
                split = [h for h in rows if sum(bool(f.strip()) for f in h.finals) > 1]
                lost = sum(not h.streamed.strip() for h in rows)
                ratio = f"{on / off:.2f}" if off else "-"
                split_wer = f" ({pct(wer(split, 'streamed').wer).strip()})" if split else ""
                names = len({h.name for h in rows})
                low, high = ratio_interval(recording_errors(rows))
                print(f"| {part} | {kind} | {side} | {names} x {len(rows) // names} | {pct(off).strip()} "
                      f"| {pct(on).strip()} | {ratio} | {low:.2f}-{high:.2f} | {paired(rows)} "
                      f"| {sum(h.empty_finals for h in rows)} "
                      f"| {lost} | {len(split)}{split_wer} | {by_lead(rows)} |")


def run_here(args: argparse.Namespace, side: str) -> list[Heard]:
    """This process's code heard on the corpus."""
    parts = args.parts.split(",")
    items: list[tuple[str, str, str, str, np.ndarray]] = [
        (r.name, r.part, "real", r.text, r.audio()) for r in RECORDINGS if r.part in parts]
    items += [(name, part, "synthetic", text, pcm)
              for name, part, text, pcm in synthetic(args.synthetic) if part in parts]
    stage = default_stage()
    stage.model.warm_up()
    if stage.partial_model is not None:
        stage.partial_model.warm_up()
    try:
        leads = [float(x) for x in args.leads.split(",")]
        return asyncio.run(hear_all(stage, items, leads, args.show, side))
    finally:
        stage.shutdown_workers()


def run_tree(args: argparse.Namespace, side: str, ref: str) -> list[Heard]:
    """A worktree of ``ref``'s code heard on this tree's corpus (a child process)."""
    from lib.sides import TREE_IMPORTS, before_tree

    tree = before_tree(ref)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        boot = TREE_IMPORTS + f"import runpy; runpy.run_path({str(Path(__file__))!r}, run_name='__main__')"
        argv = [sys.executable, "-c", boot, str(tree), "--sides", side, "--json", out.name,
                "--parts", args.parts, "--synthetic", str(args.synthetic), "--leads", args.leads]
        subprocess.run(argv + (["--show"] if args.show else []), check=True)
        return [Heard(**row) for row in json.loads(Path(out.name).read_text())]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sides", nargs="+", default=["before@6d4a117", "now"],
                   help="NAME[@REF] each: REF's code, or this tree's")
    p.add_argument("--parts", default="tune,held-out")
    p.add_argument("--leads", default=",".join(str(x) for x in LEADS_S),
                   help="seconds of silence before the words, each a hearing (comma-separated)")
    p.add_argument("--synthetic", type=int, default=4,
                   help="sentences per synthetic voice (0: real voices only)")
    p.add_argument("--show", action="store_true", help="print every recording's transcripts")
    p.add_argument("--diff", action="store_true",
                   help="print each hearing whose streamed words differ from offline's, "
                        "with the VAD's cuts")
    p.add_argument("--json", help=argparse.SUPPRESS)  # a side's rows, for the parent
    args = p.parse_args(argv)
    t0, load0 = time.monotonic(), os.getloadavg()
    heard: list[Heard] = []
    names = []
    for spec in args.sides:
        name, _, ref = spec.partition("@")
        names.append(name)
        if ref and not args.json:
            heard += run_tree(args, name, ref)
        else:
            heard += run_here(args, name)
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(h) for h in heard]))
        return 0
    print(f"\n{machine.line()} (at start {load0[0]:.1f}); {time.monotonic() - t0:.0f} s")
    if args.diff:
        diffs(heard)
    report(heard, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
