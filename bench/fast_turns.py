"""Fast turns: the gap after the user's last word, this tree against the code
before it, in one run, with each turn's critical path.

Two ``vllm-duplex serve`` subprocesses on the default pipeline
(``configs/cascade-cpu.yaml``): one runs this tree, the other the tree at
``--before`` (a git worktree made for the run, imported in place of this one).
They take turns, question by question, so both see the same machine. Each
question is spoken by Flite (several voices) into its own realtime session
at real time, with an open microphone (silence keeps flowing while the reply
plays), and read as events arrive:

* **turn gap** (``semantic_vad``, the default): the end of the user's speech
  (the slot of its last loud chunk) -> the first reply audio delta at the
  client, p50/p90;
* **TTFA after speech_stopped** (``server_vad``, 500 ms): the client's
  ``speech_stopped`` -> the first reply audio delta, p50/p90;
* **visible revisions**: replies the client saw start (``response.created``)
  that were then cancelled -- the words they answered changed; a turn with no
  completed reply within 40 s is counted apart (``unanswered``);
* **answers right**: the expected word in the reply's transcript;
* the server's **critical path** of each turn (``response.done.metadata``):
  which stage the gap waited on, segment by segment, and the p50 per segment;
  ``socket`` is the rest of the client's gap (the last chunk's way in, the
  first audio's way out).

Each side runs its questions on a fresh server, then holds filler sessions
until it has held ``--warm-after`` (10), then runs them again: "fresh" and
"warm" rows.

    .venv/bin/python bench/fast_turns.py [--rounds 1] [--sides before@ac9f7ce now]
                                         [--modes semantic server] [--warm-after 10]

A side is ``NAME[@REF][:KEY=VALUE,...]``: the tree at git ``REF`` (default:
this one), with those environment variables (``taskset=CPUS`` pins the
server process, ``config=PATH`` serves another config; e.g. to compare CPU
placements: ``now:VLLM_CPU_OMP_THREADS_BIND=0-1``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the lib package

from lib.sides import Side, machine_line, side_servers  # noqa: E402
from lib.turns import MODES, QUESTIONS, Turn, ask  # noqa: E402


def pct(xs: list[float], q: float) -> str:
    return f"{np.quantile(xs, q):.0f}" if xs else "-"


def report(turns: list[Turn], sides: list[str], modes: list[str]) -> None:
    print("\n| side | mode | server | turn gap p50 / p90 (ms) | TTFA after speech_stopped p50 / p90 (ms) "
          "| visible revisions | unanswered in 40 s | answers right |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in modes:
        for stage in ("fresh", "warm"):
            for side in sides:
                ts = [t for t in turns if (t.side, t.mode, t.stage) == (side, mode, stage)]
                if not ts:
                    continue
                gaps = [t.gap_ms for t in ts if t.gap_ms is not None]
                ttfas = [t.ttfa_ms for t in ts if t.ttfa_ms is not None]
                print(f"| {side} | {mode} | {stage} | {pct(gaps, .5)} / {pct(gaps, .9)} | "
                      f"{pct(ttfas, .5)} / {pct(ttfas, .9)} | {sum(t.revisions for t in ts)} | "
                      f"{sum(not t.answered for t in ts)} | "
                      f"{sum(t.right for t in ts)}/{len(ts)} |")
    print("\ncritical path p50 per segment (ms), over the turns whose server reported it:")
    for side in sides:
        for mode in modes:
            segs: dict[str, list[float]] = {}
            for t in turns:
                if (t.side, t.mode) != (side, mode) or not t.path:
                    continue
                for part in t.path.split(", "):
                    name, ms = part.rsplit(" ", 1)
                    segs.setdefault(name, []).append(float(ms))
            if segs:
                print(f"  {side} {mode}: " + ", ".join(f"{k} {pct(v, .5)}" for k, v in segs.items()))


async def run(args: argparse.Namespace) -> list[Turn]:
    turns: list[Turn] = []
    with side_servers(args.sides, args.config) as started:
        servers = {s.side: s for s in started}
        for stage in ("fresh", "warm"):
            if stage == "warm":  # filler sessions until each server has held --warm-after
                for s in servers.values():
                    while s.sessions < args.warm_after:
                        await ask(s, "semantic", "filler", *QUESTIONS[s.sessions % len(QUESTIONS)])
            for _ in range(args.rounds):
                for mode in args.modes:
                    for text, voice, expect in QUESTIONS:
                        for s in servers.values():  # alternate: both see the same machine
                            t = await ask(s, mode, stage, text, voice, expect)
                            turns.append(t)
                            print(f"{t.side:6} {t.mode:8} {t.stage:5} gap {t.gap_ms or float('nan'):6.0f} "
                                  f"ttfa {t.ttfa_ms or float('nan'):6.0f} rev {t.revisions} "
                                  f"{'ok ' if t.right else 'BAD'} {t.question!r} -> {t.answer[:60]!r}\n"
                                  f"       path: {t.path}", flush=True)
    return turns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sides", nargs="+", default=["before@ac9f7ce", "now"],
                   help="NAME[@REF][:KEY=VALUE,...] each (see the module doc)")
    p.add_argument("--modes", nargs="+", default=["semantic", "server"], choices=list(MODES))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--warm-after", type=int, default=10)
    p.add_argument("--config", default="configs/cascade-cpu.yaml")
    p.add_argument("--json", help="write every turn here")
    args = p.parse_args(argv)
    load0 = os.getloadavg()
    turns = asyncio.run(run(args))
    print("\n" + machine_line(load0))
    report(turns, [Side.parse(spec).name for spec in args.sides], args.modes)
    if args.json:
        Path(args.json).write_text(json.dumps([t.__dict__ for t in turns], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
