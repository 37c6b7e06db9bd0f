"""Adoption: a live worker takes over a session whose owner died.

A resume (``session.resume`` with its token and last seq) that reaches a
worker not holding the session asks the store. The session is adopted when
its lease lapsed or its holder is known dead: the worker takes the lease
(generation + 1: the old owner is fenced from then on), and rebuilds the
session -- a new incarnation -- from the stored state: the config, the
conversation items as the client got them (the LLM context is built from
them again at the next reply: re-prefilled), the journal within retention
(so the resume replays exactly the events after the client's seq, and later
resumes too). A reply that was going out when the owner died ends
``incomplete`` (reason ``owner_lost``), its item kept as far as it was sent.

A lease of another worker is waited on for up to one lease period (a
resume may come a few milliseconds after a crash, before the supervisor has
marked the dead process in the store); a lease still held then is a live
owner's, answered ``wrong_instance`` with that worker's id
(``details.owner_instance_id``): the client resumes there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.conversation import ConversationItem, ItemType, Role
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.durable.store import LeaseHeld, Stored, check_state
from vllm_duplex.durable.writer import Durability
from vllm_duplex.session.runner import DuplexSession

INCOMPLETE_REASON = "owner_lost"
POLL_S = 0.05


def _moved(session_id: str, owner: str) -> DuplexError:
    return DuplexError("wrong_instance", f"session {session_id!r} is held by worker {owner!r} "
                       "now: resume it there", param="session_id",
                       details={"owner_instance_id": owner})


def cut_reply(items: list[ConversationItem], events: list[Envelope]) -> list[ev.ServerEvent]:
    """The events that end a reply the dead owner left going, and its items
    set to what was sent: an item still ``in_progress`` gets the transcript
    (or text) its journaled deltas carried, status ``incomplete``."""
    created: dict[str, dict[str, Any]] = {}
    for env in events:
        if isinstance(env.event, ev.ResponseCreated):
            created[env.event.response["id"]] = env.event.response
        elif isinstance(env.event, ev.ResponseDone):
            created.pop(env.event.response.get("id"), None)
    if not created:
        return []
    sent: dict[str, str] = {}
    for env in events:
        e = env.event
        if isinstance(e, (ev.OutputAudioTranscriptDelta, ev.OutputTextDelta)):
            sent[e.item_id] = sent.get(e.item_id, "") + e.delta
    out: list[ev.ServerEvent] = []
    for response_id, response in created.items():
        output = []
        for item in items:
            if item.status == "in_progress" and item.type is ItemType.MESSAGE \
                    and item.role is Role.ASSISTANT:
                item.status = "incomplete"
                for part in item.content:
                    if part.type == "output_text":
                        part.text = sent.get(item.id, part.text or "")
                    else:
                        part.transcript = sent.get(item.id, part.transcript or "")
                output.append(item.wire())
        done = {**response, "status": "incomplete", "output": output,
                "status_details": {"type": "incomplete", "reason": INCOMPLETE_REASON}}
        out.append(ev.ResponseDone(response=done))
    return out


async def adopt(durability: Durability, make_session: Callable[[Stored], DuplexSession],
                api_key: str | None, session_id: str, resume_token: str,
                admit: Callable[[DuplexSession], None]) -> DuplexSession:
    """Take ``session_id`` over from the store, or raise the typed refusal
    (``session_not_found``, ``invalid_resume_token``, ``wrong_instance``).
    ``make_session`` builds the session object; ``admit`` registers it
    with the host (before it starts)."""
    store = durability.store
    if not store.durable:
        raise DuplexError("session_not_found", f"no session {session_id!r}", param="session_id")
    stored = await store.load(session_id)
    if stored is None:
        raise DuplexError("session_not_found", f"no session {session_id!r}", param="session_id")
    check_state(stored, api_key, resume_token)
    clock = durability.clock
    deadline = clock.now() + durability.lease_ttl_s + 0.5
    while stored.holder is not None and stored.holder != durability.holder:
        if clock.now() > deadline:  # renewed all along: a live owner
            raise _moved(session_id, stored.holder.split("#", 1)[0])
        await clock.sleep(POLL_S)
        stored = await store.load(session_id) or stored
    try:
        generation = await store.acquire(session_id, durability.holder, durability.lease_ttl_s)
    except LeaseHeld as held:
        raise _moved(session_id, held.owner) from None
    # Read after the acquire: the old owner can write no more.
    stored = await store.load(session_id) or stored
    events = await store.events_after(session_id, stored.first_seq - 1) or []
    session = make_session(stored)
    session.resume_token = resume_token  # checked against its hash above; rotates at the resume
    state = stored.state
    items = list(state.items)
    closing = cut_reply(items, events)
    # Through the core's restore, not its parts: it starts one incarnation past
    # the fence the owner reached, and numbered input goes on after the last
    # chunk the store saw with the state.
    session.core.restore(items, Fence(session_id, state.incarnation, state.epoch),
                         state.last_input_seq)
    journal = session.journal
    journal.log.restart_after(events[0].seq - 1 if events else stored.head_seq)
    now = session.clock.now()
    for env in events:
        journal.append(env, now)
    admit(session)  # may refuse (resource_exhausted): then nothing is tracked here
    durability.track(session, generation, journal.head_seq)
    try:
        await session.start_adopted(journal.head_seq, closing)
    except BaseException:
        durability.release(session)  # another worker may take it: not dropped
        await session.close(CloseReason.START_FAILED)
        raise
    durability.adopted += 1
    durability.last_adoption_s = time.time()
    return session
