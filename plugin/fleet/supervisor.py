"""``serve --workers N``: N worker processes behind nginx, one vLLM engine core.

The supervisor (this module, one process) owns everything that outlives a
worker::

    supervisor ── SharedEngineCore (when the config has a `vllm` stage)
       │       ── nginx (router.py): least_conn for new sessions, owner map for ids
       │       ── fleet endpoint (view.py): /health and /metrics of all workers
       └── worker w1 … wN: `vllm-duplex serve --instance-id wI --port P [--engine-slot …]`
                           each its own Runtime, sessions and CPU stages

Each worker is a subprocess of the ``vllm-duplex`` CLI on a loopback port,
with a client slot of the shared core passed as inherited descriptors. A
worker that exits is restarted with the same owner id (so ids that name it
still route to it) on a fresh slot (``engine_core``: slots are single-use),
after a backoff that doubles while restarts keep failing quickly; the
others are untouched. When the slots are spent the worker stays down
(``failed`` in ``/health``). If the engine core itself dies, every worker's
client is dead with it: the supervisor stops the workers, starts a new core
and starts them again.

With ``durability: store: redis`` and no ``url``, the supervisor also runs a
private ``redis-server`` (``redis_server.py``; restarted when it exits) and
hands its URL to the workers; when a worker dies it marks that process dead
in the store, so another worker may adopt its sessions at once instead of
after the lease (``vllm_duplex.durable``), and the router sends a resume whose
owner is down to another worker (``router.py``). A worker that is up but does
not answer its ``/health`` for longer than the lease (SIGSTOP, stuck: it
still accepts connections) is taken out of the routing, nginx reloaded with
it ``down``, and put back when it answers (``liveness.py``; ``/health``:
``unresponsive``). With an external store (``durability.url``, possibly
shared by several machines) the router also sends an id naming an owner it
does not have to a worker, which takes it over or says where it lives.

The supervisor is not in the request path: nginx sends requests straight to
the workers. SIGINT/SIGTERM stop nginx first (no new connections), then the
workers (each closes its sessions and aborts their engine requests), then
the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vllm_duplex.host.deploy import DeployConfig
from vllm_duplex.fleet.engine_core import SharedEngineCore, WorkerSlot
from vllm_duplex.fleet.liveness import watch_answers
from vllm_duplex.fleet.view import FleetView, WorkerStatus, http_get
from vllm_duplex.fleet.redis_server import RedisServer
from vllm_duplex.fleet.nginx import Nginx
from vllm_duplex.fleet.router import RouterPlan
from vllm_duplex.host.store_config import STORE_URL_ENV
from vllm_duplex.host.topology import Workers

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0  # a worker joining a vLLM core imports vLLM and torch (tens of seconds)
STABLE_S = 30.0  # a worker up this long resets the restart backoff
STOP_TIMEOUT_S = 15.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Worker:
    instance_id: str
    port: int
    proc: asyncio.subprocess.Process | None = None
    state: str = "starting"
    life: int = 0
    restarts: int = 0
    slot: WorkerSlot | None = None
    up_since: float | None = None
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)
    answered: float = 0.0  # when its /health last answered (monotonic)
    unresponsive: bool = False  # up, but silent past the lease: to be out of routing
    routed: bool = True  # nginx sends it requests (the last reload applied had it in)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def status(self) -> WorkerStatus:
        pid = self.proc.pid if self.proc is not None and self.proc.returncode is None else None
        # unresponsive from the moment it is found silent until nginx routes to it again
        silent = self.state == "up" and (self.unresponsive or not self.routed)
        return WorkerStatus(self.instance_id, self.address, "unresponsive" if silent
                            else self.state, pid, self.restarts, self.life, self.routed)


class WorkerFleet:
    def __init__(self, config: DeployConfig, config_path: Path, workers: Workers, *,
                 host: str, port: int, log_level: str = "warning") -> None:
        self.config = config
        self.config_path = config_path
        self.topology = workers
        self.host, self.port = host, port
        self.log_level = log_level
        ports = workers.ports or tuple(free_port() for _ in range(workers.count))
        self.workers = [Worker(i, p) for i, p in zip(workers.instance_ids(), ports)]
        self.engine_spec = next((s for s in config.stages if s.type == "vllm"), None)
        self.core: SharedEngineCore | None = None
        self.nginx: Nginx | None = None
        self.redis: RedisServer | None = None
        self.store_url = config.durability.url if config.durability.durable else None
        self._fleet_server = None
        self._fleet_address: str | None = None
        self._stopping = asyncio.Event()

    # ---- the parts -------------------------------------------------------

    async def _start_core(self) -> None:
        if self.engine_spec is None:
            return
        core = SharedEngineCore(self.engine_spec.options, workers=len(self.workers),
                                spare_slots=self.topology.spare_slots)
        started = time.monotonic()
        await asyncio.to_thread(core.start)
        self.core = core
        log.warning("engine core up in %.1f s (%d client slots)", time.monotonic() - started,
                    core.slots)

    def _engine_core_state(self) -> dict | None:
        if self.engine_spec is None:
            return None
        core = self.core
        return {"alive": core is not None and core.alive,
                "slots_left": core.slots_left if core is not None else 0}

    async def _start_fleet_endpoint(self) -> str:
        import uvicorn

        port = free_port()
        view = FleetView(lambda: [w.status() for w in self.workers], self._engine_core_state)
        server = uvicorn.Server(uvicorn.Config(view.app(), host="127.0.0.1", port=port,
                                               log_level=self.log_level, lifespan="off"))
        server.config.setup_event_loop = lambda: None
        task = asyncio.create_task(server.serve(), name="duplex-fleet-endpoint")
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the fleet endpoint stopped during start-up")
            await asyncio.sleep(0.01)
        self._fleet_server = (server, task)
        return f"127.0.0.1:{port}"

    def _argv(self, w: Worker) -> list[str]:
        argv = [sys.executable, "-m", "vllm_duplex.cli", "serve",
                "--config", str(self.config_path), "--host", "127.0.0.1",
                "--port", str(w.port), "--workers", "1", "--instance-id", w.instance_id,
                "--worker-life", str(w.life), "--log-level", self.log_level]
        if w.slot is not None:
            argv += ["--engine-slot", w.slot.to_json()]
        return argv

    async def _spawn(self, w: Worker) -> bool:
        """Start ``w``'s next life; False when no engine slot is left."""
        if self.engine_spec is not None:
            slot = self.core.take_slot() if self.core is not None else None
            if slot is None:
                w.state = "failed"
                log.error("worker %s: no engine-core client slot left (spare_engine_slots); "
                          "it stays down until the next restart of serve", w.instance_id)
                return False
            w.slot = slot
        w.life += 1
        w.state = "starting"
        # The machine's measured capacity (limits.max_voice_sessions: auto) is
        # shared by the workers on it (host/capacity.py).
        env = {**os.environ, "VLLM_DUPLEX_FLEET_WORKERS": str(len(self.workers))}
        if self.store_url is not None:
            env[STORE_URL_ENV] = self.store_url
        w.proc = await asyncio.create_subprocess_exec(
            *self._argv(w), pass_fds=w.slot.pass_fds if w.slot else (), env=env)
        if w.slot is not None and self.core is not None:
            self.core.release_slot(w.slot)  # the worker holds the listeners now
        return True

    async def _await_ready(self, w: Worker) -> bool:
        proc = w.proc
        assert proc is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while proc.returncode is None and time.monotonic() < deadline:
            if await http_get(w.address, "/health", timeout_s=1.0) is not None:
                w.state, w.up_since = "up", time.monotonic()
                w.answered, w.unresponsive = w.up_since, False
                return True
            await asyncio.sleep(0.1)
        return False

    async def _watch(self, w: Worker) -> None:
        """Keep ``w`` running: wait for it to exit, then restart it."""
        backoff = self.topology.restart_backoff_s
        while not self._stopping.is_set():
            if w.proc is None or w.proc.returncode is not None:
                if not await self._spawn(w):
                    return
            if not await self._await_ready(w) and w.proc.returncode is None:
                log.error("worker %s did not become ready in %.0f s; restarting it",
                          w.instance_id, READY_TIMEOUT_S)
                w.proc.kill()
            code = await w.proc.wait()
            if self._stopping.is_set():
                break
            await self._mark_dead(w)
            stable = w.up_since is not None and time.monotonic() - w.up_since >= STABLE_S
            backoff = self.topology.restart_backoff_s if stable else backoff
            w.state, w.up_since, w.unresponsive = "restarting", None, False
            log.error("worker %s (pid %s) exited with %s; restarting it in %.1f s",
                      w.instance_id, w.proc.pid, code, backoff)
            try:
                await asyncio.wait_for(self._stopping.wait(), backoff)
                break
            except TimeoutError:
                pass
            backoff = min(max(backoff, 0.5) * 2, 30.0)
            w.restarts += 1
        w.state = "stopped"

    async def _mark_dead(self, w: Worker) -> None:
        """Tell the store ``w``'s process is gone: its sessions may be adopted now."""
        if self.store_url is None or w.proc is None:
            return
        from vllm_duplex.durable.redis_store import RedisStore

        store = RedisStore(self.store_url)
        try:
            await store.mark_dead(f"{w.instance_id}#{w.proc.pid}")
        except Exception as err:  # the store may be down too: the lease runs out then
            log.warning("could not mark worker %s dead in the store: %s", w.instance_id, err)
        finally:
            await store.close()

    async def _start_redis(self) -> None:
        if not self.config.durability.durable or self.config.durability.url is not None:
            return
        self.redis = RedisServer()
        await self.redis.start()
        self.store_url = self.redis.url
        self._redis_watch = asyncio.create_task(self._watch_redis(), name="duplex-redis-watch")

    async def _watch_redis(self) -> None:
        """Restart the private redis-server on its port when it exits (it
        starts empty; the workers write their sessions into it again)."""
        while not self._stopping.is_set() and self.redis is not None:
            code = await self.redis.wait()
            if self._stopping.is_set():
                return
            log.error("redis-server exited with %s; restarting it", code)
            await asyncio.sleep(0.2)
            try:
                await self.redis.start()
            except Exception:
                log.exception("redis-server did not restart; retrying")
                await asyncio.sleep(1.0)

    async def _watch_core(self) -> None:
        """Replace a dead engine core, and with it every worker (their
        clients died with it)."""
        while not self._stopping.is_set():
            core = self.core
            if core is None:
                return
            sentinels = core.sentinels
            await asyncio.to_thread(_wait_any, sentinels, self._stopping)
            if self._stopping.is_set():
                return
            log.error("the shared engine core died; restarting it and every worker")
            await self._stop_workers()
            await asyncio.to_thread(core.shutdown)
            await self._start_core()
            for w in self.workers:
                w.proc, w.restarts = None, w.restarts + 1
                w.watcher = asyncio.create_task(self._watch(w), name=f"duplex-{w.instance_id}")

    async def _stop_workers(self) -> None:
        """Stop every worker, its watcher first (so nothing restarts it)."""
        for w in self.workers:
            if w.watcher is not None:
                w.watcher.cancel()
        await asyncio.gather(*(w.watcher for w in self.workers if w.watcher),
                             return_exceptions=True)
        procs = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for proc in procs:
            proc.terminate()  # uvicorn: close every session, abort engine requests, exit
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    # ---- the whole -------------------------------------------------------

    def router_plan(self, fleet: str | None) -> RouterPlan:
        durability = self.config.durability
        return RouterPlan.for_workers(f"{self.host}:{self.port}",
                                      {w.instance_id: w.address for w in self.workers},
                                      max_request_bytes=self.config.limits.max_request_bytes,
                                      fleet=fleet, adopt=durability.durable,
                                      # an external store may be shared by other machines
                                      foreign_to_pool=durability.durable and durability.url
                                      is not None,
                                      down=frozenset(w.instance_id for w in self.workers
                                                     if w.unresponsive))

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        core_watch = answers = None
        self._redis_watch: asyncio.Task[None] | None = None
        try:
            await self._start_redis()
            await self._start_core()
            fleet = self._fleet_address = await self._start_fleet_endpoint()
            self.nginx = Nginx(self.router_plan(fleet))
            await self.nginx.start()
            for w in self.workers:
                w.watcher = asyncio.create_task(self._watch(w), name=f"duplex-{w.instance_id}")
            if self.core is not None:
                core_watch = asyncio.create_task(self._watch_core(), name="duplex-core-watch")
            if self.config.durability.durable:
                answers = asyncio.create_task(watch_answers(self), name="duplex-answers-watch")
            await self._report_ready()
            return await self._keep_router()
        finally:
            self._stopping.set()
            if answers is not None:
                answers.cancel()
                await asyncio.gather(answers, return_exceptions=True)
            await self._shutdown(core_watch)

    async def _keep_router(self) -> int:
        """Until stopped: restart nginx when it exits (killed, crashed). The
        workers and their sessions live on meanwhile; sockets through it
        dropped, and their clients resume on the same workers once it is
        back. Five failed restarts in a row end ``serve`` (exit 1)."""
        assert self.nginx is not None
        failures = 0
        stop = asyncio.create_task(self._stopping.wait())
        try:
            while True:
                nginx_exit = asyncio.create_task(self.nginx.wait())
                await asyncio.wait([nginx_exit, stop], return_when=asyncio.FIRST_COMPLETED)
                if not nginx_exit.done():
                    nginx_exit.cancel()
                    return 0
                log.error("nginx exited (%s); restarting it: %s", nginx_exit.result(),
                          self.nginx.error_log()[-500:])
                self.nginx.reap()
                try:
                    await self.nginx.start()
                    failures = 0
                except Exception:
                    failures += 1
                    log.exception("nginx did not restart (%d in a row)", failures)
                    if failures >= 5:
                        return 1
                    await asyncio.sleep(0.5 * failures)
        finally:
            stop.cancel()

    async def _report_ready(self) -> None:
        while not self._stopping.is_set():
            if all(w.state in ("up", "failed") for w in self.workers):
                break
            await asyncio.sleep(0.1)
        ids = ", ".join(f"{w.instance_id}={w.address}" for w in self.workers)
        print(f"vllm-duplex: {len(self.workers)} workers ({ids}) behind nginx on "
              f"http://{self.host}:{self.port} (ws://{self.host}:{self.port}/v1/realtime)",
              flush=True)

    async def _shutdown(self, core_watch: asyncio.Task | None) -> None:
        if self.nginx is not None:
            await self.nginx.stop()
        await self._stop_workers()
        if core_watch is not None:
            core_watch.cancel()
            await asyncio.gather(core_watch, return_exceptions=True)
        if self.core is not None:
            await asyncio.to_thread(self.core.shutdown)
        if self._fleet_server is not None:
            server, task = self._fleet_server
            server.should_exit = True
            with contextlib.suppress(Exception):
                await task
        if self._redis_watch is not None:
            self._redis_watch.cancel()
            await asyncio.gather(self._redis_watch, return_exceptions=True)
        if self.redis is not None:  # last: the workers wrote their releases into it
            await self.redis.stop()


def _wait_any(sentinels: list[int], stopping: asyncio.Event) -> None:
    """Block until one of ``sentinels`` (process exit) or a stop (polled)."""
    from multiprocessing.connection import wait

    while not stopping.is_set():
        if wait(sentinels, timeout=0.5):
            return


def serve_workers(config: DeployConfig, config_path: Path, workers: Workers, *, host: str,
                  port: int, log_level: str = "warning") -> int:
    fleet = WorkerFleet(config, config_path, workers, host=host, port=port, log_level=log_level)
    return asyncio.run(fleet.run())
