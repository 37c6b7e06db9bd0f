"""The residual echo suppressor before and now on many more rooms than
``room_echo.py``'s table gives it, in minutes (issue 44): ``room_echo.py
--replay``.

The suppressor (``ResidualEchoSuppressor``, the VAD's view) comes after AEC3
and the linear canceller, and neither depends on it: each case runs through
the session's input path once (the bench's ``run_input``: the
``InputBuffer``, AEC3, on a virtual clock), its microphone, AEC3's output,
the reference and the linear canceller's output are kept, and each
suppressor replays them, then Silero (the stage's settings, as the bench):

- **self-interruptions**: each of the bench's 20 replies (replies 0-9 chose
  the suppressor's settings, 10-19 never did) as echo alone in *every* room
  at every level (the bench puts each in one room): 60 per level;
- **the user's onset over the echo**: the 12 tune recordings (no digit
  strings), as loud at the microphone as the reply at the speaker, in every
  room at every level, starting 2 s into a reply (as the bench) and 80 ms
  into the reply's first pause of 200 ms or more after 1.5 s (where the
  room still rings and the reply has left the hold): Silero's first onset
  from 100 ms before the words on, p50 and found of 36, and the cases whose
  onset came later or earlier by more than 20 ms (Silero's windows are
  32 ms), or was lost or found.

Variants: ``before``, the suppressor judging what AEC3 left alone (the
rule before 2026-12-07, sample for sample), and ``now``, the product's: the
lower of what AEC3 and the linear canceller left (AEC3 now and then lets go of
the echo). (Until 2026-12-06 ``before`` was the rule without the room's ring
in a pause: ``e7c34f3``'s figures in bench/README.md.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lib import machine
from lib.rooms import ROOMS, impulse
from vllm_duplex.media.echo import EchoCanceller, ResidualEchoSuppressor
from vllm_duplex.media.echo_linear import LinearEchoCanceller
from vllm_duplex.testing import noise
from vllm_duplex.testing.room import Room

RATE = 16000
STEP = 2 * RATE // 100  # 20 ms: what a client sends


def _aec3_alone(pre: np.ndarray, post: np.ndarray, reference: np.ndarray,
                linear: np.ndarray, s: ResidualEchoSuppressor) -> np.ndarray:
    return s.process(pre, post, reference)  # what AEC3 left, alone: the rule before


def _lower_of_both(pre: np.ndarray, post: np.ndarray, reference: np.ndarray,
                   linear: np.ndarray, s: ResidualEchoSuppressor) -> np.ndarray:
    return s.process(pre, post, reference, linear)  # the product's


VARIANTS = {"before": _aec3_alone, "now": _lower_of_both}


class Kept(EchoCanceller):
    """AEC3 alone (``words="aec3"``, no suppressor) and the product's linear
    canceller (Speex's filter and residual echo suppressor) beside it on the
    same reference (the bench's rooms are within the cancellers' reach: the
    aligner holds nothing back), keeping what the suppressor is given: the
    microphone, AEC3's output, the reference and the linear canceller's."""

    def __init__(self) -> None:
        super().__init__(residual=None, words="aec3")
        self.beside = LinearEchoCanceller()
        self.kept: list[tuple[np.ndarray, ...]] = []

    def process(self, mic: np.ndarray, reference: np.ndarray):  # type: ignore[override]
        out = super().process(mic, reference)
        self.kept.append((mic.copy(), out.words.copy(), reference.copy(),
                          self.beside.process(mic, reference)))
        return out

    def signals(self) -> tuple[np.ndarray, ...]:
        return tuple(np.concatenate([k[i] for k in self.kept]) for i in range(4))


def first_pause(reply: np.ndarray, after: float = 1.5) -> float:
    """80 ms into the reply's first run of 200 ms under -50 dBFS after ``after`` s."""
    frames = reply[:reply.size // 160 * 160].astype(np.float64).reshape(-1, 160)
    quiet = 10 * np.log10((frames ** 2).mean(1) / 32768 ** 2 + 1e-12) < -50
    run = 0
    for i in range(int(after * 100), quiet.size):
        run = run + 1 if quiet[i] else 0
        if run == 20:
            return (i - 19) / 100 + 0.08
    raise ValueError("no pause of 200 ms in the reply")


def replay(onsets: Callable[[np.ndarray], list[int]], variant: Callable[..., np.ndarray],
           signals: tuple[np.ndarray, ...]) -> list[int]:
    s = ResidualEchoSuppressor()
    n = signals[0].size - signals[0].size % STEP
    speech = np.concatenate([variant(*(x[i:i + STEP] for x in signals), s)
                             for i in range(0, n, STEP)])
    return onsets(speech)


def measure(said: Sequence[np.ndarray], people: Sequence[Any], levels: Sequence[int], *,
            through_aec3: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, ...]],
            onsets: Callable[[np.ndarray], list[int]], in_room: Callable[..., np.ndarray],
            sent_at: float, say_at: float) -> dict[str, Any]:
    """``said``: the bench's replies (the first ten chose the settings);
    ``people``: recordings to interrupt; the bench's own input path, onset
    finder and room."""
    hum = noise.fan(30.0, -55).astype(np.float64)
    rows: list[dict[str, Any]] = []

    def run(case: dict[str, Any], mic: np.ndarray, reply: np.ndarray) -> None:
        signals = through_aec3(mic, reply)
        for name, variant in VARIANTS.items():
            found = replay(onsets, variant, signals)
            if case["kind"] == "echo":
                rows.append({**case, "variant": name, "onsets": len(found)})
            else:
                later = [t - case["at_ms"] for t in found if t >= case["at_ms"] - 100]
                rows.append({**case, "variant": name, "onset_ms": later[0] if later else None})

    for level in levels:
        for r, room_spec in enumerate(ROOMS):
            ir = impulse(room_spec, level)
            for k, reply in enumerate(said):
                n = int((sent_at + reply.size / RATE + 1.0) * RATE)
                room = Room(ir, RATE, seconds=n / RATE + 1, noise=hum)
                room.play(reply, int(sent_at * RATE))
                run({"kind": "echo", "level": level, "room": room_spec[0], "reply": k},
                    in_room(room, n), reply)
            for k, person in enumerate(people):
                reply = said[(k + r) % min(10, len(said))]
                words = person.audio().astype(np.float64)
                words *= np.sqrt(np.mean(reply.astype(np.float64) ** 2) / np.mean(words ** 2))
                for where in ("2 s", "pause"):
                    say = say_at if where == "2 s" else first_pause(np.tile(reply, 3))
                    playing = np.tile(reply, 1 + int((say + words.size / RATE + 1) * RATE)
                                      // reply.size)
                    n = int((sent_at + say + words.size / RATE + 1.0) * RATE)
                    room = Room(ir, RATE, seconds=n / RATE + 1, noise=hum)
                    room.play(playing, int(sent_at * RATE))
                    run({"kind": "onset", "level": level, "room": room_spec[0],
                         "person": person.name, "where": where, "at_ms": (sent_at + say) * 1000},
                        in_room(room, n, words, sent_at + say), playing)
    return {"machine": machine.info(), "rows": rows, "levels": list(levels)}

def summary(result: dict[str, Any]) -> None:
    rows = result["rows"]
    print(machine.line())
    print("self-interruptions, before / now (replies 0-9 | 10-19, each in every room), "
          "by room small / medium / large")
    for level in result["levels"]:
        parts = []
        for name, lo in (("0-9", 0), ("10-19", 10)):
            mine = [r for r in rows if r["kind"] == "echo" and r["level"] == level
                    and lo <= r["reply"] < lo + 10]
            counts = {v: sum(r["onsets"] > 0 for r in mine if r["variant"] == v) for v in VARIANTS}
            rooms = {v: "/".join(str(sum(r["onsets"] > 0 for r in mine if r["variant"] == v
                                         and r["room"] == room[0])) for room in ROOMS)
                     for v in VARIANTS}
            total = len(mine) // len(VARIANTS)
            parts.append(f"{name}: {counts['before']} / {counts['now']} of {total} "
                         f"({rooms['before']} -> {rooms['now']})")
        print(f"  {level:+d} dB  " + "; ".join(parts))
    print("the user's onset over the echo (tune recordings, every room): p50 ms (found of all), "
          "before / now; cases later / earlier by over 20 ms, or lost / found")
    for where in ("2 s", "pause"):
        for level in result["levels"]:
            mine = {v: [r for r in rows if r["kind"] == "onset" and r["where"] == where
                        and r["level"] == level and r["variant"] == v] for v in VARIANTS}
            cells = []
            for v in VARIANTS:
                heard = sorted(r["onset_ms"] for r in mine[v] if r["onset_ms"] is not None)
                cells.append(f"{heard[len(heard) // 2]:.0f} ({len(heard)}/{len(mine[v])})" if heard
                             else f"- (0/{len(mine[v])})")
            later = earlier = 0
            for b, a in zip(mine["before"], mine["now"]):
                b, a = b["onset_ms"], a["onset_ms"]
                if (a is None and b is not None) or (None not in (a, b) and a > b + 20):
                    later += 1
                elif (b is None and a is not None) or (None not in (a, b) and a < b - 20):
                    earlier += 1
            print(f"  {where:5s} {level:+d} dB  {' / '.join(cells)}; later {later}, "
                  f"earlier {earlier}")
