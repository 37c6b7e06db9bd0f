"""Remote MCP tools in a session, without I/O: what the session shows and
asks for; the runner's ``mcp_client.py`` does the talking (the ``mcp`` SDK)
and hands the result back as a message, so a slow or dead server never holds
the session's loop or its audio.

* **Listing.** A server in ``session.tools`` (``domain/mcp.py``) is listed when
  it is configured (at the start, or by the ``session.update`` that adds or
  changes it): an ``mcp_list_tools`` item (``conversation.item.added``,
  ``mcp_list_tools.in_progress``), the ``ListMcpTools`` effect, then
  ``McpToolsListed`` back: ``mcp_list_tools.completed`` and the item, done,
  with the tools ``allowed_tools`` lets through -- or ``mcp_list_tools.failed``
  and an ``error`` event (``mcp_server_error``) saying why. The listed tools
  are offered to the model as function tools (``SessionConfig.mcp_tools``;
  a name that a function tool or another server already has is not offered twice).
* **A call.** The model's ``ToolCall`` naming a listed tool becomes an
  ``mcp_call`` item of the response (``response.mcp_call_arguments.delta`` /
  ``.done``, ``response.mcp_call.in_progress``) and the ``CallMcpTool``
  effect; the response is not finished while the call runs (the reply
  waits on it: ``Reply.calls``, ``Floor.finish``). ``McpToolCalled`` back:
  ``response.mcp_call.completed`` (the item's ``output``) or ``.failed`` (its
  ``error``: ``http_error``, ``protocol_error`` or ``tool_execution_error``),
  the item done, the response finished -- and once it completed (``Answer``,
  from its end) a follow-up response, in which the model answers with the
  result in its context, as OpenAI's does.
* **Approval.** A tool that ``require_approval`` names (OpenAI's default:
  all of them) makes an ``mcp_approval_request`` item instead, and nothing
  runs. The client's ``mcp_approval_response`` item (``conversation.item.create``)
  approving it runs the call as an ``mcp_call`` item with its
  ``approval_request_id``, outside any response, and the follow-up answers;
  one denying it runs nothing.

Follow-ups chain while the model calls tools again, ``MAX_ROUNDS`` at most:
the last is asked with ``tool_choice: "none"``. A follow-up never uses the
session's ``"required"`` (or named) choice: the call it asked for was made.

``McpCalls`` is a part like the others (``asks.py``): it owns this state,
reads the reply shown from the floor, puts its items in the conversation, and
returns events, effects and the asks only the core carries out: the shared
one (``Show`` an item as the floor shows an output of the reply,
``McpItemShown``) and its own (``Offer`` the listed tools; tell the reply it
waits on a call, ``Awaited``, and that the call is back, ``Returned``;
``Report`` an error; make a held response -- ``RespondWhenListed`` -- or
the ``FollowUp``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import events as ev
from vllm_duplex.domain import mcp
from vllm_duplex.domain.contracts import Show
from vllm_duplex.domain.conversation import ConversationItem, ItemType
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import ToolCall
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.session.asks import Steps
from vllm_duplex.session.items import ItemStore
from vllm_duplex.session.mcp_render import McpItemShown, function_tool

if TYPE_CHECKING:
    from vllm_duplex.session.floor import Floor

MAX_ROUNDS = 4  # follow-ups in a row that may call a tool again
MAX_RESPONSE_SERVERS = 16  # responses' own MCP servers kept listed


# ---- effects (the runner carries them out) and the messages they hand back ----


@dataclass(frozen=True, slots=True)
class ListMcpTools:
    """List the tools of ``server`` (a ``domain/mcp.py`` definition); hand back
    ``McpToolsListed(item_id, ...)``."""

    item_id: str
    server: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CallMcpTool:
    """Call ``name`` on ``server`` with ``arguments`` (JSON text); hand back
    ``McpToolCalled(item_id, ...)``."""

    item_id: str
    server: dict[str, Any]
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class McpToolsListed:
    """The server's tools (``name``, ``input_schema``, ``description``?,
    ``annotations``?), or ``error`` (an mcp_call error object) when it could not list them."""

    item_id: str
    tools: tuple[dict[str, Any], ...] = ()
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class McpToolCalled:
    """What the tool gave (``output``: its text), or ``error``."""

    item_id: str
    output: str | None = None
    error: dict[str, Any] | None = None


# ---- what only the core does (asks, carried out by SessionCore.carry) ---------------


@dataclass(frozen=True, slots=True)
class Offer:
    """The model is offered these tools of the MCP servers now (``SessionConfig.mcp_tools``)."""

    tools: tuple[tuple[str, dict[str, Any]], ...]  # (server_label, function tool)


@dataclass(frozen=True, slots=True)
class Awaited:
    """The reply shown made MCP call ``item_id``: it ends only once the call is
    back (``Floor.await_call``)."""

    item_id: str


@dataclass(frozen=True, slots=True)
class Returned:
    """MCP call ``item_id`` is back: the reply that made it may end now, if it
    was generated to its end meanwhile (``Floor.call_returned``); ``answer``:
    once it completes, a follow-up answers with the result."""

    item_id: str
    answer: bool


@dataclass(frozen=True, slots=True)
class Answer:
    """A reply whose MCP calls are back completed (``Floor.end``): the model
    answers with their results (``McpCalls.answer``)."""


@dataclass(frozen=True, slots=True)
class Report:
    """An ``error`` event for the client (counted like every error)."""

    error: DuplexError


@dataclass(frozen=True, slots=True)
class RespondWhenListed:
    """Make the response a client asked for once its own MCP servers are
    listed (``options``: their tools as function tools); the core tells
    the floor that the reply offers ``offered`` (``Reply.mcp_tools``;
    ``event_id``: the request's)."""

    options: cmd.ResponseOptions
    offered: dict[str, tuple[dict[str, Any], dict[str, Any] | None]]
    event_id: str | None


@dataclass(frozen=True, slots=True)
class FollowUp:
    """Make the response that answers with the calls' results (a follow-up:
    ``Reply.follows_up``)."""

    options: cmd.ResponseOptions


# What the MCP calls return beside events (``asks.Step``): their asks and effects.
McpStep: TypeAlias = (Offer | Awaited | Returned | Answer | Report | RespondWhenListed | FollowUp
                      | ListMcpTools | CallMcpTool)


# ---- the session's MCP state ------------------------------------------------------


@dataclass
class _Server:
    key: tuple
    tool: dict[str, Any]  # the definition in session.tools (or a response's tools)
    item: ConversationItem  # its mcp_list_tools item
    previous: str | None  # the item it follows
    listed: bool = False
    done: bool = False  # listed, or failed to


@dataclass
class _Call:
    item: ConversationItem
    response_id: str | None  # None: an approved call, run outside a response
    output_index: int
    in_conversation: bool = True




class McpCalls:
    """One session's MCP servers, calls and approvals: the only writer of
    them. Given the floor (to read the reply shown), the conversation (its
    MCP items go in) and the id maker; returns what the core carries out."""

    def __init__(self, floor: Floor, *, conversation: ItemStore,
                 make_id: Callable[[str], str]) -> None:
        self._floor = floor
        self._conversation = conversation
        self._make_id = make_id
        self.servers: dict[str, _Server] = {}  # by server_label
        self.offered: dict[str, tuple[str, dict[str, Any] | None]] = {}  # tool -> (label, annotations)
        self.calls: dict[str, _Call] = {}  # running, by item id
        self.approvals: dict[str, tuple[dict[str, Any], str, str]] = {}  # request id -> (server, name, args)
        # A response's own MCP servers (response.create's tools), by listing key,
        # and the responses waiting for them (what one offers is its reply's,
        # ``Reply.mcp_tools``).
        self._by_key: dict[tuple, _Server] = {}
        self._held: list[cmd.ResponseCreate] = []
        # The follow-up: due (an approved call is back, or a reply whose calls
        # are back completed: ``Answer``), and how many ran in a row.
        self._follow_due = False
        self._rounds = 0

    def _previous(self) -> str | None:
        last = self._conversation.last
        return last.id if last else None

    # ---- listing ------------------------------------------------------------------

    def configure(self, config: SessionConfig, *, starting: bool = False) -> Steps:
        """The session's tools changed (or it starts): list what is new, forget
        what went. A session that starts with a conversation (rebuilt from a
        store, plugin/durable/) takes its servers' listings from it when they
        have tools, as its client saw them: nothing is listed again."""
        wanted = {t["server_label"]: t for t in config.tools if t.get("type") == "mcp"}
        for label in [label for label in self.servers if label not in wanted]:
            del self.servers[label]
        steps: Steps = []
        restored = self._listings() if starting else {}
        for label, tool in wanted.items():
            key = mcp.listing_key(tool)
            server = self.servers.get(label)
            if server is not None and server.key == key:
                server.tool = tool  # require_approval, server_description: no new listing
                continue
            if label in restored:
                item = restored[label]
                self.servers[label] = _Server(key, tool, item, self._before(item.id),
                                              listed=True, done=True)
                continue
            item = ConversationItem(id=self._make_id("mcpl"), type=ItemType.MCP_LIST_TOOLS,
                                    server_label=label, tools=[])
            previous = self._previous()
            self._conversation.append(item)
            self.servers[label] = _Server(key, tool, item, previous)
            steps += [ev.ConversationItemAdded(item=item.wire(), previous_item_id=previous),
                      ev.McpListToolsInProgress(item_id=item.id), ListMcpTools(item.id, tool)]
        return steps + self._offer(config)

    def _listings(self) -> dict[str, ConversationItem]:
        """The conversation's last mcp_list_tools item of each server that listed tools."""
        out: dict[str, ConversationItem] = {}
        for item in self._conversation:
            if item.type is ItemType.MCP_LIST_TOOLS and item.server_label:
                if item.tools:
                    out[item.server_label] = item
                else:  # a failed (or empty) listing: list again
                    out.pop(item.server_label, None)
        return out

    def listed(self, m: McpToolsListed, config: SessionConfig) -> Steps:
        servers = (*self.servers.values(), *self._by_key.values())
        server = next((s for s in servers if s.item.id == m.item_id), None)
        if server is None:
            return []  # removed or replaced while it was listed
        server.done = True
        item = server.item
        steps: Steps = []
        if m.error is not None:
            steps += [ev.McpListToolsFailed(item_id=item.id), Report(DuplexError(
                "mcp_server_error", f"MCP server {item.server_label!r} could not list its tools: "
                f"{m.error.get('message', '')}",
                param=("session.tools" if any(s is server for s in self.servers.values())
                       else "response.tools"),
                details={"server_label": item.server_label, "mcp_error": m.error}))]
        else:
            item.tools = [t for t in m.tools
                          if mcp.allowed(server.tool, t["name"], t.get("annotations"))]
            server.listed = True
            steps.append(ev.McpListToolsCompleted(item_id=item.id))
        steps.append(ev.ConversationItemDone(item=item.wire(), previous_item_id=server.previous))
        return steps + self._offer(config) + self._release()

    def _offer(self, config: SessionConfig) -> Steps:
        """What the model is offered: the listed tools, as function tools."""
        taken = {t.get("name") for t in config.tools if t.get("type") != "mcp"}
        offered: dict[str, tuple[str, dict[str, Any] | None]] = {}
        tools: list[tuple[str, dict[str, Any]]] = []
        for label, server in self.servers.items():
            if not server.listed:
                continue
            about = server.tool.get("server_description")
            for t in server.item.tools or ():
                name = t["name"]
                if name in taken or name in offered:
                    continue
                offered[name] = (label, t.get("annotations"))
                tools.append((label, function_tool(t, about)))
        self.offered = offered
        return [] if tuple(tools) == config.mcp_tools else [Offer(tuple(tools))]

    # ---- a call the model makes -----------------------------------------------------

    def takes(self, call: ToolCall) -> Steps | None:
        """None: ``call`` is no listed MCP tool's (a function call, the client's).
        Else its item is shown, and the call runs unless it must be approved."""
        reply = self._floor.shown
        if reply is None or reply.id != call.response_id or reply.record is None:
            return None
        own = reply.mcp_tools
        if own is not None:  # a response with its own tools offers only those
            owner = own.get(call.name)
        else:
            session = self.offered.get(call.name)
            owner = None if session is None else (self.servers[session[0]].tool, session[1])
        if owner is None:
            return None
        if not reply.follows_up:
            self._rounds = 0  # a new exchange: the follow-ups count again
        tool, annotations = owner
        label = tool["server_label"]
        if mcp.needs_approval(tool, call.name, annotations):
            item = ConversationItem(id=self._make_id("mcpr"), type=ItemType.MCP_APPROVAL_REQUEST,
                                    server_label=label, name=call.name, arguments=call.arguments)
            self.approvals[item.id] = (tool, call.name, call.arguments)
            return [Show(McpItemShown(reply.id, item))]
        item = ConversationItem(id=self._make_id("mcp"), type=ItemType.MCP_CALL, server_label=label,
                                name=call.name, arguments=call.arguments)
        index = len(reply.record.response.output)  # where the floor shows it, next
        self.calls[item.id] = _Call(item, reply.id, index, reply.record.in_conversation)
        return [Awaited(item.id), Show(McpItemShown(reply.id, item)),
                CallMcpTool(item.id, tool, call.name, call.arguments)]

    def called(self, m: McpToolCalled) -> Steps:
        """A call came back: its item done with the output or the error; the
        reply that waited on it may end; the model will answer (``after``)."""
        call = self.calls.pop(m.item_id, None)
        if call is None:
            return []
        item = call.item
        item.output, item.error = m.output, m.error
        event = ev.McpCallCompleted if m.error is None else ev.McpCallFailed
        steps: Steps = [event(item_id=item.id, output_index=call.output_index)]
        shown = self._floor.shown
        own = shown is not None and call.response_id == shown.id
        if own:
            steps.append(ev.OutputItemDone(response_id=call.response_id,
                                           output_index=call.output_index, item=item.wire()))
        if call.in_conversation:
            steps.append(ev.ConversationItemDone(item=item.wire(),
                                                 previous_item_id=self._before(item.id)))
        if call.response_id is None:  # an approved call: the model answers next
            self._follow_due = True
        elif own:  # (a reply cut meanwhile has ended already, and its follow-up with it)
            steps.append(Returned(item.id, answer=call.in_conversation))
        return steps

    def _before(self, item_id: str) -> str | None:
        previous = None
        for item in self._conversation:
            if item.id == item_id:
                return previous
            previous = item.id
        return None

    # ---- approvals ------------------------------------------------------------------

    def _approval(self, item: ConversationItem) -> Steps:
        """The client answered an ``mcp_approval_request``: an approved call runs now."""
        request = self.approvals.pop(item.approval_request_id or "", None)
        if request is None:
            raise DuplexError("item_not_found", f"no mcp_approval_request "
                              f"{item.approval_request_id!r} is waiting for an answer",
                              param="item.approval_request_id")
        if not item.approve:
            return []
        tool, name, arguments = request
        label = tool["server_label"]
        call = ConversationItem(id=self._make_id("mcp"), type=ItemType.MCP_CALL,
                                server_label=label, name=name, arguments=arguments,
                                approval_request_id=item.approval_request_id)
        previous = self._previous()
        self._conversation.append(call)
        self.calls[call.id] = _Call(call, None, 0)
        return [ev.ConversationItemAdded(item=call.wire(), previous_item_id=previous),
                ev.McpCallInProgress(item_id=call.id, output_index=0),
                CallMcpTool(call.id, tool, name, arguments)]

    # ---- a response's own MCP servers ------------------------------------------------

    def hold(self, message: object) -> Steps | None:
        """A ``response.create`` whose ``tools`` name MCP servers waits until
        they are listed (listed once per session and definition, then reused):
        the listings it needs, then the response (``RespondWhenListed``). None: any
        other message, handled as it is. A ``response.cancel`` with no response
        shown drops the held ones (never created: nothing to end)."""
        if type(message) is cmd.ResponseCancel and self._held and self._floor.shown is None:
            self._held.clear()
            return []
        if type(message) is not cmd.ResponseCreate or not message.options.tools:
            return None
        servers = [t for t in message.options.tools if t.get("type") == "mcp"]
        if not servers:
            return None
        steps: Steps = []
        for tool in servers:
            key = mcp.listing_key(tool)
            if key in self._by_key:
                continue
            if len(self._by_key) >= MAX_RESPONSE_SERVERS:  # the oldest listed one goes
                oldest = next((k for k, s in self._by_key.items() if s.done), None)
                if oldest is None:
                    raise DuplexError("rate_limited", "too many MCP servers are being listed",
                                      param="response.tools")
                del self._by_key[oldest]
            item = ConversationItem(id=self._make_id("mcpl"), type=ItemType.MCP_LIST_TOOLS,
                                    server_label=tool["server_label"], tools=[])
            previous = self._previous()
            self._conversation.append(item)
            self._by_key[key] = _Server(key, tool, item, previous)
            steps += [ev.ConversationItemAdded(item=item.wire(), previous_item_id=previous),
                      ev.McpListToolsInProgress(item_id=item.id), ListMcpTools(item.id, tool)]
        self._held.append(message)
        return steps + self._release()

    def _release(self) -> Steps:
        """The held responses whose servers are all done, in order: their MCP
        servers' tools become function tools (a server that failed offers none)."""
        out: Steps = []
        while self._held:
            c = self._held[0]
            tools = c.options.tools or ()
            if not all(self._by_key[mcp.listing_key(t)].done for t in tools if t.get("type") == "mcp"):
                break
            self._held.pop(0)
            taken = {t.get("name") for t in tools if t.get("type") != "mcp"}
            offered: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
            model: list[dict[str, Any]] = [t for t in tools if t.get("type") != "mcp"]
            for tool in (t for t in tools if t.get("type") == "mcp"):
                server = self._by_key[mcp.listing_key(tool)]
                for t in server.item.tools or ():
                    if t["name"] in taken or t["name"] in offered:
                        continue
                    offered[t["name"]] = (tool, t.get("annotations"))
                    model.append(function_tool(t, tool.get("server_description")))
            options = dataclasses.replace(c.options, tools=tuple(model))
            out.append(RespondWhenListed(options, offered, c.event_id))
        return out

    # ---- the follow-up --------------------------------------------------------------

    def after(self, message: object, config: SessionConfig) -> Steps:
        """After every message the core handled: an approval to act on, a
        follow-up that became due."""
        steps: Steps = []
        if type(message) is cmd.ItemCreate and message.item.type is ItemType.MCP_APPROVAL_RESPONSE:
            steps += self._approval(message.item)
        return steps + self._follow_up(config)

    def answer(self) -> None:
        """A reply whose calls are back completed (``Answer``): the follow-up is due."""
        self._follow_due = True

    def _follow_up(self, config: SessionConfig) -> Steps:
        """Ask for the answer to the calls once every call is back (a reply
        cut or cancelled meanwhile took its follow-up with it: it never asks,
        ``Answer``)."""
        if not self._follow_due or self.calls:
            return []
        self._follow_due = False
        if self._floor.shown is not None:
            return []  # another reply came first: it sees the results already
        self._rounds += 1
        last = self._rounds >= MAX_ROUNDS or config.tool_choice == "none"
        return [FollowUp(cmd.ResponseOptions(tool_choice="none" if last else "auto"))]
