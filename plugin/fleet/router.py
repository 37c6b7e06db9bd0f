"""The router in front of the workers: nginx, with its config generated here.

Routing rules, in the order nginx applies them:

* A request that names an id goes to that id's owner *exactly*: an nginx
  ``map`` from the owner part of the id (``sess_…​.w2`` → ``w2``; ids a
  client chose: the ``Duplex-Owner-Instance`` header) to that owner's
  upstream, which has one server, so nothing is ever retried elsewhere.
  Where the id travels: ``/v1/sessions/{id}…``, ``/v1/streams/{id}…``,
  ``/v1/requests/{id}/abort`` (path), the resume socket
  ``/v1/realtime?resume=1&session_id=<id>`` and ``/v1/generate/stream?
  session_id=<id>`` (query: browsers cannot set WebSocket headers),
  ``/v1/streams/lookup`` (header only: its ids are in the body).
* An id whose owner part is malformed or names no worker here is refused by
  nginx (404 with the app's error shape: ``session_not_found``,
  ``stream_not_found``, ``request_not_found``), never routed at random.
* Everything else — new sessions, ``/v1/generate``, ``/v1/models``,
  ``/v1/capabilities`` — goes to the least-loaded worker (``least_conn``).
  A new session a full worker refuses (429 ``at_capacity`` /
  ``resource_exhausted``, before the upgrade: nothing was done) is sent to
  the next worker (``proxy_next_upstream http_429``); the client hears the
  429 only when every worker is full.
* ``/health`` and ``/metrics`` go to the supervisor's fleet endpoint, which
  aggregates every worker's (``vllm_duplex.fleet.view``).
* Limits as in the app: bodies over ``limits.max_request_bytes`` get 413
  ``payload_too_large`` from nginx in the app's shape; WebSocket frames are
  checked by the worker behind it (``max_frame_bytes``, close 1009);
  WebSocket upgrade and SSE pass through unbuffered with long timeouts.
* A worker that does not answer (dead, restarting) → 503 ``engine_dead``.
* With a durable session store (``durability: store: redis``), a resume
  whose owner does not answer (connection refused: dead or restarting) is
  sent to the other workers in turn (``backup`` servers of the owner's
  upstream), which adopt the session from the store. Only then: an owner
  that answers -- any answer -- is never retried elsewhere. A client may
  also name the worker that adopted its session (``&owner=w1`` in the
  resume URL, from ``session.resumed``'s ``owner_instance_id``): the query
  wins over the id's own owner part. The same holds for application
  sessions and resumable streams (``/v1/sessions/{id}…``, ``/v1/streams…``):
  their requests go to the backups when the owner does not answer, and the
  ``Duplex-Owner-Instance`` header (the worker that last served the id)
  wins over the id's minted owner.
* A worker out of routing (``RouterPlan.down``: the supervisor found it
  silent past the lease, ``liveness.py``) is ``server … down;`` in its
  upstream and in the pool: its ids go straight to its backups, new
  sessions to the others; it is put back when it answers again.
* With an external store that other machines may share
  (``foreign_to_pool``: ``durability.url`` set), an id naming a well-formed
  owner that is none of this router's workers goes to the pool, instead of
  a 404: that owner's machine may be down, and a worker here takes the
  session over from the store or answers the store's refusal
  (``wrong_instance`` naming a live owner elsewhere, ``session_not_found``).
  An id with no (or a malformed) owner part is still refused.
* Responses carry ``Duplex-Owner-Instance: <worker>`` from the worker that
  served them (``realtime/server/owner_header.py``), so a client can name
  the owner of an id it chose; a refusal by the router carries none.

The same generator writes an *edge* config for several machines: the owner
map then sends ``m2w3`` to machine ``m2``'s router by a regex on the owner.
With ``adopt`` (``vllm-duplex edge --adopt``: the machines share one store)
every other machine's router is a ``backup`` of each machine's upstream,
tried only when that machine's router does not answer (nginx's ``error``:
the connection refused or broken before any answer; a POST once sent is
never sent again, and an answer, any answer, is final).

``RouterPlan`` → ``nginx_conf`` is pure (tested without nginx); ``nginx.py``'s
``Nginx`` is the thin process shell that runs it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.owner_ids import OWNER_HEADER, ROUTABLE_OWNER

# The shape of a minted id (vllm_duplex.domain.owner_ids), as an nginx (PCRE) regex;
# \z, not $: PCRE's $ also matches before a trailing newline.
MINTED_ID_REGEX = r"^[a-z]+_[A-Za-z0-9_-]{24}\.(?<duplex_cap>[A-Za-z0-9]{1,32})\z"
POOL = "duplex_pool"
FLEET = "duplex_fleet"


@dataclass(frozen=True)
class OwnerRoute:
    """Owners ``owners`` (one owner id, or ``~regex`` on it) are served at
    ``address`` (``host:port``)."""

    name: str  # the owner id, or the machine of an edge route
    owners: str
    address: str

    @property
    def upstream(self) -> str:
        return f"duplex_{self.name}"


@dataclass(frozen=True)
class RouterPlan:
    listen: str  # host:port the router listens on
    routes: tuple[OwnerRoute, ...]
    max_request_bytes: int
    fleet: str | None = None  # the supervisor's /health + /metrics (None: the pool answers)
    adopt: bool = False  # a resume whose owner is down goes to another worker (durable store)
    read_timeout_s: int = 3600
    worker_processes: int = 1
    # An id naming a well-formed owner that is not one of these routes goes
    # to the pool (machines sharing one store: its owner may be on a machine
    # that is down), instead of a 404 from nginx.
    foreign_to_pool: bool = False
    down: frozenset[str] = frozenset()  # routes out of routing (unresponsive): backups serve

    @classmethod
    def for_workers(cls, listen: str, workers: dict[str, str], *, max_request_bytes: int,
                    fleet: str | None, adopt: bool = False, foreign_to_pool: bool = False,
                    down: frozenset[str] = frozenset()) -> RouterPlan:
        """One machine: owner ``w1`` → its worker at ``workers["w1"]``;
        ``down``: workers taken out of routing (their backups serve their ids)."""
        for owner in workers:
            if not ROUTABLE_OWNER.fullmatch(owner):
                raise ValueError(f"owner {owner!r} is not routable")
        if not down <= workers.keys():
            raise ValueError(f"down {sorted(down - workers.keys())}: not workers of this router")
        return cls(listen, tuple(OwnerRoute(o, o, a) for o, a in workers.items()),
                   max_request_bytes, fleet, adopt=adopt, foreign_to_pool=foreign_to_pool,
                   down=frozenset(down))

    @classmethod
    def for_edge(cls, listen: str, machines: dict[str, str], *, max_request_bytes: int,
                 adopt: bool = False) -> RouterPlan:
        """Several machines: owner ``m2w3`` → machine ``m2``'s router; ``adopt``
        (machines sharing one store): the other machines' routers are backups
        of each, tried when it does not answer."""
        for machine in machines:
            if not re.fullmatch(r"[A-Za-z]{1,8}[0-9]{1,6}", machine):
                raise ValueError(f"machine {machine!r}: use letters then digits (m2)")
        return cls(listen, tuple(OwnerRoute(m, f"~^{m}w[0-9]+$", a)
                                 for m, a in machines.items()), max_request_bytes, adopt=adopt)


def _error_body(code: str, message: str, param: str | None) -> str:
    """The app's error body, as an nginx single-quoted string."""
    text = json.dumps({"error": DuplexError(code, message, param=param).to_wire()},
                      separators=(",", ":"))
    if "'" in text or "$" in text or "\\" in text:  # nginx would read a variable or an escape
        raise ValueError(f"error body not expressible in nginx: {text}")
    return f"'{text}'"


_NOT_FOUND = {
    "session": ("session_not_found", "session_id"),
    "stream": ("stream_not_found", "stream_id"),
    "request": ("request_not_found", "request_id"),
}


def _refuse(kind: str) -> str:
    code, param = _NOT_FOUND[kind]
    message = (f"no worker of this router owns this {kind}: its id names no known owner "
               f"(ids this server minted end in .<owner>; for an id you chose, name the owner "
               f"in the {OWNER_HEADER} header)")
    return f"return 404 {_error_body(code, message, param)};"


def nginx_conf(plan: RouterPlan, run_dir: Path, user: str | None = None) -> str:
    run = str(run_dir)
    host, _, port = plan.listen.rpartition(":")
    owner_map = "\n".join(f"        {r.owners} {r.upstream};" for r in plan.routes)
    # A well-formed owner that is none of ours: the pool (it may be on a
    # machine that is down; a worker answers from the shared store), or refused.
    foreign = (f'        "" "";\n        default {POOL};' if plan.foreign_to_pool
               else '        default "";')

    def server(r: OwnerRoute) -> str:
        # down: out of routing (unresponsive); nginx goes straight to the backups
        return f"server {r.address} max_fails=0{' down' if r.name in plan.down else ''};"

    def servers(r: OwnerRoute) -> str:
        # backup: tried only when the owner's server fails to answer at all
        backups = "".join(f" server {o.address} backup max_fails=0;" for o in plan.routes
                          if o is not r) if plan.adopt else ""
        return f"{server(r)}{backups}"

    if plan.adopt:
        # A session another worker took over is named by the header (the
        # worker that served it last), before the owner its id was minted by.
        owner_choice = ("    map $duplex_header_owner $duplex_owner {\n"
                        "        \"\" $duplex_id_owner;\n        default $duplex_header_owner;\n    }")
    else:
        owner_choice = ("    map $duplex_id_owner $duplex_owner {\n"
                        "        \"\" $duplex_header_owner;\n        default $duplex_id_owner;\n    }")
    # With a durable store, a request whose owner does not answer (connection
    # refused) goes to the backups, which take the session or stream over; a
    # request the owner got is never sent again (nginx does not retry a POST
    # once sent, and an answer is an answer).
    named_retry = "error" if plan.adopt else "off"
    upstreams = "\n".join(
        f"    upstream {r.upstream} {{ {servers(r)} keepalive 16; }}" for r in plan.routes)
    # max_fails=0: a worker's 429 (full) is an answer, not a failure to count
    # against it (nginx would skip it for fail_timeout once it had room again).
    pool = "\n".join(f"        {server(r)}" for r in plan.routes)
    fleet = (f"    upstream {FLEET} {{ server {plan.fleet}; }}" if plan.fleet else "")
    health = FLEET if plan.fleet else POOL
    too_large = _error_body("payload_too_large",
                            f"bodies are at most {plan.max_request_bytes} bytes", None)
    unavailable = _error_body("engine_dead", "the worker for this request is not answering "
                              "(it died or is restarting); sessions it held have ended", None)
    # (proxy_set_header at a level replaces every inherited one: repeat them all)
    ws = ("proxy_set_header Upgrade $http_upgrade;\n"
          "            proxy_set_header Connection $duplex_connection;\n"
          "            proxy_set_header Host $host;\n"
          "            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;")
    user_line = f"user {user};" if user else ""
    return f"""# Generated by vllm_duplex.fleet.router; do not edit (regenerated at every start).
{user_line}
worker_processes {plan.worker_processes};
daemon off;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 8192; }}

http {{
    access_log off;
    server_tokens off;
    default_type application/json;
    client_body_temp_path {run}/client_body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;

    # The app's limits: bodies are read whole (in memory) up to max_request_bytes.
    client_max_body_size {plan.max_request_bytes};
    client_body_buffer_size {plan.max_request_bytes};
    # Realtime sockets and SSE streams live long and must flow unbuffered.
    proxy_http_version 1.1;
    proxy_buffering off;
    proxy_read_timeout {plan.read_timeout_s}s;
    proxy_send_timeout {plan.read_timeout_s}s;
    proxy_connect_timeout 5s;
    proxy_set_header Host $host;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    proxy_set_header Connection "";

    map $http_upgrade $duplex_connection {{ default upgrade; "" ""; }}

    # The owner an id names: <kind>_<24 url-safe chars>.<owner> (domain/owner_ids.py) ...
    map $duplex_id $duplex_minted_owner {{
        "~{MINTED_ID_REGEX}" $duplex_cap;
        default "";
    }}
    # ... unless a resume names the worker that adopted the session (&owner=).
    map "$arg_resume:$arg_owner" $duplex_id_owner {{
        "~^(1|true):(?<duplex_adopter>[A-Za-z0-9]{{1,32}})$" $duplex_adopter;
        default $duplex_minted_owner;
    }}
    # ... or, for an id the client chose, the {OWNER_HEADER} header.
    map $http_duplex_owner_instance $duplex_header_owner {{
        "~^[A-Za-z0-9]{{1,32}}$" $http_duplex_owner_instance;
        default "";
    }}
{owner_choice}
    # Owner -> its upstream; "" = refused (no owner, or none of ours without a shared store).
    map $duplex_owner $duplex_owner_upstream {{
{foreign}
{owner_map}
    }}
    # The resume socket goes to its owner; a new session to the least-loaded worker.
    map $arg_resume $duplex_realtime_upstream {{
        "~^(1|true)$" $duplex_owner_upstream;
        default {POOL};
    }}
    # Streaming input bound to a session goes to its owner.
    map "$arg_session_id$http_duplex_owner_instance" $duplex_generate_stream_upstream {{
        "" {POOL};
        default $duplex_owner_upstream;
    }}

{upstreams}
    upstream {POOL} {{
        zone {POOL} 64k;
        least_conn;
{pool}
        keepalive 32;
    }}
{fleet}

    server {{
        listen {host}:{port};
        error_page 413 = @too_large;
        error_page 502 504 = @unavailable;
        set $duplex_id "";

        location = /v1/realtime {{
            set $duplex_id $arg_session_id;
            if ($duplex_realtime_upstream = "") {{ {_refuse("session")} }}
            # A full worker refuses a new session before the upgrade (429): try
            # the next; the client hears 429 only when every worker is full.
            # (A resume's upstream has one server: nothing else is tried.)
            proxy_next_upstream error timeout http_429;
            {ws}
            proxy_pass http://$duplex_realtime_upstream;
        }}
        location = /v1/realtime/calls {{
            proxy_next_upstream error http_429 non_idempotent;  # a 429 did nothing, a refused
            # connection neither (a worker restarting): try the next (a worker that dies
            # holding the request may leave a session the client never saw: it expires)
            proxy_pass http://{POOL};
        }}
        location = /v1/generate/stream {{
            set $duplex_id $arg_session_id;
            if ($duplex_generate_stream_upstream = "") {{ {_refuse("session")} }}
            {ws}
            proxy_pass http://$duplex_generate_stream_upstream;
        }}
        location = /v1/sessions {{
            proxy_next_upstream error http_429 non_idempotent;  # a 429 did nothing, a refused
            # connection neither (a worker restarting): try the next (a worker that dies
            # holding the request may leave a session the client never saw: it expires)
            proxy_pass http://{POOL};
        }}
        location ~ ^/v1/sessions/(?<duplex_path_id>[^/]+)(/renew|/generate)?$ {{
            set $duplex_id $duplex_path_id;
            if ($duplex_owner_upstream = "") {{ {_refuse("session")} }}
            proxy_next_upstream {named_retry};
            proxy_pass http://$duplex_owner_upstream;
        }}
        location = /v1/streams/lookup {{
            if ($duplex_owner_upstream = "") {{ {_refuse("stream")} }}
            proxy_next_upstream {named_retry};
            proxy_pass http://$duplex_owner_upstream;
        }}
        location ~ ^/v1/streams/(?<duplex_path_id>[^/]+)(/control)?$ {{
            set $duplex_id $duplex_path_id;
            if ($duplex_owner_upstream = "") {{ {_refuse("stream")} }}
            proxy_next_upstream {named_retry};
            proxy_pass http://$duplex_owner_upstream;
        }}
        location ~ ^/v1/requests/(?<duplex_path_id>[^/]+)/abort$ {{
            set $duplex_id $duplex_path_id;
            if ($duplex_owner_upstream = "") {{ {_refuse("request")} }}
            proxy_next_upstream off;
            proxy_pass http://$duplex_owner_upstream;
        }}
        location = /health {{ proxy_pass http://{health}; }}
        location = /metrics {{ proxy_pass http://{health}; }}
        location / {{
            proxy_pass http://{POOL};
        }}
        location @too_large {{ return 413 {too_large}; }}
        location @unavailable {{ return 503 {unavailable}; }}
    }}
}}
"""
