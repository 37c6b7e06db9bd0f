"""The generate endpoint's incremental text parsers: streaming equals batch
(every split of the text gives the same events), nothing certain is held back,
and tool-call argument deltas join to the exact arguments source text."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_duplex.stages.vllm.parsers import (
    Kind,
    ReasoningSplitter,
    ToolCallDelta,
    ToolCallScanner,
)

# ---- helpers -------------------------------------------------------------------


def splits(text: str, pairs: bool = True) -> Iterator[list[str]]:
    """The text char by char, cut once at every point, and (``pairs``) cut twice."""
    yield list(text)
    n = len(text)
    for i in range(n + 1):
        yield [text[:i], text[i:]]
    if pairs:
        for i in range(n + 1):
            for j in range(i, n + 1):
                yield [text[:i], text[i:j], text[j:]]


def merge(pieces: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for kind, text in pieces:
        assert text, "no empty pieces"
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def split_reasoning(chunks: Sequence[str], **kwargs: Any) -> list[tuple[str, str]]:
    s = ReasoningSplitter(**kwargs)
    pieces: list[tuple[Kind, str]] = []
    for chunk in chunks:
        got = s.feed(chunk)
        assert got == merge(got), "adjacent same-kind pieces are merged"
        pieces += got
    return merge(pieces + s.flush())


def scan(chunks: Sequence[str]) -> tuple[list[ToolCallDelta], list[tuple[str, str]]]:
    s = ToolCallScanner()
    deltas = [d for chunk in chunks for d in s.feed(chunk)]
    return deltas, s.finish()


def joined(deltas: Sequence[ToolCallDelta]) -> list[tuple[str, str]]:
    """(name, arguments) per call, checking the delta contract on the way."""
    calls: list[tuple[str, str]] = []
    for d in deltas:
        if d.index == len(calls):  # a new call: its first delta names it
            assert d.name is not None
            calls.append((d.name, d.arguments))
        else:
            assert d.index == len(calls) - 1, "calls stream in order"
            assert d.name is None and d.arguments, "later deltas carry only new arguments text"
            calls[-1] = (calls[-1][0], calls[-1][1] + d.arguments)
    return calls


# ---- ReasoningSplitter -------------------------------------------------------------


SAMPLE = "<think>Let me see: a<b, c>d </th.</think>\n\nSo 4 < 5 <thin ice>."


def test_reasoning_every_split_gives_the_same_pieces() -> None:
    want = [("reasoning", "Let me see: a<b, c>d </th."), ("text", "So 4 < 5 <thin ice>.")]
    for chunks in splits(SAMPLE):
        assert split_reasoning(chunks) == want, chunks


def test_tag_split_across_deltas_is_recognised() -> None:
    s = ReasoningSplitter()
    assert s.feed("<thi") == []
    assert s.feed("nk>plan") == [("reasoning", "plan")]
    assert s.inside
    assert s.feed("</") == []
    assert s.feed("think>") == []
    assert not s.inside
    assert s.feed("done") == [("text", "done")]


def test_text_that_cannot_be_a_tag_is_not_delayed() -> None:
    s = ReasoningSplitter()
    assert s.feed("a < b") == [("text", "a < b")]
    assert s.feed("x <") == [("text", "x ")]  # "<" may still open a tag
    assert s.feed(" y") == [("text", "< y")]
    assert s.feed("<th") == []
    assert s.feed("e") == [("text", "<the")]
    assert s.feed("<think") == []
    assert s.feed(">") == []
    assert s.feed("a</think") == [("reasoning", "a")]  # only the close tag's prefix is held


def test_forced_thinking_starts_inside() -> None:
    assert split_reasoning(["hmm <think> still</think>\n\nok"], inside=True) == [
        ("reasoning", "hmm <think> still"), ("text", "ok")]
    s = ReasoningSplitter(inside=True)
    assert s.feed("a") == [("reasoning", "a")]


def test_several_sections() -> None:
    text = "<think>a</think>\n b<think>c\n</think>  d\n\ne<think></think>f"
    want = [("reasoning", "a"), ("text", "b"), ("reasoning", "c\n"), ("text", "d\n\ne"), ("text", "f")]
    for chunks in splits(text, pairs=False):
        assert split_reasoning(chunks) == merge(want), chunks


def test_whitespace_is_dropped_only_right_after_a_close_tag() -> None:
    s = ReasoningSplitter()
    assert s.feed(" \n<think>\n x \n</think>\n") == [("text", " \n"), ("reasoning", "\n x \n")]
    assert s.feed("\n") == []
    assert s.feed(" Hi\n\n there") == [("text", "Hi\n\n there")]
    assert split_reasoning(["<think>x</think>\n\n"]) == [("reasoning", "x")]


def test_flush_emits_what_was_held_as_its_kind() -> None:
    s = ReasoningSplitter()
    assert s.feed("abc <thi") == [("text", "abc ")]
    assert s.flush() == [("text", "<thi")]
    assert s.flush() == []
    s = ReasoningSplitter()
    assert s.feed("<think>x</thi") == [("reasoning", "x")]
    assert s.flush() == [("reasoning", "</thi")]


def test_reasoning_chars_and_custom_tags() -> None:
    s = ReasoningSplitter("[R]", "[/R]")
    assert s.feed("[R]abc[/") == [("reasoning", "abc")]
    assert s.feed("R]x[R]de") == [("text", "x"), ("reasoning", "de")]
    assert s.reasoning_chars == 5
    with pytest.raises(ValueError):
        ReasoningSplitter("", "</think>")


def reference(text: str, inside: bool) -> list[tuple[str, str]]:
    """The whole text split in one go: the batch result streaming must equal."""
    pieces: list[tuple[str, str]] = []
    after_close = False
    while True:
        head, tag, text = text.partition("</think>" if inside else "<think>")
        if after_close and not inside:
            head = head.lstrip()
        if head:
            pieces.append(("reasoning" if inside else "text", head))
        if not tag:
            return merge(pieces)
        after_close, inside = inside, not inside


PARTS = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "think>", ">", "a", " ", "\n", "é"])


@settings(max_examples=300, deadline=None)
@given(st.lists(PARTS, max_size=30),
       st.lists(st.integers(0, 200), max_size=8), st.booleans())
def test_reasoning_streaming_equals_batch(parts: list[str], cuts: list[int], inside: bool) -> None:
    text = "".join(parts)
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[i:j] for i, j in zip([0, *points], [*points, len(text)])]
    assert split_reasoning(chunks, inside=inside) == reference(text, inside)


# ---- ToolCallScanner -----------------------------------------------------------------


ARGS = '{"city": "Paris", "note": "a }{ \\"quoted\\" \\\\ ]", "opts": {"days": [1, {"x": "}"}], "u": null}}'
CALL = '{"name": "get_weather", "arguments": ' + ARGS + "}"


def test_every_split_of_a_call_reconstructs_its_arguments() -> None:
    for chunks in splits(CALL, pairs=False):
        deltas, calls = scan(chunks)
        assert joined(deltas) == calls == [("get_weather", ARGS)]


def test_arguments_stream_as_soon_as_they_are_fed() -> None:
    start = CALL.index(ARGS)
    name_end = CALL.index('"get_weather"') + len('"get_weather"')
    s = ToolCallScanner()
    deltas: list[ToolCallDelta] = []
    for k, ch in enumerate(CALL, 1):
        got = s.feed(ch)
        if k == name_end:
            assert got == [ToolCallDelta(0, "get_weather", "")]
        deltas += got
        sent = "".join(d.arguments for d in deltas)
        assert sent == ARGS[:max(0, k - start)], k  # everything fed inside the value, and no more


def test_name_goes_out_once_complete() -> None:
    s = ToolCallScanner()
    assert s.feed('{"name": "get_wea') == []
    assert s.feed('ther"') == [ToolCallDelta(0, "get_weather", "")]
    assert s.feed(', "arguments": {"city": "Pa') == [ToolCallDelta(0, None, '{"city": "Pa')]
    assert s.feed('ris"}') == [ToolCallDelta(0, None, 'ris"}')]
    assert s.feed("}") == []
    assert s.finish() == [("get_weather", '{"city": "Paris"}')]


def test_arguments_before_the_name_wait_for_it() -> None:
    s = ToolCallScanner()
    assert s.feed('{"arguments": {"a": ') == []
    assert s.feed('1}, "name": "f') == []
    assert s.feed('"') == [ToolCallDelta(0, "f", '{"a": 1}')]
    assert s.feed("}") == []
    assert s.finish() == [("f", '{"a": 1}')]
    text = ' {\n  "arguments" : {"q": "\\"name\\": \\"x\\""} ,\n  "name" : "search"\n}\n'
    for chunks in splits(text, pairs=False):
        deltas, calls = scan(chunks)
        assert joined(deltas) == calls == [("search", '{"q": "\\"name\\": \\"x\\""}')]


def test_arguments_keep_their_source_text() -> None:
    args = '{ "k" :\t[ 1.5e3 , true ,"\\u00e9\\n"] ,"é": {} }'
    deltas, calls = scan(['{"name":"f","arguments":', args, ' }'])
    assert joined(deltas) == calls == [("f", args)]


def test_an_array_of_calls_streams_each_with_its_index() -> None:
    text = ('[{"name": "a", "arguments": {"x": "]}"}},\n {"arguments": {"y": [2]}, "name": "b"},'
            ' {"name": "c", "arguments": {}}]')
    want = [("a", '{"x": "]}"}'), ("b", '{"y": [2]}'), ("c", "{}")]
    for chunks in splits(text, pairs=False):
        deltas, calls = scan(chunks)
        assert joined(deltas) == calls == want
        assert [d.index for d in deltas] == sorted(d.index for d in deltas)
    deltas, _ = scan([text])
    assert deltas == [ToolCallDelta(0, "a", want[0][1]), ToolCallDelta(1, "b", want[1][1]),
                      ToolCallDelta(2, "c", "{}")]


def test_arguments_as_a_json_string() -> None:
    text = '{"name": "f", "arguments": "{\\"city\\": \\"Paris\\"}"}'
    for chunks in splits(text, pairs=False):
        deltas, calls = scan(chunks)
        assert joined(deltas) == calls == [("f", '{"city": "Paris"}')]


def test_other_keys_are_ignored() -> None:
    _, calls = scan(['{"id": "x", "name": "f", "extra": {"name": "g"}, "arguments": {}}'])
    assert calls == [("f", "{}")]


@pytest.mark.parametrize("text", [
    "", "   ", "hello", "{", '{"name": "f", "arguments": {}', '{"name": "f"}', '{"arguments": {}}',
    '{"name": 1, "arguments": {}}', '{"name": null, "arguments": {}}', '{"name": "f", "arguments": [1]}',
    '{"name": "f", "arguments": 5}', '{"name": "f", "arguments": null}', '{"name": "f", "arguments": "x"}',
    '{"name": "f", "arguments": "[1]"}', "[]", "[1]", '["x"]', "[[]]", '"x"',
    '{"name": "f", "arguments": {}} x', '{"name": "f", "arguments": {}}}', '{"name": "f", "arguments": {}]',
    '{"name": "f" "arguments": {}}', '{"name": "f", "name": "g", "arguments": {}}',
    '{"name": "f", "arguments": {}, "arguments": {}}', '{"name": "f", "arguments": {"a": tru}}',
    '{"name": "f", "arguments": {},}', '{"name": "f", "arguments": {"a": "\\x"}}',
    '{"name": "f",, "arguments": {}}',
    '{"name": "f", "arguments": {}}\n{"name": "g", "arguments": {}}', '[{"name": "f", "arguments": {}},]',
    '{name: "f", "arguments": {}}', '{"name": "\\q", "arguments": {}}',
])
def test_invalid_text_fails_at_finish(text: str) -> None:
    s = ToolCallScanner()
    for ch in text:
        s.feed(ch)  # never raises
    with pytest.raises(ValueError):
        s.finish()


# ---- property: random calls, random splits -------------------------------------------


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10)
WS = st.sampled_from(["", " ", "\n", "\n  ", "\t"])


@st.composite
def call_texts(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]]]:
    """A call or an array of calls, keys in either order, any whitespace, arguments
    serialised in varying styles; with the (name, arguments text) expected."""
    def one() -> tuple[str, tuple[str, str]]:
        name = draw(st.text(max_size=8))
        args = json.dumps(draw(st.dictionaries(st.text(max_size=5), JSON, max_size=4)),
                          indent=draw(st.sampled_from([None, 1])), ensure_ascii=draw(st.booleans()),
                          separators=draw(st.sampled_from([None, (",", ":"), (" , ", " : ")])))
        parts = [f'"name"{draw(WS)}:{draw(WS)}{json.dumps(name)}', f'"arguments"{draw(WS)}:{draw(WS)}{args}']
        if draw(st.booleans()):
            parts.reverse()
        return "{" + draw(WS) + f"{draw(WS)},{draw(WS)}".join(parts) + draw(WS) + "}", (name, args)

    if draw(st.booleans()):
        text, call = one()
        return draw(WS) + text + draw(WS), [call]
    made = [one() for _ in range(draw(st.integers(1, 3)))]
    return "[" + ",".join(draw(WS) + t + draw(WS) for t, _ in made) + "]", [c for _, c in made]


@settings(max_examples=300, deadline=None)
@given(call_texts(), st.lists(st.integers(0, 400), max_size=10))
def test_random_splits_reconstruct_the_exact_arguments(case: tuple[str, list[tuple[str, str]]],
                                                       cuts: list[int]) -> None:
    text, want = case
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[i:j] for i, j in zip([0, *points], [*points, len(text)])]
    deltas, calls = scan(chunks)
    assert joined(deltas) == calls == want


MANGLE = st.sampled_from(["{", "}", "[", "]", '"', ",", ":", "\\", " ", "a", "1", ""])


@settings(max_examples=300, deadline=None)
@given(call_texts(), st.lists(st.tuples(st.integers(0, 400), MANGLE), min_size=1, max_size=3),
       st.lists(st.integers(0, 400), max_size=5))
def test_mangled_calls_fail_cleanly_or_agree_with_json(
        case: tuple[str, list[tuple[str, str]]], edits: list[tuple[int, str]], cuts: list[int]) -> None:
    """A scanner that disagrees with ``json`` about a text is a bug: after random
    edits the text is either rejected or read exactly as ``json.loads`` reads it."""
    text = case[0]
    for at, ch in edits:  # replace (or delete) one character
        at %= len(text)
        text = text[:at] + ch + text[at + 1:]
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[i:j] for i, j in zip([0, *points], [*points, len(text)])]
    try:
        deltas, calls = scan(chunks)
    except ValueError:
        return
    assert joined(deltas) == calls
    doc = json.loads(text)
    items = doc if isinstance(doc, list) else [doc]
    assert len(items) == len(calls)
    for (name, args), item in zip(calls, items):
        want = item["arguments"]
        assert name == item["name"]
        assert json.loads(args) == (json.loads(want) if isinstance(want, str) else want)
