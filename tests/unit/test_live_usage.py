"""``session.usage.updated``'s ``context_window``: how full the model's
context is after each reply, where the context length is known, and omitted
where it is not (as GPT-Live omits it)."""

from __future__ import annotations

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.realtime.wire.live.codec import LiveCodec

from support.live_shapes import live_event


def done(total_tokens: int | None) -> Envelope:
    response = {"id": "r1"}
    if total_tokens is not None:
        response["usage"] = {"total_tokens": total_tokens, "input_tokens": total_tokens - 12,
                             "output_tokens": 12}
    return Envelope(seq=1, fence=Fence("s"), event=ev.ResponseDone(response=response))


def codec(limit: int | None) -> LiveCodec:
    return LiveCodec(max_event_bytes=1 << 20, model_aliases={"m": "m"}, clock=lambda: 0.0,
                     context_limit=limit)


def test_the_context_window_is_the_conversations_tokens_over_the_models_context():
    usage = live_event(codec(2048).render(done(512)))
    assert usage.context_window is not None and usage.context_window.usage_ratio == 0.25


def test_no_context_window_where_the_limit_or_the_count_is_unknown():
    assert live_event(codec(None).render(done(512))).context_window is None
    assert live_event(codec(2048).render(done(None))).context_window is None
