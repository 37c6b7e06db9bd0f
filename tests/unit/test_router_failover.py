"""The router's failover rules as nginx config (no nginx needed), and the
supervisor's liveness watch on loopback sockets.

* the edge in adopt mode (``vllm-duplex edge --adopt``): each machine's
  upstream has the other machines' routers as ``backup`` servers;
* a machine sharing its store (``durability.url``): an id naming a
  well-formed owner that is none of its workers goes to the pool;
* a worker out of routing (``down``): ``server … down;`` in its upstream and
  in the pool, its backups kept;
* ``watch_answers``: a worker whose ``/health`` is silent past the lease is
  ``unresponsive`` and nginx is reloaded without it; back when it answers.
"""

from __future__ import annotations

import asyncio
import time
import types

import pytest
from vllm_duplex.fleet.liveness import poll_interval, watch_answers
from vllm_duplex.fleet.router import POOL, RouterPlan, nginx_conf
from vllm_duplex.fleet.supervisor import Worker

WORKERS = {"w1": "127.0.0.1:8101", "w2": "127.0.0.1:8102"}


def _upstream(conf: str, name: str) -> str:
    return next(line.strip() for line in conf.splitlines()
                if line.strip().startswith(f"upstream {name} {{"))


def test_the_edge_in_adopt_mode_has_the_other_machines_as_backups(tmp_path):
    machines = {"m1": "10.0.0.1:8000", "m2": "10.0.0.2:8000", "m3": "10.0.0.3:8000"}
    plain = nginx_conf(RouterPlan.for_edge("0.0.0.0:9000", machines, max_request_bytes=1),
                       tmp_path)
    assert "backup" not in plain and "proxy_next_upstream error;" not in plain
    conf = nginx_conf(RouterPlan.for_edge("0.0.0.0:9000", machines, max_request_bytes=1,
                                          adopt=True), tmp_path)
    assert _upstream(conf, "duplex_m2") == (
        "upstream duplex_m2 { server 10.0.0.2:8000 max_fails=0; "
        "server 10.0.0.1:8000 backup max_fails=0; server 10.0.0.3:8000 backup max_fails=0; "
        "keepalive 16; }")
    # sessions and streams named by id: retried only on a connection error
    assert conf.count("proxy_next_upstream error;") == 3
    # an unknown machine is still refused at the edge
    assert '        default "";\n        ~^m1w[0-9]+$ duplex_m1;' in conf


def test_a_machine_sharing_its_store_sends_foreign_owners_to_its_pool(tmp_path):
    alone = nginx_conf(RouterPlan.for_workers("127.0.0.1:8000", WORKERS, max_request_bytes=1,
                                              fleet=None, adopt=True), tmp_path)
    assert f"default {POOL};\n        w1 duplex_w1;" not in alone
    assert '        default "";\n        w1 duplex_w1;' in alone
    shared = nginx_conf(RouterPlan.for_workers("127.0.0.1:8000", WORKERS, max_request_bytes=1,
                                               fleet=None, adopt=True, foreign_to_pool=True),
                        tmp_path)
    # no owner (a malformed id, no header) is still refused; any other owner: the pool
    assert f'        "" "";\n        default {POOL};\n        w1 duplex_w1;' in shared


def test_a_worker_down_is_out_of_its_upstream_and_the_pool_its_backups_kept(tmp_path):
    conf = nginx_conf(RouterPlan.for_workers("127.0.0.1:8000", WORKERS, max_request_bytes=1,
                                             fleet=None, adopt=True, down=frozenset({"w1"})),
                      tmp_path)
    assert _upstream(conf, "duplex_w1") == (
        "upstream duplex_w1 { server 127.0.0.1:8101 max_fails=0 down; "
        "server 127.0.0.1:8102 backup max_fails=0; keepalive 16; }")
    assert _upstream(conf, "duplex_w2") == (
        "upstream duplex_w2 { server 127.0.0.1:8102 max_fails=0; "
        "server 127.0.0.1:8101 backup max_fails=0; keepalive 16; }")
    assert ("        server 127.0.0.1:8101 max_fails=0 down;\n"
            "        server 127.0.0.1:8102 max_fails=0;") in conf
    with pytest.raises(ValueError):
        RouterPlan.for_workers("127.0.0.1:8000", WORKERS, max_request_bytes=1, fleet=None,
                               down=frozenset({"w9"}))


def test_the_poll_is_a_quarter_of_the_lease_within_bounds():
    assert poll_interval(5.0) == 1.0 and poll_interval(1.5) == 0.375
    assert poll_interval(0.1) == 0.1


class _FakeNginx:
    def __init__(self) -> None:
        self.plans: list[RouterPlan] = []

    async def reload(self, plan: RouterPlan) -> None:
        self.plans.append(plan)


class _Health:
    """A worker's /health on loopback that can stop answering (it still
    accepts connections, as a SIGSTOPped process's kernel does)."""

    def __init__(self) -> None:
        self.answering = True
        self.server: asyncio.Server | None = None
        self.hung: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if not self.answering:
            self.hung.append(writer)
            return
        writer.write(b'HTTP/1.0 200 OK\r\n\r\n{"status": "ok"}')
        await writer.drain()
        writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        for w in self.hung:
            w.close()
        self.server.close()
        await self.server.wait_closed()


async def _until(predicate, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_a_worker_silent_past_the_lease_is_taken_out_and_put_back_when_it_answers():
    healths = [_Health(), _Health()]
    addresses = [await h.start() for h in healths]
    workers = []
    for i, address in enumerate(addresses, 1):
        w = Worker(f"w{i}", int(address.rpartition(":")[2]), state="up")
        w.answered = time.monotonic()
        workers.append(w)
    nginx = _FakeNginx()
    fleet = types.SimpleNamespace(
        config=types.SimpleNamespace(durability=types.SimpleNamespace(lease_ttl_s=1.0)),
        workers=workers, nginx=nginx, _fleet_address=None, _stopping=asyncio.Event(),
        router_plan=lambda fleet_address: RouterPlan.for_workers(
            "127.0.0.1:8000", {w.instance_id: w.address for w in workers},
            max_request_bytes=1, fleet=fleet_address, adopt=True,
            down=frozenset(w.instance_id for w in workers if w.unresponsive)))
    task = asyncio.create_task(watch_answers(fleet))
    try:
        healths[0].answering = False
        # (w2 answers all along: only a loop starved past the lease could take it out)
        await _until(lambda: nginx.plans and "w1" in nginx.plans[-1].down)
        assert workers[0].status().state == "unresponsive"
        assert workers[0].status().routed is False
        healths[0].answering = True
        await _until(lambda: nginx.plans[-1].down == frozenset())
        assert workers[0].status().state == "up" and workers[0].status().routed
    finally:
        fleet._stopping.set()
        await task
        for h in healths:
            await h.stop()
