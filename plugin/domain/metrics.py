"""Process metrics in Prometheus text format (no client library needed).

Latencies are kept as bounded reservoirs of recent samples and exposed as
summaries with p50/p99 quantiles, which is what the benchmarks read. The
per-stage latencies of a turn are histograms (fixed buckets, one series per
stage): they add up across workers and over time, which dashboards need.
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


# The stages of duplex_turn_latency_seconds (session/latency.py measures them).
STAGE_LATENCIES = ("vad_onset", "end_of_turn", "asr_final", "llm_ttft", "tts_first_audio", "turn_gap")
# Seconds: from a VAD's few ms to a slow CPU turn's seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
# Seconds the event loop woke late (host/loop_lag.py): from a healthy loop's
# fraction of a millisecond to a frozen server's tens of seconds.
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0)


class Histogram:
    """Cumulative buckets by label set (Prometheus ``histogram``)."""

    def __init__(self, name: str, help: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.name, self.help, self.buckets = name, help, buckets
        # labels -> (count per bucket, +Inf included; sum)
        self.series: dict[tuple[tuple[str, str], ...], tuple[list[int], list[float]]] = {}

    def _series(self, labels: dict[str, str]) -> tuple[list[int], list[float]]:
        return self.series.setdefault(tuple(sorted(labels.items())),
                                      ([0] * (len(self.buckets) + 1), [0.0]))

    def declare(self, **labels: str) -> None:
        """A series listed (all zero) before its first sample."""
        self._series(labels)

    def observe(self, seconds: float, **labels: str) -> None:
        counts, total = self._series(labels)
        for i, bound in enumerate(self.buckets):
            if seconds <= bound:
                counts[i] += 1
        counts[-1] += 1
        total[0] += seconds

    def count(self, **labels: str) -> int:
        got = self.series.get(tuple(sorted(labels.items())))
        return got[0][-1] if got else 0

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for key, (counts, total) in sorted(self.series.items()):
            base = ",".join(f'{k}="{v}"' for k, v in key)
            sep = "," if base else ""
            for bound, n in zip((*map(str, self.buckets), "+Inf"), counts):
                out.append(f'{self.name}_bucket{{{base}{sep}le="{bound}"}} {n}')
            out += [f"{self.name}_sum{_labels(key)} {total[0]:.9g}",
                    f"{self.name}_count{_labels(key)} {counts[-1]}"]
        return out


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
        self._collectors: list[Callable[[], list[str]]] = []  # whole families, read at scrape time

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
        self.histograms: dict[str, Histogram] = {}
        # The stages of a turn on the server's clock (session/latency.py says
        # what each measures); label stage=vad_onset|end_of_turn|asr_final|
        # llm_ttft|tts_first_audio|turn_gap.
        self.stage_latency = self.histogram(
            "duplex_turn_latency_seconds", "Per-stage latency of a turn, by stage")
        for stage in STAGE_LATENCIES:
            self.stage_latency.declare(stage=stage)
        # The event loop's health (host/loop_lag.py): how late its ticks wake,
        # and the stalls its watchdog reported, by cause.
        self.loop_lag = self.histogram(
            "duplex_event_loop_lag_seconds",
            "How late the server's event loop woke for a 50 ms timer (everything else it ran meanwhile)",
            LOOP_LAG_BUCKETS)
        self.loop_lag.declare()
        self.loop_stalls = c("duplex_event_loop_stalls_total",
                             "Event-loop stalls past the warning threshold, by cause (blocked: "
                             "code on the loop; gil: another thread held the GIL; starved: no CPU)")
        # What each turn's gap waited on (session/critical_path.py), segment by
        # segment along its critical path.
        self.critical_path = self.histogram(
            "duplex_turn_critical_path_seconds",
            "Segments of each turn's critical path (what the turn gap waited on), by segment")
        # semantic_vad (session/turn_end.py): each decision and its inputs.
        self.turn_end_decisions = c("duplex_turn_end_decisions_total",
                                    "Turns ended by semantic_vad, by eagerness and reason "
                                    "(semantic: the words; silence: the cap)")
        self.turn_end_resumed = c("duplex_turn_end_pauses_resumed_total",
                                  "Pauses under semantic_vad that the user spoke on after "
                                  "(did not take the turn)")
        self.turn_end_probability = s("duplex_turn_end_probability",
                                      "P(end of turn) from the LLM when a turn ended (not seconds)")
        self.turn_end_silence = s("duplex_turn_end_silence_seconds",
                                  "Silence heard when semantic_vad ended a turn")
        self.speculations = c("duplex_speculations_total",
                              "Replies started at a pause, and whether they were used (released "
                              "when the final transcript confirmed their words) or discarded")
        self.backchannels = c("duplex_backchannels_total",
                              "The engine's own backchannels (session/backchannel.py): said, "
                              "or a pause they could fill not filled, by outcome (why)")
        self.visible_revisions = c("duplex_visible_revisions_total",
                                   "Replies the client saw start that were then cancelled because "
                                   "the words they answered changed (the final transcript revised them)")

    def counter(self, name: str, help: str) -> Counter:
        with self._lock:
            return self.counters.setdefault(name, Counter(name, help))

    def summary(self, name: str, help: str) -> Summary:
        with self._lock:
            return self.summaries.setdefault(name, Summary(name, help))

    def histogram(self, name: str, help: str,
                  buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Histogram:
        with self._lock:
            return self.histograms.setdefault(name, Histogram(name, help, buckets))

    def add_histogram(self, hist: Histogram) -> None:
        """Show a histogram kept by someone else (e.g. the process's CPU scheduler)."""
        with self._lock:
            self.histograms.setdefault(hist.name, hist)

    def collector(self, lines: Callable[[], list[str]]) -> None:
        """Metric families rendered by ``lines()`` at scrape time."""
        with self._lock:
            self._collectors.append(lines)

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
        for hist in list(self.histograms.values()):
            lines += hist.lines()
        for collect in self._collectors:
            lines += collect()
        for summ in self.summaries.values():
            lines += [f"# HELP {summ.name} {summ.help}", f"# TYPE {summ.name} summary"]
            for q in (0.5, 0.99):
                lines.append(f'{summ.name}{{quantile="{q}"}} {summ.quantile(q):.9g}')
            lines += [f"{summ.name}_sum {summ.total:.9g}", f"{summ.name}_count {summ.count}"]
        return "\n".join(lines) + "\n"
