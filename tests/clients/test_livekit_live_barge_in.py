"""LiveKit Agents 1.8.9's GPT-Live model (``GPTLiveModel``), unmodified and with
its defaults, on the real CPU pipeline (Silero -> Whisper -> vLLM SmolLM2 ->
Piper): Flite asks about the history of Paris, and once a second of the
answer played, asks "Stop. What is the capital of Italy?" over it. What
LiveKit's session hands its framework shows the turn answered, the reply
cut -- its audio and its words stop, LiveKit ends that message -- and the
new question answered. The driver is ``drivers/livekit_live_driver.py``
(``barge_in``)."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio
from support.clients import run_driver, scenario, write_wav
from support.speech_fixtures import RATE, cascade_runtime, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401  (vllm_stage: tests/conftest.py)
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

NEW_MESSAGE_GAP_MS = 800  # LiveKit's own rule: a pause this long on the model's clock ends a message


def wav(folder, name: str, text: str, **kw) -> tuple[str, float]:
    """The utterance's WAV and how long its words last (the silence after them aside)."""
    pcm = speak(text, **kw)
    words_s = (len(pcm) - int(RATE * kw.get("tail_s", 1.2))) / RATE
    return str(write_wav(folder / f"{name}.wav", pcm.astype("<i2").tobytes(), RATE)), words_s


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def seen(vllm_stage, tmp_path_factory):
    folder = tmp_path_factory.mktemp("livekit_barge_in")
    first, _ = wav(folder, "history", "Tell me about the history of the city of Paris.")
    barge, barge_s = wav(folder, "italy", "Stop. What is the capital of Italy?", lead_s=0.0)
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        results = await run_driver("livekit_live_driver", srv.http_url, "--audio", first,
                                   "--barge-audio", barge, "--scenarios", "barge_in",
                                   "--timeout", "240", timeout=300)
    seen = {**scenario(results, "barge_in"), "barge_s": barge_s}
    (folder / "seen.json").write_text(json.dumps(seen))  # the run, for reading after
    return seen


def messages(seen) -> list[dict]:
    """The assistant's words as LiveKit splits them into messages: a new
    one where its clock shows a pause (``gpt_live.py``, ``_MIN_SILENCE_MS``)."""
    out: list[dict] = []
    for e in (e for e in seen["onset_events"] if e["kind"] == "transcript_delta"):
        if out and e["start_ms"] - out[-1]["end_ms"] <= NEW_MESSAGE_GAP_MS:
            out[-1].update(text=out[-1]["text"] + e["text"], last=e["t"], end_ms=e["end_ms"])
        else:
            out.append({"text": e["text"], "first": e["t"], "last": e["t"],
                        "end_ms": e["end_ms"]})
    return out


def timeline(seen) -> str:
    """LiveKit's events and its audio (per 0.5 s) around the onset, for a failure's message."""
    audio: dict[float, float] = {}
    for t, ms in seen["frames"]:
        audio[t // 0.5 * 0.5] = audio.get(t // 0.5 * 0.5, 0.0) + ms
    return "; ".join([f"{e['t']:+.2f} {e['kind']} {e.get('text', '')[:30]!r}"
                      for e in seen["onset_events"]] +
                     [f"audio {t:+.1f}: {ms:.0f} ms" for t, ms in sorted(audio.items())])


async def test_the_spoken_turn_is_answered_in_speech(seen):
    assert seen["server_errors"] == [] and seen["client_errors"] == []
    heard = " ".join(e["text"] for e in seen["onset_events"]
                     if e["kind"] == "user_transcript" and e["t"] < 0).lower()
    assert "history" in heard and "paris" in heard, timeline(seen)
    first = messages(seen)[0]
    assert first["first"] < 0 and first["text"].strip(), timeline(seen)
    played = sum(ms for t, ms in seen["frames"] if -0.5 <= t < 0)
    assert played > 300, "the reply was playing when the user spoke over it"


async def test_speech_over_the_reply_cuts_it(seen):
    """The old reply's audio and words stop while the user is still saying
    the words spoken over it (not when it would have ended): its words come
    with the audio that says them, so the cut message holds no word the user
    never heard (GPT-Live has no event that takes words back). LiveKit hears
    the user (``input_speech_started`` before the answer) and ends the cut
    message: the answer is a message of its own. How soon the voice yields is
    measured in ``bench/barge_in.py``, not here: the bound is the user's words."""
    said = messages(seen)
    assert len(said) >= 2, timeline(seen)
    cut, answer = said[0], said[-1]
    assert cut["first"] < 0 < answer["first"], timeline(seen)
    assert any(e["kind"] == "input_speech_started" and 0 <= e["t"] < answer["first"]
               for e in seen["onset_events"]), timeline(seen)
    assert cut["last"] < seen["barge_s"], (f"the interrupted reply's words went on "
                                           f"{cut['last']:.2f} s after the onset", timeline(seen))
    after = sum(ms for t, ms in seen["frames"] if 0 <= t < answer["first"]) / 1000
    assert after < seen["barge_s"], (f"{after:.2f} s of the interrupted reply's audio after "
                                     f"the onset", timeline(seen))


async def test_the_question_spoken_over_it_is_answered(seen):
    # LiveKit ends a user message after the words spoken over the reply...
    assert any(e["kind"] == "user_transcript" and e["t"] >= 0 for e in seen["onset_events"])
    # ...and the engine heard them whole: its transcript fragments name Italy.
    # Not LiveKit's message: the final's last words come as one more fragment
    # when the turn ends, and LiveKit, which ends a message 800 ms after its
    # last fragment, has sometimes closed it by then ("Stop what is the
    # capital of the"): a known gap between the two, not asserted here.
    assert "italy" in seen["input_transcript"].lower(), timeline(seen)
    answer = messages(seen)[-1]
    # Answered in words, after the question was heard. What it says is
    # SmolLM2-135M's: with the cut reply about Paris in its context it says
    # "Rome" in some runs and "The capital of France." in others.
    assert answer["first"] > 0 and answer["text"].strip(), timeline(seen)
    spoken = sum(ms for t, ms in seen["frames"] if t >= answer["first"]) / 1000
    assert spoken > 0.5, f"only {spoken:.2f} s of the answer's audio"
