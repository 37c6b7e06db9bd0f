"""Fast turns: the gap after the user's last word, this tree against the code
before it, in one run, with each turn's critical path.

Two ``vllm-duplex serve`` subprocesses on the default pipeline
(``configs/cascade-cpu.yaml``): one runs this tree, the other the tree at
``--before`` (a git worktree made for the run, imported in place of this one).
They take turns, question by question, so both see the same machine. Each
question is spoken by Flite (several voices) into its own realtime session
at real time, with an open microphone (silence keeps flowing while the reply
plays), and read as events arrive:

* **turn gap** (``semantic_vad``, the default): the end of the user's speech
  (the slot of its last loud chunk) -> the first reply audio delta at the
  client, p50/p90;
* **TTFA after speech_stopped** (``server_vad``, 500 ms): the client's
  ``speech_stopped`` -> the first reply audio delta, p50/p90;
* **visible revisions**: replies the client saw start (``response.created``)
  that were then cancelled -- the words they answered changed; a turn with no
  completed reply within 40 s is counted apart (``unanswered``);
* **answers right**: the expected word in the reply's transcript;
* the server's **critical path** of each turn (``response.done.metadata``):
  which stage the gap waited on, segment by segment, and the p50 per segment;
  ``socket`` is the rest of the client's gap (the last chunk's way in, the
  first audio's way out).

Each side runs its questions on a fresh server, then holds filler sessions
until it has held ``--warm-after`` (10), then runs them again: "fresh" and
"warm" rows.

    .venv/bin/python bench/fast_turns.py [--rounds 1] [--sides before@ac9f7ce now]
                                         [--modes semantic server] [--warm-after 10]

A side is ``NAME[@REF][:KEY=VALUE,...]``: the tree at git ``REF`` (default:
this one), with those environment variables (``taskset=CPUS`` pins the
server process, ``config=PATH`` serves another config; e.g. to compare CPU
placements: ``now:VLLM_CPU_OMP_THREADS_BIND=0-1``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from serve_process import REPO, free_port, http_get, machine, stop  # noqa: E402
from speech_corpus import right_answer  # noqa: E402
from support.speech_fixtures import RATE, chunks, speak  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient  # noqa: E402

QUESTIONS = (  # (text, voice, a word the right answer holds)
    ("What is the capital of France?", "slt", "paris"),
    ("What is the largest ocean?", "rms", "pacific"),
    ("Where is the Eiffel Tower?", "awb", "paris"),
    ("What is the capital of Italy?", "kal16", "rome"),
    ("How many days are in a week?", "slt", "seven"),
)
MODES = {"semantic": {"type": "semantic_vad", "eagerness": "auto"},
         "server": {"type": "server_vad", "silence_duration_ms": 500}}
LOUD = 300  # |sample| above this is speech (Flite pads with digital silence)

# Imports the tree at argv[1] as vllm_duplex (in place of the editable
# install), then runs its CLI with the rest of argv.
# The start of a child process that imports the package from the tree given
# as its first argument (a worktree of another ref) in place of this one.
TREE_IMPORTS = r"""
import importlib.util, sys
root = sys.argv.pop(1)
DIRS = {"vllm_duplex": root + "/plugin", "vllm_duplex.models": root + "/models",
        "vllm_duplex.realtime": root + "/realtime"}
class Tree:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in DIRS:
            return importlib.util.spec_from_file_location(
                name, DIRS[name] + "/__init__.py", submodule_search_locations=[DIRS[name]])
        return None
sys.meta_path.insert(0, Tree)
"""
_BOOT = TREE_IMPORTS + r"""
for cli in ("vllm_duplex.cli", "vllm_duplex.realtime.client.cli"):
    try:
        main = importlib.import_module(cli).main
        break
    except ModuleNotFoundError:
        continue
sys.argv[0] = "vllm-duplex"
sys.exit(main())
"""


@dataclass
class Turn:
    side: str
    mode: str
    stage: str  # fresh | warm
    question: str
    gap_ms: float | None = None
    ttfa_ms: float | None = None
    revisions: int = 0  # replies the client saw start, then cancelled
    answered: bool = False  # a reply completed within the turn's 40 s
    right: bool = False
    answer: str = ""
    path: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # of a revised or unanswered turn


@dataclass(frozen=True)
class Side:
    name: str
    ref: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, spec: str) -> Side:
        head, _, env = spec.partition(":")
        name, _, ref = head.partition("@")
        pairs = tuple(tuple(kv.split("=", 1)) for kv in env.split(",") if kv)
        return cls(name, ref or None, pairs)  # type: ignore[arg-type]


class Server:
    """A ``vllm-duplex serve`` of the tree at ``root`` on a free port."""

    def __init__(self, side: str, root: Path, config: str,
                 env: tuple[tuple[str, str], ...] = ()) -> None:
        self.side, self.root, self.config = side, root, config
        self.env = dict(env)
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix=f"fast-turns-{side}-", suffix=".log", delete=False)
        self.proc: subprocess.Popen[bytes] | None = None
        self.sessions = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    def start(self) -> None:
        extra = dict(self.env)
        pin = extra.pop("taskset", None)
        config = extra.pop("config", self.config)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}
        argv = [sys.executable, "-c", _BOOT, str(self.root), "serve", "--config", config,
                "--port", str(self.port)]
        self.proc = subprocess.Popen(["taskset", "-c", pin, *argv] if pin else argv, cwd=self.root,
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self, timeout_s: float = 900.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.side} server exited; see {self.log.name}")
            try:
                http_get(f"http://127.0.0.1:{self.port}/health", timeout=1.0)
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"{self.side} server did not start; see {self.log.name}")

    def stop(self) -> None:
        stop(self.proc, grace_s=30.0)


def before_tree(ref: str) -> Path:
    """A worktree of ``ref`` for the run (made once, reused)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", ref], check=True,
                         capture_output=True, text=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"duplex-before-{sha}"
    if not (path / "plugin").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), sha],
                       check=True, capture_output=True)
    return path


@contextmanager
def side_servers(specs: list[str], config: str) -> Iterator[list[Server]]:
    """A server per side (``NAME[@REF][:KEY=VALUE,...]``), all started, then
    all ready (they load at once); stopped however the run ends. The other
    benches with sides (``hearing.py``, ``barge_in.py``) run on these too."""
    servers = []
    for spec in specs:
        side = Side.parse(spec)
        servers.append(Server(side.name, before_tree(side.ref) if side.ref else REPO, config,
                              side.env))
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_ready()
        yield servers
    finally:
        for s in servers:
            s.stop()


def machine_line(load0: tuple[float, float, float]) -> str:
    """The machine and its load average before the run and now."""
    m = machine()
    return (f"machine: {m['summary']}, {m['memory_gib']} GiB, Python {m['python']}, Linux "
            f"{m['kernel']}; load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after")


def last_loud_s(pcm: np.ndarray) -> float:
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > LOUD)
    return float(loud[-1] + 1) / RATE


async def ask(server: Server, mode: str, stage: str, text: str, voice: str, expect: str,
              tail_s: float = 6.0) -> Turn:
    """One question in its own session, the microphone open until the reply is done."""
    pcm = speak(text, voice=voice, tail_s=tail_s)
    turn = Turn(server.side, mode, stage, text)
    async with await RealtimeClient.connect(server.url) as client:
        server.sessions += 1
        await client.update_session({"audio": {"input": {"turn_detection": MODES[mode]}}})
        start = time.monotonic()

        async def send() -> None:
            for i, chunk in enumerate(chunks(pcm)):
                await client.append_audio(chunk)
                await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))

        sender = asyncio.ensure_future(send())
        answered: dict[str, Any] | None = None
        try:
            while answered is None and time.monotonic() - start < 40:
                try:
                    event = await client.recv(timeout=1.0)
                except TimeoutError:
                    continue
                if event["type"] == "response.done":
                    resp = event["response"]
                    if resp.get("status") == "cancelled":
                        turn.revisions += 1
                    else:
                        answered = resp
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    end = start + last_loud_s(pcm)
    events = client.events
    if answered is not None:
        rid = answered["id"]
        audio = [e["_recv_t"] for e in events
                 if e["type"] == "response.output_audio.delta" and e.get("response_id") == rid]
        stopped = [e["_recv_t"] for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
        if audio:
            turn.gap_ms = (audio[0] - end) * 1000
            if stopped:
                turn.ttfa_ms = (audio[0] - stopped[-1]) * 1000
        turn.answer = "".join(e.get("delta", "") for e in events
                              if e["type"] == "response.output_audio_transcript.delta"
                              and e.get("response_id") == rid)
        turn.right = right_answer(turn.answer, (expect,))
        turn.metadata = answered.get("metadata") or {}
        turn.path = turn.metadata.get("duplex_critical_path", "")
        if turn.path and turn.gap_ms is not None:
            # The server's path starts when the end of speech reached it and
            # ends when it sent the first audio: the rest of the client's gap
            # is the socket, both ways (and the client's own loop).
            server_ms = sum(float(part.rsplit(" ", 1)[1]) for part in turn.path.split(", "))
            turn.path += f", socket {max(0.0, turn.gap_ms - server_ms):.0f}"
    turn.answered = answered is not None
    if turn.revisions or answered is None:  # kept for --json: what the client saw, in order
        turn.events = [{k: e[k] for k in ("type", "_recv_t", "delta", "transcript", "response")
                        if k in e} for e in events if not e["type"].endswith("audio.delta")]
    return turn


def pct(xs: list[float], q: float) -> str:
    return f"{np.quantile(xs, q):.0f}" if xs else "-"


def report(turns: list[Turn], sides: list[str], modes: list[str]) -> None:
    print("\n| side | mode | server | turn gap p50 / p90 (ms) | TTFA after speech_stopped p50 / p90 (ms) "
          "| visible revisions | unanswered in 40 s | answers right |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in modes:
        for stage in ("fresh", "warm"):
            for side in sides:
                ts = [t for t in turns if (t.side, t.mode, t.stage) == (side, mode, stage)]
                if not ts:
                    continue
                gaps = [t.gap_ms for t in ts if t.gap_ms is not None]
                ttfas = [t.ttfa_ms for t in ts if t.ttfa_ms is not None]
                print(f"| {side} | {mode} | {stage} | {pct(gaps, .5)} / {pct(gaps, .9)} | "
                      f"{pct(ttfas, .5)} / {pct(ttfas, .9)} | {sum(t.revisions for t in ts)} | "
                      f"{sum(not t.answered for t in ts)} | "
                      f"{sum(t.right for t in ts)}/{len(ts)} |")
    print("\ncritical path p50 per segment (ms), over the turns whose server reported it:")
    for side in sides:
        for mode in modes:
            segs: dict[str, list[float]] = {}
            for t in turns:
                if (t.side, t.mode) != (side, mode) or not t.path:
                    continue
                for part in t.path.split(", "):
                    name, ms = part.rsplit(" ", 1)
                    segs.setdefault(name, []).append(float(ms))
            if segs:
                print(f"  {side} {mode}: " + ", ".join(f"{k} {pct(v, .5)}" for k, v in segs.items()))


async def run(args: argparse.Namespace) -> list[Turn]:
    turns: list[Turn] = []
    with side_servers(args.sides, args.config) as started:
        servers = {s.side: s for s in started}
        for stage in ("fresh", "warm"):
            if stage == "warm":  # filler sessions until each server has held --warm-after
                for s in servers.values():
                    while s.sessions < args.warm_after:
                        await ask(s, "semantic", "filler", *QUESTIONS[s.sessions % len(QUESTIONS)])
            for _ in range(args.rounds):
                for mode in args.modes:
                    for text, voice, expect in QUESTIONS:
                        for s in servers.values():  # alternate: both see the same machine
                            t = await ask(s, mode, stage, text, voice, expect)
                            turns.append(t)
                            print(f"{t.side:6} {t.mode:8} {t.stage:5} gap {t.gap_ms or float('nan'):6.0f} "
                                  f"ttfa {t.ttfa_ms or float('nan'):6.0f} rev {t.revisions} "
                                  f"{'ok ' if t.right else 'BAD'} {t.question!r} -> {t.answer[:60]!r}\n"
                                  f"       path: {t.path}", flush=True)
    return turns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sides", nargs="+", default=["before@ac9f7ce", "now"],
                   help="NAME[@REF][:KEY=VALUE,...] each (see the module doc)")
    p.add_argument("--modes", nargs="+", default=["semantic", "server"], choices=list(MODES))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--warm-after", type=int, default=10)
    p.add_argument("--config", default="configs/cascade-cpu.yaml")
    p.add_argument("--json", help="write every turn here")
    args = p.parse_args(argv)
    load0 = os.getloadavg()
    turns = asyncio.run(run(args))
    print("\n" + machine_line(load0))
    report(turns, [Side.parse(spec).name for spec in args.sides], args.modes)
    if args.json:
        Path(args.json).write_text(json.dumps([t.__dict__ for t in turns], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
