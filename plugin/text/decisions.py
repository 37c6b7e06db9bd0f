"""Decisions on the engine's own LLM: a ``Chooser`` (``domain/decisions.py``)
that answers each ``ChoiceAsk`` with one request on the shared vLLM engine
(the ``VllmLlmStage``'s ``EngineHost``, as the stateless generations use it).

The answer is written under vLLM's structured outputs
(``StructuredOutputsParams(choice=...)``), so it is always exactly one of the
options, whatever the model would have said. The probabilities come from
the same request: the top logprobs of the answer's first token, read from
the model's distribution before the grammar masked it (vLLM's default
``raw_logprobs``), for each option's first token. An option whose first
token is outside those top ``LOGPROBS`` gets nothing (it is less likely than
every one of them); options that share a first token share its probability,
all of it to the one chosen when it is among them. Greedy sampling makes
the chosen option the most probable first token among the options', so
``confidence`` and the choice agree.
"""

from __future__ import annotations

import asyncio

from vllm import SamplingParams
from vllm.inputs import tokens_input
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.exceptions import EngineDeadError
from vllm_duplex.domain.decisions import ChoiceAsk, Chosen, spread
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.stages.vllm.host import EngineHost

LOGPROBS = 20  # vLLM's default max_logprobs: the most a request may ask for


class EngineChooser:
    """Answers ``ChoiceAsk``s on ``host``'s engine; ``model``: its served name."""

    def __init__(self, host: EngineHost, model: str) -> None:
        self.host = host
        self.model = model
        self._fence = Fence("decisions")  # its vLLM request ids say what they are

    async def choose(self, ask: ChoiceAsk) -> Chosen:
        host = self.host
        if not host.healthy:
            raise DuplexError("engine_dead", "the vLLM engine is dead")
        chat = host.chat
        prompt = await host.off_loop(lambda: chat.encode(chat.render(ask.messages, True)))
        # The grammar may spell an option in other tokens than its encoding; each
        # is at least a character: its characters and the end token always fit.
        longest = max(len(o) for o in ask.options) + 1
        if len(prompt) + longest >= host.max_model_len:
            raise DuplexError("invalid_value", f"the decision's inputs take {len(prompt)} tokens; "
                              f"the context holds {host.max_model_len}")
        params = SamplingParams(temperature=0.0, max_tokens=longest, logprobs=LOGPROBS,
                                detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY,
                                structured_outputs=StructuredOutputsParams(
                                    choice=list(ask.options)))
        vid = host.request_id(self._fence.request_id("decide"))
        out = None
        try:
            async for out in host.generate(tokens_input(prompt), params, vid):
                pass
        except EngineDeadError:
            raise DuplexError("engine_dead", "the vLLM engine died") from None
        except asyncio.CancelledError:  # a timeout or a closed socket: free the request
            await asyncio.shield(host.abort([vid]))
            raise
        if out is None or not out.outputs:
            raise DuplexError("stage_failed", "the engine returned no answer")
        comp = out.outputs[0]
        text = chat.decode(comp.token_ids)
        if text not in ask.options:  # the grammar makes this impossible; say so if it was not
            raise DuplexError("stage_failed", f"the engine's answer {text!r} is not an option")
        index = ask.options.index(text)
        first = comp.logprobs[0] if comp.logprobs else {}
        probabilities = spread([chat.encode(o)[0] for o in ask.options], index,
                                {tok: lp.logprob for tok, lp in first.items()})
        return Chosen(index, probabilities, input_tokens=len(prompt),
                      output_tokens=len(comp.token_ids),
                      cached_tokens=out.num_cached_tokens or 0)
