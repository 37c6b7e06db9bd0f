"""What durability costs an application session (issue 32): a turn's
``finish`` waits until Redis holds the history it made.

Two servers in this process on one vLLM engine (the default SmolLM2-135M),
one with the in-memory store (the default: nothing is written anywhere), one
with Redis (a private ``redis-server``); one client alternates text turns
between a session on each (each side first every other round) (the same question, greedy, ``max_tokens`` 8).
Per turn: the time from the last text delta to ``finish`` (on Redis that is
the wait for the save of the history), and the whole turn (request to
finish). Then Redis memory per session (``MEMORY USAGE`` of its key) after
the turns, and the time a turn waits when the history is long.

    .venv/bin/python bench/app_session_store.py [--turns 30]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lib.machine import line as machine_line  # noqa: E402
from vllm_duplex.fleet.redis_server import RedisServer  # noqa: E402
from vllm_duplex.host.deploy import load_config  # noqa: E402
from vllm_duplex.host.runtime import Runtime  # noqa: E402
from vllm_duplex.host.store_config import StoreConfig  # noqa: E402
from vllm_duplex.realtime.client.http import DuplexHttpClient  # noqa: E402
from vllm_duplex.realtime.server.serving import BackgroundServer  # noqa: E402

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "Name a color."}]


def runtime(stage, durability: StoreConfig, instance_id: str) -> Runtime:
    config = load_config("cascade-cpu")
    config = dataclasses.replace(config, durability=durability)
    return Runtime(config, shared_stages={"vllm": stage}, instance_id=instance_id)


async def turn(session) -> tuple[float, float]:
    """(last delta -> finish, request -> finish), in ms."""
    t0 = time.perf_counter()
    last = t0
    async for ev in session.generate(QUESTION, options={"max_tokens": 8}):
        now = time.perf_counter()
        if ev.event == "text-delta":
            last = now
        elif ev.event == "finish":
            return (now - last) * 1000, (now - t0) * 1000
    raise RuntimeError("no finish")


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def main(turns: int) -> None:
    from vllm_duplex.stages.vllm.llm import VllmLlmStage

    stage = VllmLlmStage()
    await stage.start()
    redis = RedisServer()
    await redis.start()
    sides = {"memory": StoreConfig(),
             "redis": StoreConfig(store="redis", url=redis.url, lease_ttl_s=5.0)}
    figures: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in sides}
    try:
        async with BackgroundServer(runtime(stage, sides["memory"], "mem")) as mem, \
                BackgroundServer(runtime(stage, sides["redis"], "red")) as red:
            servers = {"memory": mem, "redis": red}
            clients = {k: DuplexHttpClient(s.http_url, timeout=120) for k, s in servers.items()}
            sessions = {k: await c.open_session(MODEL, ttl_s=600) for k, c in clients.items()}
            for _ in range(2):  # warm both sides
                for s in sessions.values():
                    await turn(s)
            order = list(sessions.items())
            for _ in range(turns):
                order.reverse()  # each side goes first every other round
                for side, s in order:
                    tail, whole = await turn(s)
                    figures[side][0].append(tail)
                    figures[side][1].append(whole)
            used = await red.runtime.durability.store.memory_usage(
                "app:" + sessions["redis"].session_id)
            print(f"# {machine_line()}")
            print(f"# {turns} turns a side, alternating; max_tokens 8; history grows 2 messages a turn")
            print(f"{'side':8} {'delta->finish p50/p90 ms':>26} {'turn p50/p90 ms':>18}")
            for side, (tail, whole) in figures.items():
                print(f"{side:8} {p(tail, 50):>13.2f} / {p(tail, 90):<10.2f} "
                      f"{p(whole, 50):>8.1f} / {p(whole, 90):<8.1f}")
            m, r = figures["memory"], figures["redis"]
            print(f"redis - memory: delta->finish p50 +{p(r[0], 50) - p(m[0], 50):.2f} ms, "
                  f"turn p50 {p(r[1], 50) - p(m[1], 50):+.1f} ms "
                  f"(x{p(r[1], 50) / p(m[1], 50):.3f})")
            print(f"Redis memory of the session ({len((await sessions['redis'].info(True))['history'])}"
                  f" messages): {used / 1024:.1f} KiB")
            for s in sessions.values():
                await s.close()
            for c in clients.values():
                await c.aclose()
    finally:
        await redis.stop()
        await stage.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=30)
    asyncio.run(main(parser.parse_args().turns))
