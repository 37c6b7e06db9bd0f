"""The process's CPU scheduler: whose stage work runs first when the cores are busy.

Every CPU stage of every session -- Silero's windows, Whisper's partials and
finals, Piper's pieces, a camera's frames -- runs its model work holding a
*slot* of this one scheduler (``work``). There are as many slots as cores
the stages may use (``domain/machine.py``: the cores the LLM does not take), so
the stages never run more model work at once than the machine has room for,
and when more is asked for, the waiting work is ordered by who waits on it:

=================  =========================================================
``TURN_END``       a turn that is ending waits on it: the words at the pause
                   (the partial made as the audio goes quiet, the at-pause
                   decode), the final transcript, a reply's first piece of
                   speech; due the moment it is asked for
``SPEECH_DUE``     speech playing now needs it: the next piece of a reply,
                   due when the audio before it runs out (``due_in_s``)
``BACKGROUND``     nobody waits on it yet: partials in the middle of an
                   utterance, camera frames, warm-ups; due when asked for
=================  =========================================================

Waiting work goes by class, then by due time, then first come first served,
so no session is served ahead of another in the same class (fairness).
Background work holds at most ``background_slots`` slots at once (one), so a
turn that ends never finds every slot taken by partials nobody waits on
(with one slot, it waits for the rest of one partial); and background work that is
``sheddable`` runs only on room left over: when no slot is free for it at
once it is dropped (``Shed``) rather than queued. A waiting partial would
hold up its own session, whose listening works in order, and hear less than
the next one will (measured on ``bench/capacity.py`` at six talkers: partials
that waited up to 400 ms for a slot put the words at the pause 118 ms p50 /
556 ms p90 behind the VAD, dropped at once 44 / 366 ms). Under load the
partials thin out by themselves; the words at the pause never wait for them.
Work that cannot wait (``weight=0``: Silero's sub-millisecond windows, which tell when a turn
ends) runs at once, counted but holding no slot.

Nothing is preempted: a slot is held until its work returns (CTranslate2 and
onnxruntime calls cannot be interrupted), so the longest wait of a turn's
work is the rest of the shortest running piece when every slot is busy.

The scheduler is a blocking, thread-safe gate (a ``threading.Condition`` per
waiter on one lock): model work already runs on worker threads, which wait
here without the GIL. Its figures -- waits, lateness, shed work and busy
seconds, per class and stage -- are on ``/metrics`` (``publish``). One per
process (``cpu_scheduler``), sized once from the machine.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from vllm_duplex.domain.machine import Choice, choose, detect
from vllm_duplex.domain.metrics import Histogram, Metrics

# Seconds a piece of work waited or was late: from nothing to a stalled machine.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 2.0, 5.0)
# Worker threads a stage may have carry its work: they wait here for a slot,
# so a stage needs one per session working at once (made only when needed).
CARRIERS = 64


class Urgency(enum.IntEnum):
    """Who waits on a piece of CPU work (lower runs first; see the module docstring)."""

    TURN_END = 0
    SPEECH_DUE = 1
    BACKGROUND = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class Shed(Exception):
    """Sheddable background work found no free slot and was dropped: the
    caller goes on without it (e.g. no partial this time)."""


@dataclass(eq=False)
class _Ticket:
    urgency: Urgency
    stage: str
    due: float  # when it is needed, on the scheduler's timer
    seq: int
    sheddable: bool
    weight: int
    submitted: float
    cond: threading.Condition
    state: str = "waiting"  # waiting | running | done | shed | withdrawn
    started: float | None = None

    def key(self) -> tuple[int, float, int]:
        return (int(self.urgency), self.due, self.seq)


@dataclass
class _Figures:
    """Per (class, stage): what ran, what was shed, the seconds it held slots."""

    ran: int = 0
    shed: int = 0
    busy_s: float = 0.0


@dataclass
class SchedulerStats:
    slots: int
    background_slots: int
    running: int
    waiting: dict[str, int]  # by class
    figures: dict[tuple[str, str], _Figures] = field(default_factory=dict)  # (class, stage)


class CpuScheduler:
    def __init__(self, slots: int, *, background_slots: int | None = None,
                 timer: Callable[[], float] = time.monotonic) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        if background_slots is None:
            background_slots = 1
        if not 1 <= background_slots <= slots:
            raise ValueError("background_slots within 1..slots")
        self.slots = slots
        self.background_slots = background_slots
        self._timer = timer
        self._lock = threading.Lock()
        self._waiting: list[_Ticket] = []
        self._running = 0
        self._running_background = 0
        self._seq = itertools.count()
        self._figures: dict[tuple[Urgency, str], _Figures] = {}
        self.waits = Histogram("duplex_cpu_wait_seconds",
                               "How long stage work waited for a CPU slot, by class and stage",
                               WAIT_BUCKETS)
        self.lateness = Histogram(
            "duplex_cpu_lateness_seconds",
            "How long after it was due stage work finished, by class (a turn's work is due "
            "when asked for; a speech piece when the audio before it runs out)", WAIT_BUCKETS)
        for urgency in Urgency:
            self.lateness.declare(**{"class": urgency.label})

    def now(self) -> float:
        return self._timer()

    @contextmanager
    def work(self, urgency: Urgency, stage: str, *, due_in_s: float = 0.0,
             sheddable: bool = False, weight: int = 1) -> Iterator[None]:
        """Hold a slot for the body (blocking until one is granted; call it
        from a worker thread, never the event loop). ``due_in_s``: when the
        result is needed, from now; ``sheddable``: background work that runs
        only if a slot is free for it now (else raises ``Shed`` at once);
        ``weight`` 0: work that never waits (see the module docstring)."""
        ticket = self._queue(urgency, stage, due_in_s, sheddable, weight)
        self._wait(ticket)
        try:
            yield
        finally:
            self._leave(ticket)

    @asynccontextmanager
    async def holding(self, carriers: Executor, urgency: Urgency, stage: str, *,
                      due_in_s: float = 0.0) -> AsyncIterator[None]:
        """``work`` for a coroutine whose work runs elsewhere (a synthesizer
        process): the slot is waited for on one of ``carriers``' threads;
        cancelled while waiting, the work is withdrawn, never granted."""
        ticket = self._queue(urgency, stage, due_in_s, False, 1)
        waited = asyncio.get_running_loop().run_in_executor(carriers, self._wait, ticket)
        try:
            await asyncio.shield(waited)
        except asyncio.CancelledError:
            self._withdraw(ticket)
            raise
        try:
            yield
        finally:
            self._leave(ticket)

    # ---- inside --------------------------------------------------------------

    def _queue(self, urgency: Urgency, stage: str, due_in_s: float,
               sheddable: bool, weight: int) -> _Ticket:
        if sheddable and urgency is not Urgency.BACKGROUND:
            raise ValueError("only background work may be shed")
        now = self._timer()
        with self._lock:
            ticket = _Ticket(urgency, stage, now + max(0.0, due_in_s), next(self._seq),
                             sheddable, weight, now, threading.Condition(self._lock))
            if weight == 0:
                ticket.state = "running"
            else:
                self._waiting.append(ticket)
                self._grant()
                if sheddable and ticket.state == "waiting":  # no room for it now: dropped
                    self._waiting.remove(ticket)
                    ticket.state = "shed"
                    self._figure(ticket).shed += 1
            return ticket

    def _wait(self, ticket: _Ticket) -> None:
        """Block until ``ticket`` holds a slot (raises ``Shed`` when dropped)."""
        with self._lock:
            while ticket.state == "waiting":
                ticket.cond.wait()
            if ticket.state == "shed":
                raise Shed(f"no CPU slot was free for {ticket.stage}'s background work")
            if ticket.state == "withdrawn":
                return
            ticket.started = self._timer()
            self.waits.observe(ticket.started - ticket.submitted,
                               **{"class": ticket.urgency.label, "stage": ticket.stage})

    def _withdraw(self, ticket: _Ticket) -> None:
        """Its caller gave up: a waiting ticket leaves the queue, a granted one
        gives its slot back at once."""
        with self._lock:
            if ticket.state == "waiting":
                self._waiting.remove(ticket)
                ticket.state = "withdrawn"
                ticket.cond.notify()
                return
        self._leave(ticket)

    def _grant(self) -> None:
        """Hand free slots to the best waiters (under the lock). Strict order:
        when the best cannot run, nothing behind it jumps ahead."""
        while self._waiting and self._running < self.slots:
            best = min(self._waiting, key=_Ticket.key)
            background = best.urgency is Urgency.BACKGROUND
            if background and self._running_background >= self.background_slots:
                return
            self._waiting.remove(best)
            best.state = "running"
            self._running += 1
            self._running_background += background
            best.cond.notify()

    def _leave(self, ticket: _Ticket) -> None:
        now = self._timer()
        with self._lock:
            if ticket.state != "running":
                return
            ticket.state = "done"
            if ticket.weight:
                self._running -= 1
                self._running_background -= ticket.urgency is Urgency.BACKGROUND
            figures = self._figure(ticket)
            figures.ran += 1
            figures.busy_s += now - (ticket.started if ticket.started is not None else now)
            self.lateness.observe(max(0.0, now - ticket.due), **{"class": ticket.urgency.label})
            self._grant()

    def _figure(self, ticket: _Ticket) -> _Figures:
        return self._figures.setdefault((ticket.urgency, ticket.stage), _Figures())

    # ---- figures -------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        with self._lock:
            waiting = {u.label: sum(t.urgency is u for t in self._waiting) for u in Urgency}
            figures = {(u.label, s): _Figures(f.ran, f.shed, f.busy_s)
                       for (u, s), f in self._figures.items()}
            return SchedulerStats(self.slots, self.background_slots, self._running, waiting, figures)

    def publish(self, metrics: Metrics) -> None:
        """Show this scheduler on ``metrics`` (read at scrape time)."""
        metrics.add_histogram(self.waits)
        metrics.add_histogram(self.lateness)
        metrics.gauge("duplex_cpu_slots", "CPU slots the stages' model work may hold at once",
                      lambda: float(self.slots))
        metrics.gauge("duplex_cpu_slots_busy", "CPU slots held now", lambda: float(self.stats().running))
        for urgency in Urgency:
            metrics.gauge("duplex_cpu_waiting", "Stage work waiting for a CPU slot now, by class",
                          lambda u=urgency: float(self.stats().waiting[u.label]),
                          **{"class": urgency.label})
        metrics.collector(self._lines)

    def _lines(self) -> list[str]:
        stats = self.stats()
        out: list[str] = []
        for name, help_, attr in (
                ("duplex_cpu_work_total", "Stage work run under the CPU scheduler, by class and stage", "ran"),
                ("duplex_cpu_shed_total", "Background stage work dropped: no CPU slot was free for it, "
                                          "by class and stage", "shed"),
                ("duplex_cpu_busy_seconds_total", "Seconds stage work held a CPU slot, by class and stage",
                 "busy_s")):
            out += [f"# HELP {name} {help_}", f"# TYPE {name} counter"]
            for (cls, stage), f in sorted(stats.figures.items()):
                out.append(f'{name}{{class="{cls}",stage="{stage}"}} {getattr(f, attr):g}')
        return out


_process: CpuScheduler | None = None
_process_lock = threading.Lock()


def slots_choice() -> Choice:
    """How many slots this process's stages get (``domain/machine.py``: the
    cores the LLM does not take; ``VLLM_DUPLEX_CPU_SLOTS`` wins)."""
    return choose(detect(), os.environ).stage_slots


def cpu_scheduler() -> CpuScheduler:
    """The process's one scheduler (made on first use, from ``slots_choice``)."""
    global _process
    with _process_lock:
        if _process is None:
            _process = CpuScheduler(int(slots_choice().value))
        return _process
