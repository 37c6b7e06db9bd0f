"""Pipecat's ``TwilioFrameSerializer`` (unmodified) on both sides of our
Twilio Media Stream. Pipecat is itself a Twilio *server*: its ``serialize``
writes what a server sends Twilio (``media`` from an audio frame, ``clear``
from an interruption), its ``deserialize`` reads what Twilio sends a server
(``media``, ``dtmf``). So:

- our server reads what Pipecat writes: the caller's audio reaches our
  stream as the ``media`` messages Pipecat's ``serialize`` makes of it;
- Pipecat reads what our server writes: every ``media`` we send is handed
  to Pipecat's ``deserialize``, which must give back 8 kHz audio frames.

The ``connected``/``start`` messages and the mark echoes are Twilio's, as
Twilio's reference shows them (Pipecat has no code for that side). The
observations go to the test as JSON (``harness``).
"""

from __future__ import annotations

import asyncio
import json
import time
import xml.etree.ElementTree as ET

import httpx
import websockets
from harness import arguments, main, read_wav
from pipecat.frames.frames import InputAudioRawFrame, InterruptionFrame, OutputAudioRawFrame
from pipecat.processors.frame_processor import FrameProcessorSetup
from pipecat.serializers.twilio import TwilioFrameSerializer

STREAM_SID, CALL_SID = "MZpipecat0000000000000000000000000", "CApipecat0000000000000000000000000"


async def twiml(base_url: str) -> tuple[str, dict[str, str]]:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{base_url}/v1/telephony/twilio/voice",
                            data={"CallSid": CALL_SID, "From": "+15550100", "To": "+15550199"})
    r.raise_for_status()
    stream = ET.fromstring(r.text).find("./Connect/Stream")
    return stream.get("url"), {p.get("name"): p.get("value") for p in stream.findall("Parameter")}


async def interop(args) -> dict:
    serializer = TwilioFrameSerializer(STREAM_SID, params=TwilioFrameSerializer.InputParams(
        auto_hang_up=False))
    # what setup() reads of a pipeline: its input rate (Twilio's own 8 kHz here)
    await serializer.setup(FrameProcessorSetup(clock=None, task_manager=None,
                                               pipeline_worker=None, audio_in_sample_rate=8000))
    pcm, rate = read_wav(args.audio)
    url, params = await twiml(args.base_url)
    seen = {"ours_parsed": 0, "ours_rejected": [], "decoded_bytes": 0, "decoded_rates": set(),
            "peak": 0, "clears": 0, "marks": 0, "media_keys": set()}
    step = rate // 50 * 2  # 20 ms of PCM16
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await ws.send(json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": STREAM_SID,
                                  "start": {"accountSid": "AC0", "streamSid": STREAM_SID,
                                            "callSid": CALL_SID, "tracks": ["inbound"],
                                            "mediaFormat": {"encoding": "audio/x-mulaw",
                                                            "sampleRate": 8000, "channels": 1},
                                            "customParameters": params}}))

        async def speak() -> None:
            start = time.monotonic()
            for n, i in enumerate(range(0, len(pcm), step)):
                frame = OutputAudioRawFrame(audio=pcm[i:i + step], sample_rate=rate, num_channels=1)
                text = await serializer.serialize(frame)
                if text is not None:
                    await ws.send(text)
                await asyncio.sleep(max(0.0, start + (n + 1) * 0.02 - time.monotonic()))

        async def listen() -> None:
            quiet_since = None
            while True:
                try:
                    text = await asyncio.wait_for(ws.recv(), 0.2)
                except TimeoutError:
                    if seen["decoded_bytes"] and quiet_since and time.monotonic() - quiet_since > 1.5:
                        return  # the reply is over
                    continue
                message = json.loads(text)
                if message["event"] == "media":
                    quiet_since = time.monotonic()
                    seen["media_keys"] |= {"/".join(("media", k)) for k in message["media"]}
                    frame = await serializer.deserialize(text)
                    if not isinstance(frame, InputAudioRawFrame):
                        seen["ours_rejected"].append(text[:200])
                        continue
                    seen["ours_parsed"] += 1
                    seen["decoded_bytes"] += len(frame.audio)
                    seen["decoded_rates"].add(frame.sample_rate)
                    samples = memoryview(frame.audio).cast("h")
                    seen["peak"] = max(seen["peak"], max(abs(s) for s in samples))
                elif message["event"] == "mark":  # Twilio echoes it once played: at once, here
                    seen["marks"] += 1
                    await ws.send(text)
                elif message["event"] == "clear":
                    seen["clears"] += 1

        listener = asyncio.create_task(listen())
        await speak()
        await listener
        await ws.send(json.dumps({"event": "stop", "sequenceNumber": "99", "streamSid": STREAM_SID,
                                  "stop": {"accountSid": "AC0", "callSid": CALL_SID}}))
        try:
            await asyncio.wait_for(ws.recv(), 10)
        except websockets.ConnectionClosed as closed:
            seen["closed"] = [closed.rcvd.code, closed.rcvd.reason] if closed.rcvd else None
    # what Pipecat writes for 20 ms of silence and for an interruption, as it is
    seen["pipecat_media"] = await serializer.serialize(
        OutputAudioRawFrame(audio=b"\x00\x00" * 160, sample_rate=8000, num_channels=1))
    seen["pipecat_clear"] = await serializer.serialize(InterruptionFrame())
    return {k: sorted(v) if isinstance(v, set) else v for k, v in seen.items()}


if __name__ == "__main__":
    main({"interop": interop}, arguments())
