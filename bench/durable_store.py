"""What durability costs (issue 32): the Redis session store against the
in-memory one, the same scripted pipeline, the same process run.

Two `vllm-duplex serve` processes on loopback (memory; redis, a private
redis-server), driven alternately by one client: per text turn, the turn gap
(response.create sent -> first text delta received: with Redis every event
waits until the store holds it) and the time per event of the whole turn;
then Redis memory per session (MEMORY USAGE of its keys) after the turns.
Then the writer alone, in this process: a voice reply's audio deltas (100 ms
of 24 kHz PCM each) mirrored into Redis -- CPU per event of the session's
side (``published``) and of the writer task (encoding, the pipeline), the
time until the last is durable, and the Redis memory of a minute of audio.

    .venv/bin/python bench/durable_store.py [--turns 40] [--deltas 600]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from vllm_duplex.durable.redis_store import RedisStore
from vllm_duplex.fleet.redis_server import RedisServer
from vllm_duplex.host.deploy import resolve_config_path
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import free_port

TEXT = {"output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}}


def start(config: dict, port: int, tmp: Path) -> subprocess.Popen:
    path = tmp / f"{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.Popen([sys.executable, "-m", "vllm_duplex.cli", "serve", "--config",
                             str(path), "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


async def ready(port: int) -> None:
    for _ in range(600):
        try:
            c = await RealtimeClient.connect(f"ws://127.0.0.1:{port}/v1/realtime")
            await c.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise TimeoutError(port)


async def turn(c: RealtimeClient) -> tuple[float, float, int]:
    await c.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
    before = len(c.events)
    t0 = time.perf_counter()
    await c.send({"type": "response.create"})
    await c.wait_for("response.output_text.delta", timeout=30)
    gap = time.perf_counter() - t0
    await c.wait_for("response.done", timeout=30)
    total = time.perf_counter() - t0
    return gap, total, len(c.events) - before


async def writer_alone(url: str, deltas: int) -> None:
    """The mirror's own cost per event, without a socket or a pipeline."""
    from vllm_duplex.domain.events import Envelope, OutputAudioDelta
    from vllm_duplex.durable.writer import Durability
    from vllm_duplex.host.deploy import load_config
    from vllm_duplex.host.runtime import Runtime

    store = RedisStore(url)
    runtime = Runtime(load_config("scripted"), instance_id="bench", store=store)
    await runtime.start()
    session = await runtime.sessions.open(None)
    durability: Durability = runtime.durability
    pcm = bytes(4800)  # 100 ms of 24 kHz 16-bit mono
    base = session.journal.head_seq
    await asyncio.sleep(0.2)
    events = [Envelope(base + i + 1, session.fence,
                       OutputAudioDelta("resp_x", "item_x", 0, 0, pcm)) for i in range(deltas)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    for env in events:
        durability.published(session, env)
    side = time.process_time() - cpu0
    await session.outbox.mark.reached(events[-1].seq)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    usage = await store.memory_usage(session.session_id)
    print(f"  writer alone: {deltas} audio deltas of 100 ms: session side "
          f"{side * 1e6 / deltas:.1f} us/event, all CPU {cpu * 1e6 / deltas:.1f} us/event, "
          f"durable after {wall * 1000:.0f} ms; Redis memory for {deltas / 10:.0f} s of "
          f"audio: {usage / 2**20:.2f} MiB (bounded by limits.journal_bytes per session)")
    await session.close()
    await runtime.stop()


async def main(turns: int, deltas: int) -> None:
    raw = yaml.safe_load(resolve_config_path("scripted").read_text())
    raw.setdefault("limits", {})["resume_grace_s"] = 30
    redis = RedisServer()
    await redis.start()
    tmp = Path(tempfile.mkdtemp(prefix="duplex-bench-store-"))
    ports = {"memory": free_port(), "redis": free_port()}
    procs = {"memory": start(raw, ports["memory"], tmp),
             "redis": start({**raw, "durability": {"store": "redis", "url": redis.url}},
                            ports["redis"], tmp)}
    try:
        for p in ports.values():
            await ready(p)
        clients = {}
        for name, p in ports.items():
            c = await RealtimeClient.connect(f"ws://127.0.0.1:{p}/v1/realtime")
            await c.send({"type": "session.update", "session": TEXT})
            await c.wait_for("session.updated")
            clients[name] = c
        gaps: dict[str, list[float]] = {n: [] for n in ports}
        per_event: dict[str, list[float]] = {n: [] for n in ports}
        for i in range(turns + 3):
            for name, c in clients.items():  # alternate: the same load on both
                gap, total, events = await turn(c)
                if i >= 3:  # warm-up
                    gaps[name].append(gap * 1000)
                    per_event[name].append(total * 1e6 / events)
        store = RedisStore(redis.url)
        usage = await store.memory_usage(clients["redis"].session_id)
        await store.close()
        events = clients["redis"].last_seq
        print(f"turns per store: {turns}; CPU: {os.cpu_count()} cores ({_cpu()})")
        for name in ports:
            print(f"  {name:6s} turn gap p50 {statistics.median(gaps[name]):6.2f} ms "
                  f"p90 {sorted(gaps[name])[int(0.9 * len(gaps[name]))]:6.2f} ms; "
                  f"per event {statistics.median(per_event[name]):7.1f} us")
        m, r = statistics.median(gaps["memory"]), statistics.median(gaps["redis"])
        print(f"  redis/memory: turn gap p50 x{r / m:.3f} (+{r - m:.2f} ms), per event "
              f"x{statistics.median(per_event['redis']) / statistics.median(per_event['memory']):.3f}")
        print(f"  redis memory of one session ({len(clients['redis'].events)} events received, "
              f"{events} journaled, {turns + 3} turns): {usage / 1024:.1f} KiB")
        for c in clients.values():
            await c.close()
        await writer_alone(redis.url, deltas)
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(timeout=30)
        await redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--deltas", type=int, default=600)
    args = ap.parse_args()

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM (a timeout): stop the servers and Redis on the way out

    signal.signal(signal.SIGTERM, interrupted)
    asyncio.run(main(args.turns, args.deltas))
