"""The pieces a benchmark needs around a ``vllm-duplex serve`` subprocess: the
machine it ran on, the server itself (a fresh one on a free port, always
stopped), its ``/metrics`` scraped, and CPU time measured over a window.
Shared by control_plane.py, voice_workers.py and the benches with sides."""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from . import machine as bench_machine  # bench/lib/machine.py

REPO = Path(__file__).resolve().parents[2]


# ---- machine and server process ---------------------------------------------------------


def machine() -> dict[str, Any]:
    """``machine.info()`` (bench/lib/machine.py: CPU model, cores, ISA, memory, load) with the
    Python and kernel versions."""
    return {**bench_machine.info(), "python": platform.python_version(), "kernel": platform.release()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback only)
        return r.read().decode()


def stop(proc: subprocess.Popen[bytes] | None, grace_s: float = 10.0) -> None:
    """End a server started in its own session: SIGTERM, then after
    ``grace_s`` SIGKILL to its whole process group (a server killed outright
    cannot stop its vLLM engine processes itself)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(5)


class ServerProcess:
    """A fresh ``vllm-duplex serve`` on a free port, with ``limits.max_sessions`` raised to
    fit ``sessions`` (and no voice ceiling). Always terminated on exit (exceptions and Ctrl-C included)."""

    def __init__(self, config: str, sessions: int, workers: int = 1,
                 start_timeout_s: float = 60.0) -> None:
        self.config = config
        self.start_timeout_s = start_timeout_s
        self.sessions = sessions
        self.workers = workers
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.ps: psutil.Process | None = None
        self._tmp: list[str] = []

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _write_config(self) -> str:
        raw = yaml.safe_load(Path(self.config).read_text()) or {}
        limits = dict(raw.get("limits") or {})
        limits["max_sessions"] = max(int(limits.get("max_sessions", 0)), self.sessions + 8)
        limits["max_voice_sessions"] = None  # the bench holds its N; admission is capacity.py's
        if limits.get("max_sessions_per_key") is not None:
            limits["max_sessions_per_key"] = max(int(limits["max_sessions_per_key"]),
                                                 self.sessions + 8)
        raw["limits"] = limits
        fd, path = tempfile.mkstemp(prefix="bench-control-plane-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(raw, f, sort_keys=False)
        self._tmp.append(path)
        return path

    def __enter__(self) -> ServerProcess:
        cfg = self._write_config()
        log = tempfile.NamedTemporaryFile(prefix="bench-control-plane-", suffix=".log",
                                          delete=False)
        self._tmp.append(log.name)
        self.log_path = log.name
        cmd = [sys.executable, "-m", "vllm_duplex.cli", "serve", "--config", cfg,
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)]
        # Own process group: a terminal Ctrl-C reaches only the bench, which stops the server.
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        try:
            self._wait_healthy(self.start_timeout_s)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.ps = psutil.Process(self.proc.pid)
        return self

    def tree(self) -> list[psutil.Process]:
        """The server and everything it started (workers, nginx): what its CPU
        and memory are summed over."""
        assert self.ps is not None
        try:
            return [self.ps, *self.ps.children(recursive=True)]
        except psutil.NoSuchProcess:
            return [self.ps]

    def rss(self) -> int:
        total = 0
        for proc in self.tree():
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def _wait_healthy(self, timeout: float = 60.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if json.loads(http_get(self.http_url + "/health", 1.0)).get("status") == "ok":
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return Path(self.log_path).read_text()[-n:]
        except OSError:
            return ""

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)
        for path in self._tmp:
            try:
                os.unlink(path)
            except OSError:
                pass


# ---- metrics -----------------------------------------------------------------------------


def scrape(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def quantiles(samples: list[float]) -> tuple[float, float]:
    if not samples:
        return math.nan, math.nan
    a = np.asarray(samples)
    return float(np.quantile(a, 0.5)), float(np.quantile(a, 0.99))


class CpuWindow:
    """CPU seconds of processes (threads and reaped children included) over a window."""

    def __init__(self, *procs: psutil.Process) -> None:
        self.procs = procs
        self.t0 = time.monotonic()
        self.c0 = self._cpu()

    def _cpu(self) -> float:
        total = 0.0
        for proc in self.procs:
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system + t.children_user + t.children_system
        return total

    def cores(self) -> tuple[float, float]:
        """(cores busy on average, wall seconds) since construction."""
        wall = time.monotonic() - self.t0
        return (self._cpu() - self.c0) / wall, wall


def worst_quantile(metrics: dict[str, float], name: str, q: str) -> float:
    """A summary quantile; behind the router, the worst worker's (each worker
    keeps its own summary: the maximum is an upper bound of the fleet's)."""
    values = [v for k, v in metrics.items()
              if k.startswith(name + "{") and f'quantile="{q}"' in k]
    return max(values, default=math.nan)


def total(metrics: dict[str, float], name: str) -> float:
    values = [v for k, v in metrics.items() if k == name or k.startswith(name + "{")]
    return sum(values) if values else math.nan


def machine_busy(t0: Any, t1: Any) -> float:
    """Busy CPUs (not idle/iowait) between two ``psutil.cpu_times()`` samples."""
    idle = (t1.idle - t0.idle) + (getattr(t1, "iowait", 0) - getattr(t0, "iowait", 0))
    total = sum(t1) - sum(t0)
    return (total - idle) / total * psutil.cpu_count() if total > 0 else math.nan
