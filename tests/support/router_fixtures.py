"""Real ``vllm-duplex serve --workers N`` (and ``edge``) processes on loopback
for the router tests: the CLI as a user runs it, nginx included.

``Serve`` starts the command with a temporary copy of a config, waits until
its ``/health`` answers with every worker up, and stops it (SIGTERM: nginx,
workers and all) at the end, waiting for it to exit; ``kill_machine`` ends
one with kill -9 as a lost machine would (its supervisor, workers and nginx).
The realtime text helpers (``open_text``, ``say``, ``assert_lossless``) are
the fault tests' caller.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from vllm_duplex.fleet.nginx import children
from vllm_duplex.host.deploy import resolve_config_path
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import free_port


def get_json(url: str, headers: dict[str, str] | None = None, method: str = "GET",
             body: bytes | None = None, timeout: float = 10.0) -> tuple[int, Any, Any]:
    """(status, headers (case-insensitive), JSON body) of one plain HTTP request."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, head, raw = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        status, head, raw = err.code, err.headers, err.read()
    try:
        return status, head, json.loads(raw) if raw else None
    except ValueError:
        return status, head, raw.decode(errors="replace")


class Serve:
    """``vllm-duplex <argv>`` with ``config`` (a dict) written to a temp file."""

    def __init__(self, config: dict[str, Any] | None, *argv: str, port: int | None = None,
                 ready_timeout_s: float = 120.0, new_session: bool = False) -> None:
        self.port = port or free_port()
        self.dir = tempfile.TemporaryDirectory(prefix="duplex-router-test-")
        self.argv = list(argv)
        if config is not None:
            path = Path(self.dir.name) / "config.yaml"
            path.write_text(yaml.safe_dump(config))
            self.argv += ["--config", str(path)]
        self.ready_timeout_s = ready_timeout_s
        self.new_session = new_session  # its own process group (kill_machine)
        self.log = Path(self.dir.name) / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.last_output = ""

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    def start(self, *, expect_workers: int | None = None) -> Serve:
        where = (["--listen", f"127.0.0.1:{self.port}"] if self.argv[0] == "edge"
                 else ["--port", str(self.port)])
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vllm_duplex.cli", *self.argv, *where],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=self.new_session)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                status, _, body = get_json(self.http + "/health", timeout=2)
            except OSError:
                status, body = 0, None
            if status == 200 and (expect_workers is None or self.workers_up(body) == expect_workers):
                return self
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"serve did not become healthy:\n{self.output()}")

    @staticmethod
    def workers_up(health: Any) -> int:
        workers = (health or {}).get("workers") or {}
        return sum(1 for w in workers.values() if w.get("serving"))

    def health(self) -> dict[str, Any]:
        return get_json(self.http + "/health")[2]

    def output(self) -> str:
        if self.proc is None and self.last_output:
            return self.last_output
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM and wait; the exit code (uvicorn re-raises SIGTERM on the way
        out, so a lone server ends with -15; the supervisor exits 0)."""
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        self.last_output = self.output()
        self.dir.cleanup()
        return code


def scripted_workers(count: int = 2, *, limits: dict[str, Any] | None = None,
                     **workers: Any) -> dict[str, Any]:
    """``configs/scripted-workers.yaml`` with ``workers: {count, **workers}`` and ``limits``."""
    raw = yaml.safe_load(resolve_config_path("scripted-workers").read_text())
    raw["limits"] = {**raw.get("limits", {}), **(limits or {})}
    raw["workers"] = {"count": count, "restart_backoff_s": 0.2, **workers}
    return raw


async def wait_until(predicate, timeout: float = 60.0, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(every)


def owner(client: RealtimeClient) -> str:
    """The owner a minted realtime session id names."""
    return client.session_id.rsplit(".", 1)[1]


def child_pid(parent: int, name: str) -> int:
    """The pid of ``parent``'s child process running ``name`` (from /proc)."""
    for pid, cmd in children(parent).items():
        if name.encode() in cmd:
            return pid
    raise LookupError(name)


def kill_machine(serve: Serve) -> None:
    """kill -9 a ``serve --workers N`` started with ``new_session``: its
    process group (supervisor, workers) and its nginx's (own group), as a
    machine that is lost; its router then refuses connections."""
    assert serve.proc is not None and serve.new_session
    nginx = child_pid(serve.proc.pid, "nginx")
    # (nginx rewrites its title: "nginx: master process /usr/sbin/nginx -p <prefix> ...")
    cmd = Path(f"/proc/{nginx}/cmdline").read_bytes().replace(b"\0", b" ").split()
    prefix = Path(cmd[cmd.index(b"-p") + 1].decode()) if b"-p" in cmd else None
    nginx_group = os.getpgid(nginx)
    os.killpg(serve.proc.pid, signal.SIGKILL)
    os.killpg(nginx_group, signal.SIGKILL)
    serve.proc.wait(timeout=30)
    if prefix is not None and prefix.name.startswith("vllm-duplex-router-"):
        shutil.rmtree(prefix, ignore_errors=True)  # nobody is left to remove it


TEXT = {"output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}}


async def open_text(url: str) -> RealtimeClient:
    """A realtime session with text output and no turn detection."""
    c = await RealtimeClient.connect(url)
    await c.send({"type": "session.update", "session": TEXT})
    await c.wait_for("session.updated")
    return c


async def say(c: RealtimeClient, text: str, *, wait: bool = True) -> dict | None:
    """A user message and ``response.create``; the response once done."""
    await c.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await c.send({"type": "response.create"})
    if wait:
        return (await c.wait_for("response.done", timeout=30))["response"]
    return None


def reply_text(response: dict) -> str:
    return " ".join(p.get("text") or p.get("transcript") or ""
                    for item in response["output"] for p in item.get("content", []))


def assert_lossless(*sockets: RealtimeClient) -> None:
    """The seqs the caller got over all its sockets: each once, none missing."""
    seqs = [e["seq"] for c in sockets for e in c.events if isinstance(e.get("seq"), int)]
    assert len(seqs) == len(set(seqs)), "an event came twice"
    assert sorted(seqs) == list(range(1, max(seqs) + 1)), "an event is missing"
