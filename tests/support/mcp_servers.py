"""Real MCP servers for the MCP tests, in a subprocess of their own on
loopback (``python tests/support/mcp_servers.py PORT...``, or ``McpServers``).

Built on the official SDK (``MCPServer``, the former FastMCP):

* ``/mcp`` on the first port: ``add`` (read-only), ``multiply``, ``slow``
  (sleeps far past any test's timeout), ``big`` (300 KiB of text), ``broken``
  (raises: an ``isError`` result), over streamable HTTP;
* the second port: the same tools, behind a check that answers 401 unless
  the request carries ``Authorization: Bearer s3cret`` and ``X-Tenant: acme``;
* the third port: the same tools over the SDK's SSE transport (``/sse``);
* the fourth: the published ``mcp-server-time`` package's server (its own
  ``create_server``: its tools, schemas and handlers) over streamable HTTP --
  it ships only a stdio entry point, and the Realtime API takes a URL.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

TOKEN = "s3cret"
TENANT = "acme"


def _demo():
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    server = MCPServer("duplex-test")

    # Every tool takes the scripted LLM's one set of arguments (a, b): the
    # model calls whichever tool a test lets it see.
    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    @server.tool()
    async def slow(a: int = 0, b: int = 0) -> str:
        """Answer after ten minutes."""
        await asyncio.sleep(600)
        return "late"

    @server.tool()
    def big(a: int = 0, b: int = 0) -> str:
        """A very long answer."""
        return "x" * (300 * 1024)

    @server.tool()
    def broken(a: int = 0, b: int = 0) -> str:
        """Always fails."""
        raise ToolError("the broken tool is broken")

    return server


def _guarded(app):
    """401 unless the request carries the token and the tenant header."""
    async def guard(scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if headers.get("authorization") != f"Bearer {TOKEN}" or headers.get("x-tenant") != TENANT:
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)
    return guard


async def _serve(ports: list[int]) -> None:
    import uvicorn
    from mcp_server_time.server import create_server

    apps = [_demo().streamable_http_app(), _guarded(_demo().streamable_http_app()),
            _demo().sse_app(), create_server("UTC").streamable_http_app()]
    servers = [uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
               for port, app in zip(ports, apps)]
    await asyncio.gather(*(s.serve() for s in servers))


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class McpServers:
    """The servers' subprocess; ``url(i)`` the MCP endpoint of the i-th."""

    def __init__(self) -> None:
        self.ports = free_ports(4)
        self.proc: subprocess.Popen | None = None

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}" + ("/sse" if i == 2 else "/mcp")

    def start(self) -> McpServers:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__)), *map(str, self.ports)],
                                     env=env)
        deadline = time.monotonic() + 60
        for port in self.ports:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError("the MCP test servers did not start")
                    time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    import logging

    logging.disable(logging.INFO)  # the SDK logs every request at INFO
    asyncio.run(_serve([int(p) for p in sys.argv[1:5]]))
