"""A Trajectory: everything one agent-loop run produced, at token level, JSON-serializable.

The response is every token after the prompt: the model's sampled turns (mask 1) interleaved with tool
turns (mask 0: the template's closing/opening text and the tool responses). RL trains on mask-1 tokens
with `logprobs` as the old policy; the server and evals read `turns` and `tool_calls`. A client that got a
chat completion over HTTP reads it back as a Trajectory too (`Trajectory.from_chat_response`), without tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rstar.sandbox.schemas import RunResult, code_judge_reason
from rstar.server.chat_template import REASONING_CLOSE, REASONING_OPEN
from rstar.server.tool_calls import ToolCall

# stop: the model ended a turn without a tool call (its answer); length: the token budget ran out (while
# sampling, or the next tool turn would not fit); max_turns: the turn limit came with a call pending;
# tool_calls: the model called a client-declared tool, which the client runs; abort: the engine aborted.
StopReason = Literal["stop", "length", "max_turns", "tool_calls", "abort"]


def openai_finish_reason(stop_reason: str | None) -> str:
    """OpenAI's finish reason for a stop reason. A turn limit reached with a call pending counts as a length
    limit; a trajectory read back from a chat completion holds a finish reason already, which maps to itself."""
    return {"stop": "stop", "length": "length", "max_turns": "length", "tool_calls": "tool_calls"}.get(stop_reason, "abort")


def cut_off(stop_reason: str | None) -> bool:
    """Whether an answer that stopped so was cut off by a token or turn limit rather than finished."""
    return openai_finish_reason(stop_reason) == "length"


@dataclass
class ToolCallRecord:
    """One call of a trajectory from its parse to its answer: the one record of a tool call. The wire forms
    (a chat answer's code cell, a Responses code_interpreter_call item) are rendered from it; its fields are
    also the stored form, so the execution is kept flat rather than as a nested RunResult."""

    turn: int  # -1: a call the client's final assistant message already held (continue_final_message)
    index: int  # across the trajectory, in call order
    raw: str  # the text between <tool_call> and </tool_call>
    name: Any
    arguments: Any
    decode_error: str | None
    response: str | None  # what the model was shown; None for a client tool, whose result comes later
    code: str | None = None  # the call's code as decoded once (ToolCall.code), which its views show
    # The execution, when code ran (code-judge's terms).
    success: bool | None = None
    stdout: str | None = None
    stderr: str | None = None
    exec_reason: str | None = None
    exec_status: str | None = None  # the sandbox's status: ok, error, timeout, memory, output_limit, ...
    exec_duration_s: float | None = None  # as the sandbox measured it
    images: list[str] | None = None  # the figures the cell returned, as data URLs (PNG), in the order it made them
    image_notes: list[str] | None = None  # why figures were left out (the sandbox's caps)
    started_at: float | None = None  # unix time
    wall_s: float | None = None  # including sandbox queueing

    @classmethod
    def of_call(cls, turn: int, call: ToolCall) -> "ToolCallRecord":
        """A parsed call not (yet) answered; a client tool's call stays so, its result comes from the client."""
        return cls(
            turn=turn, index=call.index, raw=call.raw, name=call.name, arguments=call.arguments, decode_error=call.decode_error, response=None, code=call.code
        )

    @classmethod
    def of_stored(cls, data: Mapping) -> "ToolCallRecord":
        """A record as stored (its `asdict`); one stored before records carried `code` decodes it now."""
        record = cls(**data)
        if "code" not in data:
            record.code = ToolCall(record.index, record.raw, record.name, record.arguments, record.decode_error).code
        return record

    def answer(self, response: str, started_at: float, wall_s: float = 0.0, execution: RunResult | None = None) -> "ToolCallRecord":
        """Record what the model was shown and, when code ran, the sandbox's execution (in code-judge's terms
        for `success` and `exec_reason`, as the response text has them)."""
        self.response, self.started_at, self.wall_s = response, started_at, wall_s
        if execution is not None:
            self.success, self.stdout, self.stderr = execution.ok, execution.stdout, execution.stderr
            self.exec_reason, self.exec_status, self.exec_duration_s = code_judge_reason(execution.status), execution.status, execution.duration_s
            self.images = [image.data_url() for image in execution.images] or None
            self.image_notes = list(execution.image_notes) or None
        return self


@dataclass
class Turn:
    """One sampled assistant turn; its tokens are response_ids[start:end]."""

    start: int
    end: int
    text: str  # as decoded for clients (special tokens skipped)
    finish_reason: str | None  # the engine's: stop, length or abort
    weight_version: int
    seed: int | None = None  # the sampling seed this turn was drawn with (agent_loop.turn_seed)


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1 = sampled by the model, 0 = tool/template
    logprobs: list[float] | None = None  # one per response token (0.0 where mask is 0); None if not asked
    turns: list[Turn] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    stop_reason: StopReason | None = None
    weight_version: int = 0  # the engine's at the first turn; per-turn versions are in `turns`
    model: str = ""
    # The tool protocol that produced it: 'released' or 'improved' (rstar.sandbox.tools.ToolProtocol).
    tool_protocol: str = "improved"

    @property
    def num_sampled_tokens(self) -> int:
        return sum(self.response_mask)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_chat_response(cls, data: dict) -> "Trajectory":
        """A chat completion's first choice as a trajectory, for a client that got it over HTTP: the answer
        as one turn (its reasoning in a reasoning block), each code cell as a call that ran (its status as
        the cell says), then each client tool call, unanswered. The wire carries no token ids, so the
        token-level fields stay empty and turn 0 spans no tokens."""
        choice = data["choices"][0]
        message = choice.get("message") or {}
        reasoning = message.get("reasoning_content")
        text = (f"{REASONING_OPEN}{reasoning}{REASONING_CLOSE}" if reasoning else "") + (message.get("content") or "")
        cells = [
            ToolCallRecord(turn=0, index=cell.get("index", i), raw=cell.get("code", ""), name=cell.get("name"), arguments={"code": cell.get("code", "")},
                           decode_error=None, response=None, code=cell.get("code", ""), stdout=cell.get("stdout"), stderr=cell.get("stderr"), exec_status=cell.get("status"),
                           exec_duration_s=cell.get("duration_s"), images=cell.get("images") or None, image_notes=cell.get("image_notes") or None)
            for i, cell in enumerate(message.get("code_cells") or [])
        ]  # fmt: skip
        calls = [
            ToolCallRecord(turn=0, index=len(cells) + i, raw=call["function"].get("arguments", ""), name=call["function"]["name"],
                           arguments=call["function"].get("arguments", ""), decode_error=None, response=None)
            for i, call in enumerate(message.get("tool_calls") or [])
        ]  # fmt: skip
        return cls(
            prompt_ids=[],
            turns=[Turn(start=0, end=0, text=text, finish_reason=choice.get("finish_reason"), weight_version=0)],
            tool_calls=cells + calls,
            stop_reason=choice.get("finish_reason"),
            model=data.get("model", ""),
            # rstar says which protocol built the tool turns; another server runs no tools and says nothing.
            tool_protocol=data.get("tool_protocol"),
        )
