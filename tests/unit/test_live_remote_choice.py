"""Decisions on an external Responses backend, the sans-I/O part
(``realtime/wire/live/remote_choice.py``): the request holds the answer to
the options by a JSON schema and asks for the answer's logprobs; the reply
read gives the option chosen and each option's probability from the
alternatives at the first token past the opening quote."""

from __future__ import annotations

import json
import math

import pytest
from vllm_duplex.domain.decisions import ChoiceAsk
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import ContextMessage
from vllm_duplex.realtime.wire.live.remote_choice import TOP_LOGPROBS, choice_request, read_choice

OPTIONS = ("Tokyo", "Paris", "London")
ASK = ChoiceAsk((ContextMessage("system", "Which city did the user ask about?"),
                 ContextMessage("user", "What is the weather in Paris?")), OPTIONS)


def body(text: str, logprobs=None, status="completed") -> dict:
    part = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {"object": "response", "status": status,
            "output": [{"type": "message", "role": "assistant", "content": [part]}],
            "usage": {"input_tokens": 31, "output_tokens": 4,
                      "input_tokens_details": {"cached_tokens": 16}}}


def lp(token: str, p: float, tops: list[tuple[str, float]]) -> dict:
    return {"token": token, "logprob": math.log(p),
            "top_logprobs": [{"token": t, "logprob": math.log(q)} for t, q in tops]}


def test_the_request_holds_the_answer_to_the_options_and_asks_for_logprobs():
    req = choice_request("smollm2", ASK)
    assert req["model"] == "smollm2" and req["temperature"] == 0.0 and req["store"] is False
    assert [m["role"] for m in req["input"]] == ["system", "user"]
    assert req["input"][1]["content"] == "What is the weather in Paris?"
    fmt = req["text"]["format"]
    assert fmt["type"] == "json_schema" and fmt["schema"] == {"type": "string",
                                                              "enum": list(OPTIONS)}
    assert req["include"] == ["message.output_text.logprobs"]
    assert req["top_logprobs"] == TOP_LOGPROBS
    assert req["max_output_tokens"] > len('"London"')


def test_the_choice_and_its_probabilities_from_the_first_token_past_the_quote():
    logprobs = [lp('"', 1.0, [('"', 1.0)]),
                lp("Paris", 0.6, [("Paris", 0.6), ("Tok", 0.2), ("L", 0.1), ("Berlin", 0.05)]),
                lp('"', 1.0, [('"', 1.0)])]
    chosen = read_choice(body('"Paris"', logprobs), OPTIONS, "remote")
    assert chosen.index == 1
    # Berlin is no option: its mass is nobody's; the rest normalised
    assert chosen.probabilities == pytest.approx((0.2 / 0.9, 0.6 / 0.9, 0.1 / 0.9))
    assert (chosen.input_tokens, chosen.output_tokens, chosen.cached_tokens) == (31, 4, 16)


def test_one_token_per_option_the_one_it_is_written_with():
    """vLLM reports the alternatives after the schema's mask: "L", "Lo" and
    "London" all begin London; the tokenizer writes it "London" (the longest),
    and the shorter ones are paths greedy decoding did not take."""
    logprobs = [lp('"', 1.0, [('"', 1.0)]),
                lp("Paris", 0.5, [("Paris", 0.5), ("London", 0.25), ("L", 0.2), ("Lo", 0.05)])]
    chosen = read_choice(body('"Paris"', logprobs), OPTIONS, "remote")
    assert chosen.probabilities == pytest.approx((0.0, 0.5 / 0.75, 0.25 / 0.75))
    assert max(chosen.probabilities) == chosen.probabilities[chosen.index]


def test_a_token_holding_the_quote_and_options_that_share_a_first_token():
    options = ("Paris", "Pasadena", "Rome")
    logprobs = [lp('"Pa', 0.7, [('"Pa', 0.7), ('"Rome"', 0.3)]), lp('ris"', 1.0, [])]
    chosen = read_choice(body('"Paris"', logprobs), options, "remote")
    # "Pa begins both Paris and Pasadena: all of it to the chosen one
    assert chosen.index == 0 and chosen.probabilities == pytest.approx((0.7, 0.0, 0.3))
    other = read_choice(body('"Rome"', [lp('"Rome"', 0.3, [('"Pa', 0.7), ('"Rome"', 0.3)])]),
                        options, "remote")
    assert other.index == 2 and other.probabilities == pytest.approx((0.35, 0.35, 0.3))


def test_without_logprobs_the_answer_is_all_the_backend_said():
    chosen = read_choice(body('"London"'), OPTIONS, "remote")
    assert chosen.index == 2 and chosen.probabilities == (0.0, 0.0, 1.0)


@pytest.mark.parametrize("answer, says", [
    ({"object": "error"}, "did not answer with a Responses object"),
    ("not json", "did not answer with a Responses object"),
    (body('"Paris"', status="incomplete"), "status 'incomplete'"),
    ({"object": "response", "status": "completed", "output": []}, "no output text"),
    (body("Paris"), "none of the options"),
    (body('"Berlin"'), "none of the options"),
])
def test_an_answer_that_is_not_a_choice_is_a_typed_backend_error(answer, says):
    with pytest.raises(DuplexError) as err:
        read_choice(answer, OPTIONS, "remote")
    assert err.value.code == "backend_error" and says in err.value.message
    assert "'remote'" in err.value.message
    json.dumps(err.value.to_wire())  # a wire error, whole
