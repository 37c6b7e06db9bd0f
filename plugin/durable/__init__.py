"""Durable sessions: what of a realtime session outlives its process.

``store`` is the one interface (``SessionStore``) with two implementations:
``memory`` (one process: the default, today's behaviour) and ``redis_store``
(Redis: shared by the workers of ``serve --workers N`` and by machines). What
goes in it: the session's state (config, conversation items as the client got
them, the resume token's hash), its event journal within retention, and an
ownership lease (holder, generation, expiry; compare-and-set). ``writer``
mirrors a process's live sessions into the store (batched, ordered, fenced by
generation) and holds their events back from the socket until they are
durable; ``adopt`` rebuilds a session whose owner died.

Between the host (which wires it) and the session (whose runner it feeds).
"""
