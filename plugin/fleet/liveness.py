"""A worker that stopped answering is taken out of the routing (durable store only).

A worker stopped (SIGSTOP), stuck or cut off still accepts TCP connections:
the kernel completes the handshake, so nginx never sees a refusal and its
requests hang. The supervisor asks every worker that is up for its
``/health`` (one request in flight per worker, every quarter of the lease,
0.1-1 s: ``poll_interval``); a worker
that has not answered for longer than the store's lease
(``durability.lease_ttl_s``: by then its sessions' leases have lapsed, and
another worker may take them over) is ``unresponsive``: the router config is
written again with it ``down`` (``server … down;``: nginx sends its ids
straight to their ``backup`` servers, new sessions to the others) and nginx
reloaded (``/health``: ``state: unresponsive`` from then until it is routed
again, ``routed: false`` once nginx no longer sends it anything). When it
answers again it is put back: its sessions moved while it slept and it
was fenced from them (``moved``), new sessions reach it again.

Only with a durable store: without one, nobody could take its sessions over,
and they are better waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from vllm_duplex.fleet.view import http_get

if TYPE_CHECKING:
    from vllm_duplex.fleet.supervisor import Worker, WorkerFleet

log = logging.getLogger(__name__)


def poll_interval(lease_ttl_s: float) -> float:
    """How often each worker is asked (a quarter of the lease, 0.1-1 s)."""
    return min(1.0, max(0.1, lease_ttl_s / 4))


async def _probe(w: Worker, timeout_s: float) -> None:
    proc = w.proc
    got = await http_get(w.address, "/health", timeout_s=timeout_s)
    if got is None or w.proc is not proc or w.state != "up":
        return
    w.answered = time.monotonic()
    if w.unresponsive:
        w.unresponsive = False
        log.warning("worker %s answers again: back in the routing", w.instance_id)


async def watch_answers(fleet: WorkerFleet) -> None:
    """Until the fleet stops: mark workers silent past the lease
    unresponsive (and back), reloading nginx with each change."""
    lease = fleet.config.durability.lease_ttl_s
    every = poll_interval(lease)
    probes: dict[str, asyncio.Task[None]] = {}
    applied: frozenset[str] = frozenset()
    try:
        while not fleet._stopping.is_set():
            now = time.monotonic()
            for w in fleet.workers:
                if w.state != "up":
                    continue
                probe = probes.get(w.instance_id)
                if probe is None or probe.done():
                    probes[w.instance_id] = asyncio.create_task(_probe(w, lease))
                if not w.unresponsive and now - w.answered > lease:
                    w.unresponsive = True
                    log.error("worker %s has not answered for %.1f s (lease %.1f s): out of "
                              "the routing; its sessions go to the others", w.instance_id,
                              now - w.answered, lease)
            down = frozenset(w.instance_id for w in fleet.workers if w.unresponsive)
            if down != applied and fleet.nginx is not None:
                try:
                    await fleet.nginx.reload(fleet.router_plan(fleet._fleet_address))
                    applied = down
                    for w in fleet.workers:
                        w.routed = w.instance_id not in down
                except Exception:  # tried again at the next poll
                    log.exception("nginx reload with workers %s down failed", sorted(down))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fleet._stopping.wait(), every)
    finally:
        for probe in probes.values():
            probe.cancel()
        await asyncio.gather(*probes.values(), return_exceptions=True)
