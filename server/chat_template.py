"""Chat templates, chosen per model: render messages (+ tools) to the exact prompt text and token ids.

Two kinds:
- the rStar template (`templates/rstar.jinja`), for rStar models and for tokenizers without a template;
- a model's own template (e.g. SmolLM2's ChatML), rendered by the tokenizer. When that template does not
  speak the Hermes tool protocol itself, the tool protocol is injected into the messages it renders: the
  tools block goes into the system message, tool calls into the assistant text, and tool results become
  user turns of `<tool_response>` blocks, exactly the text the rStar template would produce there.

Besides rendering, a template knows three pieces of its own text that the token-level agent loop needs
(`assistant_header`, `generation_prefix`, `turn_end`); they are measured by rendering, not hard-coded.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATES_DIR = Path(__file__).parent / "templates"
RSTAR_TEMPLATE_PATH = TEMPLATES_DIR / "rstar.jinja"

# The Hermes tool protocol as the rStar template words it; `templates/rstar.jinja` holds the same text
# (tests/unit/test_template.py checks both agree). Used to inject the protocol into other templates.
TOOLS_BLOCK_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_BLOCK_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# rStar's reasoning block; its generation prompt opens one at the start of every assistant turn.
REASONING_OPEN = "<reason>"
REASONING_CLOSE = "</reason>"

# A sentinel that no tokenizer or template alters, used to measure where message content sits in a render.
_SENTINEL = "\x00rstar-content\x00"

TemplateKind = Literal["rstar", "model", "file"]

# What render() itself passes, and the parameters of transformers' `apply_chat_template` (which a model's
# own template is rendered through): `chat_template_kwargs` may never set them. `chat_template` among them
# would let a request supply the whole Jinja source the server renders.
RESERVED_VARIABLES = frozenset(
    {"messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template"}
    | {"tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}
)


class RenderTimeout(Exception):
    """A render that ran past its deadline (`render_deadline`)."""


_deadline = threading.local()


@contextlib.contextmanager
def render_deadline(seconds: float) -> Iterator[None]:
    """Renders on this thread within the block stop with RenderTimeout once `seconds` have passed. Checked at
    every call, attribute and item lookup of the template (each loop step over data or `range` makes some), so
    a runaway loop stops; a model's own template, rendered by its tokenizer, is outside this environment."""
    previous = getattr(_deadline, "at", None)
    _deadline.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _deadline.at = previous


def _check_deadline() -> None:
    at = getattr(_deadline, "at", None)
    if at is not None and time.monotonic() > at:
        raise RenderTimeout("the chat template ran past its time limit")


class _TimedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, checking the thread's render deadline at every call and lookup."""

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        _check_deadline()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj, attribute):
        _check_deadline()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _check_deadline()
        return super().getitem(obj, argument)


def tojson(value: Any) -> str:
    """JSON as the templates print it: transformers' `tojson` (no ASCII escaping, default separators)."""
    return json.dumps(value, ensure_ascii=False)


def tools_block(tools: Sequence[Mapping]) -> str:
    """The tools section of the system message, without the blank line that separates it from the prompt."""
    return TOOLS_BLOCK_HEAD + "".join("\n" + tojson(tool) for tool in tools) + TOOLS_BLOCK_TAIL


def tool_call_text(name: str, arguments: Any) -> str:
    """One tool call as an assistant message shows it (without the newline that precedes each call)."""
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + tojson(arguments) + "}\n</tool_call>"


def tool_responses_text(contents: Sequence[str]) -> str:
    """Consecutive tool results as the body of the one user turn that carries them."""
    return "\n".join(f"<tool_response>\n{content}\n</tool_response>" for content in contents)


def normalize_messages(messages: Sequence[Mapping]) -> list[dict]:
    """OpenAI-style messages as the templates expect them.

    Content parts are joined into text, missing content becomes "", and tool-call arguments given as a
    JSON string (the OpenAI wire format) become the object they encode, so templates print them once
    rather than as a quoted string.
    """
    normalized = []
    for message in messages:
        message = dict(message)
        message["content"] = content_text(message.get("content"))
        if message.get("tool_calls"):
            message["tool_calls"] = [_normalize_call(call) for call in message["tool_calls"]]
        normalized.append(message)
    return normalized


def content_text(content: Any) -> str:
    """Message content as text: parts joined, None as empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type", "text") == "text")


def _normalize_call(call: Mapping) -> dict:
    function = dict(call.get("function", call))
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict):
            function["arguments"] = decoded
    return {**call, "function": function} if "function" in call else function


def _environment() -> jinja2.Environment:
    # The same settings transformers renders chat templates with, so files render identically there.
    env = _TimedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    return env


def _compile(source: str) -> jinja2.Template:
    return _environment().from_string(source)


def template_variables(source: str) -> frozenset[str]:
    """The variables a template reads that it is not given by every render: the only ones a request's
    `chat_template_kwargs` may set (vLLM resolves them the same way)."""
    return frozenset(jinja2.meta.find_undeclared_variables(_environment().parse(source))) - RESERVED_VARIABLES


@dataclass(frozen=True)
class ChatTemplate:
    """One model's prompt format. `render` is pure; `encode` needs the tokenizer."""

    kind: TemplateKind
    source: str
    tokenizer: Any = field(default=None, compare=False, repr=False)
    # Whether the template itself renders `tools`, tool calls and tool messages in the Hermes format.
    native_tools: bool = True
    # Extra variables every render sees (vLLM's `chat_template_kwargs`), e.g. rstar.jinja's `math_instruction`;
    # (name, value) pairs, sorted, so templates stay comparable.
    variables: tuple[tuple[str, Any], ...] = ()

    def with_variables(self, variables: Mapping[str, Any]) -> "ChatTemplate":
        """The same template rendering with these variables too. ValueError for a render parameter; variables
        the template does not read are left out, so one request's choices work across templates."""
        if reserved := sorted(set(variables) & RESERVED_VARIABLES):
            raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)}")
        read = {name: value for name, value in variables.items() if name in self.readable_variables}
        return replace(self, variables=tuple(sorted({**dict(self.variables), **read}.items())))

    @cached_property
    def readable_variables(self) -> frozenset[str]:
        return template_variables(self.source)

    @cached_property
    def _compiled(self) -> jinja2.Template:
        return _compile(self.source)

    def render(self, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None, add_generation_prompt: bool = True) -> str:
        messages = normalize_messages(messages)
        tools = list(tools or [])
        if not self.native_tools:
            messages, tools = inject_tool_protocol(messages, tools), []
        if self.kind == "model":
            # The model's own template may use variables only its tokenizer supplies (bos_token, ...).
            return self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False, **dict(self.variables)
            )
        return self._compiled.render(messages=messages, tools=tools or None, add_generation_prompt=add_generation_prompt, **dict(self.variables))

    def encode_text(self, text: str) -> list[int]:
        """Token ids of rendered text; special-token strings in it map to their ids, nothing is added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode(self, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None, add_generation_prompt: bool = True) -> list[int]:
        return self.encode_text(self.render(messages, tools, add_generation_prompt))

    def render_continuation(self, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None) -> str:
        """The prompt that continues the final (assistant) message: the render cut right after its content,
        so the template's turn end is not there (vLLM's continue_final_message)."""
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError("continue_final_message needs an assistant message last")
        content = content_text(messages[-1].get("content"))
        rendered = self.render(messages, tools, add_generation_prompt=False)
        if content:
            return rendered[: rendered.rindex(content) + len(content)]
        return rendered.removesuffix(self.turn_end).removesuffix(self.turn_end.rstrip())

    def encode_continuation(self, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None) -> list[int]:
        return self.encode_text(self.render_continuation(messages, tools))

    # Pieces of the template's own text, measured on a one-exchange conversation.

    @cached_property
    def _exchange(self) -> tuple[str, str]:
        """(text before the assistant content, text after it) for a user message then an assistant message."""
        user_only = self.render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
        full = self.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}], add_generation_prompt=False)
        if not full.startswith(user_only) or _SENTINEL not in full:
            raise ValueError(f"{self.kind} chat template does not render an assistant message after a user message as a plain suffix")
        before, after = full[len(user_only) :].split(_SENTINEL)
        return before, after

    @property
    def assistant_header(self) -> str:
        """What opens an assistant turn before its content, e.g. '<|im_start|>assistant\\n'."""
        return self._exchange[0]

    @property
    def turn_end(self) -> str:
        """What closes an assistant turn after its content, e.g. '<|im_end|>\\n'."""
        return self._exchange[1]

    @cached_property
    def generation_prefix(self) -> str:
        """Text the generation prompt forces at the start of every assistant turn ('<reason>' for rStar, else '')."""
        messages = [{"role": "user", "content": "hi"}]
        prompt = self.render(messages, add_generation_prompt=True)
        opening = prompt[len(self.render(messages, add_generation_prompt=False)) :]
        if not opening.startswith(self.assistant_header):
            raise ValueError(f"{self.kind} chat template's generation prompt does not open an assistant turn")
        return opening[len(self.assistant_header) :]

    @property
    def starts_in_reasoning(self) -> bool:
        """Whether every assistant turn begins inside a reasoning block (the prompt opened it)."""
        return self.generation_prefix.rstrip().endswith(REASONING_OPEN)


def inject_tool_protocol(messages: list[dict], tools: Sequence[Mapping]) -> list[dict]:
    """Messages for a template without tool support that show the rStar tool protocol as plain turns."""
    injected: list[dict] = []
    if tools:
        block = tools_block(tools)
        if messages and messages[0]["role"] == "system":
            system, messages = messages[0], messages[1:]
            injected.append({**system, "content": system["content"] + "\n\n" + block})
        else:
            injected.append({"role": "system", "content": block})
    pending_results: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            pending_results.append(message["content"])
            continue
        if pending_results:
            injected.append({"role": "user", "content": tool_responses_text(pending_results)})
            pending_results = []
        if message["role"] == "assistant" and message.get("tool_calls"):
            calls = [call.get("function", call) for call in message["tool_calls"]]
            text = message["content"] + "".join("\n" + tool_call_text(call["name"], call["arguments"]) for call in calls)
            message = {key: value for key, value in message.items() if key != "tool_calls"} | {"content": text}
        injected.append(message)
    if pending_results:
        injected.append({"role": "user", "content": tool_responses_text(pending_results)})
    return injected


def rstar_template(tokenizer: Any = None) -> ChatTemplate:
    return ChatTemplate(kind="rstar", source=RSTAR_TEMPLATE_PATH.read_text(encoding="utf-8"), tokenizer=tokenizer)


def speaks_hermes_tools(source: str) -> bool:
    """A template that lists `tools` and prints `<tool_call>` blocks renders the protocol itself."""
    return "tools" in source and "<tool_call>" in source


def choose_template(tokenizer: Any, model_name: str, override: str | None = None) -> ChatTemplate:
    """The template a model is served with.

    override: "rstar" (the rStar template), "model" (the tokenizer's own) or a path to a jinja file.
    Without one: the rStar template for models whose name says rStar and for tokenizers without a
    template; otherwise the model's own, with the tool protocol injected where it has none.
    """
    own = getattr(tokenizer, "chat_template", None)
    if override is None:
        override = "rstar" if "rstar" in model_name.lower() or not own else "model"
    if override == "rstar":
        return rstar_template(tokenizer)
    if override == "model":
        if not own:
            raise ValueError(f"{model_name} has no chat template of its own; use the rStar template")
        return ChatTemplate(kind="model", source=own, tokenizer=tokenizer, native_tools=speaks_hermes_tools(own))
    source = Path(override).read_text(encoding="utf-8")
    return ChatTemplate(kind="file", source=source, tokenizer=tokenizer, native_tools=speaks_hermes_tools(source))
