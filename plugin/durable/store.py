"""The session store: one interface, two implementations (``memory``, ``redis_store``).

Per session the store keeps:

* a **lease**: holder (``<owner>#<life>``: a worker restarted under the same
  owner id is another holder), generation, expiry. ``acquire`` is a
  compare-and-set: it succeeds for a new session, for one whose lease lapsed,
  or whose holder is known dead (``mark_dead``), and then bumps the
  generation. Every write names the generation it was made under; a write
  of an older generation is refused (``Fenced``): two owners never write.
* a **state** record (``SessionState``): what a rebuilt session starts from.
* a **journal** of events, seq-numbered, bounded in events, bytes and age like
  the in-memory one (``vllm_duplex.replay.journal``), and trimmed by the
  client's acks (``Trim``).

Writes come in ordered batches (``apply``) so a store with a network in
between pays one round trip for many events. ``StoreUnavailable`` is the one
error that says "try later" (the store is down or unreachable).
"""

from __future__ import annotations

import abc
import hashlib
import io
import pickle
from dataclasses import dataclass, field
from typing import Any

from vllm_duplex.domain.errors import DuplexError


class StoreUnavailable(Exception):
    """The store cannot be reached now (a network store restarting, down)."""


class Fenced(Exception):
    """A write or renewal under a generation that is no longer the session's:
    another holder took it over. The writer must drop the session."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id}: lease taken over (fenced)")
        self.session_id = session_id


class Lost(Exception):
    """The store no longer holds the session at all (a Redis restarted
    without persistence, keys expired): the writer writes it again from
    what the process has (its state, its in-memory journal)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id}: the store lost it")
        self.session_id = session_id


@dataclass(frozen=True)
class Bounds:
    """What a stored journal may retain (the newest event always stays)."""

    max_events: int = 4096
    max_bytes: int = 8 << 20
    max_age_s: float = 300.0
    keep_s: float = 600.0  # every key of a session lives this long after its last write


class LeaseHeld(Exception):
    """``acquire`` found a live lease of another holder."""

    def __init__(self, holder: str, generation: int) -> None:
        super().__init__(f"lease held by {holder} (generation {generation})")
        self.holder, self.generation = holder, generation

    @property
    def owner(self) -> str:
        return self.holder.split("#", 1)[0]


@dataclass
class SessionState:
    """What a session is rebuilt from: its config, its items as the client
    got them, the hashes of its resume token and API key, and where its
    journal and numbered input stood. Typed values (``SessionConfig``,
    ``ConversationItem``), pickled by ``encode`` with an allow-list."""

    config: Any
    items: tuple[Any, ...]
    token_sha: str
    key_sha: str | None
    last_input_seq: int = 0
    extra_wire: dict[str, Any] = field(default_factory=dict)
    incarnation: int = 0
    epoch: int = 0


@dataclass(frozen=True)
class Stored:
    """A session as ``load`` finds it."""

    session_id: str
    state: SessionState
    generation: int
    holder: str | None  # None: no live lease
    first_seq: int  # oldest retained event (head + 1 when none)
    head_seq: int


# ---- the writes of one batch ---------------------------------------------------


@dataclass(frozen=True)
class Append:
    session_id: str
    generation: int
    seq: int
    size: int  # the wire-size estimate (the byte bound counts it)
    at: float  # unix seconds (the age bound)
    payload: Any  # an Envelope (encoded by the store that needs bytes)


@dataclass(frozen=True)
class Save:
    """The session's state now. ``holder`` + ``ttl_s``: a session the store
    does not hold yet (a new one, or one it lost) is created under
    ``generation`` with that lease; without them a missing session is ``Lost``."""

    session_id: str
    generation: int
    state: SessionState
    holder: str | None = None
    ttl_s: float = 0.0


@dataclass(frozen=True)
class Drop:
    """The session ended for good (``release_only``: its process is stopping;
    the session stays for another worker to adopt at once). Its generation
    stays until the store forgets it (an older owner waking up is fenced by
    it); ``forget``: an id claimed but never used (its creation failed) is
    forgotten whole, so the caller may ask for it again."""

    session_id: str
    generation: int
    release_only: bool = False
    forget: bool = False


@dataclass(frozen=True)
class Trim:
    """The client acknowledged every event up to ``seq``
    (``session.event_ack``): the journal forgets them, as the in-memory one
    does (``Journal.ack``). Later events and the head stay; an ack past what
    the store holds drops what it holds."""

    session_id: str
    generation: int
    seq: int


Write = Append | Save | Drop | Trim


class SessionStore(abc.ABC):
    """The interface. ``apply`` writes a batch in order and answers, per
    session of the batch, the head seq now durable (or ``Fenced``)."""

    durable: bool  # does it outlive this process?

    @abc.abstractmethod
    async def acquire(self, session_id: str, holder: str, ttl_s: float, *,
                      new: bool = False) -> int:
        """Take the lease; the generation now. ``new``: a session that must not
        exist yet (``DuplexError duplicate_id`` otherwise). An adoption of a
        session the store does not hold: ``DuplexError session_not_found``.
        A live lease of another holder: ``LeaseHeld``."""

    @abc.abstractmethod
    async def renew(self, leases: dict[str, tuple[str, int]], ttl_s: float
                    ) -> dict[str, Fenced | Lost]:
        """Renew ``{session_id: (holder, generation)}``; the ids that could not
        be: fenced (another generation) or lost (the store holds nothing)."""

    @abc.abstractmethod
    async def apply(self, writes: list[Write]) -> dict[str, int | Fenced | Lost]:
        """Write ``writes`` in order (``Append``, ``Save``, ``Drop``, ``Trim``,
        each fenced by its generation); per session: its durable head seq, or
        ``Fenced`` / ``Lost`` (the session's later writes of the batch are skipped)."""

    @abc.abstractmethod
    async def load(self, session_id: str) -> Stored | None: ...

    @abc.abstractmethod
    async def events_after(self, session_id: str, seq: int) -> list[Any] | None:
        """The journaled events after ``seq`` (Envelopes, in order), or None
        when some of them are no longer retained (the caller must resync)."""

    @abc.abstractmethod
    async def mark_dead(self, holder: str) -> None:
        """``holder``'s process is known dead: its leases may be taken now."""

    @abc.abstractmethod
    async def ping(self) -> bool: ...

    async def close(self) -> None:
        return None


def sha(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def check_state(stored: Stored, api_key: str | None, token: str) -> None:
    """A resume's caller must be the session's key and hold its token (the
    hashes compared in constant time; another key's session is not found)."""
    import hmac

    if stored.state.key_sha is not None and (
            api_key is None or not hmac.compare_digest(stored.state.key_sha, sha(api_key) or "")):
        raise DuplexError("session_not_found", f"no session {stored.session_id!r}",
                          param="session_id")
    if not hmac.compare_digest(stored.state.token_sha, sha(token) or ""):
        raise DuplexError("invalid_resume_token", "the resume token does not match "
                          "(tokens rotate on every resume)", param="resume_token")


# ---- encoding: pickle, restricted to our typed values ---------------------------

_ALLOWED_MODULES = ("vllm_duplex.domain.", "vllm_duplex.durable.store", "vllm_duplex.durable.records")
_ALLOWED_BUILTINS = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset",
                                               "bytes", "bytearray", "str", "int", "float",
                                               "bool", "complex", "getattr")}


class _Unpickler(pickle.Unpickler):
    """Only our core's value types and plain builtins: bytes from a shared
    store must never name arbitrary code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_BUILTINS or module.startswith(_ALLOWED_MODULES) or \
                (module == "copyreg" and name == "_reconstructor") or module == "enum":
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to load {module}.{name} from the store")


def encode(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()
