"""The router's nginx process (``router.py`` writes its config): a private
prefix (config, pid, logs, temp files) in a temporary directory, nginx in
the foreground (``daemon off``) under our supervision, ``reload`` for a
changed plan (workers joined or left, one taken out of routing or put back).
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import shutil
import signal
import tempfile
from pathlib import Path

from vllm_duplex.fleet.router import RouterPlan, nginx_conf

log = logging.getLogger(__name__)


def children(parent: int) -> dict[int, bytes]:
    """``parent``'s child processes: pid -> command line (from /proc)."""
    found: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found[int(entry.name)] = cmd
    return found


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx")
                                      else None)
    if found is None:
        raise FileNotFoundError("nginx is not installed (Debian: apt-get install nginx; "
                                "scripts/setup.sh installs it)")
    return found


class Nginx:
    """One nginx master process serving ``plan``, in a private prefix."""

    def __init__(self, plan: RouterPlan) -> None:
        self.plan = plan
        self.run_dir = Path(tempfile.mkdtemp(prefix="vllm-duplex-router-"))
        self.conf_path = self.run_dir / "nginx.conf"
        self._proc: asyncio.subprocess.Process | None = None
        self._group: int | None = None

    def reap(self) -> None:
        """After the master died: end what is left of its process group (its
        workers), so a new master can listen on the port."""
        group, self._group = self._group, None
        if group is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)

    def _user(self) -> str | None:
        # As root, nginx's workers drop to "nobody": let them use our temp dirs.
        if os.geteuid() != 0:
            return None
        nobody = pwd.getpwnam("nobody")
        for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            path = self.run_dir / sub
            path.mkdir(exist_ok=True)
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        os.chmod(self.run_dir, 0o755)
        return f"nobody {grp.getgrgid(nobody.pw_gid).gr_name}"

    def write(self, plan: RouterPlan | None = None) -> Path:
        if plan is not None:
            self.plan = plan
        self.conf_path.write_text(nginx_conf(self.plan, self.run_dir, self._user()))
        return self.conf_path

    def _argv(self, *extra: str) -> list[str]:
        return [nginx_binary(), "-p", str(self.run_dir), "-c", str(self.conf_path),
                "-e", str(self.run_dir / "error.log"), *extra]

    async def check(self) -> None:
        """``nginx -t`` on the written config (raises with nginx's message)."""
        proc = await asyncio.create_subprocess_exec(
            *self._argv("-t", "-q"), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"nginx rejected its config: {out.decode(errors='replace')}")

    async def start(self, timeout_s: float = 10.0) -> None:
        self.write()
        await self.check()
        # Its own process group: a master killed hard leaves its workers
        # running (they keep the listening socket); ``reap`` ends them by group.
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        self._group = self._proc.pid
        host, _, port = self.plan.listen.rpartition(":")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self._proc.returncode is not None:
                err = (await self._proc.stderr.read()).decode(errors="replace")
                raise RuntimeError(f"nginx exited at start: {err or self.error_log()}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(host, int(port))
                writer.close()
                await writer.wait_closed()
                return
            if loop.time() > deadline:
                raise TimeoutError(f"nginx did not listen on {self.plan.listen}")
            await asyncio.sleep(0.05)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def wait(self) -> int:
        assert self._proc is not None
        return await self._proc.wait()

    def _children(self) -> dict[int, bytes]:
        """The master's processes (its nginx workers): pid -> command line
        (the title, ``nginx: worker process [is shutting down]``)."""
        return children(self._proc.pid) if self._proc is not None else {}

    async def reload(self, plan: RouterPlan, timeout_s: float = 10.0) -> None:
        """A new plan (instances joined or left, one out of routing or back):
        nginx starts new worker processes on it; the old ones finish their
        connections. Returns once no old worker takes new connections (each
        has exited or is shutting down: its listening socket closed), so a
        request sent after it meets the new plan."""
        self.write(plan)
        await self.check()
        if not self.running:
            return
        before = set(self._children())
        self._proc.send_signal(signal.SIGHUP)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.running and loop.time() < deadline:
            now = self._children()
            serving = {pid for pid, cmd in now.items() if b"shutting down" not in cmd}
            if serving and not serving & before:
                return
            await asyncio.sleep(0.02)
        if self.running:
            log.warning("nginx reload: old workers still serving after %.0f s", timeout_s)

    async def stop(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()  # fast shutdown: open sockets close now
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self.reap()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def error_log(self) -> str:
        path = self.run_dir / "error.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""
