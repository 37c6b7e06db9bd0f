"""The fleet view the router serves at ``/health`` and ``/metrics``.

nginx routes requests; it cannot add up what N workers report. The
supervisor serves these two routes (nginx proxies them here) from what it
knows of its workers (state, pid, restarts) and what each worker answers at
its own ``/health`` and ``/metrics``, fetched when asked:

* ``/health``: ``{"status": "ok" | "degraded" | "unhealthy", "sessions": <sum>,
  "workers": {"w1": {...}}, "engine_core": {...} | null}`` — 200 while at least
  one worker serves (an edge keeps sending new sessions to this machine),
  503 when none does. A worker the supervisor found ``unresponsive`` is not
  asked (it would not answer) and does not serve.
* ``/metrics``: every worker's series in one exposition, each labelled
  ``worker="w1"`` (HELP/TYPE once per family), plus the supervisor's own
  ``duplex_worker_up`` and ``duplex_worker_restarts_total``. Nothing is
  pre-summed, so ``sum by (…)`` in a query never counts twice;
  ``/metrics?worker=w1`` is one worker's series alone.

``merge_metrics`` and ``fleet_health`` are pure; ``FleetView`` is the thin
shell that fetches (raw HTTP/1.0 on loopback: no client library needed).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

_SAMPLE = re.compile(r"(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)$")


@dataclass(frozen=True)
class WorkerStatus:
    """What the supervisor knows of one worker (``state``: starting, up,
    unresponsive (up, but its ``/health`` silent past the lease: out of the
    routing, ``liveness.py``), restarting, failed, stopped)."""

    instance_id: str
    address: str
    state: str
    pid: int | None
    restarts: int
    life: int
    routed: bool = True  # in the router's config (not ``down``)


def label_worker(text: str, worker: str) -> list[tuple[str, str, list[str]]]:
    """One worker's exposition as ``[(family, header lines, samples)]``,
    every sample given ``worker="<worker>"`` as its first label."""
    families: list[tuple[str, str, list[str]]] = []
    header: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            if len(parts) >= 3 and parts[1] == "HELP":
                header = [line]
            elif len(parts) >= 3 and parts[1] == "TYPE":
                families.append((parts[2], "\n".join([*header, line]), []))
                header = []
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = f'worker="{worker}"' + (f",{m['labels']}" if m["labels"] else "")
        sample = f"{m['name']}{{{labels}}} {m['value']}"
        if families:
            families[-1][2].append(sample)
        else:  # a sample before any TYPE line: a family of its own
            families.append((m["name"], "", [sample]))
    return families


def merge_metrics(by_worker: Mapping[str, str]) -> str:
    """Every worker's exposition merged into one, labelled by worker."""
    order: list[str] = []
    headers: dict[str, str] = {}
    samples: dict[str, list[str]] = {}
    for worker, text in by_worker.items():
        for family, header, lines in label_worker(text, worker):
            if family not in headers:
                order.append(family)
                headers[family] = header
                samples[family] = []
            samples[family].extend(lines)
    out: list[str] = []
    for family in order:
        if headers[family]:
            out.append(headers[family])
        out.extend(samples[family])
    return "\n".join(out) + "\n" if out else ""


def fleet_metrics(workers: list[WorkerStatus]) -> str:
    lines = ["# HELP duplex_worker_up Worker processes serving (1) or not (0)",
             "# TYPE duplex_worker_up gauge"]
    lines += [f'duplex_worker_up{{worker="{w.instance_id}"}} {int(w.state == "up")}'
              for w in workers]
    lines += ["# HELP duplex_worker_restarts_total Worker processes restarted after they died",
              "# TYPE duplex_worker_restarts_total counter"]
    lines += [f'duplex_worker_restarts_total{{worker="{w.instance_id}"}} {w.restarts}'
              for w in workers]
    return "\n".join(lines) + "\n"


def fleet_health(workers: list[WorkerStatus], answers: Mapping[str, dict[str, Any] | None],
                 engine_core: dict[str, Any] | None) -> tuple[dict[str, Any], int]:
    """The aggregate body and its HTTP status. A worker serves when the
    supervisor has it up and its own ``/health`` says ok."""
    out: dict[str, Any] = {}
    serving = 0
    sessions = 0
    for w in workers:
        answer = answers.get(w.instance_id)
        ok = w.state == "up" and answer is not None and answer.get("status") == "ok"
        serving += ok
        sessions += int((answer or {}).get("sessions", 0))
        out[w.instance_id] = {"state": w.state, "serving": ok, "pid": w.pid,
                              "restarts": w.restarts, "life": w.life, "address": w.address,
                              "routed": w.routed, "health": answer}
    core_ok = engine_core is None or engine_core.get("alive", False)
    status = ("ok" if serving == len(workers) and core_ok
              else "degraded" if serving and core_ok else "unhealthy")
    # Sessions survive their worker only while every worker can reach the store.
    stores = [(a or {}).get("durability") or {} for a in answers.values() if a]
    durability = ("degraded" if any(d.get("state") == "degraded" for d in stores)
                  else "ok" if any(d.get("durable") for d in stores) else "off")
    body = {"status": status, "sessions": sessions, "workers": out, "engine_core": engine_core,
            "durability": durability}
    return body, 200 if status != "unhealthy" else 503


async def http_get(address: str, path: str, timeout_s: float = 2.0) -> tuple[int, bytes] | None:
    """GET ``http://<address><path>`` (HTTP/1.0, loopback); None if nobody answers."""
    host, _, port = address.rpartition(":")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)),
                                                timeout_s)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout_s)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
    head, _, body = raw.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None
    return status, body


async def _none() -> None:
    return None


class FleetView:
    """The fleet endpoint's ASGI app over ``workers()`` (a snapshot each call)."""

    def __init__(self, workers: Callable[[], list[WorkerStatus]],
                 engine_core: Callable[[], dict[str, Any] | None]) -> None:
        self.workers = workers
        self.engine_core = engine_core

    async def _fetch(self, path: str) -> dict[str, tuple[int, bytes] | None]:
        ws = self.workers()
        got = await asyncio.gather(*(_none() if w.state == "unresponsive"  # it would hang
                                     else http_get(w.address, path) for w in ws))
        return {w.instance_id: g for w, g in zip(ws, got)}

    async def health(self, request: Request) -> JSONResponse:
        answers: dict[str, dict[str, Any] | None] = {}
        for worker, got in (await self._fetch("/health")).items():
            try:
                answers[worker] = json.loads(got[1]) if got else None
            except ValueError:
                answers[worker] = None
        body, status = fleet_health(self.workers(), answers, self.engine_core())
        return JSONResponse(body, status_code=status)

    async def metrics(self, request: Request) -> PlainTextResponse:
        texts = {w: got[1].decode(errors="replace")
                 for w, got in (await self._fetch("/metrics")).items() if got and got[0] == 200}
        only = request.query_params.get("worker")
        if only is not None:
            texts = {w: t for w, t in texts.items() if w == only}
        text = merge_metrics(texts) + (fleet_metrics(self.workers()) if only is None else "")
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/health", self.health), Route("/metrics", self.metrics)])
