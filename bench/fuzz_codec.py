"""Coverage-guided fuzzing (atheris / libFuzzer) of the client-frame parsers.

    .venv/bin/python bench/fuzz_codec.py -atheris_runs=100000 [corpus_dir] [libFuzzer flags]
    FUZZ_KEEP_GOING=1 .venv/bin/python bench/fuzz_codec.py -atheris_runs=100000

Targets, chosen by the first input byte: ``RealtimeCodec.parse`` on the raw
bytes (a binary frame) or on their text (a text frame), and ``parse_generate``
/ ``parse_control`` on a JSON body. Half of the inputs are raw bytes; the
other half are decoded by a small grammar (``Doc``) into JSON events and bodies
built from the real field names, so that libFuzzer's coverage guidance reaches
the field checks behind a valid ``type`` and ``model``. The property is the one
of ``tests/test_fuzz_frames.py``: a typed command or a ``DuplexError``, never
any other exception.

By default the first crash stops the run; libFuzzer writes the input to
``crash-<sha1>`` in the working directory (``-artifact_prefix=/tmp/`` to put it
elsewhere) and ``python bench/fuzz_codec.py crash-<sha1>`` replays it.
With ``FUZZ_KEEP_GOING=1`` crashes are counted by (exception, file:line) and
printed at exit with the smallest input of each, and the run goes on.

atheris is not a dependency of the project: ``.venv/bin/pip install atheris``.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import atheris

with atheris.instrument_imports(include=["vllm_duplex"]):
    from vllm_duplex.domain.errors import ERRORS, DuplexError
    from vllm_duplex.realtime.wire.codec import CLIENT_EVENT_TYPES, RealtimeCodec
    from vllm_duplex.text.requests import parse_control, parse_generate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine  # noqa: E402

MODEL = "m"
EVENT_TYPES = sorted(CLIENT_EVENT_TYPES) + ["bogus"]
# Field names of client events and generate bodies (any depth); a Doc picks among them.
KEYS = sorted({
    "type", "event_id", "session", "audio", "input", "output", "format", "rate", "turn_detection",
    "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response", "interrupt_response",
    "idle_timeout_ms", "transcription", "model", "language", "prompt", "voice", "speed", "id",
    "instructions", "output_modalities", "modalities", "tools", "tool_choice", "name", "parameters",
    "description", "max_output_tokens", "max_response_output_tokens", "temperature", "policy",
    "input_audio_format", "output_audio_format", "input_audio_transcription", "seq", "item", "role",
    "content", "text", "transcript", "call_id", "arguments", "previous_item_id", "item_id",
    "content_index", "audio_end_ms", "response", "metadata", "conversation", "response_id", "mode",
    "checkpoint", "session_id", "resume_token", "last_seq", "generation", "messages", "tool_calls",
    "tool_call_id", "function", "options", "max_tokens", "top_p", "top_k", "min_p", "seed", "stop",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "reasoning",
    "enabled", "budget_tokens", "stream_id", "deadline_ms", "request_id", "parallel_tool_calls",
    "reasoning_budget",
})
STRINGS = ["", "auto", "none", "required", "inf", "realtime", "server_vad", "semantic_vad", "audio/pcm",
           "audio/pcmu", "audio/pcma", "pcm16", "g711_ulaw", "text", "audio", "message", "function_call",
           "function_call_output", "user", "assistant", "system", "tool", "developer", "input_text",
           "input_audio", "output_text", "output_audio", "function", "append_audio_chunk",
           "append_tokens", "turn_commit_only", "rollback_to_checkpoint", "root", "AAAA", "AAA",
           "!!", "{}", '{"a": 1}', "[" * 3000, MODEL, "w", "\ud800"]
NUMBERS = [0, 1, -1, 2, 8000, 24000, 48000, 10**400, -(10**400), 0.5, 1.5, 2.0, float("inf"),
           float("nan"), True, False]


class Doc:
    """A JSON value decoded from fuzz bytes: every choice is one consumed integer,
    so a mutation of the bytes is a local edit of the document."""

    def __init__(self, fdp: atheris.FuzzedDataProvider) -> None:
        self.fdp = fdp

    def value(self, depth: int = 0) -> Any:
        kind = self.fdp.ConsumeIntInRange(0, 7 if depth < 4 else 4)
        if kind == 0:
            return None
        if kind == 1:
            return NUMBERS[self.fdp.ConsumeIntInRange(0, len(NUMBERS) - 1)]
        if kind == 2:
            return STRINGS[self.fdp.ConsumeIntInRange(0, len(STRINGS) - 1)]
        if kind == 3:
            return self.fdp.ConsumeUnicodeNoSurrogates(self.fdp.ConsumeIntInRange(0, 16))
        if kind == 4:
            return self.fdp.ConsumeInt(4)
        if kind == 5:
            return [self.value(depth + 1) for _ in range(self.fdp.ConsumeIntInRange(0, 3))]
        return self.obj(depth + 1)

    def obj(self, depth: int = 0) -> dict[str, Any]:
        return {KEYS[self.fdp.ConsumeIntInRange(0, len(KEYS) - 1)]: self.value(depth)
                for _ in range(self.fdp.ConsumeIntInRange(0, 4))}


def _event(doc: Doc) -> str:
    obj = {"type": EVENT_TYPES[doc.fdp.ConsumeIntInRange(0, len(EVENT_TYPES) - 1)], **doc.obj()}
    return json.dumps(obj)  # NaN / Infinity come out as such: not JSON, invalid_json


ROLES = ["user", "assistant", "tool", "system", "developer", "bot"]


def _body(doc: Doc) -> dict[str, Any]:
    """A generate body; half of them with the right model and messages that
    have a role, so the checks behind those are reached."""
    body = doc.obj()
    if doc.fdp.ConsumeBool():
        body.update(model=MODEL, messages=[
            {"role": ROLES[doc.fdp.ConsumeIntInRange(0, len(ROLES) - 1)], **doc.obj(1)}
            for _ in range(doc.fdp.ConsumeIntInRange(1, 3))])
    return body


CRASHES: dict[tuple[str, str], list[bytes]] = defaultdict(list)
KEEP_GOING = bool(os.environ.get("FUZZ_KEEP_GOING"))


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    target = fdp.ConsumeIntInRange(0, 5)
    try:
        if target == 0:
            RealtimeCodec(max_event_bytes=1 << 16).parse(fdp.ConsumeBytes(fdp.remaining_bytes()))
        elif target == 1:
            RealtimeCodec(max_event_bytes=1 << 16).parse(fdp.ConsumeUnicode(fdp.remaining_bytes()))
        elif target == 2:
            RealtimeCodec(max_event_bytes=1 << 16).parse(_event(Doc(fdp)))
        elif target == 3:
            try:
                body = json.loads(fdp.ConsumeBytes(fdp.remaining_bytes()))
            except (ValueError, RecursionError):
                return  # the HTTP layer's business (read_json)
            parse_generate(body, served_model=MODEL, max_tokens_cap=16)
        elif target == 4:
            spec = parse_generate(_body(Doc(fdp)), served_model=MODEL, max_tokens_cap=16)
            spec.context()
        else:
            parse_control(Doc(fdp).obj(), 16)
    except DuplexError as err:
        if err.code not in ERRORS:
            raise
    except Exception as exc:
        if not KEEP_GOING:
            raise
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
        CRASHES[(f"target {target}: {type(exc).__name__}", where)].append(data)


def report() -> None:
    if not CRASHES:
        print("fuzz_codec: no crash", file=sys.stderr)
        return
    print(f"fuzz_codec: {len(CRASHES)} distinct crash(es)", file=sys.stderr)
    for (kind, where), inputs in sorted(CRASHES.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(inputs):6d} x {kind} at {where}; smallest input: {min(inputs, key=len)!r}",
              file=sys.stderr)


if __name__ == "__main__":
    print(machine.line(), file=sys.stderr, flush=True)
    if KEEP_GOING:
        atexit.register(report)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
