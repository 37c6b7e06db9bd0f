"""``ReplyDecoder`` with the real SmolLM2 tokenizer (no engine): streaming
equals batch (the text of a reply fed token by token, or in any chunks, is
``tokenizer.decode`` of it, multi-byte characters included), each token is
decoded incrementally (never a re-decode of the whole reply), stop strings are
enforced wherever the tokens split them and held back while they may still
match, and a reply that may be a tool call is held until it ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer
from vllm_duplex.assets.prepare import prepared_model_dir
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.stages.vllm.decode import (
    Call,
    Detokenizer,
    Reasoning,
    ReplyDecoder,
    Text,
)
from vllm_duplex.stages.vllm.parsers import ReasoningSplitter, ToolCallDelta

WEATHER = ({"type": "function", "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},)
SAMPLES = ["The capital of France is Paris.", "naïve café — 東京タワー 🤖🎉 done",
           "Line one\n\n  indented\tand tabbed", "emoji at the end 👍🏽"]


@pytest.fixture(scope="module")
def tok() -> Any:
    return AutoTokenizer.from_pretrained(str(prepared_model_dir()))


class SlowTokenizer:
    """The real vocabulary without its fast backend: the decoder takes vLLM's
    slow incremental path (``detokenize_incrementally``)."""

    def __init__(self, fast: Any) -> None:
        self._fast = fast

    def __getattr__(self, name: str) -> Any:
        if name == "backend_tokenizer":
            raise AttributeError(name)
        return getattr(self._fast, name)

    def __len__(self) -> int:
        return len(self._fast)


class CountingTokenizer(SlowTokenizer):
    """Counts whole-sequence decodes (the O(n²) way of streaming a reply)."""

    def __init__(self, fast: Any) -> None:
        super().__init__(fast)
        self.decodes = 0

    def __getattr__(self, name: str) -> Any:
        if name == "backend_tokenizer":
            return self._fast.backend_tokenizer
        return super().__getattr__(name)

    def decode(self, ids: Sequence[int], **kw: Any) -> str:
        self.decodes += 1
        return self._fast.decode(ids, **kw)


def chunked(ids: list[int], cuts: list[int]) -> list[list[int]]:
    points = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    return [ids[a:b] for a, b in zip(points, points[1:])]


def run(decoder: ReplyDecoder, chunks: list[list[int]]) -> list[Any]:
    pieces = [p for chunk in chunks for p in decoder.feed(chunk)]
    return pieces + decoder.finish()


def text_of(pieces: list[Any]) -> str:
    return "".join(p.text for p in pieces if isinstance(p, Text))


# ---- streaming equals batch ------------------------------------------------------


@pytest.mark.parametrize("slow", [False, True], ids=["fast", "slow"])
def test_token_by_token_equals_decoding_the_whole(tok, slow):
    tokenizer = SlowTokenizer(tok) if slow else tok
    for sample in SAMPLES:
        ids = tok.encode(sample, add_special_tokens=False) + [tok.eos_token_id]
        d = Detokenizer(tokenizer)
        streamed = "".join(d.feed([i]) for i in ids) + d.finish()
        assert streamed == tok.decode(ids, skip_special_tokens=True) == sample


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40),
       cuts=st.lists(st.integers(0, 200), max_size=6))
def test_any_chunking_equals_decoding_the_whole(tok, text, cuts):
    ids = tok.encode(text, add_special_tokens=False)
    pieces = run(ReplyDecoder(tok), chunked(ids, cuts))
    assert text_of(pieces) == tok.decode(ids, skip_special_tokens=True)
    assert all(p.text for p in pieces)  # nothing empty goes out


def test_a_character_split_across_tokens_waits_for_its_last_token(tok):
    ids = tok.encode("🤖", add_special_tokens=False)
    assert len(ids) > 1  # byte-level BPE: the emoji is several tokens
    d = ReplyDecoder(tok)
    assert [d.feed([i]) for i in ids[:-1]] == [[]] * (len(ids) - 1)
    assert d.feed(ids[-1:]) == [Text("🤖")]
    # A reply cut mid-character ends as tokenizer.decode has it (U+FFFD).
    cut = ReplyDecoder(tok)
    assert run(cut, [ids[:-1]]) == [Text(tok.decode(ids[:-1]))] and "\ufffd" in cut.text


def test_each_token_is_decoded_incrementally_not_the_whole_reply(tok):
    counting = CountingTokenizer(tok)
    ids = tok.encode("word " * 300, add_special_tokens=False)
    d = ReplyDecoder(counting)
    for i in ids:
        d.feed([i])
    d.finish()
    assert counting.decodes == 0
    assert d.text == tok.decode(ids)


# ---- stop strings ------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 200), max_size=8))
def test_stop_strings_end_the_answer_wherever_tokens_split_them(tok, cuts):
    text = "The capital of France is Paris. It is lovely."
    ids = tok.encode(text, add_special_tokens=False)
    d = ReplyDecoder(tok, stops=("Paris", "lovely"))
    pieces = run(d, chunked(ids, cuts))
    assert d.stopped and text_of(pieces) == "The capital of France is "


def test_text_that_may_begin_a_stop_string_is_held_back(tok):
    d = ReplyDecoder(tok, stops=("ZZZZ",))
    out = d.feed(tok.encode("Hello Z", add_special_tokens=False))
    assert text_of(out) == "Hell"  # len(stop) - 1 = 3 characters wait
    assert text_of(d.feed(tok.encode(" world", add_special_tokens=False))) == "o Z wo"
    assert text_of(d.finish()) == "rld" and not d.stopped


# ---- loops ---------------------------------------------------------------------------


def test_a_reply_that_loops_ends_there(tok):
    """What SmolLM2 said greedily to "How many days we are in a week?": the
    loop would run to the length limit, the voice speaking it for a minute."""
    d = ReplyDecoder(tok, stop_loops=True)
    ids = tok.encode("We are in a week, but in a calendar" + " calendar" * 40,
                     add_special_tokens=False)
    out: list[Any] = []
    for i in ids:
        out += d.feed([i])
        if d.stopped:
            break
    assert d.stopped and d.looped
    assert text_of(out) == "We are in a week, but in a calendar" + " calendar" * 3
    assert d.finish() == []  # nothing more goes out


@pytest.mark.parametrize("text", [
    "The capital of France is Paris, and Paris is lovely.",
    "Yes, yes, yes! I can count: one, two, three, four, five.",
    "Ha ha ha, that is funny.",  # three: a laugh, not a loop
])
def test_repetition_that_is_not_a_loop_goes_on(tok, text):
    d = ReplyDecoder(tok, stop_loops=True)
    assert text_of(run(d, chunked(tok.encode(text, add_special_tokens=False), []))) == text
    assert not d.stopped


def test_loops_are_only_stopped_when_asked(tok):
    d = ReplyDecoder(tok)  # the stateless step generates what it is asked for
    text = "ha" + " ha" * 20
    assert text_of(run(d, chunked(tok.encode(text, add_special_tokens=False), []))) == text


# ---- tool calls --------------------------------------------------------------------


def test_a_reply_that_may_be_a_tool_call_is_held_until_it_ends(tok):
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    ids = tok.encode(call, add_special_tokens=False)
    d = ReplyDecoder(tok, tools=WEATHER)
    assert [p for i in ids for p in d.feed([i])] == []
    assert d.finish() == [Call("get_weather", '{"city": "Paris"}')]
    # Tagged and fenced calls too; a reply that is no call goes out as text at the end.
    for text, want in (('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
                        [Call("get_weather", "{}")]),
                       ("{not a call}", [Text("{not a call}")])):
        assert run(ReplyDecoder(tok, tools=WEATHER), [tok.encode(text, add_special_tokens=False)]) == want


def test_text_that_cannot_be_a_tool_call_streams_at_once(tok):
    # "[" is not held: an array is never parsed as a call (see tools.TOOL_STARTS).
    for text in ("Sure, it is sunny.", "[laughs] It is sunny."):
        ids = tok.encode(text, add_special_tokens=False)
        d = ReplyDecoder(tok, tools=WEATHER)
        first = [p for i in ids[:3] for p in d.feed([i])]
        assert first and text.startswith(text_of(first))


def test_a_stop_string_in_a_held_call_ends_it_as_one_call(tok):
    text = '{"name": "get_weather", "arguments": {"city": "Rome"}}<|im_end|>after'
    d = ReplyDecoder(tok, tools=WEATHER, stops=("after",))
    pieces = run(d, [tok.encode(text, add_special_tokens=False)])
    assert d.stopped and pieces == [Call("get_weather", '{"city": "Rome"}')]


def test_a_constrained_call_streams_its_arguments(tok):
    text = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    ids = tok.encode(text, add_special_tokens=False)
    d = ReplyDecoder(tok, tools=WEATHER, constrained=True)
    deltas = [p for i in ids for p in d.feed([i])]
    assert all(isinstance(p, ToolCallDelta) for p in deltas) and len(deltas) > 2
    assert "".join(p.arguments for p in deltas) == '{"city": "Paris"}'
    assert d.finish() == [Call("get_weather", '{"city": "Paris"}')]
    # Cut off by the length limit: no call; an invalid one is a typed error.
    cut = ReplyDecoder(tok, tools=WEATHER, constrained=True)
    cut.feed(ids[:-4])
    assert not [p for p in cut.finish(truncated=True) if isinstance(p, Call)]
    bad = ReplyDecoder(tok, tools=WEATHER, constrained=True)
    bad.feed(ids[:-4])
    with pytest.raises(DuplexError) as err:
        bad.finish()
    assert err.value.code == "stage_failed"


def test_reasoning_is_split_off_before_the_answer(tok):
    text = "<think>17 has no divisor but 1 and itself</think>\n\nYes, 17 is prime."
    ids = tok.encode(text, add_special_tokens=False)
    d = ReplyDecoder(tok, stops=("prime",), reasoning=ReasoningSplitter())
    pieces = run(d, [[i] for i in ids])
    assert "".join(p.text for p in pieces if isinstance(p, Reasoning)) == \
        "17 has no divisor but 1 and itself"
    assert text_of(pieces) == "Yes, 17 is " and d.stopped  # stops apply to the answer only
