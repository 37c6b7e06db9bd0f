"""What every client driver shares. A driver is a script that runs in the
clients' own virtualenv (``.venv-clients``: their pins clash with ours), drives
one real client library, unmodified, against a server the test started, and
prints what it observed as one JSON object: ``{scenario: observations}``.

Drivers only observe; the tests in ``tests/clients`` decide what is right. A
scenario that raises is reported as ``{"exception": "..."}`` and the others
still run, so one gap never hides another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
import wave
from collections.abc import Awaitable, Callable
from typing import Any

Scenario = Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]


def read_wav(path: str) -> tuple[bytes, int]:
    """A mono PCM16 WAV the test wrote -> (little-endian PCM16 bytes, rate)."""
    with wave.open(path, "rb") as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1, path
        return w.readframes(w.getnframes()), w.getframerate()


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True, help="http://127.0.0.1:PORT (the server)")
    parser.add_argument("--api-key", default="sk-local")
    parser.add_argument("--audio", help="the user's utterance: mono PCM16 WAV")
    parser.add_argument("--scenarios", default="", help="comma-separated; default: all")
    parser.add_argument("--timeout", type=float, default=30.0, help="per scenario")
    parser.add_argument("--realtime", action="store_true", help="pace audio at real time")
    return parser


class Recorder:
    """Raw server events as the client library saw them, with arrival times."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.events: list[dict[str, Any]] = []

    def add(self, event: Any) -> None:
        if not isinstance(event, dict):
            event = json.loads(event) if isinstance(event, (str, bytes)) else dict(event)
        event = {k: v for k, v in event.items() if k != "delta" or not isinstance(v, str)
                 or not event.get("type", "").endswith("audio.delta")}
        event["_t"] = round(time.monotonic() - self.t0, 4)
        self.events.append(event)

    def types(self) -> list[str]:
        return [e.get("type", "?") for e in self.events]

    def errors(self) -> list[dict[str, Any]]:
        return [e.get("error") or {} for e in self.events if e.get("type") == "error"]

    def first(self, etype: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("type") == etype), None)

    def summary(self) -> dict[str, Any]:
        return {"server_events": self.types(), "server_errors": self.errors()}


def main(scenarios: dict[str, Scenario], parser: argparse.ArgumentParser | None = None) -> None:
    args = (parser or arguments()).parse_args()
    wanted = [s for s in args.scenarios.split(",") if s] or list(scenarios)

    async def run_all() -> dict[str, Any]:
        results: dict[str, Any] = {}
        for name in wanted:
            started = time.monotonic()
            try:
                results[name] = await asyncio.wait_for(scenarios[name](args), args.timeout)
            except BaseException as exc:  # reported, never swallowed silently
                if isinstance(exc, KeyboardInterrupt):
                    raise
                results[name] = {"exception": f"{type(exc).__name__}: {exc}",
                                 "traceback": traceback.format_exc(limit=8)}
            results[name]["_seconds"] = round(time.monotonic() - started, 3)
        return results

    results = asyncio.run(run_all())
    sys.stdout.write("\n" + json.dumps(results) + "\n")
