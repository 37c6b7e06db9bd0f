"""``vllm-duplex serve`` beyond loopback: refused without API keys, open only
with ``--allow-unauthenticated``, guarded with keys -- the real CLI in a
subprocess (the model-free scripted config), reached over this machine's
non-loopback address."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).with_name("vllm-duplex")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def lan_address() -> str:
    """An address of this machine that is not loopback (a UDP socket's
    source address toward a private network; nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        addr = s.getsockname()[0]
    if addr.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address")
    return addr


def serve(*extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proc = subprocess.Popen([str(CLI), "serve", "--config", "scripted", "--host", "0.0.0.0",
                             "--port", str(port), *extra], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    return proc, port


def get(url: str, key: str | None = None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            json.load(r)
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_up(proc: subprocess.Popen[str], url: str, key: str | None = None) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            return get(url, key)
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(url)


def stopped(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    return out


def test_an_exposed_server_without_keys_is_refused_and_never_listens():
    proc, port = serve()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "refusing to serve on 0.0.0.0 without API keys" in err
    assert "api_keys" in err and "--allow-unauthenticated" in err
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_allow_unauthenticated_serves_it_open_and_says_so():
    host = lan_address()
    proc, port = serve("--allow-unauthenticated")
    try:
        assert wait_up(proc, f"http://{host}:{port}/v1/models") == 200  # no key, from the LAN side
    finally:
        out = stopped(proc)
    assert "API keys: none -- open to anyone who can reach 0.0.0.0" in out


def test_with_keys_it_serves_and_every_request_needs_one():
    host = lan_address()
    proc, port = serve(env={"VLLM_DUPLEX_API_KEYS": "sk-door"})
    try:
        assert wait_up(proc, f"http://{host}:{port}/v1/models") == 401
        assert get(f"http://{host}:{port}/v1/models", "sk-door") == 200
        assert get(f"http://{host}:{port}/v1/models", "sk-wrong") == 401
    finally:
        out = stopped(proc)
    assert "API keys: 1 configured" in out
