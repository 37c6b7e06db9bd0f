"""The event-loop lag monitor (host/loop_lag.py): a loop held by code on it is
measured in ``duplex_event_loop_lag_seconds`` and reported with the stack that
held it; an idle loop is told apart from a blocked one; the server serves the
histogram on ``/metrics`` and the threshold comes from the config."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvloop
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.host.deploy import DeployConfig, load_config
from vllm_duplex.host.loop_lag import LoopLagMonitor, Scheduling, classify
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.server.serving import BackgroundServer

LOGGER = "vllm_duplex.host.loop_lag"


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a synchronous call on the loop does to every session


def lag_count_above(metrics: Metrics, bound: float) -> int:
    hist = metrics.loop_lag
    counts, _ = hist.series[()]
    i = hist.buckets.index(bound)
    return counts[-1] - counts[i]


async def test_a_blocked_loop_is_measured_and_reported_with_its_stack(caplog):
    metrics = Metrics()
    monitor = LoopLagMonitor(metrics, warn_after_s=0.25)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monitor.start()
    try:
        await asyncio.sleep(0.2)  # some healthy ticks first
        _hold_the_loop(0.8)
        await asyncio.sleep(0.2)  # the tick after the stall
    finally:
        await monitor.stop()
    assert lag_count_above(metrics, 0.5) == 1  # the one stall, measured (~0.8 s)
    assert monitor.worst_s >= 0.7
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    blocked = [w for w in warnings if "blocked for" in w]
    assert len(blocked) == 1, warnings  # reported once, while it held the loop
    assert "_hold_the_loop" in blocked[0] and "time.sleep(seconds)" in blocked[0]
    assert "the code that holds the loop" in blocked[0] or "cause: starved" in blocked[0]
    assert monitor.stalls[-1].cause == "blocked"  # judged over the whole stall: a sleep on the loop
    assert any("stalled for" in w for w in warnings)  # and how long it lasted, after
    assert metrics.loop_stalls.get(cause="blocked") == 1
    assert "duplex_event_loop_lag_seconds_bucket{le=\"0.5\"}" in metrics.render()


async def test_code_that_computes_on_the_loop_is_blocked_not_starved(caplog):
    metrics = Metrics()
    monitor = LoopLagMonitor(metrics, warn_after_s=0.25)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monitor.start()
    try:
        await asyncio.sleep(0.2)
        end = time.thread_time() + 0.6
        while time.thread_time() < end:  # 0.6 s of CPU on the loop, however busy the machine
            pass
        await asyncio.sleep(0.2)
    finally:
        await monitor.stop()
    stall = monitor.stalls[-1]
    assert stall.cause == "blocked" and not stall.in_selector
    assert stall.sched is not None  # the kernel told
    warnings = [r.getMessage() for r in caplog.records]
    assert any("test_code_that_computes_on_the_loop" in w for w in warnings if "blocked for" in w)
    ended = [w for w in warnings if "stalled for" in w]
    assert len(ended) == 1 and "cause: blocked" in ended[0] and "the loop thread ran" in ended[0]
    assert stall.sched.loop_ran_s >= 0.5
    assert metrics.loop_stalls.get(cause="blocked") == 1


def test_the_cause_comes_from_the_scheduler_and_the_stack():
    def sched(ran=0.0, queued=0.0, others=0.0, late=0.0) -> Scheduling:
        return Scheduling(1.0, ran, queued, others, 1.0, late)

    assert classify(sched(ran=0.9), in_selector=False) == "blocked"  # ran our code
    assert classify(sched(ran=0.2, queued=0.8), in_selector=False) == "blocked"  # ... on a busy machine
    assert classify(sched(), in_selector=False) == "blocked"  # slept in a call on the loop, GIL free
    assert classify(sched(queued=0.8), in_selector=False) == "starved"  # waited for a CPU
    assert classify(sched(queued=0.8), in_selector=True) == "starved"
    assert classify(sched(late=0.9), in_selector=False) == "gil"  # the GIL held elsewhere
    assert classify(sched(late=0.9), in_selector=True) == "gil"
    assert classify(sched(late=0.9, others=0.7), in_selector=False) == "starved"  # ... by a thread with no CPU
    assert classify(None, in_selector=True) == "gil"  # no schedstat: the stack says
    assert classify(None, in_selector=False) == "blocked"


def test_a_thread_that_holds_the_gil_is_not_blamed_on_the_loop():
    """sum() over a range is one C call: it keeps the GIL for its whole run."""
    import uvloop

    n = 1
    while True:  # n for a C call of >= 0.1 s of CPU on this machine (before the loop runs)
        t = time.thread_time()
        sum(range(n))
        if time.thread_time() - t > 0.1:
            break
        n *= 4

    async def hold_the_gil() -> LoopLagMonitor:
        monitor = LoopLagMonitor(Metrics(), warn_after_s=0.25)
        monitor.start()
        try:
            await asyncio.sleep(0.2)
            worker = threading.Thread(target=lambda: sum(range(n * 6)))
            worker.start()
            await asyncio.to_thread(worker.join)
            await asyncio.sleep(0.2)
        finally:
            await monitor.stop()
        return monitor

    monitor = uvloop.run(hold_the_gil())
    assert monitor.stalls, "the loop was held"  # reported while it lasted, or after
    assert {s.cause for s in monitor.stalls} <= {"gil", "starved"}  # never the loop's code


async def test_a_healthy_loop_reports_nothing(caplog):
    metrics = Metrics()
    monitor = LoopLagMonitor(metrics, warn_after_s=0.25)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monitor.start()
    try:
        for _ in range(10):
            _hold_the_loop(0.05)  # short holds: a lag, not a stall
            await asyncio.sleep(0.02)
    finally:
        await monitor.stop()
    assert metrics.loop_lag.count() >= 5
    # Not blamed on the code (a busy machine may starve the loop: that is said so).
    assert metrics.loop_stalls.get(cause="blocked") == 0, [s.stack for s in monitor.stalls]


async def _idle_verdict() -> bool:
    """Whether the watchdog, asked from another thread while the loop only
    waits, says the loop runs none of our code."""
    monitor = LoopLagMonitor(Metrics(), warn_after_s=0.25)
    monitor.start()
    try:
        await asyncio.sleep(0.12)  # the tick has run
        await asyncio.to_thread(time.sleep, 0.01)  # the loop now waits in its selector ...
        idle = asyncio.Event()
        seen: list[bool] = []

        def look() -> None:
            time.sleep(0.02)  # ... for this thread
            seen.append(monitor._loop_idle())
            asyncio.run_coroutine_threadsafe(_set(idle), loop)

        loop = asyncio.get_running_loop()
        threading.Thread(target=look).start()
        await idle.wait()
    finally:
        await monitor.stop()
    return seen[0]


async def _set(event: asyncio.Event) -> None:
    event.set()


async def test_an_idle_loop_is_told_apart_from_a_blocked_one():
    assert await _idle_verdict()  # asyncio's loop, waiting in select()


def test_an_idle_uvloop_is_told_apart_from_a_blocked_one():
    assert uvloop.run(_idle_verdict())  # the server's loop (uvicorn picks uvloop)


def test_the_threshold_is_a_server_setting():
    raw = {"name": "x", "model": "m", "policy": "scripted", "stages": []}
    assert DeployConfig.from_dict(raw).loop_lag_warning_ms == 250.0
    assert DeployConfig.from_dict({**raw, "server": {"loop_lag_warning_ms": 100}}
                                  ).loop_lag_warning_ms == 100.0
    for bad in (-1, "fast", True):
        with pytest.raises(ValueError, match="loop_lag_warning_ms"):
            DeployConfig.from_dict({**raw, "server": {"loop_lag_warning_ms": bad}})


async def test_the_server_serves_the_histogram_and_stops_the_watchdog():
    engine = Runtime(load_config("scripted"))
    assert engine.loop_lag.warn_after_s == 0.25
    async with BackgroundServer(engine) as server:
        await asyncio.sleep(0.2)
        async with httpx.AsyncClient() as http:
            text = (await http.get(server.http_url + "/metrics")).text
        assert "# TYPE duplex_event_loop_lag_seconds histogram" in text
        count = [ln for ln in text.splitlines()
                 if ln.startswith("duplex_event_loop_lag_seconds_count")]
        assert count and float(count[0].split()[-1]) >= 1
        # This runtime's own watchdog (a session-scoped server of other tests has one too).
        watchdog = engine.loop_lag._thread
        assert watchdog is not None and watchdog.is_alive()
        assert watchdog.name == "duplex-loop-watchdog"
    assert not engine.loop_lag.running
    assert not watchdog.is_alive()


def test_a_started_server_keeps_its_heap_out_of_full_collections():
    """A started server's ~680k objects (models, tokenizers, engine client) were
    walked by every full garbage collection, on the loop thread: 0.5-1.1 s of
    every session frozen each time (issue 21). In a fresh process, as a server:"""
    script = (
        "import asyncio, gc\n"
        "from vllm_duplex.host.deploy import load_config\n"
        "from vllm_duplex.host.runtime import Runtime\n"
        "async def main():\n"
        "    runtime = Runtime(load_config('scripted'))\n"
        "    await runtime.start()\n"
        "    try:\n"
        "        print(gc.get_freeze_count(), len(gc.get_objects(generation=2)))\n"
        "    finally:\n"
        "        await runtime.stop()\n"
        "asyncio.run(main())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    frozen, walked = int(out[0]), int(out[1])
    assert frozen > 20_000  # the start-up heap (a scripted one: ~35k; the default: ~680k)
    assert walked < frozen / 20  # what a full collection walks now


def test_a_stopped_loop_is_neither_a_stall_nor_a_lag(caplog):
    """A loop that is not running (a program that runs it in turns, a test
    session's loop between its tests, a server shutting down) holds nobody:
    the watchdog warns of nothing and the lag of that pause is not measured."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    metrics = Metrics()
    monitor = LoopLagMonitor(metrics, warn_after_s=0.25)
    loop = asyncio.new_event_loop()

    async def start() -> None:
        monitor.start()
        await asyncio.sleep(0.2)

    try:
        loop.run_until_complete(start())
        time.sleep(0.8)  # the loop is stopped: this thread runs other things
        loop.run_until_complete(asyncio.sleep(0.3))  # its tick runs again
        loop.run_until_complete(monitor.stop())
    finally:
        loop.close()
    assert not monitor.stalls, [s.stack for s in monitor.stalls]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert monitor.worst_s < 0.25
    assert lag_count_above(metrics, 0.25) == 0
