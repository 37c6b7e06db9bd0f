"""The LLM half of ``bench/speech_models.py``: the instruction candidates
(typed QA through the vLLM stage) and the spoken QA over the realtime socket,
old default against new. See that file for what the figures mean."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from typing import Any

import psutil
from .speech_corpus import QA, QA_VOICES, RATE, ms, normalize, pct, right_answer


def tree_rss() -> int:
    proc = psutil.Process()
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total


# ---- LLM: instructions, and the spoken QA ---------------------------------------------------

# Candidates for the default instructions (the examples share no answer with the QA set).
INSTRUCTIONS = {
    "short-sentence": "You are a helpful voice assistant. Answer in one short sentence.",
    "name-answer": ("You are a helpful voice assistant. Answer the question in one short, "
                    "correct sentence that names the answer."),
    "fewshot": ("You are a helpful voice assistant. Answer in one short sentence.\nExamples:\n"
                "Q: What is the capital of Portugal? A: The capital of Portugal is Lisbon.\n"
                "Q: How many legs does a cat have? A: A cat has four legs.\n"
                "Q: What color are strawberries? A: Strawberries are red."),
    "fewshot-facts": ("You are a voice assistant that answers questions with facts. Give the "
                      "answer in one short sentence.\n"
                      "Q: What is the capital of Portugal?\nA: Lisbon is the capital of Portugal.\n"
                      "Q: How many legs does a cat have?\nA: A cat has four legs.\n"
                      "Q: What color are strawberries?\nA: Strawberries are red.\n"
                      "Q: Which animal gives us wool?\nA: Sheep give us wool."),
    "accurate": "You are a helpful voice assistant. Answer in one short, accurate sentence.",
    "simple-facts": ("You are a helpful voice assistant. The user asks simple questions about "
                     "common facts. Answer in one short sentence."),
    "short-sentence-plain": "Answer in one short sentence.",
    "one-word": "You are a helpful voice assistant. Answer with one word.",
    "fewshot-words": ("You are a helpful voice assistant. Answer in a few words.\n"
                      "Q: What is the capital of Portugal?\nA: Lisbon.\n"
                      "Q: What color is a tomato?\nA: Red.\n"
                      "Q: How many legs does an insect have?\nA: Six.\n"
                      "Q: What animal says meow?\nA: A cat.\n"
                      "Q: What is the opposite of big?\nA: Small."),
    "fewshot-sentences": ("You are a helpful voice assistant. Answer in one short sentence.\n"
                          "Q: What is the capital of Portugal?\nA: The capital of Portugal is "
                          "Lisbon.\nQ: What color is a tomato?\nA: A tomato is red.\n"
                          "Q: How many legs does an insect have?\nA: An insect has six legs.\n"
                          "Q: What animal says meow?\nA: A cat says meow.\n"
                          "Q: What is the opposite of big?\nA: The opposite of big is small."),
    "smollm": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "smollm-short": ("You are a helpful AI assistant named SmolLM, trained by Hugging Face. "
                     "Answer in one short sentence."),
    "smollm-fewshot": ("You are a helpful AI assistant named SmolLM, trained by Hugging Face. "
                       "Answer in one short sentence, for example:\n"
                       "Q: What is the capital of Portugal? A: Lisbon.\n"
                       "Q: How many legs does a cat have? A: Four."),
}


async def ask(stage: Any, instructions: str, question: str, max_tokens: int = 48) -> str:
    import uuid

    from vllm_duplex.domain.contracts import SamplingConfig
    from vllm_duplex.domain.fence import Fence
    from vllm_duplex.domain.payloads import (
        ContextMessage,
        GenerateRequest,
        GenerationDone,
        StageInput,
        TextDelta,
    )

    sid = f"bench-qa-{uuid.uuid4().hex[:8]}"
    fence = Fence(sid)
    port = stage.port(sid)
    await port.open(fence)
    text = ""
    try:
        ctx = (ContextMessage("system", instructions), ContextMessage("user", question))
        await port.submit(StageInput(fence, fence.request_id("resp"), GenerateRequest(
            f"resp_{sid}", ctx, SamplingConfig(temperature=0.0, max_tokens=max_tokens))))
        async with asyncio.timeout(120):
            async for out in port.outputs():
                if isinstance(out.payload, TextDelta):
                    text += out.payload.text
                elif isinstance(out.payload, GenerationDone):
                    break
    finally:
        await port.close()
    return text


async def part_prompt(stage: Any, instructions: dict[str, str]) -> dict[str, Any]:
    results = {}
    for label, text in instructions.items():
        right, wrong = 0, []
        for question, answers in QA:
            reply = await ask(stage, text, question)
            if right_answer(reply, answers):
                right += 1
            else:
                wrong.append((question, reply.strip()))
        results[label] = right / len(QA)
        print(f"  {label:28s} right {pct(right / len(QA))} ({right}/{len(QA)})", flush=True)
        for q, r in wrong[:12]:
            print(f"      x {q} -> {r[:70]!r}")
    return results


async def spoken_turn(url: str, pcm24: bytes, *, fast: bool) -> dict[str, Any]:
    """One question in a fresh session: 0.3 s of silence, the speech, then
    silence as an open microphone sends it, in 20 ms chunks on a real-time
    schedule, reading events between chunks (so their stamps are arrival
    times) until ``response.done`` -- or 8 s of silence without one."""
    from vllm_duplex.realtime.client.realtime import RealtimeClient

    step = 960  # 20 ms at 24 kHz, bytes
    speech = bytes(15 * step) + pcm24
    chunks = [speech[i:i + step] for i in range(0, len(speech), step)]
    silence = bytes(step)
    done = None
    async with await RealtimeClient.connect(url) as client:
        start = time.monotonic()
        k = 0
        while done is None and k < len(chunks) + 400:
            await client.append_audio(chunks[k] if k < len(chunks) else silence)
            k += 1
            slot = start + k * 0.02 if not fast or k > len(chunks) else 0.0
            while done is None and (left := slot - time.monotonic()) > 0:
                try:
                    event = await client.recv(timeout=left)
                except TimeoutError:
                    break
                if event.get("type") == "response.done":
                    done = event
        events = client.events
    first: dict[str, Any] = {}
    for e in events:
        first.setdefault(e["type"], e)
    stopped = first.get("input_audio_buffer.speech_stopped")
    audio = first.get("response.output_audio.delta")
    transcript = (first.get("conversation.item.input_audio_transcription.completed") or {}
                  ).get("transcript", "")
    reply = "".join(e["delta"] for e in events
                    if e["type"] == "response.output_audio_transcript.delta")
    gap = audio["_recv_t"] - stopped["_recv_t"] if stopped and audio and not fast else float("nan")
    return {"transcript": transcript, "reply": reply, "gap_s": gap,
            "status": (done or {}).get("response", {}).get("status", "none")}


async def part_qa(stage: Any, configs: list[str], voices: int, questions: int, fast: bool,
                  instructions: str | None) -> dict[str, Any]:
    import soxr
    from vllm_duplex.host.deploy import load_config
    from vllm_duplex.host.runtime import Runtime
    from vllm_duplex.realtime.server.serving import BackgroundServer

    qa = QA[:questions]
    audio = {(v.name, q): soxr.resample(v.speak(q), RATE, 24000).astype("<i2").tobytes()
             for v in QA_VOICES[:voices] for q, _ in qa}
    results: dict[str, Any] = {"rss_vllm_only_mib": tree_rss() / 2**20}
    for name in configs:
        config = load_config(name)
        session = dict(config.session)
        if instructions:
            session["instructions"] = instructions
        config = dataclasses.replace(config, session=session, limits=dataclasses.replace(
            config.limits, resume_grace_s=0))
        print(f"[qa] {name}: {len(audio)} spoken questions ...", flush=True)
        async with BackgroundServer(Runtime(config, shared_stages={"vllm": stage})) as server:
            turns = []
            for (voice, q), pcm in audio.items():
                answers = dict(qa)[q]
                t = await spoken_turn(server.ws_url, pcm, fast=fast)
                t.update(voice=voice, question=q, right=right_answer(t["reply"], answers),
                         heard_right=normalize(t["transcript"]) == normalize(q))
                turns.append(t)
                print(f"  {'ok ' if t['right'] else 'BAD'} {voice:16s} gap {ms(t['gap_s'])}  "
                      f"heard {t['transcript']!r} -> {t['reply'][:60]!r}", flush=True)
            rss = tree_rss()
        gaps = sorted(t["gap_s"] for t in turns if t["gap_s"] == t["gap_s"])
        row = {"right": sum(t["right"] for t in turns) / len(turns),
               "heard_right": sum(t["heard_right"] for t in turns) / len(turns),
               "gap_median_s": statistics.median(gaps) if gaps else float("nan"),
               "gap_p90_s": gaps[int(0.9 * (len(gaps) - 1))] if gaps else float("nan"),
               "rss_tree_mib": rss / 2**20,
               "per_voice": {v.name: sum(t["right"] for t in turns if t["voice"] == v.name)
                             / max(1, sum(t["voice"] == v.name for t in turns))
                             for v in QA_VOICES[:voices]},
               "turns": turns}
        results[name] = row
        print(f"  {name}: right {pct(row['right'])}, transcript exact {pct(row['heard_right'])}, "
              f"turn gap median {ms(row['gap_median_s'])} (p90 {ms(row['gap_p90_s'])}), process "
              f"tree RSS {row['rss_tree_mib']:.0f} MiB", flush=True)
    return results
