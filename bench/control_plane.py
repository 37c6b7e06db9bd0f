"""Control-plane benchmark: N concurrent sessions streaming 20 ms chunks at real time.

    python bench/control_plane.py [--sessions 200] [--seconds 20] [--baseline-sessions 1]
                                  [--cancels-per-session 3] [--config configs/scripted.yaml]
                                  [--workers N] [--deflate] [--json out.json]

Two phases, each against a fresh ``vllm-duplex serve`` subprocess: a baseline
(``--baseline-sessions``) and the load (``--sessions``). With ``--workers N``
(N > 1) a third phase runs the same load through the router of ``serve
--workers N`` (nginx in front of N worker processes), and the table compares it
with the one-process load of the same run. Every client connects
with raw ``websockets``, streams one pre-encoded 20 ms PCM16 24 kHz silence
append on an absolute schedule (t0 + k * 20 ms, a random phase per client), and
meanwhile runs ``--cancels-per-session`` cancels at random times:
``response.create`` -> first ``response.output_audio.delta`` -> ``response.cancel``
-> ``response.done`` (cancelled), timed on the client.

The target figures are the server's own summaries, scraped from ``/metrics``:
``duplex_ingest_latency_seconds`` (frame received -> stage submit) and
``duplex_cancel_latency_seconds`` (cancel received -> response.done(cancelled)
emitted). Targets: p99 <= 2 ms ingest and <= 5 ms cancel at 200 sessions on
2 cores. They are reported (PASS/MISS), not asserted: this is a benchmark.

Every figure is printed next to the baseline run in the same process and as a
ratio load/baseline (house rule). See bench/README.md for what each row means.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from lib.serve_process import (  # bench/lib/ (bench/ is the script's directory)
    REPO,
    CpuWindow,
    ServerProcess,
    http_get,
    machine,
    machine_busy,
    quantiles,
    scrape,
    total,
    worst_quantile,
)

CHUNK_S = 0.020
RATE = 24000
INGEST_TARGET_S = 0.002
CANCEL_TARGET_S = 0.005
CONNECT_CONCURRENCY = 32
SUMMARY_WINDOW = 100_000  # samples a server Summary keeps (vllm_duplex.domain.metrics)
WAIT_TIMEOUT_S = 5.0  # for the first audio delta and for response.done
MiB = 1 << 20

# One 20 ms chunk of PCM16 24 kHz silence, encoded once and sent as-is (bytes, text frame).
APPEND_FRAME = json.dumps({
    "type": "input_audio_buffer.append",
    "audio": base64.b64encode(bytes(2 * RATE * 20 // 1000)).decode("ascii"),
}, separators=(",", ":")).encode()
CREATE_FRAME = b'{"type":"response.create"}'
CANCEL_FRAME = b'{"type":"response.cancel"}'

# Server events are ``{"type":"<type>",...`` (compact JSON, type first): read the type
# by slicing, parse JSON only for the few events whose body matters.
_TYPE_AT = len(b'{"type":"')
AUDIO_DELTA = b"response.output_audio.delta"
RESPONSE_DONE = b"response.done"
ERROR = b"error"


def event_type(msg: bytes) -> bytes:
    return msg[_TYPE_AT:msg.find(b'"', _TYPE_AT)]


# ---- clients -----------------------------------------------------------------------------


@dataclass
class Stats:
    frames_sent: int = 0
    send_lag: list[float] = field(default_factory=list)  # actual send - scheduled send (s)
    cancel_rtt: list[float] = field(default_factory=list)  # cancel sent -> done(cancelled) read
    cancels_missed: Counter[str] = field(default_factory=Counter)  # why a cancel was not timed
    error_events: Counter[str] = field(default_factory=Counter)  # server `error` events by code
    connect_failed: Counter[str] = field(default_factory=Counter)
    closed_by_server: Counter[str] = field(default_factory=Counter)


class Client:
    """One session: a reader task, a paced sender and a cancel controller."""

    def __init__(self, ws: ClientConnection, stats: Stats) -> None:
        self.ws = ws
        self.stats = stats
        self.closing = False
        self.want_delta: asyncio.Future[float] | None = None
        self.want_done: asyncio.Future[tuple[float, str]] | None = None

    async def read(self) -> None:
        stats = self.stats
        try:
            while True:
                msg = await self.ws.recv(decode=False)
                kind = event_type(msg)
                if kind == AUDIO_DELTA:
                    fut = self.want_delta
                    if fut is not None and not fut.done():
                        fut.set_result(time.monotonic())
                elif kind == RESPONSE_DONE:
                    now = time.monotonic()
                    fut = self.want_done
                    if fut is not None and not fut.done():
                        fut.set_result((now, json.loads(msg)["response"]["status"]))
                elif kind == ERROR:
                    code = (json.loads(msg).get("error") or {}).get("code") or "unknown"
                    stats.error_events[code] += 1
                    for fut in (self.want_delta, self.want_done):
                        if fut is not None and not fut.done():
                            fut.set_exception(RuntimeError(code))
        except ConnectionClosed as exc:
            if not self.closing:
                rcvd = exc.rcvd
                why = f"{rcvd.code} {rcvd.reason}" if rcvd else "no close frame"
                stats.closed_by_server[why] += 1

    async def send(self, t0: float, end: float) -> None:
        """Append frames at t0 + k * 20 ms until ``end``; late frames go out at once
        (the schedule is absolute, so the average rate stays real time)."""
        loop = asyncio.get_running_loop()
        lag = self.stats.send_lag
        k = 0
        while (due := t0 + k * CHUNK_S) < end:
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await self.ws.send(APPEND_FRAME, text=True)
            except ConnectionClosed:
                return
            lag.append(loop.time() - due)
            k += 1
        self.stats.frames_sent += k

    async def cancels(self, times: list[float]) -> None:
        loop = asyncio.get_running_loop()
        for at in times:
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._cancel_once(loop)

    async def _cancel_once(self, loop: asyncio.AbstractEventLoop) -> None:
        stats = self.stats
        self.want_delta = loop.create_future()
        self.want_done = loop.create_future()
        try:
            await self.ws.send(CREATE_FRAME, text=True)
            try:
                await asyncio.wait_for(self.want_delta, WAIT_TIMEOUT_S)
            except TimeoutError:
                stats.cancels_missed["no audio delta in 5 s"] += 1
            t_cancel = time.monotonic()
            await self.ws.send(CANCEL_FRAME, text=True)
            t_done, status = await asyncio.wait_for(self.want_done, WAIT_TIMEOUT_S)
        except ConnectionClosed:
            stats.cancels_missed["connection closed"] += 1
            return
        except TimeoutError:
            stats.cancels_missed["no response.done in 5 s"] += 1
            return
        except RuntimeError as exc:  # an error event while waiting
            stats.cancels_missed[f"error {exc}"] += 1
            return
        finally:
            self.want_delta = self.want_done = None
        if status == "cancelled":
            stats.cancel_rtt.append(t_done - t_cancel)
        else:
            stats.cancels_missed[f"done with status {status}"] += 1


async def open_client(url: str, stats: Stats, gate: asyncio.Semaphore,
                      compression: str | None) -> Client | None:
    async with gate:
        try:
            ws = await connect(url, max_size=None, compression=compression, open_timeout=20)
        except Exception as exc:  # counted and reported, never fatal
            stats.connect_failed[type(exc).__name__] += 1
            return None
        try:
            first = await asyncio.wait_for(ws.recv(decode=False), 20)
            if event_type(first) != b"session.created":
                raise RuntimeError(event_type(first).decode())
        except Exception as exc:
            stats.connect_failed[f"no session.created ({type(exc).__name__}: {exc})"] += 1
            await ws.close()
            return None
        return Client(ws, stats)


def cancel_schedule(rng: random.Random, count: int, start: float, seconds: float) -> list[float]:
    """``count`` random times inside the stream, avoiding its first 0.3 s and last 1.5 s."""
    lo, hi = 0.3, max(0.4, seconds - 1.5)
    return sorted(start + rng.uniform(lo, hi) for _ in range(count))


# ---- one phase ---------------------------------------------------------------------------


async def run_phase(n: int, args: argparse.Namespace, seed: int,
                    workers: int = 1) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    me = psutil.Process()
    stats = Stats()
    with ServerProcess(args.config, n, workers) as server:
        assert server.ps is not None
        rss_idle = server.rss()
        gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
        compression = "deflate" if args.deflate else None
        t_conn = time.monotonic()
        opened = await asyncio.gather(*(open_client(server.ws_url, stats, gate, compression)
                                        for _ in range(n)))
        connect_s = time.monotonic() - t_conn
        clients = [c for c in opened if c is not None]
        readers = [asyncio.create_task(c.read()) for c in clients]
        try:
            await asyncio.sleep(0.5)  # let the sessions settle before weighing them
            rss_connected = server.rss()
            live = json.loads(http_get(server.http_url + "/health"))["sessions"]

            start = loop.time() + 0.5
            end = start + args.seconds
            work = []
            for c in clients:
                work.append(c.send(start + rng.uniform(0, CHUNK_S), end))
                work.append(c.cancels(cancel_schedule(rng, args.cancels_per_session,
                                                      start, args.seconds)))
            tasks = [asyncio.create_task(w) for w in work]
            await asyncio.sleep(max(0.0, start - loop.time()))
            server_cpu = CpuWindow(*server.tree())
            bench_cpu, sys_t0 = CpuWindow(me), psutil.cpu_times()
            await asyncio.sleep(max(0.0, end - loop.time()))
            server_cores, wall = server_cpu.cores()
            bench_cores, _ = bench_cpu.cores()
            machine_cores = machine_busy(sys_t0, psutil.cpu_times())
            rss_end = server.rss()
            await asyncio.gather(*tasks)
        finally:
            for c in clients:
                c.closing = True
            await asyncio.gather(*(c.ws.close() for c in clients), return_exceptions=True)
            await asyncio.gather(*readers, return_exceptions=True)
        metrics = scrape(http_get(server.http_url + "/metrics"))

    ingest = "duplex_ingest_latency_seconds"
    cancel = "duplex_cancel_latency_seconds"
    rtt50, rtt99 = quantiles(stats.cancel_rtt)
    lag50, lag99 = quantiles(stats.send_lag)
    ncpu = len(os.sched_getaffinity(0))
    return {
        "sessions": n,
        "workers": workers,
        "connected": len(clients),
        "live_sessions_seen": live,
        "connect_failed": dict(stats.connect_failed),
        "connect_s": connect_s,
        "window_s": wall,
        "frames_sent": stats.frames_sent,
        "frames_per_s": stats.frames_sent / args.seconds,
        "frames_expected_per_s": len(clients) / CHUNK_S,
        "send_lag_p50_s": lag50,
        "send_lag_p99_s": lag99,
        "send_lag_max_s": max(stats.send_lag, default=math.nan),
        "ingest_p50_s": worst_quantile(metrics, ingest, "0.5"),
        "ingest_p99_s": worst_quantile(metrics, ingest, "0.99"),
        "ingest_count": total(metrics, f"{ingest}_count"),
        "cancel_p50_s": worst_quantile(metrics, cancel, "0.5"),
        "cancel_p99_s": worst_quantile(metrics, cancel, "0.99"),
        "cancel_count": total(metrics, f"{cancel}_count"),
        "client_cancel_rtt_p50_s": rtt50,
        "client_cancel_rtt_p99_s": rtt99,
        "cancels_timed": len(stats.cancel_rtt),
        "cancels_missed": dict(stats.cancels_missed),
        "server_error_events": dict(stats.error_events),
        "server_errors_total": sum(v for k, v in metrics.items()
                                   if k.startswith("duplex_errors_total")),
        "closed_by_server": dict(stats.closed_by_server),
        "server_cpu_cores": server_cores,
        "server_cpu_pct_of_machine": 100 * server_cores / ncpu,
        "server_cpu_ms_per_session_s": 1000 * server_cores / max(1, len(clients)),
        "bench_cpu_cores": bench_cores,
        "machine_busy_cores": machine_cores,
        "other_cpu_cores": max(0.0, machine_cores - server_cores - bench_cores),
        "server_rss_idle_mib": rss_idle / MiB,
        "server_rss_connected_mib": rss_connected / MiB,
        "server_rss_end_mib": rss_end / MiB,
        "mem_per_session_kib": (rss_connected - rss_idle) / 1024 / max(1, len(clients)),
        "mem_growth_kib_per_session_s": (rss_end - rss_connected) / 1024 / max(1, len(clients))
                                        / args.seconds,
    }


# ---- report ------------------------------------------------------------------------------

ROWS: list[tuple[str, str, float, str]] = [
    # (label, key, scale, format)
    ("sessions connected", "connected", 1, "{:.0f}"),
    ("frames sent / s", "frames_per_s", 1, "{:.0f}"),
    ("client send lag p99 (ms)", "send_lag_p99_s", 1e3, "{:.2f}"),
    ("ingest p50 (ms) [server]", "ingest_p50_s", 1e3, "{:.3f}"),
    ("ingest p99 (ms) [server]", "ingest_p99_s", 1e3, "{:.3f}"),
    ("cancel p50 (ms) [server]", "cancel_p50_s", 1e3, "{:.3f}"),
    ("cancel p99 (ms) [server]", "cancel_p99_s", 1e3, "{:.3f}"),
    ("cancel rtt p50 (ms) [client]", "client_cancel_rtt_p50_s", 1e3, "{:.2f}"),
    ("cancel rtt p99 (ms) [client]", "client_cancel_rtt_p99_s", 1e3, "{:.2f}"),
    ("cancels timed", "cancels_timed", 1, "{:.0f}"),
    ("server CPU (cores busy)", "server_cpu_cores", 1, "{:.3f}"),
    ("server CPU (% of machine)", "server_cpu_pct_of_machine", 1, "{:.1f}"),
    ("server CPU ms per session-second", "server_cpu_ms_per_session_s", 1, "{:.2f}"),
    ("bench CPU (cores busy)", "bench_cpu_cores", 1, "{:.3f}"),
    ("machine busy (cores)", "machine_busy_cores", 1, "{:.2f}"),
    ("other processes (cores)", "other_cpu_cores", 1, "{:.2f}"),
    ("server RSS idle (MiB)", "server_rss_idle_mib", 1, "{:.1f}"),
    ("server RSS connected (MiB)", "server_rss_connected_mib", 1, "{:.1f}"),
    ("server RSS end (MiB)", "server_rss_end_mib", 1, "{:.1f}"),
    ("memory per session (KiB)", "mem_per_session_kib", 1, "{:.0f}"),
    ("RSS growth KiB/session/s", "mem_growth_kib_per_session_s", 1, "{:.1f}"),
    ("server error events", "server_errors_total", 1, "{:.0f}"),
]


def fmt(v: float, spec: str) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


def _label(phase: dict[str, Any]) -> str:
    workers = phase["workers"]
    return f"{phase['sessions']} sessions" + (f", {workers} workers" if workers > 1 else "")


def table(base: dict[str, Any], load: dict[str, Any], routed: dict[str, Any] | None = None) -> str:
    """Baseline and load side by side with their ratio; with a routed phase,
    also that phase and its ratio to the one-process load."""
    head = ["metric", f"baseline ({_label(base)})", f"load ({_label(load)})", "load/base"]
    if routed is not None:
        head += [f"routed ({_label(routed)})", "routed/load"]
    rows = [tuple(head)]

    def ratio(a: float, b: float) -> float:
        return a / b if b and not math.isnan(b) and not math.isnan(a) else math.nan

    for label, key, scale, spec in ROWS:
        b, ld = base[key] * scale, load[key] * scale
        row = [label, fmt(b, spec), fmt(ld, spec), fmt(ratio(ld, b), "{:.2f}x")]
        if routed is not None:
            r = routed[key] * scale
            row += [fmt(r, spec), fmt(ratio(r, ld), "{:.2f}x")]
        rows.append(tuple(row))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for i, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdicts(load: dict[str, Any]) -> list[str]:
    out = []
    for label, key, target in (("ingest p99", "ingest_p99_s", INGEST_TARGET_S),
                               ("cancel p99", "cancel_p99_s", CANCEL_TARGET_S)):
        v = load[key]
        ok = not math.isnan(v) and v <= target
        out.append(f"target {label} <= {target * 1e3:g} ms at {_label(load)}: "
                   f"{fmt(v * 1e3, '{:.3f}')} ms -> {'PASS' if ok else 'MISS'}")
    return out


def warnings(phase: dict[str, Any]) -> list[str]:
    """Signs that the client side, not the server, limited the run."""
    out = []
    tag = f"[{_label(phase)}]"
    if phase["bench_cpu_cores"] >= 0.85:
        out.append(f"{tag} the bench process used {phase['bench_cpu_cores']:.2f} cores: its single "
                   "event loop is (near) saturated, client-side figures include its own queueing")
    if phase["send_lag_p99_s"] > CHUNK_S:
        out.append(f"{tag} client send lag p99 {phase['send_lag_p99_s'] * 1e3:.1f} ms > 20 ms: "
                   "the bench could not keep real time")
    if phase["frames_per_s"] < 0.95 * phase["frames_expected_per_s"]:
        out.append(f"{tag} sent {phase['frames_per_s']:.0f} frames/s of "
                   f"{phase['frames_expected_per_s']:.0f} expected")
    if phase["machine_busy_cores"] >= 0.9 * len(os.sched_getaffinity(0)):
        out.append(f"{tag} the machine was saturated ({phase['machine_busy_cores']:.2f} cores "
                   "busy): bench and server competed for CPU")
    if phase["server_cpu_cores"] >= 0.9 * phase["workers"]:
        out.append(f"{tag} the server used {phase['server_cpu_cores']:.2f} cores: its single event "
                   "loop is saturated, latencies are mostly queueing behind other sessions")
    if phase["ingest_count"] > SUMMARY_WINDOW:
        out.append(f"{tag} the server kept only its last {SUMMARY_WINDOW} ingest samples (of "
                   f"{phase['ingest_count']:.0f}): ingest quantiles cover the end of the run")
    if phase["other_cpu_cores"] >= 0.2:
        out.append(f"{tag} other processes used {phase['other_cpu_cores']:.2f} cores during the "
                   "window: the machine was not quiet, figures are pessimistic")
    for key in ("connect_failed", "cancels_missed", "server_error_events", "closed_by_server"):
        if phase[key]:
            out.append(f"{tag} {key}: {phase[key]}")
    return out


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--baseline-sessions", type=int, default=1)
    p.add_argument("--cancels-per-session", type=int, default=3)
    p.add_argument("--config", default=str(REPO / "configs" / "scripted.yaml"))
    p.add_argument("--workers", type=int, default=1,
                   help="N > 1: also run the load through `serve --workers N` (the router)")
    p.add_argument("--deflate", action="store_true",
                   help="negotiate permessage-deflate (off by default: measures the control "
                        "plane, not zlib)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None, help="also write every figure to this JSON file")
    args = p.parse_args(argv)
    if args.seconds < 2:
        p.error("--seconds must be >= 2")

    # SIGTERM unwinds like Ctrl-C, so the server subprocess is always stopped.
    signal.signal(signal.SIGTERM, _interrupted)
    info = machine()
    print(f"machine: {info['summary']}, {info['memory_gib']} GiB, "
          f"Python {info['python']}, Linux {info['kernel']}", flush=True)
    print(f"config: {args.config}; {args.seconds:g} s of 20 ms chunks per session, "
          f"{args.cancels_per_session} cancels per session, deflate "
          f"{'on' if args.deflate else 'off'}", flush=True)
    phases = {}
    plan = [("baseline", args.baseline_sessions, args.seed, 1),
            ("load", args.sessions, args.seed + 1, 1)]
    if args.workers > 1:
        plan.append(("routed", args.sessions, args.seed + 1, args.workers))
    for name, n, seed, workers in plan:
        print(f"running {name}: {n} session(s), {workers} worker(s) ...", flush=True)
        phases[name] = asyncio.run(run_phase(n, args, seed, workers))
    base, load, routed = phases["baseline"], phases["load"], phases.get("routed")
    print()
    print(table(base, load, routed))
    print()
    for phase in (load, routed):
        for line in verdicts(phase) if phase is not None else ():
            print(line)
    for phase in (base, load, routed):
        for line in warnings(phase) if phase is not None else ():
            print("note:", line)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "machine": info, "args": vars(args), **phases}, indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; the server subprocess was stopped", file=sys.stderr)
        sys.exit(130)
