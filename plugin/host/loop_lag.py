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
import gc
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
class Scheduling:
    """What the kernel's scheduler says of the process over a stall
    (``/proc/self/task/<tid>/schedstat``)."""

    window_s: float  # the span the figures cover
    loop_ran_s: float  # the loop thread on a CPU
    loop_queued_s: float  # the loop thread runnable, waiting for a CPU
    others_queued_s: float  # the most any other thread of the process waited for a CPU ...
    others_window_s: float  # ... over this (later, shorter) span; 0: not measured
    watchdog_late_s: float  # the most the watchdog woke late meanwhile (it needs the GIL too)


@dataclass(frozen=True)
class Stall:
    """What the watchdog saw when it reported a stall."""

    silent_s: float  # how long the loop had not ticked (so far; its length once over)
    stack: str  # the loop thread's stack then
    cause: str  # blocked | gil | starved (see the module docstring)
    in_selector: bool  # the loop thread was in its selector (running none of our code)
    sched: Scheduling | None  # None where the kernel does not say


def classify(sched: Scheduling | None, in_selector: bool,
             threshold_s: float = DEFAULT_WARN_AFTER_S) -> str:
    """The cause of a stall. Code that ran on the loop for half the threshold
    is to blame even on a busy machine (it would stall an idle one too). A
    loop thread that slept while the GIL was free (the watchdog kept time)
    slept in a call made on the loop. One that slept while the GIL was held
    elsewhere waited for that thread -- unless threads of the process were
    waiting for a CPU: then the holder had none (the machine is busy)."""
    if sched is None:
        return "gil" if in_selector else "blocked"
    half = 0.5 * sched.window_s
    if sched.loop_ran_s >= 0.5 * threshold_s:
        return "blocked"
    if sched.loop_queued_s >= half:
        return "starved"
    if sched.watchdog_late_s < 0.5 * threshold_s and not in_selector:
        return "blocked"  # the GIL was free: a lock, a sleep, a queue on the loop
    if sched.others_window_s >= 0.05 and sched.others_queued_s >= 0.5 * sched.others_window_s:
        return "starved"
    return "gil"


Snapshot = dict[int, tuple[float, float]]  # native thread id -> (on a CPU, waiting for one), s


def _snapshot(only: int | None = None) -> Snapshot:
    """The scheduler's figures of this process's threads (or of ``only``);
    empty where the kernel does not say."""
    ids = [only] if only is not None else _task_ids()
    out: Snapshot = {}
    for tid in ids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                run, wait, _ = f.read().split()
        except (OSError, ValueError):
            continue
        out[tid] = (int(run) / 1e9, int(wait) / 1e9)
    return out


def _task_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


_heap_frozen = False


def freeze_startup_heap() -> int:
    """Keep the objects that exist once the server has started out of every
    later garbage collection (``gc.freeze``), once per process; returns how
    many are frozen.

    A started server holds ~680k objects (the models, the tokenizers, the
    vLLM client); CPython's full (generation 2) collection walks them all, on
    whatever thread allocated last -- the loop thread, mostly: 0.5-1.1 s of
    every session frozen each time one ran (issue 21). They live as long as
    the process, so nothing is lost by not walking them again; what the
    sessions allocate is still collected as usual. One full collection first,
    so no garbage of the start-up is frozen with them."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.collect()
        gc.freeze()
    return gc.get_freeze_count()


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
        self._open: _OpenStall | None = None  # the stall reported and not yet over
        self._current: _OpenStall | None = None  # the watchdog's figures since the last tick
        self.worst_s = 0.0  # the longest lag seen
        self.stalls: list[Stall] = []  # reported stalls (the last 32)
        self._stalls_lock = threading.Lock()  # the watchdog and the tick both record stalls

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
            self.worst_s = max(self.worst_s, lag)
            if reported:
                self._stall_ended(lag)
            elif lag >= self.warn_after_s > 0:
                self._unseen_stall(lag)

    def _stall_ended(self, lag: float) -> None:
        """The loop is back from a stall the watchdog reported: its length and
        the scheduler's figures now go to the watchdog, which judges, counts
        and logs it (``_finish``). Its report may still be in the making (it
        formats the stack while the loop runs again), so it is not done here."""
        opened = self._open
        if opened is not None and opened.ended is None:
            opened.ended = (lag, opened.scheduling(self._timer(), self._loop_native_id))

    def _record(self, stall: Stall, replacing: Stall | None = None) -> None:
        with self._stalls_lock:
            self.stalls = [*(s for s in self.stalls if s is not replacing), stall][-32:]

    def _unseen_stall(self, lag: float) -> None:
        """A stall the watchdog could not report while it lasted: it was held
        too, so the loop ran no Python (that would have let it run) -- the
        GIL was held by another thread in a C call, or the process had no
        CPU. Counted and logged now, with what the other threads do now."""
        current = self._current
        sched = (current.scheduling(self._timer(), self._loop_native_id, held=lag)
                 if current is not None else None)
        cause = classify(sched, True, self.warn_after_s)
        stall = Stall(lag, "", cause, True, sched)
        self._record(stall)
        self.metrics.loop_stalls.inc(cause=cause)
        log.warning("event loop stalled for %.0f ms (threshold %.0f ms; load average %s%s); "
                    "cause: %s -- the watchdog was held as long (the GIL was held by another "
                    "thread, or no CPU for the process), so no stack while it lasted. Other "
                    "threads now:\n%s", lag * 1000, self.warn_after_s * 1000,
                    "/".join(f"{x:.2f}" for x in os.getloadavg()), _describe(sched), cause,
                    _other_threads(sys._current_frames(), self._loop_thread))

    # ---- on the watchdog thread --------------------------------------------

    def _watch(self) -> None:
        step = min(self.interval_s, self.warn_after_s / 2)
        due = self._timer() + step
        reported_at = 0.0
        seen_beat: float | None = None
        current: _OpenStall | None = None  # the scheduler's figures of this silence
        while not self._stop.wait(max(0.0, due - self._timer())):
            if self._open is not None and self._open.ended is not None:
                self._finish(self._open)
            now = self._timer()
            late = max(0.0, now - due)  # how late this thread itself woke up
            due = now + step
            beat = self._beat
            if beat != seen_beat:  # a new tick: the loop thread's figures from here
                seen_beat = beat
                current = self._current = _OpenStall(now, _snapshot(self._loop_native_id))
                continue
            assert current is not None
            current.watchdog_late_s = max(current.watchdog_late_s, late)
            silent = now - beat - self.interval_s  # past the tick's expected wake-up
            if silent >= self.warn_after_s / 2 and current.others is None:
                current.others = (now, _snapshot())  # late already: every thread from here
            if silent < self.warn_after_s:
                continue
            if self._reported_beat == beat and now - reported_at < REPEAT_S:
                continue  # this stall is reported; again only if it goes on
            if not current.looked_again and self._loop_idle():
                # Idle in its selector with a tick overdue: either held out of
                # the GIL (a stall to report), or it has just let the GIL go to
                # poll, its stall over, the tick about to run. A step later tells.
                current.looked_again = True
                continue
            self._reported_beat, reported_at = beat, now
            self._open = current  # before the report: the loop may end the stall meanwhile
            stall = self._report(silent, current.scheduling(now, self._loop_native_id))
            if stall is not None:
                current.stall = stall
            if current.ended is not None:
                self._finish(current)
        if self._open is not None and self._open.ended is not None:
            self._finish(self._open)

    def _finish(self, opened: _OpenStall) -> None:
        """A reported stall is over: its cause, judged over the whole stall,
        is counted and logged."""
        self._open = None
        stall, ended = opened.stall, opened.ended
        if stall is None or ended is None:
            return  # the loop's thread was gone when it was reported
        lag, sched = ended
        cause = classify(sched, stall.in_selector, self.warn_after_s) if sched else stall.cause
        final = dataclasses.replace(stall, silent_s=lag, cause=cause, sched=sched or stall.sched)
        self._record(final, replacing=stall)
        self.metrics.loop_stalls.inc(cause=cause)
        log.warning("event loop stalled for %.0f ms (cause: %s%s; the stack is above)",
                    lag * 1000, cause, _describe(final.sched))

    def _idle(self, frame: FrameType) -> bool:
        """The loop thread's innermost frame is its selector's (it runs none of our code)."""
        return frame is self._idle_frame or (
            frame.f_code.co_name in _SELECTOR_FUNCS and frame.f_back is not None
            and frame.f_back.f_code.co_name == "_run_once")

    def _loop_idle(self) -> bool:
        frame = sys._current_frames().get(self._loop_thread) if self._loop_thread else None
        return frame is not None and self._idle(frame)

    def _report(self, silent: float, sched: Scheduling | None) -> Stall | None:
        frames = sys._current_frames()
        frame = frames.get(self._loop_thread) if self._loop_thread is not None else None
        if frame is None:
            return None  # the loop's thread is gone
        stack = "".join(traceback.format_stack(frame))
        in_selector = self._idle(frame)
        cause = classify(sched, in_selector, self.warn_after_s)
        stall = Stall(silent, stack, cause, in_selector, sched)
        self._record(stall)
        load = "/".join(f"{x:.2f}" for x in os.getloadavg())
        if cause == "starved":
            verdict = ("cause: starved -- the machine had no CPU for the process (other "
                       "processes); the loop thread was here:")
        elif cause == "gil":
            verdict = ("cause: gil -- the loop thread waits for the GIL, which another thread "
                       "holds. Other threads:\n" + _other_threads(frames, self._loop_thread)
                       + "\nThe loop thread:")
        else:
            verdict = ("cause: blocked -- the loop thread runs this (the code that holds the "
                       "loop):")
        log.warning("event loop blocked for %.0f ms so far (threshold %.0f ms; load average "
                    "%s%s); %s\n%s", silent * 1000, self.warn_after_s * 1000, load,
                    _describe(sched), verdict, stack)
        return stall


class _OpenStall:
    """The watchdog's figures of one silence of the loop: the loop thread's
    scheduling at its last tick, every thread's once the silence was long,
    the watchdog's own lateness, and the report (once made)."""

    def __init__(self, at: float, loop: Snapshot) -> None:
        self.at = at
        self.loop = loop
        self.others: tuple[float, Snapshot] | None = None
        self.watchdog_late_s = 0.0
        self.stall: Stall | None = None
        # Set once by the loop's tick when the stall is over: its length, the figures then.
        self.ended: tuple[float, Scheduling | None] | None = None
        self.looked_again = False  # found idle in its selector once: looked again a step later

    def scheduling(self, now: float, loop_id: int | None, *, held: float = 0.0
                   ) -> Scheduling | None:
        """The figures from the last tick to ``now``; ``held``: the watchdog
        is known to have been held that long (it could not say so itself)."""
        if loop_id is None or loop_id not in self.loop:
            return None
        since, before = self.others if self.others is not None else (self.at, {})
        after = _snapshot() if before else _snapshot(loop_id)
        if loop_id not in after:
            return None
        (run0, wait0), (run1, wait1) = self.loop[loop_id], after[loop_id]
        others = max((after[t][1] - w0 for t, (_, w0) in before.items()
                      if t != loop_id and t in after), default=0.0)
        return Scheduling(now - self.at, run1 - run0, wait1 - wait0, others,
                          now - since if before else 0.0, max(self.watchdog_late_s, held))


def _describe(sched: Scheduling | None) -> str:
    if sched is None:
        return ""
    text = (f"; of the last {sched.window_s * 1000:.0f} ms the loop thread ran "
            f"{sched.loop_ran_s * 1000:.0f} ms and waited {sched.loop_queued_s * 1000:.0f} ms "
            f"for a CPU")
    if sched.others_window_s:
        text += (f", another thread up to {sched.others_queued_s * 1000:.0f} ms of the last "
                 f"{sched.others_window_s * 1000:.0f}")
    if sched.watchdog_late_s >= 0.1:
        text += f", the watchdog woke up to {sched.watchdog_late_s * 1000:.0f} ms late"
    return text


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
