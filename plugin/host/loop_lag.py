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
- ``starved``: otherwise, when it waited for a CPU most of the time, or the
  process's other Python threads (those that can hold the GIL) did -- the
  machine is busy (other processes); the stack is wherever it happened to be;
- ``gil``: it slept in its selector while a timer was due -- it waits for the
  GIL, which another thread holds (the warning lists what the other threads
  were doing; a C extension that does not release the GIL shows there);
- ``blocked`` too for anything else: it slept in a blocking call made on the
  loop (a lock, a sleep, a queue); the stack is the culprit.

A watchdog that itself woke up late by as much as the threshold says the
whole process was held (the GIL, or no CPU for any of its threads).

The watchdog's path from "the loop is silent" to "reported" does no I/O: each
file read hands the GIL over, and taking it back from code that computes on
the loop costs up to the switch interval, so a stall could end before it was
seen. A loop that is not running (stopped between runs of an embedding
program, or at shutdown) is not stalled: that silence is neither warned of
nor measured.
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

from vllm_duplex.domain.metrics import Metrics

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


def _snapshot(ids: list[int]) -> Snapshot:
    """The scheduler's figures of these threads; empty where the kernel does
    not say. One small file each, and each read hands the GIL over and back:
    while code computes on the loop, taking it back costs up to the switch
    interval (5 ms), so the watchdog reads as few as it can."""
    out: Snapshot = {}
    for tid in ids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                run, wait, _ = f.read().split()
        except (OSError, ValueError):
            continue
        out[tid] = (int(run) / 1e9, int(wait) / 1e9)
    return out


_heap_frozen = False


def freeze_startup_heap() -> int:
    """Keep the objects that exist once the server has started out of every
    later garbage collection (``gc.freeze``), once per process; returns how
    many are frozen.

    A started server holds ~680k objects (the models, the tokenizers, the
    vLLM client); CPython's full (generation 2) collection walks them all, on
    whatever thread allocated last -- the loop thread, mostly: 0.5-1.1 s of
    every session frozen each time one ran. They live as long as the process,
    so nothing is lost by not walking them again; what the sessions allocate
    is still collected as usual. One full collection first, so no garbage of
    the start-up is frozen with them."""
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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._loop_native_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # The tick and the watchdog meet here, under the lock (no I/O inside):
        # the tick's last wake-up, the heartbeat whose stall was reported, and
        # that stall's figures -- so a stall is either reported by the
        # watchdog and ended by the tick, or found by the tick alone, never both.
        self._handshake = threading.Lock()
        self._beat = timer()
        self._reported_beat: float | None = None
        self._open: _OpenStall | None = None
        self._paused_beat: float | None = None  # the loop was stopped after this tick (not a stall)
        # uvloop's loop is C: an idle loop thread's innermost Python frame is
        # the one that started the loop (found from the tick, below).
        self._idle_frame: FrameType | None = None
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
        loop = self._loop = asyncio.get_running_loop()
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
            with self._handshake:
                beat, self._beat = self._beat, now
                opened = self._open if self._reported_beat == beat else None
            if opened is not None:  # reported while it lasted: the watchdog judges it
                opened.ended = (lag, now, _snapshot([self._loop_native_id or 0]))
            if self._paused_beat == beat:
                continue  # the loop was stopped meanwhile (between runs): no lag of its own
            self.metrics.loop_lag.observe(lag)
            self.worst_s = max(self.worst_s, lag)
            if opened is None and lag >= self.warn_after_s > 0:
                self._unseen_stall(lag)

    def _record(self, stall: Stall, replacing: Stall | None = None) -> None:
        with self._stalls_lock:
            self.stalls = [*(s for s in self.stalls if s is not replacing), stall][-32:]

    def _unseen_stall(self, lag: float) -> None:
        """A stall the watchdog could not report while it lasted: it got
        neither the GIL (another thread kept it in a C call) nor a CPU (the
        machine was busy) long enough to look. Counted and logged now, with
        the loop thread's figures and what the other threads do now."""
        current = self._current
        sched = (current.scheduling(self._timer(), _snapshot([self._loop_native_id or 0]),
                                    held=lag) if current is not None else None)
        # Where the loop thread was is unknown; it ran our code if the kernel says it ran.
        in_selector = sched is None or sched.loop_ran_s < 0.5 * self.warn_after_s
        cause = classify(sched, in_selector, self.warn_after_s)
        self._record(Stall(lag, "", cause, in_selector, sched))
        self.metrics.loop_stalls.inc(cause=cause)
        log.warning("event loop stalled for %.0f ms (threshold %.0f ms; load average %s%s); "
                    "cause: %s -- the watchdog was held as long (the GIL was held by another "
                    "thread, or no CPU for it), so no stack while it lasted. Other threads "
                    "now:\n%s", lag * 1000, self.warn_after_s * 1000, _load(), _describe(sched),
                    cause, _other_threads(sys._current_frames(), self._loop_thread))

    # ---- on the watchdog thread --------------------------------------------

    def _watch(self) -> None:
        step = min(self.interval_s, self.warn_after_s / 2)
        due = self._timer() + step
        reported_at = 0.0
        seen_beat: float | None = None
        current: _OpenStall | None = None  # the scheduler's figures of this silence
        loop, loop_id = self._loop, self._loop_native_id or 0
        assert loop is not None
        while not self._stop.wait(max(0.0, due - self._timer())):
            opened = self._open
            if opened is not None and opened.ended is not None:
                self._finish(opened)
            now = self._timer()
            late = max(0.0, now - due)  # how late this thread itself woke up
            due = now + step
            beat = self._beat
            if beat != seen_beat or current is None:  # a new tick: the loop's figures from here
                seen_beat = beat
                current = self._current = _OpenStall(now, loop_id, _snapshot([loop_id]))
                continue
            if not loop.is_running():
                self._paused_beat = beat  # stopped (between runs, at shutdown), not held
            if self._paused_beat == beat:
                continue  # and until its next tick: the restart's first steps are not a stall
            current.watchdog_late_s = max(current.watchdog_late_s, late)
            silent = now - beat - self.interval_s  # past the tick's expected wake-up
            if silent < self.warn_after_s:
                continue
            if self._reported_beat == beat and now - reported_at < REPEAT_S:
                continue  # this stall is reported; again only if it goes on
            frame = sys._current_frames().get(self._loop_thread or 0)
            if frame is None:
                continue  # the loop's thread is gone
            in_selector = self._idle(frame)
            if in_selector and not current.looked_again:
                # Idle in its selector with a tick overdue: either held out of
                # the GIL (a stall to report), or it has just let the GIL go to
                # poll, its stall over, the tick about to run. A step later tells.
                current.looked_again = True
                continue
            # The stack as it is now, with no I/O (no GIL hand-over), then the
            # handshake: from here the stall is this report's.
            held = traceback.StackSummary.extract(traceback.walk_stack(frame),
                                                  lookup_lines=False)
            with self._handshake:
                if self._beat != beat:
                    continue  # the loop came back meanwhile: the tick counts it
                self._open, self._reported_beat = current, beat
            reported_at = now
            self._report(silent, current, held, in_selector, now)
            if current.ended is not None:
                self._finish(current)
        opened = self._open
        if opened is not None and opened.ended is not None:
            self._finish(opened)

    def _finish(self, opened: _OpenStall) -> None:
        """A reported stall is over: its cause, judged over the whole stall,
        is counted and logged."""
        with self._handshake:
            if self._open is opened:
                self._open = None
        stall, ended = opened.stall, opened.ended
        if stall is None or ended is None:
            return
        lag, at, loop_after = ended
        others = _snapshot(list(opened.others[1])) if opened.others is not None else None
        sched = opened.scheduling(at, loop_after, others)
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

    def _python_threads(self) -> list[int]:
        """The other threads that can hold the GIL: Python's. A native pool's
        threads (OpenMP, onnxruntime: a hundred in a server) never keep the
        loop out of it, and reading each one's figures costs a GIL hand-over."""
        mine = {self._loop_native_id, threading.get_native_id()}
        return [t.native_id for t in threading.enumerate()
                if t.native_id is not None and t.native_id not in mine]

    def _report(self, silent: float, current: _OpenStall, held: traceback.StackSummary,
                in_selector: bool, now: float) -> None:
        if current.others is None:  # from here: did the threads that hold the GIL get a CPU?
            current.others = (now, _snapshot(self._python_threads()))
        sched = current.scheduling(now, _snapshot([current.loop_id]))
        cause = classify(sched, in_selector, self.warn_after_s)
        held.reverse()  # outermost first, as a traceback reads
        stack = "".join(held.format())  # the source lines are read now
        stall = current.stall = Stall(silent, stack, cause, in_selector, sched)
        self._record(stall)
        if cause == "starved":
            verdict = ("cause: starved -- the machine had no CPU for the process (other "
                       "processes); the loop thread was here:")
        elif cause == "gil":
            verdict = ("cause: gil -- the loop thread waits for the GIL, which another thread "
                       "holds. Other threads:\n"
                       + _other_threads(sys._current_frames(), self._loop_thread)
                       + "\nThe loop thread:")
        else:
            verdict = ("cause: blocked -- the loop thread runs this (the code that holds the "
                       "loop):")
        log.warning("event loop blocked for %.0f ms so far (threshold %.0f ms; load average "
                    "%s%s); %s\n%s", silent * 1000, self.warn_after_s * 1000, _load(),
                    _describe(sched), verdict, stack)


class _OpenStall:
    """The watchdog's figures of one silence of the loop: the loop thread's
    scheduling at its last tick, the Python threads' from the report on, the
    watchdog's own lateness, the report, and the loop's figures at its end."""

    def __init__(self, at: float, loop_id: int, loop: Snapshot) -> None:
        self.at = at
        self.loop_id = loop_id
        self.loop = loop
        self.others: tuple[float, Snapshot] | None = None
        self.watchdog_late_s = 0.0
        self.stall: Stall | None = None
        # Set once by the loop's tick when the stall is over: its length, when, the loop's figures.
        self.ended: tuple[float, float, Snapshot] | None = None
        self.looked_again = False  # found idle in its selector once: looked again a step later

    def scheduling(self, now: float, loop_after: Snapshot, others_after: Snapshot | None = None,
                   *, held: float = 0.0) -> Scheduling | None:
        """The figures from the last tick to ``now``; ``held``: the watchdog
        is known to have been held that long (it could not say so itself)."""
        if self.loop_id not in self.loop or self.loop_id not in loop_after:
            return None
        (run0, wait0), (run1, wait1) = self.loop[self.loop_id], loop_after[self.loop_id]
        others = window = 0.0
        if self.others is not None and others_after:
            since, before = self.others
            window = now - since
            others = max((others_after[t][1] - w0 for t, (_, w0) in before.items()
                          if t in others_after), default=0.0)
        return Scheduling(now - self.at, run1 - run0, wait1 - wait0, others, window,
                          max(self.watchdog_late_s, held))


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


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
    """One line per other thread: its name and innermost frame (no source
    lines read: this runs while the loop may be held)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    lines = [f"  {names.get(ident, ident)}: {frame.f_code.co_name} "
             f"({frame.f_code.co_filename}:{frame.f_lineno})"
             for ident, frame in frames.items() if ident not in (loop_thread, me)]
    return "\n".join(sorted(lines)) or "  (none)"
