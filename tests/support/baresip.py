"""Debian's baresip, a real SIP phone, driven from a test.

``Baresip`` writes a config directory (``-f``): no sound card -- the
``aufile`` module plays a WAV as the microphone, ``aubridge`` stands in for
the speaker, and ``sndfile`` records what the phone hears (``dump-…-dec.wav``)
-- and drives the phone over its ``ctrl_tcp`` socket (netstring JSON:
``dial``, ``sndcode``, ``hangup``), reading its call events back.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import shutil
import socket
import tempfile
import wave
from pathlib import Path
from typing import Any

import numpy as np

RATE = 8000


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_wav(path: Path, pcm: np.ndarray, rate: int = RATE) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())


def read_wav(path: str) -> tuple[np.ndarray, int]:
    with wave.open(path, "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2"), w.getframerate()


class Baresip:
    """One baresip process; ``async with Baresip(wav) as phone: await phone.dial(uri)``."""

    def __init__(self, microphone: np.ndarray, *, transport: str = "udp",
                 codec: str = "PCMU") -> None:
        """``transport``: ``udp``, ``tcp`` or ``tls`` (baresip 1.0 does not
        check the server's certificate)."""
        self.dir = Path(tempfile.mkdtemp(prefix="baresip-"))
        self.ctrl_port = free_tcp_port()
        self.transport, self.codec = transport, codec
        self.events: list[dict[str, Any]] = []
        self._event = asyncio.Condition()
        self._responses: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._proc: asyncio.subprocess.Process | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None
        write_wav(self.dir / "mic.wav", microphone)

    def _config(self) -> str:
        return "\n".join([
            "poll_method epoll",
            "sip_listen 127.0.0.1:0",  # any free port (for UDP, TCP and TLS each)
            f"audio_player aubridge,speaker",
            f"audio_source aufile,{self.dir / 'mic.wav'}",
            "audio_alert aubridge,alert",
            "ausrc_srate 8000", "auplay_srate 8000", "ausrc_channels 1", "auplay_channels 1",
            "audio_buffer 20-160",
            "jitter_buffer_delay 1-4",
            "rtp_ports 20000-40000",
            f"snd_path {self.dir}",
            "module_path /usr/lib/baresip/modules",
            "module g711.so", "module aufile.so", "module aubridge.so", "module sndfile.so",
            "module_app account.so", "module_app menu.so", "module_app ctrl_tcp.so",
            f"ctrl_tcp_listen 127.0.0.1:{self.ctrl_port}",
            "",
        ])

    async def __aenter__(self) -> Baresip:
        (self.dir / "config").write_text(self._config())
        (self.dir / "accounts").write_text(
            f"<sip:caller@127.0.0.1;transport={self.transport}>;regint=0;"
            f"audio_codecs={self.codec}/8000/1\n")
        (self.dir / "contacts").write_text("")
        self._proc = await asyncio.create_subprocess_exec(
            "baresip", "-f", str(self.dir), stdin=asyncio.subprocess.DEVNULL,
            stdout=open(self.dir / "stdout.log", "wb"), stderr=asyncio.subprocess.STDOUT)
        for _ in range(200):
            try:
                reader, self._writer = await asyncio.open_connection("127.0.0.1", self.ctrl_port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError("baresip did not open its control socket: " + self.log())
        self._reader_task = asyncio.create_task(self._read(reader), name="baresip-ctrl")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), 5)
            except asyncio.TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        try:
            return (self.dir / "stdout.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            length = await reader.readuntil(b":")
            data = await reader.readexactly(int(length[:-1]))
            await reader.readexactly(1)  # the netstring's ","
            message = json.loads(data)
            if message.get("event"):
                async with self._event:
                    self.events.append(message)
                    self._event.notify_all()
            elif message.get("response"):
                await self._responses.put(message)

    async def command(self, command: str, params: str = "") -> dict[str, Any]:
        assert self._writer is not None
        body = json.dumps({"command": command, "params": params, "token": command}).encode()
        self._writer.write(b"%d:%s," % (len(body), body))
        await self._writer.drain()
        return await asyncio.wait_for(self._responses.get(), 10)

    async def event(self, kind: str, timeout: float = 20.0) -> dict[str, Any]:
        """The first event of ``kind`` (``CALL_ESTABLISHED``, ``CALL_CLOSED`` ...)."""
        async with self._event:
            await asyncio.wait_for(self._event.wait_for(
                lambda: any(e.get("type") == kind for e in self.events)), timeout)
            return next(e for e in self.events if e.get("type") == kind)

    async def dial(self, uri: str) -> None:
        await self.command("dial", uri)

    async def send_digits(self, digits: str, gap_s: float = 0.3) -> None:
        for digit in digits:
            await self.command("sndcode", digit)
            await asyncio.sleep(gap_s)

    async def hangup(self) -> None:
        await self.command("hangup")

    def heard(self) -> np.ndarray:
        """What the phone received (its decoded audio, recorded by sndfile)."""
        return self._recording("dec")

    def said(self) -> np.ndarray:
        """What the phone sent (its microphone as encoded, recorded by sndfile)."""
        return self._recording("enc")

    def _recording(self, which: str) -> np.ndarray:
        files = sorted(glob.glob(os.path.join(self.dir, f"dump-*-{which}.wav")))
        if not files:
            raise AssertionError("sndfile recorded nothing: " + self.log())
        pcm, rate = read_wav(files[-1])
        assert rate == RATE, rate
        return pcm
