"""Hypothesis strategies for fuzzing what clients send (the realtime frames of
``test_fuzz_frames`` and the HTTP bodies of ``test_fuzz_http``).

Documents are built from templates of the real field names: ``noisy`` puts
wrong types at every level, ``mutated`` takes a plausible document and breaks
one node at any depth (reaching checks that sit behind valid fields). ``draw``
takes examples outside any event loop, for async tests to replay.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

MAX_EVENT = 64 << 10  # a realtime server's event_too_large above this

# ---- values ------------------------------------------------------------------------

BIG_INTS = st.sampled_from([2**31, 2**53 + 1, 2**63, -(2**63), 10**400, -(10**400)])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), BIG_INTS,
    st.floats(),  # NaN and +-inf are dumped as NaN/Infinity (not JSON), or rewritten to 1e400
    st.text(max_size=16),
    st.sampled_from(["", " ", "inf", "auto", "none", "null", "\x00", "\ud800", "\U0001f600"]),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Long strings: a few near and over the event limit (the frame stays under the transport's).
HUGE = st.builds(lambda ch, n: ch * n, st.sampled_from(["a", "\u00e9", "\\", '"', "\U0001f600"]),
                 st.sampled_from([1000, 16000, MAX_EVENT - 200, MAX_EVENT + 10, 4 * MAX_EVENT // 5]))
WRONG = st.one_of(JSON_VALUES, HUGE, st.sampled_from(["", {}, [], [[]], {"": None}, 0, -1, True]))
TEXT = st.text(max_size=24)

# ---- documents from templates -------------------------------------------------------


def plausible(template: Any) -> st.SearchStrategy[Any]:
    """A document shaped like ``template`` (dict: every key optional; list: a
    list of its alternatives; strategy: a leaf)."""
    if isinstance(template, dict):
        return st.fixed_dictionaries({}, optional={k: plausible(v) for k, v in template.items()})
    if isinstance(template, list):
        return st.lists(st.one_of([plausible(t) for t in template]), max_size=3)
    return template


def noisy(template: Any) -> st.SearchStrategy[Any]:
    """Like ``plausible``, but every value may be of the wrong type."""
    if isinstance(template, dict):
        return st.fixed_dictionaries({}, optional={k: noisy(v) | WRONG for k, v in template.items()})
    if isinstance(template, list):
        return st.lists(st.one_of([noisy(t) for t in template]), max_size=3)
    return template


_DELETE: Any = object()


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    if not rest and value is _DELETE:
        del copy[head]
    else:
        copy[head] = _replaced(doc[head], rest, value)
    return copy


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[Any]) -> Any:
    """A document of ``base`` with one node (at any depth) replaced by a value
    of the wrong type, or deleted: reaches checks deep behind valid fields."""
    doc = draw(base)
    paths = _paths(doc)
    if not paths:
        return doc
    return _replaced(doc, draw(st.sampled_from(paths)), draw(WRONG | st.just(_DELETE)))


def shaped(template: Any) -> st.SearchStrategy[Any]:
    return noisy(template) | mutated(plausible(template))


def one_of_values(*values: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(values)


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """``one_of`` with weights (``one_of`` folds identical branches together)."""
    pool = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(pool) - 1).flatmap(lambda i: pool[i])


# ---- the text surfaces' request bodies ---------------------------------------------

NUMBERS = st.integers() | BIG_INTS | st.floats()
IN_RANGE = st.integers(0, 100) | st.floats(0.0, 2.0) | BIG_INTS  # mostly valid option values
ID_TEXT = st.from_regex(r"[A-Za-z0-9._:-]{1,16}", fullmatch=True)
CONTENT = TEXT | st.none() | st.lists(st.fixed_dictionaries(
    {"type": one_of_values("text", "input_text", "output_text"), "text": TEXT}), max_size=2)
TOOL_CALL = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": one_of_values("w", "get")}, optional={
        "arguments": one_of_values("{}", '{"a": 1}') | st.dictionaries(st.text(max_size=3), JSON_VALUES,
                                                                        max_size=2)})},
    optional={"id": ID_TEXT, "type": st.just("function")})
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": one_of_values("system", "developer", "user"), "content": CONTENT}),
    st.fixed_dictionaries({"role": st.just("assistant")}, optional={
        "content": CONTENT, "tool_calls": st.lists(TOOL_CALL, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": ID_TEXT, "content": CONTENT}),
)
MESSAGES = st.lists(MESSAGE, max_size=3)
GEN_TOOL = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "name": one_of_values("w", "x")},
                          optional={"description": TEXT, "parameters": st.just({"type": "object"})}),
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": one_of_values("w", "x")}, optional={"parameters": st.just({"type": "object"})})}))
GENERATE_T = {
    "request_id": ID_TEXT, "instructions": TEXT, "tools": st.lists(GEN_TOOL, max_size=2, unique_by=str),
    "tool_choice": one_of_values("auto", "none", "required") | plausible(
        {"type": st.just("function"), "name": one_of_values("w", "x"), "function": {"name": st.just("w")}}),
    "parallel_tool_calls": st.booleans(),
    "options": {**{k: IN_RANGE for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
                                         "presence_penalty", "frequency_penalty", "repetition_penalty",
                                         "min_tokens")},
                "stop": TEXT | st.lists(st.text(min_size=1, max_size=4), max_size=3)},
    "reasoning": {"enabled": st.booleans(), "budget_tokens": st.integers(0, 100) | BIG_INTS},
    "stream_id": ID_TEXT, "deadline_ms": st.integers(1, 10**6) | BIG_INTS, "stream": st.booleans()}


def generate_bodies(model: str) -> st.SearchStrategy[Any]:
    """Generate request bodies for a server of ``model``: mostly valid ones
    (right model, one message at least) reach the deep checks, and one
    mutation then puts a wrong value anywhere in them."""
    valid = st.builds(lambda rest, messages: {**rest, "model": model, "messages": messages},
                      plausible(GENERATE_T), st.lists(MESSAGE, min_size=1, max_size=3))
    return st.one_of(valid, mutated(valid), mutated(valid),
                     noisy({**GENERATE_T, "model": one_of_values(model, "other", ""), "messages": MESSAGES}),
                     JSON_VALUES)


# ---- drawing examples for replay -----------------------------------------------------


def draw(strategy: st.SearchStrategy[Any], n: int) -> list[Any]:
    """``n`` examples of ``strategy`` drawn by hypothesis outside any event loop work."""
    out: list[Any] = []

    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              derandomize=not os.environ.get("FUZZ_RANDOM"), suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example):
        out.append(example)

    collect()
    return out
