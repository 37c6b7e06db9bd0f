"""The native omni path for real: the omni policy and the ``vllm_omni`` stage
serving a tiny MiniCPM-o 4.5 (random weights, built locally) on vLLM's CPU
engine -- vLLM's ``MiniCPMO`` model class, its multimodal processor and
streaming input -- behind the realtime server that ``vllm-duplex serve
--config omni-tiny-cpu`` runs, with a real client.

The replies are random tokens; what is checked is the path: units of the
user's speech (and camera frames) rendered by vLLM's processor and appended
to the session's one live request while the user talks, the placeholders and
multimodal items vLLM saw, the prompt growing by exactly those chunks (no
re-prefill), the reply's tokens, a barge-in aborting the request and the
next turn replaying the context into a new one, and nothing left in the
engine after the session closes.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import time

import numpy as np
import pytest
import pytest_asyncio
from PIL import Image
from support.audio import b64
from support.omni_fixtures import audio_tokens, config, image_tokens
from support.speech_fixtures import RATE, chunks, speak
from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.omni import OmniInstructions, OmniUnit
from vllm_duplex.domain.payloads import GenerateRequest, GenerationDone, StageFailed, StageInput
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")  # the engine lives in that loop


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(tiny_omni_stage):
    async with BackgroundServer(Runtime(config(), shared_stages={"vllm_omni": tiny_omni_stage})) as srv:
        yield srv


def png(width: int, height: int, shade: int) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), shade, np.uint8)).save(buf, "PNG")
    return b64(buf.getvalue())


async def say(rt: RealtimeClient, pcm: np.ndarray, at: dict[float, dict] | None = None) -> float:
    """Stream ``pcm`` in 20 ms chunks at real time, sending the events of
    ``at`` (seconds into the audio -> event) on the way; returns when the
    last chunk holding speech was sent (``speak`` adds 1.2 s of silence)."""
    start = time.monotonic()
    pending = sorted((at or {}).items())
    speech_end = (len(pcm) / RATE - 1.2)
    sent_speech = start
    for i, chunk in enumerate(chunks(pcm)):
        t = i * 0.02
        while pending and pending[0][0] <= t:
            await rt.send(pending.pop(0)[1])
        await rt.append_audio(chunk)
        if t <= speech_end:
            sent_speech = time.monotonic()
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))
    return sent_speech


async def settled(engine, count: int, timeout: float = 30.0) -> None:
    """Until the engine holds ``count`` unfinished requests (aborts are async)."""
    async with asyncio.timeout(timeout):
        while engine.get_num_unfinished_requests() != count:
            await asyncio.sleep(0.05)


async def test_a_spoken_turn_with_frames_streams_into_one_live_request(server, tiny_omni_stage):
    stage = tiny_omni_stage
    baseline, rebuilds = stage.engine.get_num_unfinished_requests(), stage.rebuilds
    async with await RealtimeClient.connect(server.ws_url) as rt:
        sid = rt.session_id
        await rt.update_session({"audio": {"output": {"pacing": {"type": "none"}}}})
        # Between turns the newest frame waits for the next turn
        # (replace_latest_chunk): a large one, then a small one replacing it.
        await rt.send({"type": "duplex.video.frame", "image": png(1344, 1008, 40), "timestamp_ms": 0})
        await asyncio.sleep(0.3)
        await rt.send({"type": "duplex.video.frame", "image": png(112, 84, 80), "timestamp_ms": 600})
        await asyncio.sleep(0.3)
        # And one while the user talks, in a later unit.
        talking = {1.6: {"type": "duplex.video.frame", "image": png(96, 72, 120), "timestamp_ms": 2200}}
        spoke = await say(rt, speak("What is the capital of France?"), talking)
        reply = await rt.collect_response(timeout=120)
        port = stage.ports[sid]
        live = port.live
        assert live is not None

        # The tiny model never says <|im_end|> (minicpmo.never_ends): the reply
        # runs to the config's max_tokens. Its text is spoken by Flite.
        usage = reply.done["response"]["usage"]
        assert reply.status == "incomplete" and usage["output_tokens"] == 32, reply.done["response"]
        assert reply.audio and reply.transcript
        history = port.prompt.history
        kinds = [c.kind for c in history]
        units = [c for c in history if c.kind == "unit"]
        assert kinds == ["system", *["unit"] * len(units), "generation", "reply"] and len(units) >= 2

        # What vLLM's MiniCPM-o processor made of each chunk: one audio item
        # per unit with its placeholder expanded, one image item per frame.
        rendered = live.rendered
        assert len(rendered) == len(history)  # one request took every chunk
        for chunk, r in zip(history, rendered):
            if chunk.kind == "unit":
                assert r.items.get("audio") == 1
                assert r.item_tokens["audio"] == audio_tokens(chunk.audios[0].size)
                assert r.items.get("image", 0) == len(chunk.images)
                if chunk.images:
                    assert r.item_tokens["image"] == image_tokens()
            else:
                assert r.items == {}
        framed = [c for c in units if c.images]
        assert [c.images[0].shape for c in framed] == [(84, 112, 3), (72, 96, 3)]
        assert framed[0] is units[0]  # the frame seen before the turn opens it
        assert sum(r.items.get("image", 0) for r in rendered) == 2  # the large frame was replaced

        # Units reached vLLM while the user was still talking.
        first_unit = rendered[1]
        assert first_unit.at < spoke, (first_unit.at, spoke)

        # The KV grew by the appended chunks: the engine's prompt for the
        # request is the running sum of the rendered chunks, never re-prefilled.
        sums = list(itertools.accumulate(r.tokens for r in rendered))
        reply_start = sums[kinds.index("generation")]
        assert usage["input_tokens"] == reply_start
        assert live.prompt_lens == sorted(set(live.prompt_lens))
        assert set(live.prompt_lens) <= set(sums) and live.prompt_lens[-1] == reply_start
        assert live.cached_tokens == 0 and stage.rebuilds == rebuilds
        assert stage.engine.get_num_unfinished_requests() == baseline + 1  # the live request waits
    # Closing the session releases its request.
    await settled(stage.engine, baseline)


async def test_barge_in_aborts_the_request_and_the_next_turn_replays_the_context(server, tiny_omni_stage):
    stage = tiny_omni_stage
    baseline, aborted, rebuilds = (stage.engine.get_num_unfinished_requests(), stage.aborted_requests,
                                   stage.rebuilds)
    async with await RealtimeClient.connect(server.ws_url) as rt:
        sid = rt.session_id
        await rt.update_session({"output_modalities": ["text"], "max_output_tokens": 4000})
        await say(rt, speak("Tell me a very long story."))
        await rt.wait_for("response.output_text.delta", timeout=120)
        # The user talks over the reply: it is cancelled, its request aborted
        # (and the next reply is kept short).
        short = {1.0: {"type": "session.update", "session": {"max_output_tokens": 8}}}
        await say(rt, speak("Stop. What is the capital of France?"), short)
        first = await rt.collect_response(timeout=120)
        assert first.status == "cancelled"
        assert stage.aborted_requests > aborted
        second = await rt.collect_response(timeout=120)
        # The tiny model never ends a reply by itself (minicpmo.never_ends).
        assert second.status == "incomplete" and second.done["response"]["usage"]["output_tokens"] == 8
        port = stage.ports[sid]
        live = port.live
        kinds = [c.kind for c in port.prompt.history]
        # The context as the client got it: the cut reply kept as far as it was
        # sent, then the new turn's units, replayed into a new request...
        assert kinds.count("generation") == 2 and kinds[-1] == "reply"
        cut = port.prompt.history[kinds.index("reply")].text
        assert cut == first.text
        # One rebuild after the abort; one more when deltas the port had
        # released were still on their way at the cut (the client never got
        # them): the request that replayed them is replaced by the heard one.
        assert stage.rebuilds == rebuilds + 1 + port.heard_replays
        # ... which holds all of it: the replay is a re-prefill, chunk by chunk
        # (vLLM looks its prefix cache up for a streaming request's first
        # chunk only: README, "Known limits").
        assert live is not None and live.cached_tokens == 0
        sums = list(itertools.accumulate(r.tokens for r in live.rendered))
        assert len(live.rendered) == len(kinds)
        assert live.prompt_lens[-1] == sums[len(kinds) - 2] == second.done["response"]["usage"]["input_tokens"]
        assert stage.engine.get_num_unfinished_requests() == baseline + 1
    await settled(stage.engine, baseline)


async def turn(stage, session_id: str, units: list[OmniUnit], max_tokens: int = 4):
    """One turn straight into a port of ``stage``: the units, then a
    request; the port and its first terminal output (done or failed)."""
    fence = Fence(session_id)
    port = stage.port(session_id)
    await port.open(fence)
    stream = port.outputs()

    async def submit(payload: object) -> None:
        await port.submit(StageInput(fence, fence.request_id("omni"), payload))

    try:
        await submit(OmniInstructions("Be brief."))
        for u in units:
            await submit(u)
        await submit(GenerateRequest("r1", (), SamplingConfig(temperature=0.0, max_tokens=max_tokens)))
        async with asyncio.timeout(60):
            async for out in stream:
                if isinstance(out.payload, (GenerationDone, StageFailed)):
                    return port, out.payload
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    raise AssertionError("outputs ended")


async def test_a_unit_of_a_few_ms_still_reaches_the_model(tiny_omni_stage):
    """The last unit of a turn can be a few ms long: MiniCPM-o gives that no
    token and vLLM refuses it, so the stage pads it with silence."""
    from vllm_duplex.stages.omni.vllm_omni import VllmOmniStage

    stage = VllmOmniStage(engine=tiny_omni_stage.engine, dialect="minicpmo")
    baseline = stage.engine.get_num_unfinished_requests()
    port, done = await turn(stage, "omni-tiny-short", [OmniUnit(audio=np.zeros(160, np.int16), final=True)])
    try:
        assert isinstance(done, GenerationDone), done
        unit = port.live.rendered[1]
        assert unit.items == {"audio": 1} and unit.item_tokens["audio"] == audio_tokens(1600)
    finally:
        await port.close()
    await settled(stage.engine, baseline)


async def test_a_context_past_max_model_len_fails_its_turn_with_a_clear_error(tiny_omni_stage):
    from vllm_duplex.stages.omni.vllm_omni import VllmOmniStage

    small = VllmOmniStage(engine=tiny_omni_stage.engine, dialect="minicpmo", max_model_len=64)
    baseline = small.engine.get_num_unfinished_requests()
    second = np.zeros(16000, np.int16)  # each unit is about 14 tokens
    port, failed = await turn(small, "omni-tiny-limit", [OmniUnit(audio=second, start_ms=1000 * i)
                                                         for i in range(4)])
    try:
        assert isinstance(failed, StageFailed)
        assert failed.error.code == "stage_failed" and "max_model_len (64" in failed.error.message
    finally:
        await port.close()
    await settled(small.engine, baseline)


async def test_a_cut_reply_is_kept_as_the_client_got_it_even_when_the_port_released_more(
        tiny_omni_stage):
    """The race behind an intermittent failure of the barge-in test above: a
    reply is cut while deltas the port already released are still on their
    way to the session, so the client never gets them. The next reply's
    context (the session's conversation: what the client got) is what the
    model must hold, not what the port released -- here, deterministically,
    the client got the first delta only."""
    from vllm_duplex.domain.payloads import ContextMessage, TextDelta

    stage = tiny_omni_stage
    baseline, rebuilds = stage.engine.get_num_unfinished_requests(), stage.rebuilds
    fence = Fence("omni-tiny-cut-race")
    port = stage.port(fence.session_id)
    await port.open(fence)
    stream = port.outputs()
    unit = OmniUnit(audio=np.zeros(16000, np.int16), final=True)
    try:
        await port.submit(StageInput(fence, fence.request_id("omni"), unit))
        await port.submit(StageInput(fence, fence.request_id("omni"), GenerateRequest(
            "long", (), SamplingConfig(temperature=0.0, max_tokens=400))))
        deltas: list[str] = []
        async with asyncio.timeout(60):
            async for out in stream:
                if isinstance(out.payload, TextDelta):
                    deltas.append(out.payload.text)
                    if len(deltas) == 3:
                        break
        fence = fence.next_epoch()  # a barge-in: the session saw only the first delta
        await port.cancel(fence)
        released = [c.text for c in port.prompt.history if c.kind == "reply"][-1]
        assert released.startswith(deltas[0] + deltas[1] + deltas[2]) and released != deltas[0]
        await port.submit(StageInput(fence, fence.request_id("omni"), unit))
        heard = (ContextMessage("assistant", deltas[0]),)
        await port.submit(StageInput(fence, fence.request_id("omni"), GenerateRequest(
            "next", heard, SamplingConfig(temperature=0.0, max_tokens=2))))
        async with asyncio.timeout(60):
            async for out in stream:
                if isinstance(out.payload, (GenerationDone, StageFailed)) and \
                        getattr(out.payload, "response_id", "next") == "next":
                    assert isinstance(out.payload, GenerationDone), out.payload
                    break
        replies = [c.text for c in port.prompt.history if c.kind == "reply"]
        assert replies[0] == deltas[0]  # as the client got it
        assert port.heard_replays == 1 and stage.rebuilds > rebuilds
        # ... and that is what the request holds: it was replayed with it.
        live = port.live
        assert live is not None and live.sent == len(port.prompt.history)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await port.close()
    await settled(stage.engine, baseline)


async def test_a_spoken_conversation_past_max_model_len_keeps_answering(tiny_omni_stage):
    """Units count as the tokens vLLM's MiniCPM-o processor makes of their
    audio and frames. Turns of two units (one with a frame) outgrow a 256-token
    context after a few: the oldest turns leave it with their audio and images,
    the instructions stay, and every turn is answered (before: ``stage_failed``
    from the fourth turn on, for good)."""
    from vllm_duplex.domain.truncation import Truncation
    from vllm_duplex.stages.omni.vllm_omni import VllmOmniStage

    small = VllmOmniStage(engine=tiny_omni_stage.engine, dialect="minicpmo", max_model_len=256,
                          stop_loops=False)
    baseline = small.engine.get_num_unfinished_requests()
    fence = Fence("omni-tiny-long")
    port = small.port(fence.session_id)
    await port.open(fence)
    stream = port.outputs()
    rng = np.random.default_rng(7)
    frame = np.full((48, 64, 3), 90, np.uint8)

    async def submit(payload: object) -> None:
        await port.submit(StageInput(fence, fence.request_id("omni"), payload))

    seen, sent_audio = [], 0
    try:
        await submit(OmniInstructions("Be brief."))
        for n in range(9):
            for k, frames in enumerate(((frame,), ())):
                audio = (rng.standard_normal(16000) * 3000).astype(np.int16)
                await submit(OmniUnit(audio=audio, frames=frames, start_ms=(2 * n + k) * 1000))
                sent_audio += 1
            await submit(GenerateRequest(f"r{n}", (), SamplingConfig(temperature=0.0, max_tokens=8),
                                         truncation=Truncation()))
            async with asyncio.timeout(60):
                done = None
                async for out in stream:
                    if isinstance(out.payload, (GenerationDone, StageFailed)):
                        done = out.payload
                        break
            assert isinstance(done, GenerationDone), f"turn {n}: {done}"
            assert done.output_tokens == 8
            seen.append(done.input_tokens)
        assert max(seen) <= 256 - 8 and port.truncations >= 2
        assert [n for n in range(1, 9) if seen[n] < seen[n - 1]]  # the model saw less after a cut
        live = port.live
        assert live is not None and sum(r.items.get("audio", 0) for r in live.rendered) < sent_audio
        history = port.prompt.history
        assert history[0].text.startswith("<|im_start|>system\nBe brief.")
        assert history[1].text.startswith("<|im_start|>")  # the first turn kept opens whole
        assert live.held == sum(r.tokens for r in live.rendered) <= 256
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await port.close()
    await settled(small.engine, baseline)


async def test_typed_turns_past_max_model_len_keep_answering_over_the_socket(tiny_omni_stage):
    """The issue's repro on the omni path: text turns over /v1/realtime until
    the conversation is several times the context (512 tokens here). Every
    turn is answered (the tiny model stops only at max_output_tokens), what
    the model saw (``usage.input_tokens``) stays within the context and falls
    at each truncation, and the items stay in the conversation."""
    from vllm_duplex.stages.omni.vllm_omni import VllmOmniStage

    small = VllmOmniStage(engine=tiny_omni_stage.engine, dialect="minicpmo", max_model_len=512,
                          stop_loops=False)
    baseline = small.engine.get_num_unfinished_requests()
    async with BackgroundServer(Runtime(config(), shared_stages={"vllm_omni": small})) as srv:
        async with await RealtimeClient.connect(srv.ws_url) as rt:
            await rt.update_session({"output_modalities": ["text"], "max_output_tokens": 8,
                                     "audio": {"input": {"turn_detection": None}}})
            assert rt.session["truncation"] == "auto"
            seen = []
            for n in range(16):
                await rt.send({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": (
                        f"Note {n}. The quick brown fox jumps over the lazy dog by the river. Say OK.")}]}})
                await rt.create_response()
                done = (await rt.collect_response(timeout=60)).done["response"]
                assert done["status"] == "incomplete", f"turn {n}: {done.get('status_details')}"
                seen.append(done["usage"]["input_tokens"])
            port = small.ports[rt.session_id]
            assert not [e for e in rt.events if e["type"] == "error"]
            assert not [e for e in rt.events if e["type"] == "conversation.item.deleted"]
        assert max(seen) <= 512 - 8 and port.truncations >= 2
        assert [n for n in range(1, 16) if seen[n] < seen[n - 1]]
    await settled(small.engine, baseline)
