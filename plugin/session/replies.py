"""A reply's request, built in one place: what the model of a reply sees and
how it samples, for a reply the client asks for and for one speculated at a
pause alike (so a speculated reply can be used exactly when the reply asked
for would have been the same request).

Pure: functions of the policy, the session view and the conversation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain.conversation import ConversationItem, Response, context_messages
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import ContextMessage, GenerateRequest
from vllm_duplex.domain.session_config import AudioFormat, SessionConfig, check_modalities
from vllm_duplex.domain.contracts import Capabilities
from vllm_duplex.policy import ModelPolicy, SessionView
from vllm_duplex.session.items import ItemStore

Tools = tuple[tuple[dict[str, Any], ...], Any]


def reply_tools(config: SessionConfig, options: cmd.ResponseOptions) -> Tools:
    """The tools and tool choice of one reply: its own, else the session's.
    A choice that cannot be met is the client's mistake, not a silent no-call."""
    tools = model_tools(config) if options.tools is None else options.tools
    choice = options.tool_choice or config.tool_choice
    param = "response.tool_choice" if options.tool_choice else "response.tools"
    if isinstance(choice, dict) and choice.get("type") == "mcp":
        tools, choice = _mcp_choice(config, tuple(tools), choice, param)
    if choice == "required" and not tools:
        raise DuplexError("invalid_value", 'tool_choice "required" needs tools', param=param)
    if isinstance(choice, dict) and choice.get("name") not in {t.get("name") for t in tools}:
        raise DuplexError("invalid_value", f"tool_choice names no declared tool "
                          f"({choice.get('name')!r})", param=param)
    return tools, choice


def model_tools(config: SessionConfig) -> tuple[dict[str, Any], ...]:
    """The session's function tools and the tools its MCP servers listed (an
    MCP server is called by the engine: the model sees only its tools)."""
    return (*(t for t in config.tools if t.get("type") != "mcp"), *(t for _, t in config.mcp_tools))


def _mcp_choice(config: SessionConfig, tools: tuple[dict[str, Any], ...], choice: dict[str, Any],
                param: str) -> tuple[tuple[dict[str, Any], ...], Any]:
    """``{"type": "mcp", "server_label", "name"?}`` as the model's choice: that
    tool, named as a function; without a name, one of that server's tools."""
    label, name = choice["server_label"], choice.get("name")
    listed = [t for lab, t in config.mcp_tools if lab == label and name in (None, t["name"])]
    if not listed or not all(t in tools for t in listed):
        raise DuplexError("invalid_value", f"tool_choice names no listed tool of MCP server "
                          f"{label!r}" + (f" ({name!r})" if name else ""), param=param)
    if name is not None:
        return tools, {"type": "function", "name": name}
    return tuple(listed), "required"


def check_response(config: SessionConfig, caps: Capabilities,
                   options: cmd.ResponseOptions) -> None:
    """Modalities the policy cannot make are the client's mistake."""
    modalities = tuple(options.output_modalities or config.output_modalities)
    check_modalities(modalities, caps, param="response.output_modalities")


def new_response(config: SessionConfig, options: cmd.ResponseOptions, response_id: str,
                 session_id: str) -> tuple[Response, AudioFormat]:
    """The response ``options`` ask for, and the audio format it speaks in."""
    modalities = tuple(options.output_modalities or config.output_modalities)
    fmt = options.output_format or config.output_format
    return Response(
        id=response_id,
        conversation_id=None if options.conversation == "none" else "conv_" + session_id,
        output_modalities=modalities, output_format=fmt.wire(),
        voice=options.voice or config.voice,
        max_output_tokens=options.max_output_tokens or config.max_output_tokens,
        metadata=options.metadata), fmt


def reply_context(policy: ModelPolicy[Any], view: SessionView[Any],
                  items: Sequence[ConversationItem], instructions: str,
                  then: tuple[ContextMessage, ...] = ()) -> tuple[ContextMessage, ...]:
    """What the model of a reply sees: the instructions and ``items``, then
    ``then`` (a speculated reply: the user's words not yet an item); the
    policy shapes it last."""
    return policy.shape_context(view, (*context_messages(items, instructions), *then))


def response_context(policy: ModelPolicy[Any], view: SessionView[Any], conversation: ItemStore,
                     options: cmd.ResponseOptions) -> tuple[ContextMessage, ...]:
    """What the model of a response sees: the conversation, or the response's
    own ``input`` items in its place, after its instructions (or the session's)."""
    items: Sequence[ConversationItem] = conversation.snapshot()
    if options.input is not None:
        items = [conversation.get(i, param=f"response.input[{n}].id")
                 if isinstance(i, str) else i for n, i in enumerate(options.input)]
    return reply_context(policy, view, items, options.instructions or view.config.instructions)


def reply_request(policy: ModelPolicy[Any], view: SessionView[Any], response_id: str,
                  context: tuple[ContextMessage, ...], options: cmd.ResponseOptions,
                  tools: Tools) -> GenerateRequest:
    return GenerateRequest(response_id=response_id, context=context,
                           sampling=policy.configure_sampling_params(view, options),
                           tools=tools[0], tool_choice=tools[1], truncation=view.config.truncation)
