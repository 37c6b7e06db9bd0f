"""A private ``redis-server`` for ``serve --workers N`` (``durability:
store: redis`` without a ``url``): the session store of its workers.

Run like nginx (``router.py``): Debian's binary, a private directory in
``/tmp/vllm-duplex-redis-*`` (removed at stop), loopback only, in the
foreground under the supervisor, which restarts it when it exits. No
persistence (``save ""``, no AOF): it lives as long as the supervisor, and a
restarted one starts empty -- the workers then write their live sessions
into it again (``vllm_duplex.durable.writer``: ``Lost`` → reseed).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from pathlib import Path


def redis_binary() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if found is None:
        raise FileNotFoundError("redis-server is not installed (Debian: apt-get install "
                                "redis-server; scripts/setup.sh installs it)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One ``redis-server`` on ``127.0.0.1:port`` (a free one by default)."""

    def __init__(self, port: int | None = None, *, maxmemory: str = "1gb") -> None:
        self.port = port or _free_port()
        self.maxmemory = maxmemory
        self.dir = Path(tempfile.mkdtemp(prefix="vllm-duplex-redis-"))
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        # noeviction: a full store refuses writes (the workers degrade) rather
        # than silently dropping a session's lease or journal.
        return [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                "--maxmemory", self.maxmemory, "--maxmemory-policy", "noeviction",
                "--protected-mode", "yes", "--loglevel", "warning"]

    async def start(self, timeout_s: float = 10.0) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self._proc.returncode is not None:
                raise RuntimeError(f"redis-server exited at start ({self._proc.returncode})")
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(b"PING\r\n")
                await writer.drain()
                line = await reader.readline()
                writer.close()
                await writer.wait_closed()
                if line.startswith(b"+PONG"):
                    return
            if loop.time() > deadline:
                raise TimeoutError(f"redis-server did not answer on port {self.port}")
            await asyncio.sleep(0.05)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running else None

    async def wait(self) -> int:
        assert self._proc is not None
        return await self._proc.wait()

    async def stop(self, timeout_s: float = 5.0, *, remove: bool = True) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)
