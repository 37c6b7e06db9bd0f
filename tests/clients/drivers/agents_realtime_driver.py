"""The official browser SDK, ``@openai/agents-realtime`` (npm, installed by
scripts/setup.sh into ``.venv-clients/npm``), in Debian's Chromium, headless,
driven by Playwright with a fake microphone (a WAV).

The page is a ``RealtimeAgent`` with one tool (``get_weather``) in a
``RealtimeSession``, connected with the SDK's defaults -- its model, its
session config, its transports -- and only the URL changed to this server:
the ``webrtc`` scenario uses its WebRTC transport (``POST /v1/realtime/calls``,
the microphone by ``getUserMedia``, the reply on a peer-connection track),
the ``websocket`` scenario its WebSocket transport (the page streams the WAV
with ``sendAudio``). The key is an ephemeral client key the driver mints
first, as an app's backend would (the SDK refuses a plain key in a browser).
The SDK's bundle and the page are served to the browser by Playwright
(``page.route``) on the server's own origin; nothing is fetched elsewhere.

Each scenario: the user asks, the agent calls its tool, the tool's output
goes back, the spoken answer is heard (WebRTC: the inbound track's audio
energy in ``getStats``; WebSocket: the SDK's ``audio`` events), then
``session.interrupt()`` while it speaks, then ``session.close()``.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from harness import arguments, main
from playwright.async_api import async_playwright

CHROMIUM = "/usr/bin/chromium"
BUNDLE = (Path(__file__).resolve().parents[3] / ".venv-clients" / "npm" / "node_modules"
          / "@openai" / "agents-realtime" / "dist" / "bundle")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--autoplay-policy=no-user-gesture-required",
         # ICE on loopback: the server offers only 127.0.0.1 candidates, and the
         # page's own must be plain addresses (no mDNS names) to reach it
         "--allow-loopback-in-peer-connection",
         # the page is fulfilled by Playwright, not fetched: Chromium cannot tell
         # its address space, and would block its socket to the loopback server
         "--disable-features=WebRtcHideLocalIpsWithMdns,LocalNetworkAccessChecks"]

PAGE = """<!doctype html><meta charset="utf-8"><title>agents-realtime</title>
<script type="module">
import { RealtimeAgent, RealtimeSession, tool } from './openai-realtime-agents.mjs';
const d = window.sdk = { events: [], tools: [], errors: [], audioBytes: 0, history: [],
                         connected: false, closed: false };
const getWeather = tool({
  name: 'get_weather', description: 'The weather in a city.',
  parameters: { type: 'object', properties: { city: { type: 'string' } },
                required: ['city'], additionalProperties: false },
  strict: true,
  execute: async ({ city }) => { d.tools.push(city); return `sunny in ${city}`; },
});
const agent = new RealtimeAgent({ name: 'Assistant', instructions: 'Answer briefly.',
                                  tools: [getWeather] });
window.start = async (transport, url, apiKey) => {
  const session = window.session = new RealtimeSession(agent, { transport });
  session.transport.on('*', (e) => d.events.push(e.type === 'error' ? {type: 'error', error: e.error}
      : e.type === 'response.done' ? {type: e.type, status: e.response.status} : {type: e.type}));
  session.on('audio', (e) => { d.audioBytes += e.data.byteLength; });
  session.on('error', (e) => d.errors.push(String(e.error?.message ?? e.error ?? e)));
  session.on('history_updated', (h) => { d.history = h.map((i) => ({type: i.type, role: i.role,
      status: i.status, name: i.name, output: i.output,
      text: (i.content || []).map((c) => c.transcript ?? c.text ?? '').join(' ')})); });
  await session.connect({ apiKey, url });
  d.connected = true;
  d.energy = 0;
  if (transport === 'webrtc') setInterval(async () => { d.energy = await window.energy(); }, 100);
};
window.energy = async () => {
  const pc = window.session.transport.connectionState.peerConnection;
  if (!pc) return 0;
  let energy = 0;
  (await pc.getStats()).forEach((s) => { if (s.type === 'inbound-rtp' && s.kind === 'audio')
      energy = s.totalAudioEnergy || 0; });
  return energy;
};
window.sendWav = async (bytes) => {   // the WebSocket transport: PCM16 24 kHz, 20 ms chunks
  const pcm = new Uint8Array(bytes);
  const step = 960;
  const t0 = performance.now();
  for (let i = 0, n = 0; i < pcm.length; i += step, n++) {
    window.session.sendAudio(pcm.slice(i, i + step).buffer);
    const wait = t0 + (n + 1) * 20 - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  }
};
window.ready = true;
</script>"""


def mint(base_url: str, api_key: str) -> str:
    """What the app's backend does: an ephemeral key for the browser."""
    req = urllib.request.Request(base_url + "/v1/realtime/client_secrets", data=b"{}", method="POST",
                                 headers={"Authorization": f"Bearer {api_key}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["value"]


async def scenario(args, transport: str) -> dict[str, Any]:
    flags = FLAGS + ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
                     f"--use-file-for-fake-audio-capture={args.audio}%noloop"]
    pw = await async_playwright().start()
    context = await pw.chromium.launch_persistent_context(
        tempfile.mkdtemp(prefix="duplex-agents-rt-"), executable_path=CHROMIUM, headless=True,
        args=flags)
    try:
        page = context.pages[0] if context.pages else await context.new_page()
        console: list[str] = []
        requests: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
        page.on("request", lambda r: requests.append(r.url))

        async def serve_sdk(route) -> None:
            name = route.request.url.split("/sdk/", 1)[1].split("?")[0]
            if name in ("", "index.html"):
                await route.fulfill(body=PAGE, content_type="text/html")
            else:
                await route.fulfill(path=str(BUNDLE / name), content_type="text/javascript")

        await page.route("**/sdk/**", serve_sdk)
        await page.goto(args.base_url + "/sdk/")
        await page.wait_for_function("() => window.ready === true", timeout=30_000)
        key = mint(args.base_url, args.api_key)
        if transport == "webrtc":
            url = args.base_url + "/v1/realtime/calls"
        else:
            url = args.base_url.replace("http", "ws", 1) + "/v1/realtime"
        out: dict[str, Any] = {"transport": transport}
        try:
            await page.evaluate("([t, u, k]) => window.start(t, u, k)", [transport, url, key])
        except Exception as exc:  # noqa: BLE001 -- the SDK's connect failed: what it said
            raise RuntimeError(f"connect failed: {exc}; console: {console[-10:]}") from None
        if transport == "websocket":  # the SDK takes audio from the app here
            wav = Path(args.audio).read_bytes()[44:]
            asyncio.ensure_future(page.evaluate("(b) => window.sendWav(b)", list(wav)))

        async def until(predicate: str, timeout: float) -> bool:
            try:
                await page.wait_for_function(f"() => {{ const d = window.sdk; return {predicate}; }}",
                                             timeout=timeout * 1000)
                return True
            except Exception:  # noqa: BLE001 -- a miss is an observation
                return False

        out["tool_called"] = await until("d.tools.length > 0", args.timeout)
        # the answer after the tool's output: audio of the second response
        out["answer_started"] = await until(
            "d.events.filter(e => e.type === 'response.created').length >= 2", args.timeout)
        if transport == "webrtc":
            # the reply track's audio, as the browser decoded it (inbound-rtp stats)
            out["heard"] = await until("d.energy > 0.0001", args.timeout)
            out["audio_energy"] = await page.evaluate("() => window.sdk.energy")
        else:
            out["heard"] = await until("d.audioBytes > 9600", args.timeout)
        out["audio_bytes"] = await page.evaluate("() => window.sdk.audioBytes")
        mark = await page.evaluate("() => window.sdk.events.length")
        await page.evaluate("() => window.session.interrupt()")
        # what the server answers to it: the track cut (WebRTC), the item cut
        # to what the SDK played (WebSocket), or the reply cancelled
        answer = ("output_audio_buffer.cleared" if transport == "webrtc"
                  else "conversation.item.truncated")
        out["interrupted"] = await until(
            f"d.events.slice({mark}).some(e => e.type === '{answer}')", 15)
        await until(f"d.events.slice({mark}).some(e => e.type === 'response.done')", 15)
        # Over WebRTC the item is cut by the call's own truncate, which the
        # session takes after the SDK's response.cancel: it follows response.done.
        await until(f"d.events.slice({mark}).some(e => e.type === 'conversation.item.truncated')", 15)
        out["after_interrupt"] = await page.evaluate(f"() => window.sdk.events.slice({mark})")
        state = await page.evaluate("() => window.sdk")
        out.update(events=[e["type"] for e in state["events"]],
                   errors=state["errors"] + [e for e in state["events"] if e["type"] == "error"],
                   tools=state["tools"], history=state["history"])
        await page.evaluate("() => window.session.close()")
        out["console"] = [c for c in console if "error" in c.lower()][-20:]
        out["requests"] = sorted({r.split("?")[0] for r in requests})
        return out
    finally:
        await context.close()
        await pw.stop()


async def webrtc(args) -> dict[str, Any]:
    return await scenario(args, "webrtc")


async def websocket(args) -> dict[str, Any]:
    return await scenario(args, "websocket")


if __name__ == "__main__":
    main({"webrtc": webrtc, "websocket": websocket}, arguments())
