"""Merging the stage outputs a lagging session has not read yet.

When a session's STAGE lane is full, the newest queued output and the next
one become one when they are adjacent deltas of the same thing: text of one
request, or audio of one request at one rate. The client then gets fewer,
larger deltas with the same text and the same samples, in the same order --
as vLLM's per-request output collector merges ``DELTA`` outputs its consumer
has not taken yet. Anything else stays apart: a different fence (the gate
must judge each fence), request or stage, any other payload, and audio that
starts a new spoken segment (``AudioOut.text``: barge-in truncation and the
transcript of what was heard are counted by segment).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from vllm_duplex.domain.payloads import AudioOut, StageOutput, TextDelta

# A queued stage output and when it entered the mailbox.
Queued = tuple[float, StageOutput]


def merge_outputs(older: StageOutput, newer: StageOutput) -> StageOutput | None:
    """``older`` then ``newer`` as one output, or None when they must stay apart."""
    if (older.fence != newer.fence or older.request_id != newer.request_id
            or older.stage != newer.stage):
        return None
    a, b = older.payload, newer.payload
    if type(a) is TextDelta and type(b) is TextDelta and a.response_id == b.response_id:
        return replace(older, payload=TextDelta(a.response_id, a.text + b.text))
    if (type(a) is AudioOut and type(b) is AudioOut and a.response_id == b.response_id
            and a.rate == b.rate and not b.text):
        pcm = np.concatenate((a.pcm, b.pcm))
        return replace(older, payload=AudioOut(a.response_id, pcm, rate=a.rate, text=a.text))
    return None


def merge_queued(older: Queued, newer: Queued) -> Queued | None:
    """``merge_outputs`` for mailbox entries; the merged one keeps the older
    arrival time (latencies are measured from the first delta)."""
    merged = merge_outputs(older[1], newer[1])
    return None if merged is None else (older[0], merged)
