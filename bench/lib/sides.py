"""Sides: the same bench against several trees in one run, as the benches
with sides run them (``fast_turns.py``, ``hearing.py``, ``barge_in.py``,
``capacity.py``; ``hops.py`` and ``real_hearing.py`` use the worktree and the
child-process imports only).

A side is ``NAME[@REF][:KEY=VALUE,...]``: the tree at git ``REF`` (default:
this one; a git worktree made for the run, imported in place of this one),
with those environment variables (``taskset=CPUS`` pins the server process,
``config=PATH`` serves another config). Each side's ``vllm-duplex serve`` runs
as a subprocess on a free port, stopped however the run ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from .serve_process import REPO, free_port, http_get, machine, stop

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


def in_turn(servers: list[Server], k: int) -> list[Server]:
    """The sides for try ``k``: each goes first in turn, so neither always
    runs on a machine the other has just warmed (or loaded)."""
    return servers if k % 2 == 0 else servers[::-1]


T = TypeVar("T")


async def as_row(t: T, attempt: Callable[[T], Awaitable[T]]) -> T:
    """``attempt(t)``'s result; a try that raised is a row saying why
    (``t.status``), not the end of the run."""
    try:
        return await attempt(t)
    except Exception as exc:  # noqa: BLE001 -- one failed try is a row
        t.status = f"failed: {exc!r}"  # type: ignore[attr-defined]
        return t


def add_sides_argument(p: Any, default: list[str]) -> None:
    """``--sides``, as every bench with sides takes it."""
    p.add_argument("--sides", nargs="+", default=default,
                   help="NAME[@REF][:KEY=VALUE,...] each (fast_turns.py's sides)")


def run_and_report(args: Any, run: Callable[[Any], Awaitable[list[Any]]],
                   report: Callable[[list[Any], list[str]], None]) -> int:
    """A bench with sides from its parsed ``args`` (``--sides``, ``--json``):
    its tries (``run``, dataclass rows), the machine and its load, the
    report per side, the rows to ``--json``."""
    load0 = os.getloadavg()
    rows = asyncio.run(run(args))
    print("\n" + machine_line(load0))
    report(rows, [Side.parse(s).name for s in args.sides])
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


def machine_line(load0: tuple[float, float, float]) -> str:
    """The machine and its load average before the run and now."""
    m = machine()
    return (f"machine: {m['summary']}, {m['memory_gib']} GiB, Python {m['python']}, Linux "
            f"{m['kernel']}; load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
