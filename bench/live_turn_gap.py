"""Turn gap on GPT-Live (``/v1/live/sessions``) beside ``/v1/realtime``, the
same spoken questions on the same server in one run (issue 45's target: the
live gap within 10 % of the realtime one).

    .venv/bin/python bench/live_turn_gap.py [--config cascade-cpu] [--rounds 2] [--json out.json]

One in-process ``BackgroundServer`` (loopback) on the default CPU pipeline.
Each round asks every question of ``lib/turns.py`` (Flite voices, spoken at
real time in 20 ms PCM16 24 kHz appends on an absolute schedule, the
microphone open until the reply is done), once on each endpoint, alternating
which goes first, each turn in its own session:

- ``/v1/realtime`` (the baseline): ``semantic_vad`` (``eagerness: auto``,
  ``create_response``), as a Realtime client asks for it; the gap is the end
  of the question's last loud sample -> the reply's first
  ``response.output_audio.delta``.
- ``/v1/live/sessions``: ``session.start`` with the default config (the
  engine's end of turn; the server paces its audio); the gap is the same end
  -> the first ``session.output_audio.delta``.

Prints each turn, then p50 / p90 per endpoint and the live/realtime ratio.
Never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import websockets

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import machine  # noqa: E402
from lib.turns import QUESTIONS, last_loud_s  # noqa: E402
from support.speech_fixtures import chunks, speak  # noqa: E402
from vllm_duplex.host.deploy import load_config  # noqa: E402
from vllm_duplex.host.runtime import Runtime  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient  # noqa: E402
from vllm_duplex.realtime.server.serving import BackgroundServer  # noqa: E402

TURN_S = 40.0  # a turn with no reply by then is unanswered
SLOW_S = 2.0  # a turn slower than this prints what the client saw (the --json has every turn's)


class Trace(list):
    """What the client saw of a turn, but audio: (ms after the end of the
    question, event type, its text or status), to tell where a slow turn went."""

    def see(self, t: float, end: float, event: dict) -> None:
        what = event.get("delta") or event.get("transcript") or \
            (event.get("response") or {}).get("status") or ""
        self.append((round((t - end) * 1000), event["type"], what))


async def _send(send, pcm_chunks: list[bytes], start: float, stop: asyncio.Event) -> None:
    for i, chunk in enumerate(pcm_chunks):
        if stop.is_set():
            return
        await send(chunk)
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))


REALTIME_EXTRA: dict = {}  # --realtime-session: more of the baseline's session (experiments)


def _merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merged(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


async def realtime_turn(url: str, pcm_chunks: list[bytes], end_s: float,
                        trace: Trace) -> float | None:
    async with await RealtimeClient.connect(url) as rt:
        await rt.update_session(_merged({"audio": {"input": {"turn_detection": {
            "type": "semantic_vad", "eagerness": "auto", "create_response": True}}}},
            REALTIME_EXTRA))
        done = asyncio.Event()
        start = time.monotonic()
        sender = asyncio.ensure_future(_send(rt.append_audio, pcm_chunks, start, done))
        first: float | None = None
        try:
            while time.monotonic() - start < TURN_S:
                try:
                    event = await rt.recv(timeout=1.0)
                except TimeoutError:
                    continue
                if event["type"] == "response.output_audio.delta" and first is None:
                    first = event["_recv_t"]
                if not event["type"].endswith("audio.delta"):
                    trace.see(event["_recv_t"], start + end_s, event)
                if event["type"] == "response.done" and first is not None:
                    break
        finally:
            done.set()
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    return None if first is None else first - (start + end_s)


async def live_turn(url: str, pcm_chunks: list[bytes], end_s: float,
                    trace: Trace) -> float | None:
    import base64

    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
        while json.loads(await ws.recv())["type"] != "session.started":
            pass

        async def append(chunk: bytes) -> None:
            await ws.send(json.dumps({"type": "session.input_audio.append",
                                      "audio": base64.b64encode(chunk).decode()}))

        done = asyncio.Event()
        start = time.monotonic()
        sender = asyncio.ensure_future(_send(append, pcm_chunks, start, done))
        first: float | None = None
        try:
            while time.monotonic() - start < TURN_S:
                try:
                    frame = await asyncio.wait_for(ws.recv(), 1.0)
                except TimeoutError:
                    continue
                t = time.monotonic()
                event = json.loads(frame)
                kind = event["type"]
                if kind == "session.output_audio.delta" and first is None:
                    first = t
                if kind != "session.output_audio.delta" or first == t:
                    trace.see(t, start + end_s, event)
                if kind == "session.usage.updated" and first is not None:
                    break  # the reply is done (usage follows each reply)
        finally:
            done.set()
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            await ws.send(json.dumps({"type": "session.close"}))
    return None if first is None else first - (start + end_s)


def quantiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="cascade-cpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="", help="ask only the questions holding this text")
    ap.add_argument("--realtime-session", default="{}",
                    help="JSON merged into the baseline's session.update (to try what differs)")
    args = ap.parse_args()
    REALTIME_EXTRA.update(json.loads(args.realtime_session))
    asked = []
    for text, voice, _ in QUESTIONS:
        if args.only.lower() not in text.lower():
            continue
        pcm = speak(text, voice=voice, tail_s=6.0)
        asked.append((text, chunks(pcm), last_loud_s(pcm)))
    gaps: dict[str, list[float]] = {"realtime": [], "live": []}
    traces: list[dict] = []
    unanswered = {"realtime": 0, "live": 0}
    async with BackgroundServer(Runtime(load_config(args.config))) as server:
        live_url = server.ws_url.replace("/v1/realtime", "/v1/live/sessions")
        turn = 0
        for _ in range(args.rounds):
            for text, pcm_chunks, end_s in asked:
                turn += 1
                order = ("realtime", "live") if turn % 2 else ("live", "realtime")
                line = []
                for side in order:  # alternating: load drifts hit both alike
                    ask = realtime_turn if side == "realtime" else live_turn
                    trace = Trace()
                    gap = await ask(server.ws_url if side == "realtime" else live_url,
                                    pcm_chunks, end_s, trace)
                    traces.append({"turn": turn, "side": side, "gap": gap, "trace": trace})
                    if gap is None or gap > SLOW_S:
                        print(f"  {side} turn {turn} saw: " + "; ".join(
                            f"{ms} {kind} {what!r}" for ms, kind, what in trace if ms > -3000),
                            flush=True)
                    if gap is None:
                        unanswered[side] += 1
                        line.append(f"{side} unanswered")
                    else:
                        gaps[side].append(gap)
                        line.append(f"{side} {gap * 1000:.0f} ms")
                print(f"turn {turn} ({text!r}): " + ", ".join(line), flush=True)
    print(f"\nconfig {args.config}, {turn} questions per endpoint "
          "(end of speech -> first reply audio)")
    print(machine.line())
    print(f"{'endpoint':<20}{'p50 ms':>10}{'p90 ms':>10}{'unanswered':>12}")
    q = {side: quantiles(xs) for side, xs in gaps.items() if xs}
    for side, name in (("realtime", "/v1/realtime"), ("live", "/v1/live/sessions")):
        if side in q:
            print(f"{name:<20}{q[side][0] * 1000:>10.0f}{q[side][1] * 1000:>10.0f}"
                  f"{unanswered[side]:>12}")
    if len(q) == 2:
        print(f"live / realtime: p50 {q['live'][0] / q['realtime'][0]:.2f}x, "
              f"p90 {q['live'][1] / q['realtime'][1]:.2f}x")
    # Paired: the same question on both endpoints, a few seconds apart, so a
    # drift of the machine's load hits both sides of a pair alike.
    by_turn: dict[int, dict[str, float]] = {}
    for t in traces:
        if t["gap"] is not None:
            by_turn.setdefault(t["turn"], {})[t["side"]] = t["gap"]
    diffs = [p["live"] - p["realtime"] for p in by_turn.values() if len(p) == 2]
    if diffs:
        print(f"paired (live - realtime, {len(diffs)} questions): median "
              f"{statistics.median(diffs) * 1000:+.0f} ms, live faster in "
              f"{sum(d < 0 for d in diffs)} of {len(diffs)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"gaps": gaps, "unanswered": unanswered,
                                               "traces": traces,
                                               "machine": machine.info()}))


if __name__ == "__main__":
    asyncio.run(main())
