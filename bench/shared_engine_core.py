"""Proof of the shared engine core (issue 13, item 1).

One vLLM engine core (``vllm_duplex.fleet.engine_core.SharedEngineCore``), two
worker processes each with an ``AsyncLLM`` client on it, both generating at
once. Compares their greedy answers with a single-process engine's and
reports every process's RSS: the weights exist once, in the core.
Optionally waits ``--late-s`` before starting a spare-slot client, which is
how a restarted worker joins a core that has been up for a while.

    .venv/bin/python bench/shared_engine_core.py [--late-s 70] [--tokens 24]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine  # noqa: E402

PROMPTS = ["The capital of France is", "Water boils at", "One, two, three,"]


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def tree_mib(pid: int) -> tuple[float, float]:
    """RSS and PSS (shared pages split between their users) of a process and
    its descendants (the core's executor worker holds the weights)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    info = [p.memory_full_info() for p in procs]
    return sum(i.rss for i in info) / 2**20, sum(i.pss for i in info) / 2**20


async def generate_all(engine, tokens: int) -> list[str]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0)

    async def one(i: int, prompt: str) -> str:
        text = ""
        async for out in engine.generate(prompt, params, f"proof-{os.getpid()}-{i}"):
            text = out.outputs[0].text
        return text

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS))))


def client_main(slot_json: str, tokens: int) -> None:
    """A worker: join the core through the slot, generate, print JSON."""
    from vllm_duplex.fleet.engine_core import WorkerSlot, connect_client

    started = time.monotonic()
    engine = connect_client({}, WorkerSlot.from_json(slot_json))
    joined = time.monotonic() - started

    async def run() -> list[str]:
        return await generate_all(engine, tokens)

    answers = asyncio.run(run())
    print("RESULT", json.dumps({"answers": answers, "join_s": round(joined, 2),
                      "mib": tree_mib(os.getpid())}), flush=True)
    engine.shutdown()


def result_of(client: subprocess.Popen) -> dict:
    out = client.communicate(timeout=300)[0]
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"client failed:\n{out[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def spawn_client(slot, tokens: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--client", slot.to_json(),
                             "--tokens", str(tokens)], pass_fds=slot.pass_fds,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def single_process(tokens: int) -> tuple[list[str], float]:
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm_duplex.fleet.engine_core import engine_args

    engine = AsyncLLM.from_engine_args(engine_args({}))
    try:
        answers = asyncio.run(generate_all(engine, tokens))
        return answers, tree_mib(os.getpid())
    finally:
        engine.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--late-s", type=float, default=0.0,
                    help="then start a third client on a spare slot after this many seconds")
    args = ap.parse_args()
    if args.client is not None:
        client_main(args.client, args.tokens)
        return 0

    from vllm_duplex.fleet.engine_core import SharedEngineCore

    print(machine.line(), flush=True)
    baseline, single_rss = single_process(args.tokens)
    core = SharedEngineCore({}, workers=2, spare_slots=1 if args.late_s else 0)
    started = time.monotonic()
    core.start()
    print(f"engine core up in {time.monotonic() - started:.1f} s, {core.slots} slots")
    try:
        core_pids = [p.pid for p in core._launch.engine_manager.processes]
        slots = [core.take_slot(), core.take_slot()]
        clients = [spawn_client(s, args.tokens) for s in slots]
        for s in slots:
            core.release_slot(s)
        results = [result_of(c) for c in clients]
        core_mib = [sum(x) for x in zip(*(tree_mib(p) for p in core_pids))]
        if args.late_s:
            time.sleep(args.late_s)
            slot = core.take_slot()
            late = spawn_client(slot, args.tokens)
            core.release_slot(slot)
            results.append(result_of(late))
    finally:
        core.shutdown()
    print("single-process engine (its client, core and executor worker): "
          "%.0f MiB RSS, %.0f MiB PSS" % single_rss)
    print("shared core (core and executor worker): %.0f MiB RSS, %.0f MiB PSS" % tuple(core_mib))
    for i, r in enumerate(results):
        same = r["answers"] == baseline
        print(f"client {i}: joined in {r['join_s']} s, {r['mib'][0]:.0f} MiB RSS, "
              f"{r['mib'][1]:.0f} MiB PSS, "
              f"greedy answers equal the single-process engine's: {same}")
    print("answers:", json.dumps(baseline))
    return 0 if all(r["answers"] == baseline for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
