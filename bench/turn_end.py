"""Turn-taking figures: semantic_vad against server_vad on the real pipeline.

One server (``configs/cascade-cpu.yaml`` by default: Silero -> Whisper ->
vLLM -> Piper) in this process; Flite speaks into the realtime socket at real
time while a reader takes the events as they arrive. Per ``turn_detection``
(``semantic_vad`` at each eagerness asked for, and ``server_vad`` with its
500 ms silence as the baseline, in the same run):

* **turn gap**: the end of the user's speech (its last loud sample, on the
  client's clock) -> the first reply audio delta *at the client*, p50/p90 over
  complete questions; and -> ``speech_stopped`` (when the turn was taken);
* **take-over rate**: a question with a thinking pause of 300/600/900/1200 ms
  inside it ("What is the capital of ... France?"): the share of runs in which
  the pause ended the turn (more than one commit);
* the speculations started / used / discarded (``/metrics``).

    .venv/bin/python bench/turn_end.py [--config cascade-cpu] [--eagerness auto high]
                                       [--repeat 1]

The machine's load moves every figure: the script prints the load average
beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import machine  # noqa: E402
from support.speech_fixtures import RATE, chunks, speak  # noqa: E402
from vllm_duplex.host.deploy import load_config  # noqa: E402
from vllm_duplex.host.runtime import Runtime  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient  # noqa: E402
from vllm_duplex.realtime.server.serving import BackgroundServer  # noqa: E402

COMPLETE = ("What is the capital of France?", "Tell me a joke.", "What is the largest ocean?",
            "How are you today?")
PAUSES_MS = (300, 600, 900, 1200)
BEFORE, AFTER = "What is the capital of", "France?"


def voiced(pcm: np.ndarray) -> np.ndarray:
    """``pcm`` cut to its speech (Flite pads each utterance with its own silence)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 300)
    return pcm[loud[0]:loud[-1] + 1]


def with_pause(before: str, pause_ms: int, after: str) -> np.ndarray:
    """``before``, exactly ``pause_ms`` of silence, ``after`` (with the usual lead and tail)."""
    gap = np.zeros(int(pause_ms / 1000 * RATE), np.int16)
    lead, tail = np.zeros(int(0.3 * RATE), np.int16), np.zeros(int(1.2 * RATE), np.int16)
    return np.concatenate([lead, voiced(speak(before)), gap, voiced(speak(after)), tail])


def voiced_end_s(pcm: np.ndarray) -> float:
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 300)
    return float(loud[-1] + 1) / RATE


async def exchange(url: str, td: dict[str, Any], pcm: np.ndarray, quiet_s: float = 2.5) -> dict[str, Any]:
    """Speak ``pcm`` at real time; read until no event came for ``quiet_s``
    after the audio ended and a response finished."""
    async with await RealtimeClient.connect(url) as client:
        await client.update_session({"audio": {"input": {"turn_detection": td}}})
        start = time.monotonic()

        async def read() -> None:
            while True:
                try:
                    await client.recv(timeout=quiet_s)
                except TimeoutError:
                    if sent.done() and any(e["type"] == "response.done" for e in client.events):
                        return
                    if time.monotonic() - start > 60:
                        return

        async def send() -> None:
            for i, chunk in enumerate(chunks(pcm)):
                await client.append_audio(chunk)
                await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))

        sent = asyncio.ensure_future(send())
        await read()
        await sent
    end = start + voiced_end_s(pcm)
    first = lambda kind: next((e["_recv_t"] - end for e in client.events if e["type"] == kind), None)  # noqa: E731
    return {"commits": sum(e["type"] == "input_audio_buffer.committed" for e in client.events),
            "stopped_s": first("input_audio_buffer.speech_stopped"),
            "gap_s": first("response.output_audio.delta"),
            "transcripts": [e.get("transcript") for e in client.events
                            if e["type"] == "conversation.item.input_audio_transcription.completed"]}


def q(values: list[float], p: float) -> float:
    return float(np.quantile(values, p)) * 1000 if values else float("nan")


async def run(args: argparse.Namespace) -> None:
    config = load_config(args.config)
    config = dataclasses.replace(config, limits=dataclasses.replace(config.limits, resume_grace_s=0))
    modes: list[tuple[str, dict[str, Any]]] = [
        (f"semantic_vad ({e})", {"type": "semantic_vad", "eagerness": e}) for e in args.eagerness]
    modes.append(("server_vad (500 ms)", {"type": "server_vad", "silence_duration_ms": 500}))
    complete = [speak(t) for t in COMPLETE]
    paused = {ms: with_pause(BEFORE, ms, AFTER) for ms in PAUSES_MS}
    rows = []
    async with BackgroundServer(Runtime(config)) as server:
        m = server.runtime.metrics
        await exchange(server.ws_url, modes[0][1], complete[0])  # warm-up (not counted)
        for name, td in modes:
            spec0 = {k: m.speculations.get(outcome=k) for k in ("started", "used", "discarded")}
            gaps, stops = [], []
            for _ in range(args.repeat):
                for pcm in complete:
                    r = await exchange(server.ws_url, td, pcm)
                    if r["gap_s"] is not None:
                        gaps.append(r["gap_s"])
                    if r["stopped_s"] is not None:
                        stops.append(r["stopped_s"])
            takeovers = {}
            for ms, pcm in paused.items():
                runs = [await exchange(server.ws_url, td, pcm) for _ in range(args.repeat)]
                takeovers[ms] = sum(r["commits"] > 1 for r in runs) / len(runs)
            spec = {k: m.speculations.get(outcome=k) - spec0[k] for k in spec0}
            rows.append((name, gaps, stops, takeovers, spec))
    print(f"\nturn-taking on {args.config}, {args.repeat} run(s) per case")
    print(machine.line())
    head = ("turn_detection", "gap p50", "gap p90", "stop p50", *(f"take-over {ms}" for ms in PAUSES_MS),
            "spec s/u/d")
    print(" | ".join(head))
    for name, gaps, stops, takeovers, spec in rows:
        cells = [name, f"{q(gaps, .5):.0f} ms", f"{q(gaps, .9):.0f} ms", f"{q(stops, .5):.0f} ms",
                 *(f"{takeovers[ms]:.2f}" for ms in PAUSES_MS),
                 f"{spec['started']:g}/{spec['used']:g}/{spec['discarded']:g}"]
        print(" | ".join(cells))
    print("gap: end of speech -> first reply audio at the client; stop: -> speech_stopped "
          "(the turn taken); take-over: share of runs where the pause ended the turn")


def main(argv: list[str] | None = None) -> int:
    # Each decision's inputs (P(end), the words, silence) as they happen.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("  decision: %(message)s"))
    decisions = logging.getLogger("vllm_duplex.session.turn_end")
    decisions.setLevel(logging.INFO)
    decisions.addHandler(handler)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="cascade-cpu")
    p.add_argument("--eagerness", nargs="+", default=["auto"])
    p.add_argument("--repeat", type=int, default=1)
    asyncio.run(run(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
