"""The CPU scheduler: who runs first when every slot is busy, what background
work may hold, what is dropped, and what it reports. Real threads wait on it
(it is a blocking gate); order is read from the grants, never from timing."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.stages.scheduler import CpuScheduler, Shed, Urgency

TURN, SPEECH, BACKGROUND = Urgency.TURN_END, Urgency.SPEECH_DUE, Urgency.BACKGROUND


class Timer:
    """The scheduler's clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def wait_until(check, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.001)


class Jobs:
    """Threads that each hold a slot of ``sched`` once; the order they got them in."""

    def __init__(self, sched: CpuScheduler) -> None:
        self.sched = sched
        self.order: list[str] = []
        self.threads: list[threading.Thread] = []
        self.errors: dict[str, BaseException] = {}

    def start(self, name: str, urgency: Urgency, *, hold: threading.Event | None = None,
              **kwargs) -> None:
        def run() -> None:
            try:
                with self.sched.work(urgency, "asr", **kwargs):
                    self.order.append(name)
                    if hold is not None:
                        hold.wait(5)
            except BaseException as exc:  # noqa: BLE001 - recorded for the test
                self.errors[name] = exc

        t = threading.Thread(target=run, name=f"job-{name}")
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        for t in self.threads:
            t.join(5)
            assert not t.is_alive()


def queued(sched: CpuScheduler, n: int) -> None:
    wait_until(lambda: sum(sched.stats().waiting.values()) == n)


def test_a_turn_that_ends_goes_first_then_speech_by_its_due_time_then_background():
    sched = CpuScheduler(1, timer=Timer())
    jobs, busy = Jobs(sched), threading.Event()
    jobs.start("running", BACKGROUND, hold=busy)
    wait_until(lambda: jobs.order == ["running"])
    jobs.start("partial", BACKGROUND)
    queued(sched, 1)
    jobs.start("piece due late", SPEECH, due_in_s=2.0)
    queued(sched, 2)
    jobs.start("piece due soon", SPEECH, due_in_s=0.5)
    queued(sched, 3)
    jobs.start("final", TURN)
    queued(sched, 4)
    busy.set()
    jobs.join()
    assert jobs.order == ["running", "final", "piece due soon", "piece due late", "partial"]


def test_within_a_class_first_come_first_served():
    sched = CpuScheduler(1, timer=Timer())
    jobs, busy = Jobs(sched), threading.Event()
    jobs.start("running", TURN, hold=busy)
    wait_until(lambda: jobs.order == ["running"])
    for i, name in enumerate("abcd"):
        jobs.start(name, TURN)
        queued(sched, i + 1)
    busy.set()
    jobs.join()
    assert jobs.order == ["running", "a", "b", "c", "d"]


def test_background_never_holds_the_slot_a_turn_needs():
    """Two slots, background at most one of them: a second partial waits
    beside a free slot, and a final takes that slot at once."""
    sched = CpuScheduler(2, timer=Timer())
    assert sched.background_slots == 1
    jobs, busy, final_busy = Jobs(sched), threading.Event(), threading.Event()
    jobs.start("partial 1", BACKGROUND, hold=busy)
    wait_until(lambda: jobs.order == ["partial 1"])
    jobs.start("partial 2", BACKGROUND)
    queued(sched, 1)
    assert sched.stats().running == 1  # a slot is free, and stays free for a turn
    jobs.start("final", TURN, hold=final_busy)
    wait_until(lambda: jobs.order == ["partial 1", "final"])
    assert sched.stats().waiting["background"] == 1
    busy.set()
    final_busy.set()
    jobs.join()
    assert jobs.order == ["partial 1", "final", "partial 2"]


def test_a_sheddable_partial_runs_only_on_room_left_over():
    """No slot free for it now: dropped at once, never queued (it would hold
    up its own session and hear less than the next one)."""
    sched = CpuScheduler(2, timer=Timer())
    jobs, busy, final_busy = Jobs(sched), threading.Event(), threading.Event()
    jobs.start("partial 1", BACKGROUND, hold=busy, sheddable=True)
    wait_until(lambda: jobs.order == ["partial 1"])
    jobs.start("partial 2", BACKGROUND, sheddable=True)  # the background slot is taken
    wait_until(lambda: "partial 2" in jobs.errors)
    assert isinstance(jobs.errors["partial 2"], Shed)
    jobs.start("final", TURN, hold=final_busy)
    wait_until(lambda: jobs.order == ["partial 1", "final"])
    jobs.start("partial 3", BACKGROUND, sheddable=True)  # every slot is taken
    wait_until(lambda: "partial 3" in jobs.errors)
    busy.set()
    final_busy.set()
    jobs.join()
    with sched.work(BACKGROUND, "asr", sheddable=True):  # room again: it runs
        jobs.order.append("partial 4")
    assert jobs.order == ["partial 1", "final", "partial 4"]
    stats = sched.stats()
    assert stats.figures[("background", "asr")].shed == 2 and stats.running == 0
    assert sum(stats.waiting.values()) == 0
    with pytest.raises(ValueError):
        with sched.work(TURN, "asr", sheddable=True):
            pass


def test_work_that_cannot_wait_runs_beside_full_slots():
    sched = CpuScheduler(1, timer=Timer())
    jobs, busy = Jobs(sched), threading.Event()
    jobs.start("final", TURN, hold=busy)
    wait_until(lambda: jobs.order == ["final"])
    with sched.work(TURN, "vad", weight=0):
        assert sched.stats().running == 1  # it holds no slot
    busy.set()
    jobs.join()
    assert sched.stats().figures[("turn_end", "vad")].ran == 1


def test_a_coroutine_cancelled_while_it_waits_gives_up_its_place():
    sched = CpuScheduler(1, timer=Timer())
    carriers = ThreadPoolExecutor(2)
    busy = threading.Event()

    async def main() -> None:
        jobs = Jobs(sched)
        jobs.start("final", TURN, hold=busy)
        wait_until(lambda: jobs.order == ["final"])

        async def piece() -> None:
            async with sched.holding(carriers, SPEECH, "tts"):
                raise AssertionError("never granted")

        task = asyncio.create_task(piece())
        while sum(sched.stats().waiting.values()) == 0:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sum(sched.stats().waiting.values()) == 0
        busy.set()
        await asyncio.to_thread(jobs.join)
        async with sched.holding(carriers, SPEECH, "tts"):
            assert sched.stats().running == 1
        assert sched.stats().running == 0

    try:
        asyncio.run(main())
    finally:
        carriers.shutdown()


def test_its_figures_are_on_metrics():
    timer = Timer()
    sched = CpuScheduler(2, timer=timer)
    metrics = Metrics()
    sched.publish(metrics)
    with sched.work(TURN, "asr"):
        timer.t += 0.3
    with sched.work(SPEECH, "tts", due_in_s=1.0):
        timer.t += 0.2  # done before it was due: not late
    text = metrics.render()
    assert 'duplex_cpu_slots 2' in text
    assert 'duplex_cpu_work_total{class="turn_end",stage="asr"} 1' in text
    assert 'duplex_cpu_busy_seconds_total{class="turn_end",stage="asr"} 0.3' in text
    assert 'duplex_cpu_wait_seconds_count{class="speech_due",stage="tts"} 1' in text
    assert 'duplex_cpu_lateness_seconds_bucket{class="turn_end",le="0.35"} 1' in text
    assert 'duplex_cpu_lateness_seconds_bucket{class="turn_end",le="0.2"} 0' in text
    assert 'duplex_cpu_lateness_seconds_bucket{class="speech_due",le="0.001"} 1' in text
    assert 'duplex_cpu_waiting{class="background"} 0' in text
