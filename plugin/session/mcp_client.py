"""The MCP I/O of one session, in its runner: lists a server's tools and
calls them with the official ``mcp`` SDK, each in a task of its own, and
hands the result back to the session's mailbox as a message
(``mcp_calls.McpToolsListed`` / ``McpToolCalled``). The session core asked
for it by an effect and goes on meanwhile: a slow server holds no audio.

Transport: a ``server_url`` whose path ends in ``/sse`` is the SDK's SSE
transport (servers that still use it); any other, streamable HTTP. Each list
and each call opens its own MCP session (initialize, the request, close:
the SDK's DELETE ends the server's side), under one deadline
(``SessionLimits.mcp_timeout_s``) for all of it; nothing is kept open
between calls, so nothing leaks when the session goes, and ``close`` cancels
what still runs.

Every failure becomes the item's typed error, never an exception in the
session: an HTTP status from the server is ``http_error`` with it; no answer
in time is ``http_error`` 504, no connection 502 (the engine is the
gateway between the model and the server); a JSON-RPC error is
``protocol_error`` with its code; a tool that reports ``isError`` is
``tool_execution_error`` with its text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx2
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import PaginatedRequestParams

from vllm_duplex.domain import mcp
from vllm_duplex.session.mcp_calls import CallMcpTool, ListMcpTools, McpToolCalled, McpToolsListed

log = logging.getLogger(__name__)

MAX_PAGES = 32  # a server that pages on and on is cut off here
# A tool's output goes into events (the journal, the socket) and the model's
# context: past this many characters the call fails, typed, rather than
# flooding both (the small models' context holds a few thousand tokens).
MAX_OUTPUT_CHARS = 256 * 1024


_tls: ssl.SSLContext | None = None


async def _tls_context() -> ssl.SSLContext:
    """httpx2's default TLS context, made once per process and off the loop:
    making one reads the CA bundle from disk (tens of ms; seconds were seen
    under load, a stalled loop), and httpx2 makes one for every new client,
    for http:// too. One context serves any number of connections."""
    global _tls
    if _tls is None:
        _tls = await asyncio.to_thread(httpx2.create_ssl_context)
    return _tls


@contextlib.asynccontextmanager
async def _connect(server: dict[str, Any], timeout_s: float,
                   refused: list[int]) -> AsyncIterator[ClientSession]:
    """An initialized MCP session with ``server``; ``refused`` gathers the
    HTTP error statuses it answered (the SDK turns them into a JSON-RPC error
    that no longer says which)."""
    url = server["server_url"]
    headers = mcp.request_headers(server)

    async def status(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            refused.append(response.status_code)

    tls = await _tls_context()

    def client(headers: Any = None, timeout: Any = None, auth: Any = None) -> httpx2.AsyncClient:
        # (the SDK's own factory, but with the process's TLS context: see _tls_context)
        return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, verify=tls,
                                  event_hooks={"response": [status]})

    if urlsplit(url).path.rstrip("/").endswith("/sse"):
        transport = sse_client(url, headers=headers, timeout=timeout_s, sse_read_timeout=timeout_s,
                               httpx_client_factory=client)
    else:
        transport = _streamable(url, client(headers, httpx2.Timeout(timeout_s)))
    async with transport as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


@contextlib.asynccontextmanager
async def _streamable(url: str, http: httpx2.AsyncClient) -> AsyncIterator[Any]:
    async with http, streamable_http_client(url, http_client=http) as streams:
        yield streams


def _leaves(exc: BaseException) -> list[BaseException]:
    """The SDK's task groups wrap what failed in exception groups: the failures."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def error_of(exc: BaseException, timeout_s: float, refused: list[int]) -> dict[str, Any]:
    """A failure as the typed error an ``mcp_call`` (or the list's error event)
    carries (``refused``: the HTTP error statuses the server answered)."""
    leaves = _leaves(exc)
    if refused:
        return mcp.http_error(refused[-1], f"the MCP server answered HTTP {refused[-1]}")
    for leaf in leaves:
        if isinstance(leaf, MCPError):
            return mcp.protocol_error(leaf.error.code, leaf.error.message)
        if isinstance(leaf, httpx2.HTTPStatusError):
            return mcp.http_error(leaf.response.status_code,
                                  f"the MCP server answered HTTP {leaf.response.status_code}")
    for leaf in leaves:
        if isinstance(leaf, (TimeoutError, httpx2.TimeoutException)):
            return mcp.http_error(504, f"the MCP server did not answer within {timeout_s:g} s")
        if isinstance(leaf, (httpx2.TransportError, OSError)):
            return mcp.http_error(502, f"the MCP server could not be reached ({type(leaf).__name__})")
    return mcp.protocol_error(-32603, f"the MCP exchange failed: {leaves[0]!r}"[:500])


def _tool(t: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": t.name, "input_schema": t.input_schema}
    if t.description:
        out["description"] = t.description
    if t.annotations is not None:
        out["annotations"] = t.annotations.model_dump(by_alias=True, exclude_none=True)
    return out


def _output(result: Any) -> str:
    """The result as the text the model reads: its text blocks, else its structured content."""
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content)
    return ""


class McpClients:
    """The session's MCP requests under way; ``deliver`` puts a result in its mailbox."""

    def __init__(self, deliver: Callable[[object], None], *, timeout_s: float, name: str) -> None:
        self._deliver = deliver
        self._timeout_s = timeout_s
        self._name = name
        self._tasks: set[asyncio.Task[None]] = set()

    def list(self, e: ListMcpTools) -> None:
        self._spawn(self._list(e), "list")

    def call(self, e: CallMcpTool) -> None:
        self._spawn(self._call(e), "call")

    def _spawn(self, work: Any, what: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=f"duplex-mcp-{what}-{self._name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _list(self, e: ListMcpTools) -> None:
        refused: list[int] = []
        try:
            async with asyncio.timeout(self._timeout_s):
                async with _connect(e.server, self._timeout_s, refused) as session:
                    tools: list[dict[str, Any]] = []
                    cursor = None
                    for _ in range(MAX_PAGES):
                        params = PaginatedRequestParams(cursor=cursor) if cursor else None
                        page = await session.list_tools(params=params)
                        tools += [_tool(t) for t in page.tools]
                        cursor = page.next_cursor
                        if not cursor:
                            break
            message = McpToolsListed(e.item_id, tuple(tools))
        except Exception as exc:  # noqa: BLE001 -- every failure is the item's
            log.info("MCP server %s: listing failed: %r", e.server["server_label"], exc)
            message = McpToolsListed(e.item_id, error=error_of(exc, self._timeout_s, refused))
        self._deliver(message)

    async def _call(self, e: CallMcpTool) -> None:
        try:
            arguments = json.loads(e.arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("the arguments are not a JSON object")
        except ValueError as exc:
            self._deliver(McpToolCalled(e.item_id, error=mcp.protocol_error(
                -32602, f"the model's arguments are not a JSON object: {exc}")))
            return
        refused: list[int] = []
        try:
            async with asyncio.timeout(self._timeout_s):
                async with _connect(e.server, self._timeout_s, refused) as session:
                    result = await session.call_tool(e.name, arguments)
            output = _output(result)
            if len(output) > MAX_OUTPUT_CHARS:
                message = McpToolCalled(e.item_id, error=mcp.execution_error(
                    f"the tool's output ({len(output)} characters) is over the "
                    f"{MAX_OUTPUT_CHARS} this engine takes"))
            elif result.is_error:
                message = McpToolCalled(e.item_id, error=mcp.execution_error(output[:4096]))
            else:
                message = McpToolCalled(e.item_id, output=output)
        except Exception as exc:  # noqa: BLE001 -- every failure is the item's
            log.info("MCP server %s: call of %s failed: %r", e.server["server_label"], e.name, exc)
            message = McpToolCalled(e.item_id, error=error_of(exc, self._timeout_s, refused))
        self._deliver(message)

    async def close(self) -> None:
        """Cancel what still runs (its MCP sessions and HTTP connections close with it)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
