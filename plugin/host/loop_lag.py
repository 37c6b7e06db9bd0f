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

Telling a blocked loop from a starved machine: a loop thread whose stack
ends in the selector (``select``/``poll``) was not running any of our code;
it was waiting to be scheduled -- for the GIL (another thread held it:
the warning lists what the other threads were doing) or for a CPU (the
warning gives the load average). A watchdog that itself woke up late by as
much as the threshold says the same: the whole process was held. Any other
stack is the culprit: a synchronous call on the loop.
"""

from __future__ import annotations

import asyncio
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
    in_selector: bool  # the loop thread was waiting to run, not running our code
    watchdog_late_s: float  # how late the watchdog itself woke (the whole process held)


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
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reported_beat: float | None = None  # the heartbeat of the stall last reported
        # uvloop's loop is C: an idle loop thread's innermost Python frame is
        # the one that started the loop (found from the tick, below).
        self._idle_frame: FrameType | None = None
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
                log.warning("event loop stalled for %.0f ms (reported above)", lag * 1000)

    # ---- on the watchdog thread --------------------------------------------

    def _watch(self) -> None:
        step = min(self.interval_s, self.warn_after_s / 2)
        due = self._timer() + step
        reported_at = 0.0
        while not self._stop.wait(max(0.0, due - self._timer())):
            now = self._timer()
            late = max(0.0, now - due)  # how late this thread itself woke up
            due = now + step
            beat = self._beat
            silent = now - beat - self.interval_s  # past the tick's expected wake-up
            if silent < self.warn_after_s:
                continue
            if self._reported_beat == beat and now - reported_at < REPEAT_S:
                continue  # this stall is reported; again only if it goes on
            self._reported_beat, reported_at = beat, now
            self._report(silent, late)

    def _report(self, silent: float, watchdog_late: float) -> None:
        frames = sys._current_frames()
        frame = frames.get(self._loop_thread) if self._loop_thread is not None else None
        if frame is None:
            return  # the loop's thread is gone
        stack = "".join(traceback.format_stack(frame))
        in_selector = frame is self._idle_frame or (
            frame.f_code.co_name in _SELECTOR_FUNCS and frame.f_back is not None
            and frame.f_back.f_code.co_name == "_run_once")
        stall = Stall(silent, stack, in_selector, watchdog_late)
        self.stalls = [*self.stalls[-31:], stall]
        self.metrics.loop_stalls.inc(cause="starved" if in_selector else "blocked")
        load = "/".join(f"{x:.2f}" for x in os.getloadavg())
        if in_selector:
            others = _other_threads(frames, self._loop_thread)
            verdict = ("the loop thread is in its selector: no code on the loop holds it; it "
                       "waits for the GIL (another thread holds it) or for a CPU (the machine "
                       "is busy). Other threads:\n" + others)
        else:
            verdict = "the loop thread runs this (the code that holds the loop):"
        held = (f"; the watchdog itself woke {watchdog_late * 1000:.0f} ms late (the whole "
                "process was held)") if watchdog_late >= self.warn_after_s else ""
        log.warning("event loop blocked for %.0f ms so far (threshold %.0f ms; load average "
                    "%s%s); %s\n%s", silent * 1000, self.warn_after_s * 1000, load, held,
                    verdict, stack)


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
