"""Conversations as training tokens, exactly as the agent loop would have produced them while serving.

The loop encodes the prompt with the chat template (generation prompt included), appends each sampled turn
as the model's own tokens ending in its end-of-turn token, and appends each tool turn through the bridge
(`tool_results.tool_turn_ids`). Encoding a conversation the same way, with the same template and bridge,
means the tokens trained on are the tokens served: `tests/unit/test_rl_sft.py` checks this against the
loop itself on a scripted engine. Loss falls on the model's own tokens only (mask 1); prompts, tool
results and the template's own text between turns carry none (mask 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rstar.rl.data import jsonl_rows
from rstar.sandbox.tools import PYTHON_TOOL
from rstar.server.builtin_tools import builtin_tool_schemas
from rstar.server.chat_template import ChatTemplate
from rstar.server.tool_results import tool_turn_ids

# A sentinel no tokenizer or template alters: it locates the assistant content in a render.
_USER = {"role": "user", "content": "\x00"}


class ConversationError(ValueError):
    """A conversation the format cannot train on; the message says where and why."""


@dataclass(frozen=True)
class EncodedConversation:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]  # one per response token: 1 = the model's own token


def assistant_turn_text(template: ChatTemplate, message: Mapping) -> str:
    """What the model samples for an assistant message: its rendering without the turn's header, the
    generation prefix the prompt already holds ('<reason>'), and the turn end (sampled as its own token)."""
    base = template.render([_USER], add_generation_prompt=False)
    full = template.render([_USER, dict(message)], add_generation_prompt=False)
    body = full[len(base) :]
    header, end = template.assistant_header, template.turn_end
    if not body.startswith(header) or not body.endswith(end):
        raise ConversationError("the template does not render this assistant message as one turn")
    body = body[len(header) : len(body) - len(end)]
    if not body.startswith(template.generation_prefix):
        raise ConversationError(f"an assistant turn must start with the generation prefix {template.generation_prefix!r}, as served")
    return body[len(template.generation_prefix) :]


def encode_conversation(template: ChatTemplate, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None) -> EncodedConversation:
    """Prompt ids (everything before the first assistant message) and the response with its loss mask."""
    tools = builtin_tool_schemas([PYTHON_TOOL]) if tools is None else list(tools)
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None or first == 0:
        raise ConversationError("a conversation needs at least one message before its first assistant message, and one assistant message")
    if messages[-1].get("role") != "assistant":
        raise ConversationError(f"a conversation must end with an assistant message, not {messages[-1].get('role')!r}")
    prompt_ids = template.encode(list(messages[:first]), tools, add_generation_prompt=True)
    turn_end_ids = template.encode_text(template.turn_end.rstrip())
    response: list[int] = []
    mask: list[int] = []
    position = first
    while position < len(messages):
        message = messages[position]
        if message.get("role") != "assistant":
            raise ConversationError(f"message {position}: expected an assistant message after the tool results, got {message.get('role')!r}")
        sampled = template.encode_text(assistant_turn_text(template, message)) + turn_end_ids
        response += sampled
        mask += [1] * len(sampled)
        position += 1
        results = []
        while position < len(messages) and messages[position].get("role") == "tool":
            content = messages[position].get("content")
            if not isinstance(content, str):
                raise ConversationError(f"message {position}: a tool message's content must be text")
            results.append(content)
            position += 1
        if results:
            if not message.get("tool_calls"):
                raise ConversationError(f"message {position - len(results)}: tool results follow an assistant message without tool calls")
            tool_ids = tool_turn_ids(template, results, template.turn_end.rstrip())
            response += tool_ids
            mask += [0] * len(tool_ids)
    return EncodedConversation(prompt_ids, response, mask)


def read_conversations(path: str) -> list[tuple[str, list[dict], list[dict] | None]]:
    """(where, messages, tools) for each line of a JSONL file of `{"messages": [...], "tools"?: [...]}` rows."""
    rows = []
    for where, row in jsonl_rows(path, ConversationError):
        messages = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise ConversationError(f"{where}: 'messages' must be a list of objects with a 'role'")
        rows.append((where, messages, row.get("tools")))
    if not rows:
        raise ConversationError(f"{path}: no conversations in the file")
    return rows
