"""``LoopLagMonitor``: how late the server's event loop runs, and who held it.

Every session's audio, every HTTP answer and every stage output goes through
one event loop, so a call that holds it for half a second stops all of them
at once. Two parts measure that:

- a *tick* task on the loop sleeps ``interval_s`` again and again; how much
  later than asked it wakes is the loop's lag (everything else that ran on
  the loop in between). Each lag goes into the
  ``duplex_event_loop_lag_seconds`` histogram;
- a *watchdog* thread checks the tick's last heartbeat. When the loop has
  been silent for ``warn_after_s`` (default 250 ms), it reads the loop
  thread's current frame (``sys._current_frames``) and logs a WARNING with
  that stack -- the code holding the loop, while it still holds it (a
  deadlock is reported too: the loop never comes back). When the loop
  answers again, one more WARNING says how long the stall lasted.

Telling a blocked loop from a starved machine: the watchdog reads what the
kernel's scheduler knows of the loop thread since its last tick
(``/proc/self/task/<tid>/schedstat``: time on a CPU, time runnable but
waiting for one), and where the thread is:

- ``blocked`` when it ran on a CPU for half the threshold or more: code on
  the loop (the stack is the culprit; it would stall an idle machine too);
- ``starved``: otherwise, when it waited for a CPU most of the time -- the
  machine is busy (other processes); the stack is wherever it happened to be;
- ``gil``: it slept in its selector while a timer was due -- it waits for the
  GIL, which another thread holds (the warning lists what the other threads
  were doing; a C extension that does not release the GIL shows there);
- ``blocked`` too for anything else: it slept in a blocking call made on the
  loop (a lock, a sleep, a queue); the stack is the culprit.

A watchdog that itself woke up late by as much as the threshold says the
whole process was held (the GIL, or no CPU for any of its threads).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from vllm_duplex.core.metrics import Metrics

log = logging.getLogger(__name__)

DEFAULT_WARN_AFTER_S = 0.25
DEFAULT_INTERVAL_S = 0.05
REPEAT_S = 5.0  # a stall that goes on is reported again this often, with its stack then
# asyncio's selector calls, where its loop thread waits for I/O (runs none of our code).
_SELECTOR_FUNCS = frozenset({"select", "poll", "_poll"})


@dataclass(frozen=True)
class Stall:
    """What the watchdog saw when it reported a stall."""

    silent_s: float  # how long the loop had not ticked (so far)
    stack: str  # the loop thread's stack then
    cause: str  # blocked | starved | gil (see the module docstring)
    in_selector: bool  # the loop thread was in its selector (running none of our code)
    on_cpu_s: float | None  # of the loop thread since its last tick (None: not known)
    queued_s: float | None  # ... runnable, waiting for a CPU
    watchdog_late_s: float  # how late the watchdog itself woke (the whole process held)


def classify(elapsed_s: float, on_cpu_s: float | None, queued_s: float | None,
             in_selector: bool, threshold_s: float = DEFAULT_WARN_AFTER_S) -> str:
    """The cause of a stall from the loop thread's scheduling since its last
    tick (None: not known here) and where it is. Code that ran on the loop
    for half the threshold is to blame even on a busy machine (it would stall
    an idle one too); otherwise mostly waiting for a CPU is the machine's."""
    ran = on_cpu_s is not None and on_cpu_s >= 0.5 * threshold_s
    if ran:
        return "blocked"
    if queued_s is not None and queued_s >= 0.5 * elapsed_s:
        return "starved"
    return "gil" if in_selector else "blocked"


def _schedstat(native_id: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable waiting for one) of a thread of
    this process; None where the kernel does not say."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat", "rb") as f:
            run, wait, _ = f.read().split()
    except (OSError, ValueError):
        return None
    return int(run) / 1e9, int(wait) / 1e9


class LoopLagMonitor:
    """Start on the loop it watches (``start``), stop there (``stop``)."""

    def __init__(self, metrics: Metrics, *, warn_after_s: float = DEFAULT_WARN_AFTER_S,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 timer: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0 or warn_after_s < 0:
            raise ValueError("interval_s must be > 0 and warn_after_s >= 0 (0: no warnings)")
        self.metrics = metrics
        self.warn_after_s = warn_after_s
        self.interval_s = interval_s
        self._timer = timer
        self._beat = timer()  # the tick's last wake-up (read by the watchdog thread)
        self._loop_thread: int | None = None
        self._loop_native_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reported_beat: float | None = None  # the heartbeat of the stall last reported
        # uvloop's loop is C: an idle loop thread's innermost Python frame is
        # the one that started the loop (found from the tick, below).
        self._idle_frame: FrameType | None = None
        # The stall reported and not yet over: (when the watchdog saw its last
        # tick, the loop thread's schedstat then, the report).
        self._open: tuple[float, tuple[float, float] | None, Stall] | None = None
        self.worst_s = 0.0  # the longest lag seen
        self.stalls: list[Stall] = []  # reported stalls (the last 32)

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is not None:
            return
        loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._loop_native_id = threading.get_native_id()
        self._beat = self._timer()
        self._stop.clear()
        self._task = loop.create_task(self._tick(), name="duplex-loop-lag")
        # What a leak looks like from outside: tasks that stay after their sessions.
        self.metrics.gauge("duplex_event_loop_tasks", "asyncio tasks alive on the server's loop",
                           lambda: len(asyncio.all_tasks(loop)))
        if self.warn_after_s > 0:
            self._thread = threading.Thread(target=self._watch, name="duplex-loop-watchdog",
                                            daemon=True)
            self._thread.start()

    async def stop(self) -> None:
        task, self._task = self._task, None
        self._stop.set()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join)

    # ---- on the loop ---------------------------------------------------------

    async def _tick(self) -> None:
        caller = sys._getframe().f_back  # what steps this task: asyncio's Handle._run, or
        if caller is not None and caller.f_code.co_name != "_run":  # the frame running uvloop
            self._idle_frame = caller
        interval, timer = self.interval_s, self._timer
        while True:
            asked = timer()
            await asyncio.sleep(interval)
            now = timer()
            lag = max(0.0, now - asked - interval)
            reported = self._reported_beat is not None and self._reported_beat == self._beat
            self._beat = now
            self.metrics.loop_lag.observe(lag)
            if lag > self.worst_s:
                self.worst_s = lag
            if reported:
                self._stall_ended(lag)

    def _stall_ended(self, lag: float) -> None:
        """The loop is back from a stall the watchdog reported: its cause,
        judged over the whole stall, is counted and logged."""
        opened = self._open
        if opened is None:
            return
        base_at, base, stall = opened
        self._open = None
        on_cpu, queued = stall.on_cpu_s, stall.queued_s
        sched = _schedstat(self._loop_native_id) if self._loop_native_id else None
        if base is not None and sched is not None:
            on_cpu, queued = sched[0] - base[0], sched[1] - base[1]
        cause = classify(self._timer() - base_at, on_cpu, queued, stall.in_selector,
                         self.warn_after_s)
        final = dataclasses.replace(stall, silent_s=lag, cause=cause, on_cpu_s=on_cpu,
                                    queued_s=queued)
        self.stalls = [*(s for s in self.stalls if s is not stall), final][-32:]
        self.metrics.loop_stalls.inc(cause=cause)
        detail = ("" if on_cpu is None or queued is None else
                  f"; the loop thread ran {on_cpu * 1000:.0f} ms and waited "
                  f"{queued * 1000:.0f} ms for a CPU")
        log.warning("event loop stalled for %.0f ms (cause: %s%s; the stack is above)",
                    lag * 1000, cause, detail)

    # ---- on the watchdog thread --------------------------------------------

    def _watch(self) -> None:
        step = min(self.interval_s, self.warn_after_s / 2)
        due = self._timer() + step
        reported_at = 0.0
        # The loop thread's scheduling when this thread last saw a new tick.
        base_beat, base_at, base = None, 0.0, None
        while not self._stop.wait(max(0.0, due - self._timer())):
            now = self._timer()
            late = max(0.0, now - due)  # how late this thread itself woke up
            due = now + step
            beat = self._beat
            if beat != base_beat:
                base_beat, base_at = beat, now
                base = _schedstat(self._loop_native_id) if self._loop_native_id else None
            silent = now - beat - self.interval_s  # past the tick's expected wake-up
            if silent < self.warn_after_s:
                continue
            if self._reported_beat == beat and now - reported_at < REPEAT_S:
                continue  # this stall is reported; again only if it goes on
            self._reported_beat, reported_at = beat, now
            sched = _schedstat(self._loop_native_id) if self._loop_native_id else None
            on_cpu = queued = None
            if base is not None and sched is not None:
                on_cpu, queued = sched[0] - base[0], sched[1] - base[1]
            stall = self._report(silent, late, now - base_at, on_cpu, queued)
            if stall is not None and (self._open is None or self._open[2] is not stall):
                self._open = (base_at, base, stall) if self._open is None else (
                    self._open[0], self._open[1], stall)

    def _report(self, silent: float, watchdog_late: float, elapsed: float = 0.0,
                on_cpu: float | None = None, queued: float | None = None) -> Stall | None:
        frames = sys._current_frames()
        frame = frames.get(self._loop_thread) if self._loop_thread is not None else None
        if frame is None:
            return None  # the loop's thread is gone
        stack = "".join(traceback.format_stack(frame))
        in_selector = frame is self._idle_frame or (
            frame.f_code.co_name in _SELECTOR_FUNCS and frame.f_back is not None
            and frame.f_back.f_code.co_name == "_run_once")
        cause = classify(elapsed, on_cpu, queued, in_selector, self.warn_after_s)
        stall = Stall(silent, stack, cause, in_selector, on_cpu, queued, watchdog_late)
        self.stalls = [*self.stalls[-31:], stall]
        load = "/".join(f"{x:.2f}" for x in os.getloadavg())
        sched = ("" if on_cpu is None or queued is None else
                 f"; of the last {elapsed * 1000:.0f} ms the loop thread ran {on_cpu * 1000:.0f} ms "
                 f"and waited {queued * 1000:.0f} ms for a CPU")
        held = (f"; the watchdog itself woke {watchdog_late * 1000:.0f} ms late (the whole "
                "process was held)") if watchdog_late >= self.warn_after_s else ""
        if cause == "starved":
            verdict = ("cause: starved -- the machine had no CPU for the loop thread (other "
                       "processes); it was here:")
        elif cause == "gil":
            verdict = ("cause: gil -- the loop thread sleeps in its selector with a timer due: "
                       "another thread holds the GIL. Other threads:\n"
                       + _other_threads(frames, self._loop_thread) + "\nThe loop thread:")
        else:
            verdict = ("cause: blocked -- the loop thread runs this (the code that holds the "
                       "loop):")
        log.warning("event loop blocked for %.0f ms so far (threshold %.0f ms; load average "
                    "%s%s%s); %s\n%s", silent * 1000, self.warn_after_s * 1000, load, sched,
                    held, verdict, stack)
        return stall


def _other_threads(frames: dict[int, FrameType], loop_thread: int | None) -> str:
    """One line per other thread: its name and innermost frame."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    lines = []
    for ident, frame in frames.items():
        if ident in (loop_thread, me):
            continue
        (summary,) = traceback.extract_stack(frame, limit=1)
        lines.append(f"  {names.get(ident, ident)}: {summary.name} "
                     f"({summary.filename}:{summary.lineno})")
    return "\n".join(sorted(lines)) or "  (none)"
