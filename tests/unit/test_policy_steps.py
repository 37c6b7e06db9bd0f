"""A policy's steps (``domain/contracts.py``) as the session carries them out:
in the order the policy gave them, by the one table the parts' asks use, with
the session deciding where a step does nothing (``carrying.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from support.session_core import TEN_MS, create_response, emitted, make_core, output, types
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain.contracts import (
    CommitTurn,
    FinishReply,
    PolicyStep,
    Respond,
    Show,
)
from vllm_duplex.domain.payloads import GenerationDone, StageOutput, TextDelta, VadSpeechStopped
from vllm_duplex.models.scripted import ScriptedPolicy


class CommitFirst(ScriptedPolicy):
    """A model whose end of speech commits the turn before it is shown."""

    def decide_output(self, view, output: StageOutput) -> Sequence[PolicyStep]:
        if isinstance(output.payload, VadSpeechStopped):
            return [CommitTurn(), Show(), Respond()]
        return super().decide_output(view, output)


def test_steps_are_carried_out_in_the_order_the_policy_gave_them():
    core = make_core(CommitFirst())
    core.handle(cmd.AudioAppend(audio=TEN_MS * 10), 0.0)
    got = types(output(core, VadSpeechStopped(100), stage="vad"))
    committed = got.index("input_audio_buffer.committed")
    assert committed < got.index("input_audio_buffer.speech_stopped") < got.index("response.created")
    # The scripted policy's own order: shown first, as the GA server sends them.
    core = make_core()
    core.handle(cmd.AudioAppend(audio=TEN_MS * 10), 0.0)
    got = types(output(core, VadSpeechStopped(100), stage="vad"))
    assert got.index("input_audio_buffer.speech_stopped") < got.index("input_audio_buffer.committed")


def test_a_commit_of_an_empty_buffer_does_nothing():
    core = make_core(CommitFirst())
    got = types(output(core, VadSpeechStopped(100), stage="vad"))
    assert "input_audio_buffer.committed" not in got and "error" not in got


class RespondsToText(ScriptedPolicy):
    """A model that asks for a reply at every text delta (a reply is shown then)."""

    def decide_output(self, view, output: StageOutput) -> Sequence[PolicyStep]:
        if isinstance(output.payload, TextDelta):
            return [Show(), Respond()]
        return super().decide_output(view, output)


def test_a_policys_respond_while_a_reply_is_shown_is_skipped_a_clients_is_refused():
    core = make_core(RespondsToText(), turn_detection=None, output_modalities=("text",))
    rid = create_response(core)
    got = types(output(core, TextDelta(rid, "hi")))
    assert got == ["response.output_item.added", "conversation.item.added",
                   "response.content_part.added", "response.output_text.delta"]
    assert core.shown is not None and core.shown.id == rid  # no second response, no error
    [err] = emitted(core.handle(cmd.ResponseCreate(), 0.0))
    assert err.error.code == "conversation_already_has_active_response"


def test_finish_reply_ends_the_reply_shown():
    core = make_core(turn_detection=None, output_modalities=("text",))
    rid = create_response(core)
    output(core, TextDelta(rid, "hi"))
    assert ScriptedPolicy().decide_output(core, StageOutput(
        core.fence, core.fence.request_id("llm"), "llm", GenerationDone(rid, "stop"))) == [
        Show(), FinishReply()]
    got = types(output(core, GenerationDone(rid, "stop")))
    assert got[-1] == "response.done" and core.shown is None
