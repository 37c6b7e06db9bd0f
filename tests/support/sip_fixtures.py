"""For the SIP call tests: a server with ``sip:``, the webhook receiver the
server rings, and a raw SIP sender for what no phone would send."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import socket
from typing import Any

import numpy as np
from vllm_duplex.host.deploy import DeployConfig
from vllm_duplex.host.sip import Sip

SECRET = "whsec_" + base64.b64encode(b"a test secret of 32 bytes, fixed").decode()
RATE = 8000


def with_sip(config: DeployConfig, **sip: Any) -> DeployConfig:
    return dataclasses.replace(config, sip=Sip(port=0, **sip))


def tone8k(seconds: float, freq: float = 220.0, level: float = 0.3) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * freq * t) * level * 32767).astype(np.int16)


def silence8k(seconds: float) -> np.ndarray:
    return np.zeros(int(RATE * seconds), np.int16)


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if pcm.size else 0.0


class WebhookReceiver:
    """A tiny HTTP server on loopback: every POST is kept (headers, body)
    and answered 200 -- what an application's webhook endpoint is."""

    def __init__(self) -> None:
        self.deliveries: asyncio.Queue[tuple[dict[str, str], bytes]] = asyncio.Queue()
        self._server: asyncio.AbstractServer | None = None
        self.url = ""

    async def __aenter__(self) -> WebhookReceiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/hooks/calls"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:  # one request per connection: nothing waits on a kept-alive one
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.partition(":") for line in lines[1:] if line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            await self.deliveries.put((headers, body))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def next(self, timeout: float = 10.0) -> tuple[dict[str, str], bytes, dict[str, Any]]:
        headers, body = await asyncio.wait_for(self.deliveries.get(), timeout)
        return headers, body, json.loads(body)


def sip_exchange(port: int, message: bytes, *, tcp: bool = False, timeout: float = 5.0
                 ) -> bytes:
    """Send one raw message to the agent; its first answer (blocking: run it
    in a thread)."""
    if tcp:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(message)
            return s.recv(65536)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(message, ("127.0.0.1", port))
        return s.recv(65536)


def raw_request(method: str, port: int, *, call_id: str = "raw-1@test", extra: str = "",
                body: str = "") -> bytes:
    return (f"{method} sip:agent@127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK{call_id.split('@')[0]}\r\n"
            "Max-Forwards: 70\r\nFrom: <sip:tester@127.0.0.1>;tag=t1\r\n"
            f"To: <sip:agent@127.0.0.1>\r\nCall-ID: {call_id}\r\nCSeq: 1 {method}\r\n"
            f"{extra}Content-Length: {len(body.encode())}\r\n\r\n{body}").encode()
