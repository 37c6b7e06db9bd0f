"""Process metrics in Prometheus text format (no client library needed).

Latencies are kept as bounded reservoirs of recent samples and exposed as
summaries with p50/p99 quantiles, which is what the benchmarks read.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import numpy as np


class Counter:
    def __init__(self, name: str, help: str) -> None:
        self.name, self.help = name, help
        self.values: dict[tuple[tuple[str, str], ...], float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def get(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)


class Summary:
    """Recent samples (seconds); quantiles computed at scrape time."""

    def __init__(self, name: str, help: str, window: int = 100_000) -> None:
        self.name, self.help = name, help
        self.samples: deque[float] = deque(maxlen=window)
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.samples.append(seconds)
        self.count += 1
        self.total += seconds

    def quantile(self, q: float) -> float:
        if not self.samples:
            return float("nan")
        return float(np.quantile(np.fromiter(self.samples, float), q))

    def reset(self) -> None:
        self.samples.clear()
        self.count, self.total = 0, 0.0


def _labels(key: tuple[tuple[str, str], ...]) -> str:
    if not key:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in key) + "}"


class Metrics:
    """One registry per server process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, Counter] = {}
        self.summaries: dict[str, Summary] = {}
        # name -> (help, {labels: reader}); read at scrape time
        self.gauges: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], Callable[[], float]]]] = {}

        c, s = self.counter, self.summary
        self.sessions_opened = c("duplex_sessions_opened_total", "Realtime sessions opened")
        self.sessions_closed = c("duplex_sessions_closed_total", "Realtime sessions closed, by reason")
        self.errors = c("duplex_errors_total", "Error events sent, by code")
        self.slow_consumers = c("duplex_slow_consumers_total",
                                "Sockets cut off for not reading their events")
        self.resumes = c("duplex_resumes_total", "Realtime sessions resumed, by outcome")
        self.stale_dropped = c("duplex_stale_outputs_dropped_total", "Stage outputs dropped by the fence gate")
        self.interrupts = c("duplex_interrupts_total", "Responses interrupted, by reason")
        self.barge_ins = c("duplex_barge_ins_total",
                           "Speech over a reply in adaptive mode, by outcome (interrupted, dismissed)")
        self.epoch_bumps = c("duplex_epoch_bumps_total", "Epoch increments")
        self.incarnation_bumps = c("duplex_incarnation_bumps_total", "Incarnation increments")
        self.control_overtakes = c("duplex_control_overtakes_total",
                                   "Control/stage messages handled ahead of older queued audio")
        self.ingest_latency = s("duplex_ingest_latency_seconds", "Frame received -> stage submit")
        self.cancel_latency = s("duplex_cancel_latency_seconds",
                                "Cancel or barge-in received -> response.done(cancelled) sent")

    def counter(self, name: str, help: str) -> Counter:
        with self._lock:
            return self.counters.setdefault(name, Counter(name, help))

    def summary(self, name: str, help: str) -> Summary:
        with self._lock:
            return self.summaries.setdefault(name, Summary(name, help))

    def gauge(self, name: str, help: str, read: Callable[[], float], **labels: str) -> None:
        with self._lock:
            self.gauges.setdefault(name, (help, {}))[1][tuple(sorted(labels.items()))] = read

    def render(self) -> str:
        lines: list[str] = []
        for counter in self.counters.values():
            lines += [f"# HELP {counter.name} {counter.help}", f"# TYPE {counter.name} counter"]
            for key, value in sorted(counter.values.items()) or [((), 0.0)]:
                lines.append(f"{counter.name}{_labels(key)} {value:g}")
        for name, (help, readers) in self.gauges.items():
            lines += [f"# HELP {name} {help}", f"# TYPE {name} gauge"]
            lines += [f"{name}{_labels(key)} {read():g}" for key, read in sorted(readers.items())]
        for summ in self.summaries.values():
            lines += [f"# HELP {summ.name} {summ.help}", f"# TYPE {summ.name} summary"]
            for q in (0.5, 0.99):
                lines.append(f'{summ.name}{{quantile="{q}"}} {summ.quantile(q):.9g}')
            lines += [f"{summ.name}_sum {summ.total:.9g}", f"{summ.name}_count {summ.count}"]
        return "\n".join(lines) + "\n"
