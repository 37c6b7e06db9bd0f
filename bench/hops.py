"""How many hops one spoken turn takes through the session's modules.

A ``SessionCore`` with the real cascade policy is driven through one spoken
turn under ``semantic_vad`` with paced output -- speech, the pause, its
words, ``P(end)``, the reply started in the pause, the commit, the final
transcript that releases the reply, its audio going out -- and then speech
over the reply that lasts long enough to interrupt it. The clock is
virtual (the core's timers fire when the script reaches their time), so
the run is the same on every machine.

A profile hook counts every call from a function of one module of the
tree (``plugin/``, ``models/``) into a function of another:

* per pair of ``session/`` modules, both ways (``core<->decisions 19/22``:
  19 calls from the core into decisions, 22 back), and in all the calls
  from another ``session/`` module back into ``core.py`` (a helper calling
  back into the core that called it: a trampoline);
* for the one ``TranscriptFinal`` that releases the reply: the calls into
  the tree's functions it makes and the modules they run in.

Fewer hops is the aim of the house's step 3 (a reply has one owner, helpers
return effects instead of calling back into the core).

    .venv/bin/python bench/hops.py [--sides before@REF now]

``--sides``: each ``NAME[@REF]`` runs in its own process on a git worktree
of ``REF`` (the current tree without one), side by side in one table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Files that hold parts of SessionCore's own class (its SessionView, how it
# carries out asks): counted as the core, not as helpers calling back into it.
CORE_CLASS = ("session/view", "session/carrying")

# Runs the measurement in a child on the tree given first (before@REF: a worktree).
_MEASURE = r"""
sys.path.insert(0, sys.argv[1].rsplit("/", 1)[0])
import hops
hops.measure(root)
"""


def measure(root: str) -> None:
    """Drive the turn on the tree at ``root`` and print the counts as JSON."""
    import numpy as np
    from vllm_duplex.domain import commands as cmd
    from vllm_duplex.domain.metrics import Metrics
    from vllm_duplex.domain.payloads import (
        AudioOut,
        GenerateRequest,
        GenerationDone,
        StageOutput,
        TextDelta,
        TranscriptFinal,
        TranscriptPartial,
        TurnEndProbability,
        VadSpeechStarted,
        VadSpeechStopped,
    )
    from vllm_duplex.domain.session_config import SessionConfig, TurnDetection
    from vllm_duplex.models.cascade import CascadePolicy
    from vllm_duplex.session.core import SessionCore
    from vllm_duplex.session.effects import ArmTimer, CancelTimer, Submit, TimerFired

    policy = CascadePolicy()
    td = TurnDetection(type="semantic_vad", eagerness="auto")
    core = SessionCore("s", config=SessionConfig(model="m", policy=policy.name, turn_detection=td),
                       policy=policy, stage_names=("vad", "asr", "llm", "tts"), metrics=Metrics(),
                       now=0.0)
    timers: dict[str, float] = {}
    replies: list[str] = []

    def track(effects: list) -> None:
        for e in effects:
            if isinstance(e, ArmTimer):
                timers[e.name] = e.at
            elif isinstance(e, CancelTimer):
                timers.pop(e.name, None)
            elif isinstance(e, Submit) and isinstance(e.payload, GenerateRequest):
                replies.append(e.payload.response_id)

    def until(t: float) -> None:
        """Fire every timer due by ``t``, in time order."""
        while timers and min(timers.values()) <= t:
            name = min(timers, key=timers.__getitem__)
            at = timers.pop(name)
            track(core.handle(TimerFired(name), at))

    def out(t: float, stage: str, payload: object) -> list:
        until(t)
        fence = core.fence
        effects = core.handle(StageOutput(fence, fence.request_id(stage), stage, payload), t)
        track(effects)
        return effects

    track(core.start("tok", 0.0))
    tree = (str(Path(root) / "plugin"), str(Path(root) / "models"))
    pairs: Counter[tuple[str, str]] = Counter()
    final = {"calls": 0, "modules": set()}
    counting_final = [False]

    def label(path: str) -> str | None:
        for base in tree:
            if path.startswith(base):
                rel = path[len(base) + 1:].removesuffix(".py")
                if rel in CORE_CLASS:
                    return "session/core"  # the same class, kept in another file
                return rel if base.endswith("plugin") else "models/" + rel
        return None

    def hook(frame, event, arg) -> None:
        if event != "call":
            return
        callee = label(frame.f_code.co_filename)
        if callee is None:
            return
        if counting_final[0]:
            final["calls"] += 1
            final["modules"].add(callee)
        caller = label(frame.f_back.f_code.co_filename) if frame.f_back else None
        if caller is not None and caller != callee:
            pairs[(caller, callee)] += 1

    words = "what is the capital of france"
    second = bytes(2 * 24000)
    sys.setprofile(hook)
    try:
        track(core.handle(cmd.AudioAppend(audio=second), 1.0))
        out(1.0, "vad", VadSpeechStarted(audio_ms=0))
        ws = words.split()
        for n in range(1, len(ws) + 1):
            out(1.0 + 0.1 * n, "asr", TranscriptPartial(" ".join(ws[:n])))
        out(2.1, "vad", VadSpeechStopped(audio_ms=1000))
        out(2.11, "asr", TranscriptPartial(words, at_pause=True))
        out(2.12, "llm", TurnEndProbability(0.9, words))
        rid = replies[-1]
        out(2.15, "llm", TextDelta(rid, "The capital of France is Paris."))
        out(2.3, "tts", AudioOut(rid, np.zeros(12000, np.int16), text="The capital"))
        until(2.34)  # the pause's deadline: the turn commits
        counting_final[0] = True
        out(2.35, "asr", TranscriptFinal("What is the capital of France?"))
        counting_final[0] = False
        out(2.4, "tts", AudioOut(rid, np.zeros(24000, np.int16), text="of France is Paris."))
        out(2.4, "llm", GenerationDone(rid, "stop"))
        # Speech over the reply, long enough to be an interruption.
        until(2.8)
        track(core.handle(cmd.AudioAppend(audio=second), 2.8))
        out(2.8, "vad", VadSpeechStarted(audio_ms=2000))
        out(2.9, "asr", TranscriptPartial("wait"))
        until(5.0)
    finally:
        sys.setprofile(None)
    session = {f"{a}->{b}": n for (a, b), n in sorted(pairs.items())
               if a.startswith("session/") and b.startswith("session/")}
    back = sum(n for (a, b), n in pairs.items() if b == "session/core" and a.startswith("session/"))
    print(json.dumps({"pairs": session, "calls_back_into_core": back,
                      "cross_module_calls": sum(session.values()),
                      "all_cross_module_calls": sum(pairs.values()),
                      "final_calls": final["calls"], "final_modules": len(final["modules"]),
                      "interrupted": core.metrics.interrupts.get(reason="turn_detected")}))


def run_side(spec: str) -> dict:
    name, _, ref = spec.partition("@")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lib.sides import TREE_IMPORTS, before_tree  # as the benches with sides run theirs
    root = before_tree(ref) if ref else REPO
    proc = subprocess.run([sys.executable, "-c", TREE_IMPORTS + _MEASURE, str(root), __file__],
                          cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{name}: {proc.stderr[-2000:]}")
    return {"name": name, **json.loads(proc.stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sides", nargs="+", default=["now"])
    args = ap.parse_args()
    sides = [run_side(s) for s in args.sides]
    names = [s["name"] for s in sides]
    print("one spoken turn (semantic_vad, paced) and a barge-in, through SessionCore.handle")
    print(f"{'':34}" + "".join(f"{n:>12}" for n in names))
    for key in ("calls_back_into_core", "cross_module_calls", "all_cross_module_calls", "final_calls", "final_modules",
                "interrupted"):
        print(f"{key:34}" + "".join(f"{s[key]:>12}" for s in sides))
    mods = sorted({m for s in sides for k in s["pairs"] for m in k.split("->")})
    print("\nsession/ module pairs, calls each way (a->b / b->a):")
    seen = set()
    for a in mods:
        for b in mods:
            if a >= b or (a, b) in seen:
                continue
            row = [(s["pairs"].get(f"{a}->{b}", 0), s["pairs"].get(f"{b}->{a}", 0)) for s in sides]
            if any(x or y for x, y in row):
                seen.add((a, b))
                label = f"{a.removeprefix('session/')}<->{b.removeprefix('session/')}"
                print(f"  {label:32}" + "".join(f"{f'{x}/{y}':>12}" for x, y in row))


if __name__ == "__main__":
    main()
