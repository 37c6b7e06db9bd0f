"""What the model still sees of a conversation that outgrew its context
(domain/truncation.py): the oldest messages after the instructions go, down to
the retention ratio of the room; the kept prefix stays while it fits."""

from __future__ import annotations

import pytest
from vllm_duplex.domain.payloads import ContextMessage
from vllm_duplex.domain.truncation import AUTO_RETENTION, Truncation, fit

SYSTEM = ("system", 50)


def conv(*sizes: int) -> list[tuple[str, int]]:
    return [SYSTEM] + [("user" if i % 2 == 0 else "assistant", n) for i, n in enumerate(sizes)]


def run(messages, room, truncation=Truncation(), dropped_before=0):
    return fit(messages, lambda m: m[1], room, truncation, dropped_before=dropped_before,
               is_instructions=lambda m: m[0] == "system")


def test_a_conversation_that_fits_is_kept_whole():
    msgs = conv(100, 100, 100)
    assert run(msgs, 400).kept == tuple(msgs) and run(msgs, 400).dropped == 0


def test_the_oldest_go_down_to_the_retention_of_the_room_the_instructions_stay():
    msgs = conv(*[100] * 10)  # 50 + 1000 tokens, room 550: 500 after the instructions
    fitted = run(msgs, 550)
    assert fitted.kept[0] == SYSTEM
    kept = sum(n for _, n in fitted.kept[1:])
    assert kept <= AUTO_RETENTION * 500 and kept + 100 > AUTO_RETENTION * 500  # just under 3/4
    assert fitted.kept[-1] == msgs[-1] and fitted.dropped == 7


def test_the_kept_prefix_stays_while_it_fits_then_drops_again():
    msgs = conv(*[100] * 10)
    first = run(msgs, 550)
    later = msgs + [("user", 100)]  # one more turn: 400 after the kept prefix, still fits 500
    again = run(later, 550, dropped_before=first.dropped)
    assert again.dropped == first.dropped and again.kept[1] == first.kept[1]
    fuller = later + [("assistant", 100), ("user", 100)]  # 600: over, cut again
    assert run(fuller, 550, dropped_before=again.dropped).dropped > again.dropped


def test_the_newest_message_is_kept_even_alone_over_the_room():
    msgs = conv(100, 900)
    assert run(msgs, 500).kept == (SYSTEM, ("assistant", 900))


@pytest.mark.parametrize("truncation, room, dropped", [
    (Truncation("disabled"), 100, 0),  # never drops: the reply fails instead
    (Truncation("retention_ratio", 0.5), 550, 8),  # 500 x 0.5: two messages kept
    (Truncation("retention_ratio", 1.0, post_instructions=300), 10_000, 7),  # its own limit
])
def test_settings(truncation, room, dropped):
    assert run(conv(*[100] * 10), room, truncation).dropped == dropped


def test_the_wire_shapes():
    assert Truncation().wire() == "auto" and Truncation("disabled").wire() == "disabled"
    assert Truncation("retention_ratio", 0.8, 5000).wire() == {
        "type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {"post_instructions": 5000}}
    with pytest.raises(ValueError):
        Truncation("retention_ratio", 1.5)


# ---- the LLM stage's window: what was dropped is remembered by item ----------------------

def window_of(words_per_message: int = 10):
    from vllm_duplex.stages.vllm.window import TEMPLATE_TOKENS, ContextWindow

    async def off_loop(fn, *args):
        return fn(*args)

    return ContextWindow(lambda text: text.split(), off_loop), words_per_message + TEMPLATE_TOKENS


def said(n: int, role: str = "user") -> ContextMessage:
    return ContextMessage(role, " ".join([f"w{n}"] * 10), item_id=f"item_{n}")


async def test_deleting_a_dropped_item_moves_nothing_the_model_sees():
    window, size = window_of()
    system = ContextMessage("system", "be brief")
    conversation = [said(n) for n in range(10)]
    kept = await window.fit([system, *conversation], Truncation(), room=6 * size)
    assert kept[1] == conversation[window.dropped]  # the oldest went
    first_kept = kept[1]
    # The client deletes the first item (the model no longer saw it), then says one more thing.
    after = await window.fit([system, *conversation[1:], said(10)], Truncation(), room=6 * size)
    assert after[1] is first_kept and after[-1].item_id == "item_10"
    # An item inserted among the dropped ones is as old as they are: left out too.
    inserted = [system, conversation[1], said(99), *conversation[2:], said(10)]
    assert (await window.fit(inserted, Truncation(), room=6 * size))[1] is first_kept
