"""Reliability figures of the realtime socket (issue 5), each against a
baseline measured in the same process:

1. **Resume**: a scripted conversation cut at every event boundary in turn and
   resumed; events lost and duplicated over all cuts (baseline: the
   uninterrupted stream).
2. **Churn**: RSS and leftovers after N sessions on the embedded default (real
   vLLM) opened, closed, cancelled, dropped, abandoned, resumed and expired
   (baseline: RSS after a warm-up churn).
3. **Slow consumer**: one socket that stops reading during long audio replies
   — the server memory it can hold, and the event latency of 8 well-behaved
   sessions beside it (baseline: the same 8 sessions alone).
4. **Engine kill**: SIGKILL of the vLLM engine process while sessions are
   mid-reply — time to each terminal error, and to ``/health`` healthy again
   (baseline: the engine's own start time).

Run (from the repository root)::

    .venv/bin/python bench/reliability.py            # all four, 200 sessions of churn
    .venv/bin/python bench/reliability.py --only resume,slow --sessions 1000
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import socket
import statistics
import sys
import time
from pathlib import Path

import httpx
import psutil
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine  # noqa: E402
from lib.churn import churn, rss_bytes, settle  # noqa: E402
from vllm_duplex.domain.close_reason import CloseReason  # noqa: E402
from vllm_duplex.host.deploy import StageSpec, load_config  # noqa: E402
from vllm_duplex.host.runtime import Runtime  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient  # noqa: E402
from vllm_duplex.realtime.server.serving import BackgroundServer  # noqa: E402

TEXT = {"output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}}
USER = {"type": "conversation.item.create", "item": {
    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}}


def scripted(reply: str, interval: float, **limits) -> object:
    config = load_config("scripted")
    stages = tuple(StageSpec(s.type, {**s.options, "reply": reply, "token_interval_s": interval})
                   if s.type == "scripted_llm" else s for s in config.stages)
    return dataclasses.replace(config, stages=stages,
                               limits=dataclasses.replace(config.limits, **limits))


async def turn(rt: RealtimeClient, session: dict = TEXT) -> None:
    await rt.send({"type": "session.update", "session": session})
    await rt.send(USER)
    await rt.send({"type": "response.create"})


async def until_done(rt: RealtimeClient) -> list[dict]:
    got = []
    while True:
        event = await rt.recv(timeout=60)
        got.append(event)
        if event["type"] == "response.done":
            return [e for e in got if isinstance(e.get("seq"), int)]


# ---- 1. resume -------------------------------------------------------------------


async def bench_resume() -> None:
    config = scripted("One two three four five six seven eight nine ten.", 0.002, resume_grace_s=10)
    async with BackgroundServer(Runtime(config)) as server:
        rt = await RealtimeClient.connect(server.ws_url)
        await turn(rt)
        reference = [(e["seq"], e["type"]) for e in await until_done(rt)]
        await rt.close()
        lost = duplicated = 0
        started = time.perf_counter()
        for k in range(1, len(reference)):
            rt = await RealtimeClient.connect(server.ws_url)
            await turn(rt)
            before = []
            while len(before) < k:
                event = await rt.recv(timeout=10)
                before += [event] if isinstance(event.get("seq"), int) else []
            await rt.close(end_session=False)
            back = await rt.reconnect()
            seen = [(e["seq"], e["type"]) for e in before + await until_done(back)]
            await back.close()
            lost += len(set(reference) - set(seen))
            duplicated += len(seen) - len(set(seen))
        took = time.perf_counter() - started
    print(f"resume: {len(reference) - 1} cuts of a {len(reference)}-event conversation: "
          f"{lost} events lost, {duplicated} duplicated ({took / (len(reference) - 1) * 1000:.0f} ms "
          "per cut and resume)")


# ---- 2. churn ----------------------------------------------------------------------


async def bench_churn(sessions: int) -> None:
    config = load_config("cascade-cpu")
    config = dataclasses.replace(config, limits=dataclasses.replace(
        config.limits, max_sessions=64, resume_grace_s=1.0, max_voice_sessions=None))
    async with BackgroundServer(Runtime(config)) as server:
        await churn(server.ws_url, 20)
        await settle(server.runtime)
        before = rss_bytes()
        result = await churn(server.ws_url, sessions)
        settled = await settle(server.runtime)
        after = rss_bytes()
        llm = next(s for s in server.runtime.stages if getattr(s, "serves_text", False))
        print(f"churn: {sessions} sessions {dict(result.fates)} in {result.seconds:.0f} s, "
              f"{len(result.errors)} errors {result.errors[:2]}, {sum(result.retries.values())} "
              f"retried admissions; settled: {settled}; left: "
              f"{len(server.runtime.manager)} sessions, {llm.engine.get_num_unfinished_requests()} vLLM "
              f"requests, {server.runtime.journal_budget.used} journal bytes; RSS "
              f"{before / 2**20:.0f} -> {after / 2**20:.0f} MiB ({after / before:.3f}x)")


# ---- 3. slow consumer ---------------------------------------------------------------


async def latency_of_neighbours(url: str, n: int = 8) -> float:
    """p50 of text-delta inter-arrival jitter seen by ``n`` reading sessions."""
    async def one() -> list[float]:
        async with await RealtimeClient.connect(url) as rt:
            await turn(rt)
            stamps = [e["_recv_t"] for e in await until_done(rt) if e["type"] == "response.output_text.delta"]
        return [b - a for a, b in zip(stamps, stamps[1:])]

    gaps = [g for gs in await asyncio.gather(*(one() for _ in range(n))) for g in gs]
    return statistics.quantiles(gaps, n=100)[98]


class NonReadingClient:
    """A WebSocket client that reads its handshake and first event, then never
    reads again (a stalled phone): a small receive buffer, no keepalive. Built
    on websockets' sans-I/O protocol over a raw non-blocking socket."""

    def __init__(self, sock: socket.socket, protocol: ClientProtocol, session_id: str) -> None:
        self.sock, self.protocol, self.session_id = sock, protocol, session_id

    @classmethod
    async def connect(cls, host: str, port: int) -> NonReadingClient:
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, port))
        protocol = ClientProtocol(parse_uri(f"ws://{host}:{port}/v1/realtime"))
        protocol.send_request(protocol.connect())
        await loop.sock_sendall(sock, b"".join(protocol.data_to_send()))
        while True:  # until session.created
            protocol.receive_data(await loop.sock_recv(sock, 1 << 16))
            for frame in protocol.events_received():
                if isinstance(frame, Frame) and frame.opcode is Opcode.TEXT:
                    return cls(sock, protocol, json.loads(frame.data)["session"]["id"])

    async def send(self, event: dict) -> None:
        self.protocol.send_text(json.dumps(event).encode())
        await asyncio.get_running_loop().sock_sendall(self.sock, b"".join(self.protocol.data_to_send()))

    def close(self) -> None:
        self.sock.close()


async def bench_slow_consumer() -> None:
    reply = " ".join(f"Sentence {i} of a long scripted reply." for i in range(40))
    config = scripted(reply, 0.005, resume_grace_s=10, outbound_capacity=8192,
                      outbound_bytes=1 << 20)
    async with BackgroundServer(Runtime(config)) as server:
        alone = await latency_of_neighbours(server.ws_url)
        slow = await NonReadingClient.connect(server.host, server.port)
        await slow.send({"type": "session.update",
                         "session": {"audio": {"input": {"turn_detection": None}}}})
        session, _ = server.runtime.manager.get(slow.session_id, None)
        peak = 0
        metrics = server.runtime.metrics

        async def feed() -> None:  # turn after turn until the socket is cut off
            for _ in range(30):
                if metrics.slow_consumers.get() > 0:
                    return
                await slow.send(USER)
                await slow.send({"type": "response.create"})
                while session.active_response_id is None and metrics.slow_consumers.get() == 0:
                    await asyncio.sleep(0.01)
                while session.active_response_id is not None:
                    await asyncio.sleep(0.01)

        async def watch() -> None:
            nonlocal peak
            while True:
                att = session.attachment
                peak = max(peak, att.pending_bytes if att else 0)
                await asyncio.sleep(0.002)

        watcher = asyncio.create_task(watch())
        rss0 = rss_bytes()
        feeder = asyncio.create_task(feed())
        beside = await latency_of_neighbours(server.ws_url)
        await feeder
        watcher.cancel()
        rss1 = rss_bytes()
        cut = metrics.slow_consumers.get() > 0
        journal = session.journal.bytes
        slow.close()
        await server.runtime.sessions.end(session, CloseReason.CLIENT)
    print(f"slow consumer: cut off: {cut} (close 4008); queued for it at most {peak / 2**20:.2f} MiB "
          f"(bound {config.limits.outbound_bytes / 2**20:.0f} MiB), journal {journal / 2**20:.1f} MiB "
          f"(bound {config.limits.journal_bytes / 2**20:.0f} MiB); server RSS "
          f"{(rss1 - rss0) / 2**20:+.0f} MiB; 8 neighbours' p99 gap between text deltas "
          f"{beside * 1000:.1f} ms vs {alone * 1000:.1f} ms alone ({beside / alone:.2f}x)")


# ---- 4. engine kill ------------------------------------------------------------------


def engine_core_pid() -> int:
    for child in psutil.Process().children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
            return child.pid
    raise RuntimeError("no EngineCore process found")


async def bench_engine_kill() -> None:
    config = load_config("cascade-cpu")
    config = dataclasses.replace(config, limits=dataclasses.replace(config.limits, resume_grace_s=0))
    started = time.perf_counter()
    runtime = Runtime(config)
    async with BackgroundServer(runtime) as server, httpx.AsyncClient(base_url=server.http_url) as http:
        boot = time.perf_counter() - started
        clients = [await RealtimeClient.connect(server.ws_url) for _ in range(4)]
        for rt in clients:
            await turn(rt, {**TEXT, "max_output_tokens": 400})
            await rt.wait_for("response.output_text.delta", timeout=60)
        kill = time.perf_counter()
        os.kill(engine_core_pid(), signal.SIGKILL)

        async def terminal(rt: RealtimeClient) -> float:
            while True:
                try:
                    event = await rt.recv(timeout=30)
                except Exception:
                    return time.perf_counter() - kill
                if event["type"] == "error" and event["error"]["code"] == "engine_dead":
                    return time.perf_counter() - kill

        times = await asyncio.gather(*(terminal(rt) for rt in clients))
        unhealthy = (await http.get("/health")).status_code
        while (await http.get("/health")).status_code != 200:
            if time.perf_counter() - kill > 300:
                break
            await asyncio.sleep(0.25)
        healthy_after = time.perf_counter() - kill
        for rt in clients:
            await rt.ws.close()
    print(f"engine kill: terminal error after {min(times) * 1000:.0f}-{max(times) * 1000:.0f} ms "
          f"in {len(times)} sessions; /health {unhealthy} at once, 200 again after "
          f"{healthy_after:.1f} s (engine start alone: {boot:.1f} s; {healthy_after / boot:.2f}x)")


async def main(args: argparse.Namespace) -> None:
    only = set(args.only.split(",")) if args.only else {"resume", "churn", "slow", "kill"}
    print(machine.line(), flush=True)
    if "resume" in only:
        await bench_resume()
    if "slow" in only:
        await bench_slow_consumer()
    if "churn" in only:
        await bench_churn(args.sessions)
    if "kill" in only:
        await bench_engine_kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--only", default="", help="comma list of resume,slow,churn,kill")
    asyncio.run(main(parser.parse_args()))
