"""Tool calls in model text: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the Hermes format).

`parse_tool_calls` reads a finished turn the way rStar2-Agent's parser does: every non-overlapping
`<tool_call>...</tool_call>` span, JSON-decoded; a span that does not decode to an object with `name` and
`arguments` is still a call, one that carries the decode error (it becomes the tool response
`Failed to decode tool call: <error>`, so the model sees what it got wrong).

`ToolCallStreamParser` reads the same text as deltas and emits events for an API stream: reasoning text,
content text, and tool calls (name first, then argument text as it arrives). It never emits any part of a
tag as text, wherever the deltas split it, and its finished calls equal `parse_tool_calls` on the whole text.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rstar.sandbox.tools import JUPYTER_TOOL, ToolProtocol
from rstar.server.chat_template import REASONING_CLOSE, REASONING_OPEN

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

_CALL_SPAN = re.compile(re.escape(CALL_OPEN) + "(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One `<tool_call>` span of an assistant turn, with its arguments decoded once into what a built-in
    tool runs: `code` and `stdin`, which the loop, the executor and every view of the call read."""

    index: int  # position among the turn's calls
    raw: str  # the text between the tags, as the model wrote it
    name: Any = None  # as decoded; not necessarily a string, nor a known tool
    arguments: Any = None  # as decoded: normally an object, possibly a string or anything else
    decode_error: str | None = None  # why the span is not {"name": ..., "arguments": ...}
    # The `code` argument (missing counts as empty, as in the released tools); None when it is not a string.
    code: str | None = field(init=False)
    # The `input` argument, piped to stdin; always empty for jupyter_code, which reads none.
    stdin: str = field(init=False)
    _arguments_error: str | None = field(init=False, repr=False)  # why they cannot run, read the improved way

    def __post_init__(self):
        code, stdin, error = _code_and_stdin(self.name, self.arguments)
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "stdin", stdin)
        object.__setattr__(self, "_arguments_error", error)

    def arguments_error(self, protocol: ToolProtocol) -> str | None:
        """Why a built-in tool cannot run these arguments under `protocol`; None when `code` and `stdin` run.

        Arguments given as a JSON string that encodes an object are accepted under `improved` (the OpenAI
        wire format). Under `released` they fail as the released tool failed them: it called `.get` on
        whatever `arguments` decoded to, so a string gives "'str' object has no attribute 'get'".
        """
        if protocol == "released" and not isinstance(self.arguments, Mapping):
            return f"'{type(self.arguments).__name__}' object has no attribute 'get'"
        return self._arguments_error

    @property
    def arguments_json(self) -> str:
        """Arguments in the OpenAI wire format (a JSON string); a string argument is passed through."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments, ensure_ascii=False)


def _code_and_stdin(name: Any, arguments: Any) -> tuple[str | None, str, str | None]:
    """(code, stdin, why they cannot run) of a call's decoded arguments."""
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, Mapping):
        return None, "", f"arguments must be a JSON object, not {type(arguments).__name__}"
    code, stdin = arguments.get("code", ""), "" if name == JUPYTER_TOOL else arguments.get("input", "")
    error = None if isinstance(code, str) and isinstance(stdin, str) else "arguments 'code' and 'input' must be strings"
    return code if isinstance(code, str) else None, stdin if isinstance(stdin, str) else "", error


def decode_tool_call(index: int, raw: str) -> ToolCall:
    """Decode one span's text. The error text is Python's own, as in the released parser (e.g. "'name'")."""
    try:
        decoded = json.loads(raw)
        name, arguments = decoded["name"], decoded["arguments"]
    except Exception as exc:  # any shape the model produced: bad JSON, a list, a missing key
        return ToolCall(index=index, raw=raw, decode_error=str(exc))
    return ToolCall(index=index, raw=raw, name=name, arguments=arguments)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every complete tool call in a turn's text, in order."""
    return [decode_tool_call(index, match.group(1)) for index, match in enumerate(_CALL_SPAN.finditer(text))]


# Stream events. Text deltas concatenate to the turn's text without the tags; argument deltas of one call
# concatenate to the raw text of its "arguments" value.


@dataclass(frozen=True)
class TextDelta:
    text: str
    reasoning: bool  # inside <reason> ... </reason>


@dataclass(frozen=True)
class ToolCallStarted:
    index: int
    name: Any  # None when the call's text never showed a name (its ToolCallEnded carries the error)


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class ToolCallEnded:
    call: ToolCall
    complete: bool  # False: the text ended before `</tool_call>` (such a span is not a call)


StreamEvent = TextDelta | ToolCallStarted | ToolCallArgumentsDelta | ToolCallEnded

# The start of a well-formed call, up to where the arguments value begins, as a sequence of pieces:
# whitespace runs, literal text, and the name (a JSON string).
_WS, _STRING = object(), object()
_NAMED_PREFIX = (_WS, "{", _WS, '"name"', _WS, ":", _WS, _STRING, _WS, ",", _WS, '"arguments"', _WS, ":", _WS)
# A complete JSON string: only JSON's own escapes and no raw control characters, so json.loads takes it.
_JSON_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
# What may follow the arguments value before `</tool_call>`: the object's closing brace and whitespace.
_CALL_TAIL = re.compile(r"\s*(\}\s*)?$")


def _match_named_prefix(text: str) -> tuple[str, Any, int]:
    """("match", name, end) when text starts with the whole prefix and a character after it;
    ("partial", None, 0) when more text could still make it match; ("no", None, 0) when it cannot."""
    position, name = 0, None
    for piece in _NAMED_PREFIX:
        if piece is _WS:
            while position < len(text) and text[position].isspace():
                position += 1
            if position == len(text):
                return "partial", None, 0
        elif piece is _STRING:
            match = _JSON_STRING.match(text, position)
            if match is None:
                # An open string that has not closed yet may still complete.
                return ("partial", None, 0) if text.startswith('"', position) else ("no", None, 0)
            name, position = json.loads(match.group()), match.end()
        elif text.startswith(piece, position):
            position += len(piece)
        elif piece.startswith(text[position:]):
            return "partial", None, 0
        else:
            return "no", None, 0
    return "match", name, position


def _held_tag_prefix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    longest = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:size]):
                longest = size
                break
    return longest


class ToolCallStreamParser:
    """Turns text deltas of one assistant turn into StreamEvents.

    `in_reasoning`: whether the turn starts inside a reasoning block (rStar's prompt opens `<reason>`).
    Call `feed` with each delta and `finish` once at the end; each returns the events now certain.
    """

    def __init__(self, in_reasoning: bool = False, first_index: int = 0):
        self.in_reasoning = in_reasoning
        self._buffer = ""  # text not yet turned into events
        self._next_index = first_index
        self._call: _OpenCall | None = None
        self.calls: list[ToolCall] = []  # complete calls so far

    def feed(self, delta: str) -> list[StreamEvent]:
        self._buffer += delta
        events: list[StreamEvent] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[StreamEvent]:
        """Flush what was held back; an unterminated call ends incomplete."""
        events: list[StreamEvent] = []
        if self._call is not None:
            call = self._call
            self._call = None
            body = call.body + self._buffer
            self._buffer = ""
            decoded = decode_tool_call(call.index, body)
            if not call.started:
                events.append(ToolCallStarted(call.index, decoded.name))
            events.append(ToolCallEnded(decoded, complete=False))
        elif self._buffer:
            events.append(TextDelta(self._buffer, self.in_reasoning))
            self._buffer = ""
        return events

    def _step(self, events: list[StreamEvent]) -> bool:
        """Consume what can be decided from the buffer; True when another step may make progress."""
        if self._call is not None:
            return self._step_in_call(events)
        tags = (CALL_OPEN, REASONING_CLOSE) if self.in_reasoning else (CALL_OPEN, REASONING_OPEN)
        found = [(self._buffer.find(tag), tag) for tag in tags if tag in self._buffer]
        if found:
            position, tag = min(found)
            if position:
                events.append(TextDelta(self._buffer[:position], self.in_reasoning))
            self._buffer = self._buffer[position + len(tag) :]
            if tag == CALL_OPEN:
                self._call = _OpenCall(index=self._next_index)
                self._next_index += 1
            else:
                self.in_reasoning = tag == REASONING_OPEN
            return True
        safe = len(self._buffer) - _held_tag_prefix(self._buffer, tags)
        if safe:
            events.append(TextDelta(self._buffer[:safe], self.in_reasoning))
            self._buffer = self._buffer[safe:]
        return False

    def _step_in_call(self, events: list[StreamEvent]) -> bool:
        call = self._call
        end = self._buffer.find(CALL_CLOSE)
        if end < 0:
            # Everything but a possible partial `</tool_call>` belongs to the body.
            keep = _held_tag_prefix(self._buffer, (CALL_CLOSE,))
            call.body += self._buffer[: len(self._buffer) - keep]
            self._buffer = self._buffer[len(self._buffer) - keep :]
            call.advance(events, final=False)
            return False
        call.body += self._buffer[:end]
        self._buffer = self._buffer[end + len(CALL_CLOSE) :]
        decoded = call.advance(events, final=True)
        events.append(ToolCallEnded(decoded, complete=True))
        self.calls.append(decoded)
        self._call = None
        return True


@dataclass
class _OpenCall:
    """A call whose `</tool_call>` has not arrived yet."""

    index: int
    body: str = ""
    started: bool = False
    arguments_start: int | None = None  # where the arguments value begins in body, once the name is known
    emitted: int = 0  # how much of the arguments text was sent

    def advance(self, events: list[StreamEvent], final: bool) -> ToolCall | None:
        if not self.started:
            status, name, end = _match_named_prefix(self.body)
            if status == "match":
                self.started = True
                self.arguments_start = end
                events.append(ToolCallStarted(self.index, name))
            elif final or status == "no":
                # Not the usual shape (keys reordered, bad JSON): announce it whole once it is complete.
                if not final:
                    return None
                decoded = decode_tool_call(self.index, self.body)
                self.started = True
                events.append(ToolCallStarted(self.index, decoded.name))
                if decoded.decode_error is None:
                    events.append(ToolCallArgumentsDelta(self.index, decoded.arguments_json))
                return decoded
        if self.arguments_start is not None:
            arguments = self.body[self.arguments_start :]
            # Hold back a trailing `}` (maybe the call object's) and whitespace until the call ends.
            end = _CALL_TAIL.search(arguments).start()
            if end > self.emitted:
                events.append(ToolCallArgumentsDelta(self.index, arguments[self.emitted : end]))
                self.emitted = end
        return decode_tool_call(self.index, self.body) if final else None
