"""The agent loop, token-in/token-out: generate a turn, parse its tool calls, run them in the sandbox,
append the tool turn's tokens, and continue, until a turn has no call, the turn limit, or the one token
budget of the whole trajectory (tool tokens count, as in the paper) runs out.

History is never re-tokenized: the prompt is encoded once, sampled tokens are kept as sampled, and tool
turns come from the bridge (`tool_results.tool_turn_ids`). `run_agent` yields events as they happen, for
an API stream; closing it (client gone) or cancelling its task aborts the engine request and cancels a
running tool job. `run_trajectory` drains it for callers that only want the Trajectory (evals, RL).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

from rstar.sandbox.tools import BUILTIN_TOOLS, JUPYTER_TOOL, ToolSettings
from rstar.server.builtin_tools import CodeExecutor, run_builtin_call
from rstar.server.chat_template import ChatTemplate, content_text
from rstar.server.engine import SamplingOptions, TokenDelta, TokenEngine
from rstar.server.tool_calls import (
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallStreamParser,
    parse_tool_calls,
)
from rstar.server.tool_results import execution_error_text, tool_turn_ids
from rstar.server.trajectory import ToolCallRecord, Trajectory, Turn


@dataclass(frozen=True)
class LoopConfig:
    # Assistant turns per trajectory. The paper used 10 (RL stages 1-2), 15 (stage 3) and 30 (evaluation);
    # serving defaults to the evaluation setting.
    max_turns: int = 30
    # Tokens after the prompt, sampled and tool tokens together; None: whatever the context window leaves.
    max_response_tokens: int | None = None
    # Calls executed per turn; later calls in the same turn are ignored, as in the released loop (1).
    max_parallel_calls: int = 1
    # Whose tool protocol the loop speaks (tool_results.py; docs/api.md compares them): the tool-turn
    # tokens, the sandbox's result semantics and the answers to calls the released loop rejected; and the
    # second cut of an execution's result text (the sandbox already cuts stdout and stderr to 1000 chars
    # each). `improved` is the default here because every caller that knows its model passes its own choice.
    tools: ToolSettings = field(default_factory=lambda: ToolSettings.of_protocol("improved"))
    # Tools the API client declared: a call to one ends the loop with stop reason "tool_calls".
    client_tools: frozenset[str] = frozenset()
    # The API asks for these: each engine delta as a TokensSampled event, with the top k logprobs.
    token_events: bool = False
    top_logprobs: int = 0
    # Built-in tools the loop runs; a call to one switched off is answered as an unknown tool. With no
    # tools at all (neither kind) the loop is plain chat: the first turn is the answer, calls or not.
    builtin_tools: frozenset[str] = BUILTIN_TOOLS
    logprobs: bool = True

    def __post_init__(self):
        if self.max_turns < 1 or self.max_parallel_calls < 1:
            raise ValueError("max_turns and max_parallel_calls must be at least 1")


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of one turn of a seeded trajectory. Each turn is a new engine request, and the same
    seed on each would replay one random stream turn after turn, so the turns would not be independent draws.
    The first turn keeps the request's seed (a one-turn answer samples as vLLM does with it); later turns
    derive theirs from it and the turn index."""
    if seed is None or turn == 0:
        return seed
    digest = hashlib.sha256(f"{seed}/turn/{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


# Loop events, besides the parser's StreamEvents (text, tool call started / arguments / ended).


@dataclass(frozen=True)
class TurnStarted:
    turn: int


@dataclass(frozen=True)
class TokensSampled:
    """An engine delta as it arrived (only with LoopConfig.token_events); its text follows as parser events."""

    delta: TokenDelta


@dataclass(frozen=True)
class ToolExecutionStarted:
    index: int  # the call's index across the trajectory
    name: str
    code: str


@dataclass(frozen=True)
class ToolResult:
    record: ToolCallRecord


@dataclass(frozen=True)
class TurnEnded:
    turn: int
    finish_reason: str | None


@dataclass(frozen=True)
class Done:
    trajectory: Trajectory


LoopEvent = TurnStarted | TokensSampled | StreamEvent | ToolExecutionStarted | ToolResult | TurnEnded | Done


@dataclass
class _Sampled:
    """What one turn's generation produced."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None


async def run_agent(
    engine: TokenEngine,
    template: ChatTemplate,
    messages: Sequence[Mapping],
    tools: Sequence[Mapping],
    sampling: SamplingOptions,
    executor: CodeExecutor,
    config: LoopConfig = LoopConfig(),
    request_id: str | None = None,
    continue_final_message: bool = False,
    prompt_ids: Sequence[int] | None = None,
) -> AsyncIterator[LoopEvent]:
    """Run one trajectory; the last event is Done(trajectory).

    sampling: the client's options; max_tokens, logprobs and special-token handling are set per turn.
    tools: the schemas listed in the prompt (built-in and client-declared).
    continue_final_message: the last message is an assistant message the answer continues (vLLM's
    option of that name). If it already holds complete tool calls, they run first and the model goes on
    from their results (the forced tool-call path); their records have turn -1. Otherwise the first turn
    extends it, and its calls are parsed over the message's text and the sampled text together. Text of
    the given message is not sent again as events; its tool-call events are, so a call it starts reaches
    the client whole.
    prompt_ids: `messages` and `tools` as the template encodes them, when the caller already has them (the
    API encodes a prompt once, to check it fits the context window); encoded here otherwise.
    """
    request_id = request_id or uuid.uuid4().hex
    prefix = content_text(messages[-1].get("content")) if continue_final_message else None
    if prompt_ids is not None:
        prompt_ids = list(prompt_ids)
    elif continue_final_message:
        prompt_ids = template.encode_continuation(messages, tools)
    else:
        prompt_ids = template.encode(messages, tools, add_generation_prompt=True)
    context_left = engine.max_model_len - len(prompt_ids)
    budget = min(config.max_response_tokens or context_left, context_left)
    trajectory = Trajectory(
        prompt_ids=prompt_ids,
        logprobs=[] if config.logprobs else None,
        weight_version=engine.weight_version,
        model=engine.model_name,
        tool_protocol=config.tools.tool_protocol,
    )
    turn_end_ids = template.encode_text(template.turn_end.rstrip())
    jupyter_cells = prior_jupyter_cells(messages)
    next_call_index = 0
    runs_tools = bool(config.builtin_tools or config.client_tools)

    forced = parse_tool_calls(prefix)[: config.max_parallel_calls] if prefix and runs_tools else []
    if forced:
        records = []
        async with contextlib.aclosing(_run_calls(-1, forced, executor, jupyter_cells, config)) as running:
            async for event in running:
                if isinstance(event, ToolResult):
                    records.append(event.record)
                yield event
        trajectory.tool_calls += records
        next_call_index = len(parse_tool_calls(prefix))
        # The given message's turn end was not sampled, so the template supplies all of it.
        tool_ids = tool_turn_ids(template, [record.response for record in records], "", config.tools.tool_protocol)
        _append(trajectory, tool_ids, mask=0, logprobs=[0.0] * len(tool_ids) if config.logprobs else None)
        prefix = None

    for turn in range(config.max_turns):  # every path through the last turn ends in a break
        if budget - len(trajectory.response_ids) <= 0:
            trajectory.stop_reason = "length"
            break
        yield TurnStarted(turn)
        options = dataclasses.replace(
            sampling,
            seed=turn_seed(sampling.seed, turn),
            max_tokens=budget - len(trajectory.response_ids),
            stop_token_ids=tuple(dict.fromkeys((*sampling.stop_token_ids, *turn_end_ids))),
            logprobs=config.top_logprobs if config.logprobs else None,
            skip_special_tokens=True,
            include_stop_str_in_output=False,
        )
        parser = ToolCallStreamParser(in_reasoning=template.starts_in_reasoning, first_index=next_call_index)
        given = ""  # text of the turn that was given, not sampled (a continued final message)
        if prefix is not None and turn == 0:
            given, parser = prefix, ToolCallStreamParser(in_reasoning=False, first_index=next_call_index)
            for event in parser.feed(prefix):
                if not isinstance(event, TextDelta):
                    yield event
        sampled = _Sampled()
        weight_version = engine.weight_version
        async with contextlib.aclosing(engine.generate(prompt_ids + trajectory.response_ids, options, f"{request_id}-{turn}")) as stream:
            async for delta in stream:
                sampled.token_ids += delta.token_ids
                sampled.logprobs += delta.logprobs or []
                sampled.text += delta.text
                if config.token_events:
                    yield TokensSampled(delta)
                for event in parser.feed(delta.text):
                    yield event
                if delta.finished:
                    sampled.finish_reason, sampled.stop_reason = delta.finish_reason, delta.stop_reason
        for event in parser.finish():
            yield event

        start = len(trajectory.response_ids)
        _append(trajectory, sampled.token_ids, mask=1, logprobs=sampled.logprobs if config.logprobs else None)
        trajectory.turns.append(Turn(start, len(trajectory.response_ids), sampled.text, sampled.finish_reason, weight_version, options.seed))
        yield TurnEnded(turn, sampled.finish_reason)

        if sampled.finish_reason in ("length", "abort"):
            trajectory.stop_reason = sampled.finish_reason
            break
        # A client stop string ends the trajectory where it stands; the end-of-turn token ends only the turn.
        calls = [] if sampled.stop_reason in sampling.stop or not runs_tools else parse_tool_calls(given + sampled.text)
        calls = [dataclasses.replace(call, index=next_call_index + call.index) for call in calls][: config.max_parallel_calls]
        if not calls:
            trajectory.stop_reason = "stop"
            break
        if turn + 1 == config.max_turns:
            trajectory.stop_reason = "max_turns"
            break
        next_call_index += len(parser.calls)
        if any(isinstance(call.name, str) and call.name in config.client_tools for call in calls):
            trajectory.tool_calls += [ToolCallRecord.of_call(turn, call) for call in calls]
            trajectory.stop_reason = "tool_calls"
            break

        records = []
        async with contextlib.aclosing(_run_calls(turn, calls, executor, jupyter_cells, config)) as running:
            async for event in running:
                if isinstance(event, ToolResult):
                    records.append(event.record)
                yield event
        trajectory.tool_calls += records

        sampled_turn_end = template.turn_end.rstrip() if sampled.token_ids[-len(turn_end_ids) :] == turn_end_ids else ""
        tool_ids = tool_turn_ids(template, [record.response for record in records], sampled_turn_end, config.tools.tool_protocol)
        # As released: a tool turn that would use up the budget ends the trajectory instead (the model
        # would have no room to answer), and the last tokens stay the model's own.
        if len(trajectory.response_ids) + len(tool_ids) >= budget:
            trajectory.stop_reason = "length"
            break
        _append(trajectory, tool_ids, mask=0, logprobs=[0.0] * len(tool_ids) if config.logprobs else None)

    yield Done(trajectory)


async def run_trajectory(*args, **kwargs) -> Trajectory:
    """run_agent without the events."""
    async with contextlib.aclosing(run_agent(*args, **kwargs)) as events:
        async for event in events:
            if isinstance(event, Done):
                return event.trajectory
    raise RuntimeError("the agent loop ended without a trajectory")


def _append(trajectory: Trajectory, token_ids: list[int], mask: int, logprobs: list[float] | None) -> None:
    trajectory.response_ids += token_ids
    trajectory.response_mask += [mask] * len(token_ids)
    if logprobs is not None:
        if len(logprobs) != len(token_ids):
            raise RuntimeError(f"engine returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
        trajectory.logprobs += logprobs


async def _run_calls(
    turn: int, calls: list[ToolCall], executor: CodeExecutor, jupyter_cells: list[str], config: LoopConfig
) -> AsyncIterator[LoopEvent]:
    """Run one turn's calls concurrently; results come out in call order.

    A jupyter cell replays the cells before it, including earlier calls of the same turn (as released).
    `jupyter_cells` grows with every jupyter call that had runnable code, whatever its outcome.
    """
    jobs: list[asyncio.Future] = []
    try:
        for call in calls:
            replay = list(jupyter_cells)
            enabled = _is_builtin(call, config.builtin_tools)
            if enabled and call.arguments_error(config.tools.tool_protocol) is None:
                yield ToolExecutionStarted(call.index, call.name, call.code)
                if call.name == JUPYTER_TOOL:
                    jupyter_cells.append(call.code)
            if _is_builtin(call) and not enabled:
                # Switched off for this request: the model hears what an unknown tool gets.
                jobs.append(asyncio.ensure_future(_unavailable(turn, call)))
                continue
            jobs.append(asyncio.ensure_future(run_builtin_call(turn, call, executor, replay, config.tools)))
        for job in jobs:
            yield ToolResult(await job)
    finally:
        # Closing the event stream early (client gone) must not leave sandbox jobs running.
        for job in jobs:
            job.cancel()


def _is_builtin(call: ToolCall, enabled: frozenset[str] = BUILTIN_TOOLS) -> bool:
    return call.decode_error is None and isinstance(call.name, str) and call.name in enabled


async def _unavailable(turn: int, call: ToolCall) -> ToolCallRecord:
    return ToolCallRecord.of_call(turn, call).answer(execution_error_text(repr(call.name)), time.time())


def prior_jupyter_cells(messages: Sequence[Mapping]) -> list[str]:
    """Code of the `jupyter_code` calls in a conversation's assistant messages, to replay before new cells."""
    cells = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            if function.get("name") == JUPYTER_TOOL:
                # Read the improved way whatever the protocol: over the wire, arguments are JSON strings.
                cell = ToolCall(index=0, raw="", name=JUPYTER_TOOL, arguments=function.get("arguments"))
                if cell.arguments_error("improved") is None:
                    cells.append(cell.code)
    return cells

