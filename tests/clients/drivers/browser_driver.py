"""The playground page in a real browser: Debian's Chromium, headless, driven
by Playwright (``executable_path``: Playwright's own browser download is never
used), with a fake microphone (a WAV) and a fake camera (a Y4M). Each scenario
opens a fresh browser profile, reports what the page shows (``window.duplex``,
the visible problem box) and saves a screenshot under ``--out``."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import arguments, main
from playwright.async_api import async_playwright

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--autoplay-policy=no-user-gesture-required",
         # a WebRTC call on loopback: the server offers only 127.0.0.1; the page's
         # candidates must be plain addresses (no mDNS names) to reach it
         "--allow-loopback-in-peer-connection", "--disable-features=WebRtcHideLocalIpsWithMdns"]
STATE = "() => JSON.parse(JSON.stringify(window.duplex, (k, v) => k === 'li' ? undefined : v))"


async def page_for(args, *, microphone: bool = True, camera: bool = False):
    flags = list(FLAGS)
    if microphone:
        flags += ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
                  f"--use-file-for-fake-audio-capture={args.audio}%noloop"]
        if args.video:
            flags.append(f"--use-file-for-fake-video-capture={args.video}")
    else:  # a microphone that exists, and a permission prompt that is refused
        flags += ["--use-fake-device-for-media-stream", "--deny-permission-prompts"]
    pw = await async_playwright().start()
    profile = tempfile.mkdtemp(prefix="duplex-chromium-")
    context = await pw.chromium.launch_persistent_context(
        profile, executable_path=CHROMIUM, headless=True, args=flags,
        viewport={"width": 1180, "height": 760})
    page = context.pages[0] if context.pages else await context.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))

    async def close() -> None:
        await context.close()
        await pw.stop()

    return page, requests, console, close


async def open_and_connect(page, args, *, key: str | None = None, camera: bool = False) -> None:
    await page.goto(args.base_url + args.path)
    if key is not None:
        await page.fill("#key", key)
    if camera:
        await page.check("#camera")
    await page.click("#connect")


async def wait_state(page, predicate: str, timeout: float) -> bool:
    try:
        await page.wait_for_function(f"() => {{ const d = window.duplex; return {predicate}; }}",
                                     timeout=timeout * 1000)
        return True
    except Exception:  # noqa: BLE001 -- playwright's TimeoutError: a miss is an observation
        return False


async def report(page, requests, console, args, name: str) -> dict[str, Any]:
    shot = Path(args.out) / f"playground-{name}.png"
    await page.screenshot(path=str(shot), full_page=True)
    problem = await page.locator("#problem").inner_text() if await page.locator("#problem").is_visible() else ""
    return {"state": await page.evaluate(STATE), "problem_visible": problem, "requests": requests,
            "console": console[-20:], "screenshot": str(shot),
            "status_text": await page.locator("#status").inner_text(),
            "shown": {part: await page.locator(f"#{part}").inner_text()
                      for part in ("user", "assistant", "scene", "gap", "ttfa")}}


async def talk(args) -> dict[str, Any]:
    """The fake microphone asks something, then talks over the reply."""
    page, requests, console, close = await page_for(args, camera=args.camera)
    try:
        await open_and_connect(page, args, key=args.key, camera=args.camera)
        heard = await wait_state(page, "d.playedSamples > 0", args.wait)
        # what the scenario waits for next: a barge-in (scripted) or the transcript (real)
        done = await wait_state(page, args.until, args.wait) if args.until else None
        await asyncio.sleep(0.5)
        out = await report(page, requests, console, args, args.shot or "talk")
        out.update(heard=heard, done=done)
        await page.click("#hangup")
        return out
    finally:
        await close()


async def refused_key(args) -> dict[str, Any]:
    page, requests, console, close = await page_for(args)
    try:
        await open_and_connect(page, args, key="sk-wrong")
        await wait_state(page, "d.problem !== null", 15)
        return await report(page, requests, console, args, "refused-key")
    finally:
        await close()


async def full_server(args) -> dict[str, Any]:
    page, requests, console, close = await page_for(args)
    try:
        await open_and_connect(page, args, key=args.key)
        await wait_state(page, "d.problem !== null", 15)
        return await report(page, requests, console, args, "full")
    finally:
        await close()


async def denied_microphone(args) -> dict[str, Any]:
    page, requests, console, close = await page_for(args, microphone=False)
    try:
        await open_and_connect(page, args, key=args.key)
        await wait_state(page, "d.problem !== null", 15)
        return await report(page, requests, console, args, "denied-microphone")
    finally:
        await close()


async def resume(args) -> dict[str, Any]:
    """The socket drops mid-session; the page resumes it with its resume token."""
    page, requests, console, close = await page_for(args)
    try:
        await open_and_connect(page, args, key=args.key)
        await wait_state(page, "d.connected && d.received.includes('session.updated')", 15)
        before = await page.evaluate(STATE)
        started = time.monotonic()
        await page.evaluate("() => window.duplex.dropSocket()")
        resumed = await wait_state(page, "d.resumes === 1 && d.connected", 15)
        out = await report(page, requests, console, args, "resume")
        out.update(resumed=resumed, before=before, resume_s=round(time.monotonic() - started, 3))
        return out
    finally:
        await close()


if __name__ == "__main__":
    parser = arguments()
    parser.add_argument("--path", default="/")
    parser.add_argument("--key", default=None)
    parser.add_argument("--video", default=None, help="a Y4M for the fake camera")
    parser.add_argument("--camera", action="store_true", help="tick the page's camera box")
    parser.add_argument("--out", default=tempfile.gettempdir(), help="where screenshots go")
    parser.add_argument("--shot", default=None, help="the talk screenshot's name")
    parser.add_argument("--until", default="", help="a JS condition on d = window.duplex to wait for")
    parser.add_argument("--wait", type=float, default=20.0)
    main({"talk": talk, "refused_key": refused_key, "full_server": full_server,
          "denied_microphone": denied_microphone, "resume": resume}, parser)
