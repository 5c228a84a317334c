"""The token-in/token-out agent loop on a scripted engine and the real default-model tokenizer: token
exactness against the rendered conversation, budgets, turn limits, parallel calls, events, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from rstar.sandbox.tools import JUPYTER_TOOL, PYTHON_TOOL
from rstar.server.agent_loop import (
    Done,
    LoopConfig,
    ToolExecutionStarted,
    ToolResult,
    TurnEnded,
    TurnStarted,
    prior_jupyter_cells,
    run_agent,
    run_trajectory,
    turn_seed,
)
from rstar.server.builtin_tools import builtin_tool_schemas
from rstar.server.chat_template import choose_template, rstar_template
from rstar.server.engine import SamplingOptions, TokenDelta
from rstar.server.tool_calls import TextDelta, ToolCallArgumentsDelta, ToolCallEnded, ToolCallStarted
from rstar.server.tool_results import tool_turn_text
from rstar.server.trajectory import Trajectory
from tests.scripted_engine import call, scripted_engine
from tests.scripted_sandbox import scripted_sandbox

QUESTION = [{"role": "user", "content": "How many positive divisors does 2024 have?"}]
TOOLS = builtin_tool_schemas([PYTHON_TOOL, JUPYTER_TOOL])
SAMPLING = SamplingOptions(max_tokens=1, temperature=0.6)


def trajectory_messages(template, messages, trajectory: Trajectory) -> list[dict]:
    """The conversation a trajectory is, as chat messages: the prompt's, then each sampled turn as an
    assistant message (the forced generation prefix + its text, special tokens kept) and each tool turn's
    responses as tool messages, for checking that the template renders them to the trajectory's exact text."""
    conversation = [dict(message) for message in messages]
    closing = template.turn_end.rstrip()
    for number, turn in enumerate(trajectory.turns):
        text = template.tokenizer.decode(trajectory.response_ids[turn.start : turn.end], skip_special_tokens=False)
        text = text[: -len(closing)] if closing and text.endswith(closing) else text
        conversation.append({"role": "assistant", "content": template.generation_prefix + text})
        conversation += [{"role": "tool", "content": call.response} for call in trajectory.tool_calls if call.turn == number and call.response is not None]
    return conversation


def run(engine, executor, template, config=LoopConfig(), messages=QUESTION, tools=TOOLS) -> Trajectory:
    return asyncio.run(run_trajectory(engine, template, messages, tools, SAMPLING, executor, config))


TWO_TOOL_TURNS = [
    "The divisors come from the factorization.\n" + call("import sympy\nprint(sympy.factorint(2024))"),
    "So 2024 = 2^3 * 11 * 23. Let me count.\n" + call("print(4 * 2 * 2)"),
    "There are 16.</reason>\n<answer>\\boxed{16}</answer>",
]
OUTPUTS = {"import sympy\nprint(sympy.factorint(2024))": "{2: 3, 11: 1, 23: 1}\n", "print(4 * 2 * 2)": "16\n"}


@pytest.fixture(params=["rstar", "model"])
def template(request, default_tokenizer):
    """The rStar template, and the default model's own template with the tool protocol injected."""
    return rstar_template(default_tokenizer) if request.param == "rstar" else choose_template(default_tokenizer, "SmolLM2-135M-Instruct")


def test_token_stream_equals_the_rendered_conversation(template, default_tokenizer):
    engine = scripted_engine(default_tokenizer, TWO_TOOL_TURNS)
    trajectory = run(engine, scripted_sandbox(OUTPUTS).executor(), template)
    assert trajectory.stop_reason == "stop" and len(trajectory.turns) == 3

    conversation = trajectory_messages(template, QUESTION, trajectory)
    rendered = template.render(conversation, TOOLS, add_generation_prompt=False)
    stream = default_tokenizer.decode(trajectory.prompt_ids + trajectory.response_ids, skip_special_tokens=False)
    # The only difference: the newline after the final <|im_end|>, which belongs to the next turn's opening.
    assert rendered == stream + "\n"
    assert template.encode(conversation, TOOLS, add_generation_prompt=False) == trajectory.prompt_ids + trajectory.response_ids + template.encode_text("\n")


def test_mask_zero_tokens_are_exactly_the_tool_turns(template, default_tokenizer):
    trajectory = run(scripted_engine(default_tokenizer, TWO_TOOL_TURNS), scripted_sandbox(OUTPUTS).executor(), template)
    spans, current = [], []
    for token, mask in zip(trajectory.response_ids, trajectory.response_mask):
        if mask == 0:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    responses = [[call.response] for call in trajectory.tool_calls]
    assert [default_tokenizer.decode(span, skip_special_tokens=False) for span in spans] == [
        tool_turn_text(template, response, "<|im_end|>") for response in responses
    ]
    # The newline after <|im_end|> is deliberate: the template's, kept so the stream equals the render.
    assert all(default_tokenizer.decode(span[:1]) == "\n" for span in spans)
    assert "stdout: {2: 3, 11: 1, 23: 1}\n" in responses[0][0]


def test_never_retokenizes_history(default_tokenizer):
    engine = scripted_engine(default_tokenizer, TWO_TOOL_TURNS)
    trajectory = run(engine, scripted_sandbox(OUTPUTS).executor(), rstar_template(default_tokenizer))
    full = trajectory.prompt_ids + trajectory.response_ids
    for prompt in engine.prompts:
        assert full[: len(prompt)] == prompt
    assert [len(prompt) for prompt in engine.prompts][0] == len(trajectory.prompt_ids)
    turn_starts = [len(trajectory.prompt_ids) + turn.start for turn in trajectory.turns]
    assert [len(prompt) for prompt in engine.prompts] == turn_starts


def test_trajectory_records_logprobs_calls_and_versions(default_tokenizer):
    trajectory = run(scripted_engine(default_tokenizer, TWO_TOOL_TURNS, weight_version=7), scripted_sandbox(OUTPUTS).executor(), rstar_template(default_tokenizer))
    assert len(trajectory.logprobs) == len(trajectory.response_ids) == len(trajectory.response_mask)
    assert {lp for lp, m in zip(trajectory.logprobs, trajectory.response_mask) if m == 1} == {-0.5}
    assert {lp for lp, m in zip(trajectory.logprobs, trajectory.response_mask) if m == 0} == {0.0}
    assert [(c.turn, c.index, c.name, c.success, c.stdout, c.exec_duration_s) for c in trajectory.tool_calls] == [
        (0, 0, PYTHON_TOOL, True, "{2: 3, 11: 1, 23: 1}\n", 0.25),
        (1, 1, PYTHON_TOOL, True, "16\n", 0.25),
    ]
    assert all(c.wall_s >= 0 and c.started_at > 0 for c in trajectory.tool_calls)
    assert trajectory.weight_version == 7 and {t.weight_version for t in trajectory.turns} == {7}
    assert trajectory.turns[-1].text.endswith("<answer>\\boxed{16}</answer>")
    assert json.loads(json.dumps(trajectory.to_dict())) == trajectory.to_dict()  # storable as it is


def test_turn_seeds_are_derived_from_the_sample_seed_and_the_turn():
    assert turn_seed(None, 3) is None and turn_seed(12345, 0) == 12345  # unseeded stays so; a one-turn answer keeps its seed
    seeds = [turn_seed(12345, turn) for turn in range(30)]
    assert len(set(seeds)) == 30 and all(0 <= seed < 2**31 for seed in seeds)
    assert seeds == [turn_seed(12345, turn) for turn in range(30)]  # pure
    assert (turn_seed(12345, 1), turn_seed(0, 2)) == (2763157, 1879924865)  # golden: a change reseeds every stored run


def test_each_turn_samples_with_its_own_seed_and_the_trajectory_records_it(default_tokenizer):
    engine = scripted_engine(default_tokenizer, TWO_TOOL_TURNS)
    sampling = SamplingOptions(max_tokens=1, temperature=0.6, seed=12345)
    trajectory = asyncio.run(run_trajectory(engine, rstar_template(default_tokenizer), QUESTION, TOOLS, sampling, scripted_sandbox(OUTPUTS).executor(), LoopConfig()))
    sent = [options.seed for options in engine.sampling]
    assert sent == [turn.seed for turn in trajectory.turns] == [turn_seed(12345, turn) for turn in range(3)]
    assert len(set(sent)) == 3
    assert trajectory.to_dict()["turns"][1]["seed"] == sent[1]


def test_one_budget_for_the_whole_trajectory(default_tokenizer):
    template = rstar_template(default_tokenizer)
    full = run(scripted_engine(default_tokenizer, TWO_TOOL_TURNS), scripted_sandbox(OUTPUTS).executor(), template)
    budget = full.turns[2].start + 5  # the third turn gets only what the first two and both tool turns left
    engine = scripted_engine(default_tokenizer, TWO_TOOL_TURNS)
    cut = run(engine, scripted_sandbox(OUTPUTS).executor(), template, LoopConfig(max_response_tokens=budget))
    assert [options.max_tokens for options in engine.sampling] == [budget, budget - full.turns[1].start, 5]
    assert cut.stop_reason == "length" and len(cut.response_ids) == budget
    assert cut.response_ids == full.response_ids[:budget]


def test_a_tool_turn_that_would_fill_the_budget_ends_the_trajectory(default_tokenizer):
    template = rstar_template(default_tokenizer)
    full = run(scripted_engine(default_tokenizer, TWO_TOOL_TURNS), scripted_sandbox(OUTPUTS).executor(), template)
    budget = full.turns[1].start  # first turn + its tool turn exactly fill it
    cut = run(scripted_engine(default_tokenizer, TWO_TOOL_TURNS), scripted_sandbox(OUTPUTS).executor(), template, LoopConfig(max_response_tokens=budget))
    assert cut.stop_reason == "length"
    assert cut.response_ids == full.response_ids[: full.turns[0].end]  # the last tokens are the model's
    assert set(cut.response_mask) == {1}
    assert len(cut.tool_calls) == 1  # it ran; its result did not fit


def test_context_window_caps_the_budget(default_tokenizer):
    template = rstar_template(default_tokenizer)
    prompt_len = len(template.encode(QUESTION, TOOLS))
    engine = scripted_engine(default_tokenizer, ["Short answer."], max_model_len=prompt_len + 3)
    trajectory = run(engine, scripted_sandbox().executor(), template, LoopConfig(max_response_tokens=1000))
    assert engine.sampling[0].max_tokens == 3
    assert trajectory.stop_reason == "length"


def test_turn_limit_stops_before_running_the_pending_call(default_tokenizer):
    sandbox = scripted_sandbox(OUTPUTS)
    trajectory = run(scripted_engine(default_tokenizer, TWO_TOOL_TURNS), sandbox.executor(), rstar_template(default_tokenizer), LoopConfig(max_turns=2))
    assert trajectory.stop_reason == "max_turns"
    assert len(trajectory.turns) == 2 and len(sandbox.requests) == 1
    assert trajectory.response_mask[-1] == 1


def test_no_call_ends_after_one_turn(default_tokenizer):
    trajectory = run(scripted_engine(default_tokenizer, TWO_TOOL_TURNS[2:]), scripted_sandbox().executor(), rstar_template(default_tokenizer))
    assert trajectory.stop_reason == "stop" and trajectory.tool_calls == [] and set(trajectory.response_mask) == {1}


def test_only_the_first_call_of_a_turn_runs_by_default(default_tokenizer):
    turns = ["Two at once.\n" + call("print(1)") + "\n" + call("print(2)"), "Done.</reason><answer>1</answer>"]
    sandbox = scripted_sandbox()
    trajectory = run(scripted_engine(default_tokenizer, turns), sandbox.executor(), rstar_template(default_tokenizer))
    assert sandbox.codes == ["print(1)"]
    assert len(trajectory.tool_calls) == 1


def test_parallel_calls_share_one_tool_turn(default_tokenizer):
    turns = ["Two at once.\n" + call("print(1)") + "\n" + call("print(2)"), "Done.</reason><answer>1</answer>"]
    sandbox = scripted_sandbox({"print(1)": "1\n", "print(2)": "2\n"})
    template = rstar_template(default_tokenizer)
    trajectory = run(scripted_engine(default_tokenizer, turns), sandbox.executor(), template, LoopConfig(max_parallel_calls=2))
    assert sorted(sandbox.codes) == ["print(1)", "print(2)"]
    tool_text = default_tokenizer.decode([t for t, m in zip(trajectory.response_ids, trajectory.response_mask) if m == 0], skip_special_tokens=False)
    assert tool_text.count("<|im_start|>user") == 1 and tool_text.count("<tool_response>") == 2
    assert tool_text.index("stdout: 1") < tool_text.index("stdout: 2")


def test_malformed_call_is_answered_with_the_decode_error(default_tokenizer):
    turns = ['Oops.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "1"\n</tool_call>', "Fine.</reason>"]
    sandbox = scripted_sandbox()
    trajectory = run(scripted_engine(default_tokenizer, turns), sandbox.executor(), rstar_template(default_tokenizer))
    assert sandbox.requests == []
    assert trajectory.tool_calls[0].response.startswith("Failed to decode tool call: Expecting ',' delimiter")
    assert "<tool_response>\nFailed to decode tool call:" in default_tokenizer.decode(trajectory.response_ids, skip_special_tokens=False)


def test_jupyter_cells_replay_earlier_ones_including_from_the_conversation(default_tokenizer):
    history = [
        *QUESTION,
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": JUPYTER_TOOL, "arguments": '{"code": "a = 1"}'}}]},
        {"role": "tool", "content": "Tool call success\nexecution time: 0.01s"},
    ]
    assert prior_jupyter_cells(history) == ["a = 1"]
    turns = [call("b = a + 1", JUPYTER_TOOL), call("b", JUPYTER_TOOL), "2.</reason>"]
    sandbox = scripted_sandbox()
    run(scripted_engine(default_tokenizer, turns), sandbox.executor(), rstar_template(default_tokenizer), messages=history)
    assert [(r.code, r.input, r.history) for r in sandbox.requests] == [("b = a + 1", None, ["a = 1"]), ("b", None, ["a = 1", "b = a + 1"])]  # a cell has no stdin


def test_a_client_declared_tool_ends_the_loop_with_the_call(default_tokenizer):
    turns = ['<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>']
    sandbox = scripted_sandbox()
    config = LoopConfig(client_tools=frozenset({"get_weather"}))
    trajectory = run(scripted_engine(default_tokenizer, turns), sandbox.executor(), rstar_template(default_tokenizer), config)
    assert trajectory.stop_reason == "tool_calls" and sandbox.requests == []
    record = trajectory.tool_calls[0]
    assert (record.name, record.arguments, record.response) == ("get_weather", {"city": "Paris"}, None)


def collect_events(engine, executor, template, config=LoopConfig()):
    async def go():
        return [event async for event in run_agent(engine, template, QUESTION, TOOLS, SAMPLING, executor, config)]

    return asyncio.run(go())


def test_events_stream_reasoning_code_and_results_in_order(default_tokenizer):
    events = collect_events(scripted_engine(default_tokenizer, TWO_TOOL_TURNS), scripted_sandbox(OUTPUTS).executor(), rstar_template(default_tokenizer))
    kinds = []
    for event in events:
        kind = type(event).__name__
        if not kinds or kinds[-1] != kind or kind not in ("TextDelta", "ToolCallArgumentsDelta"):
            kinds.append(kind)
    turn = ["TurnStarted", "TextDelta", "ToolCallStarted", "ToolCallArgumentsDelta", "ToolCallEnded", "TurnEnded", "ToolExecutionStarted", "ToolResult"]
    assert kinds == turn + turn + ["TurnStarted", "TextDelta", "TurnEnded", "Done"]
    assert [e.code for e in events if isinstance(e, ToolExecutionStarted)] == list(OUTPUTS)
    assert [e.record.stdout for e in events if isinstance(e, ToolResult)] == list(OUTPUTS.values())
    reasoning = "".join(e.text for e in events if isinstance(e, TextDelta) and e.reasoning)
    content = "".join(e.text for e in events if isinstance(e, TextDelta) and not e.reasoning)
    assert reasoning.startswith("The divisors come from the factorization.\n") and "There are 16." in reasoning
    assert content == "\n<answer>\\boxed{16}</answer>"
    assert [e.index for e in events if isinstance(e, ToolCallStarted)] == [0, 1]
    arguments = "".join(e.text for e in events if isinstance(e, ToolCallArgumentsDelta) and e.index == 1)
    assert json.loads(arguments) == {"code": "print(4 * 2 * 2)", "input": ""}
    assert [e.call.index for e in events if isinstance(e, ToolCallEnded)] == [0, 1]
    assert isinstance(events[-1], Done) and events[-1].trajectory.stop_reason == "stop"
    assert [e.turn for e in events if isinstance(e, TurnStarted)] == [0, 1, 2]
    assert [e.finish_reason for e in events if isinstance(e, TurnEnded)] == ["stop"] * 3


def test_closing_the_event_stream_aborts_the_engine_request(default_tokenizer):
    engine = scripted_engine(default_tokenizer, TWO_TOOL_TURNS)

    async def go():
        events = run_agent(engine, rstar_template(default_tokenizer), QUESTION, TOOLS, SAMPLING, scripted_sandbox().executor(), request_id="r1")
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, TextDelta):
                    break  # the client went away mid-turn

    asyncio.run(go())
    assert engine.aborted == ["r1-0"]


def test_cancelling_during_a_tool_call_cancels_the_sandbox_job(default_tokenizer):
    sandbox = scripted_sandbox(delay_s=3600)

    async def go():
        started = asyncio.Event()

        async def consume():
            async for event in run_agent(scripted_engine(default_tokenizer, TWO_TOOL_TURNS), rstar_template(default_tokenizer), QUESTION, TOOLS, SAMPLING, sandbox.executor()):
                if isinstance(event, ToolExecutionStarted):
                    started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        while not sandbox.requests:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)

    asyncio.run(go())
    assert sandbox.cancelled


def test_a_trajectory_through_the_real_sandbox(default_tokenizer):
    from rstar.sandbox.clients import LocalClient
    from rstar.sandbox.settings import SandboxSettings
    from rstar.server.builtin_tools import SandboxExecutor

    async def go():
        async with LocalClient(SandboxSettings()) as client:
            engine = scripted_engine(default_tokenizer, TWO_TOOL_TURNS)
            return await run_trajectory(engine, rstar_template(default_tokenizer), QUESTION, TOOLS, SAMPLING, SandboxExecutor(client))

    trajectory = asyncio.run(go())
    assert trajectory.stop_reason == "stop"
    assert [(c.success, c.stdout) for c in trajectory.tool_calls] == [(True, "{2: 3, 11: 1, 23: 1}\n"), (True, "16\n")]
    assert trajectory.tool_calls[1].response.startswith("Tool call success\nstdout: 16\n\nexecution time: 0.0")


def test_closing_between_parallel_calls_cancels_the_started_job(default_tokenizer):
    turns = ["Two at once.\n" + call("print(1)") + "\n" + call("print(2)")]
    sandbox = scripted_sandbox(delay_s=3600)

    async def go():
        engine = scripted_engine(default_tokenizer, turns)
        events = run_agent(engine, rstar_template(default_tokenizer), QUESTION, TOOLS, SAMPLING, sandbox.executor(), LoopConfig(max_parallel_calls=2))
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, ToolExecutionStarted) and event.code == "print(2)":
                    while not sandbox.requests:  # the first call's job is running in the sandbox
                        await asyncio.sleep(0)
                    break
        await asyncio.sleep(0)

    asyncio.run(go())
    assert sandbox.codes == ["print(1)"]
    assert sandbox.cancelled


def test_a_call_whose_name_is_not_a_string_is_answered_not_raised(default_tokenizer):
    turns = ['<tool_call>{"name": ["python"], "arguments": {}}</tool_call>', "Ok.</reason>"]
    config = LoopConfig(client_tools=frozenset({"get_weather"}))
    trajectory = run(scripted_engine(default_tokenizer, turns), scripted_sandbox().executor(), rstar_template(default_tokenizer), config)
    assert trajectory.tool_calls[0].response == "Error when executing tool: ['python']"
    assert trajectory.stop_reason == "stop"


def test_a_continued_final_message_runs_its_call_first_token_exactly(template, default_tokenizer):
    given = {"role": "assistant", "content": template.generation_prefix + "Let me count.\n" + call("print(4 * 2 * 2)")}
    answer = "There are 16.</reason>\n<answer>\\boxed{16}</answer>"
    engine = scripted_engine(default_tokenizer, [answer])
    messages = [*QUESTION, given]
    trajectory = asyncio.run(run_trajectory(engine, template, messages, TOOLS, SAMPLING, scripted_sandbox(OUTPUTS).executor(), continue_final_message=True))
    assert [(c.turn, c.stdout) for c in trajectory.tool_calls] == [(-1, "16\n")]
    assert trajectory.stop_reason == "stop" and len(trajectory.turns) == 1
    conversation = [*messages, {"role": "tool", "content": trajectory.tool_calls[0].response}, {"role": "assistant", "content": template.generation_prefix + answer}]
    rendered = template.render(conversation, TOOLS, add_generation_prompt=False)
    stream = default_tokenizer.decode(trajectory.prompt_ids + trajectory.response_ids, skip_special_tokens=False)
    assert rendered == stream + "\n"
    # The given message's tokens are prompt; the tool turn is mask 0, the answer mask 1.
    first_sampled = trajectory.response_mask.index(1)
    assert set(trajectory.response_mask[:first_sampled]) == {0} and set(trajectory.response_mask[first_sampled:]) == {1}


def test_a_continued_partial_message_is_extended_and_its_call_parsed_whole(default_tokenizer):
    template = choose_template(default_tokenizer, "SmolLM2-135M-Instruct")
    start = call("print(4 * 2 * 2)")[:30]
    engine = scripted_engine(default_tokenizer, [call("print(4 * 2 * 2)")[30:], "16."])
    messages = [*QUESTION, {"role": "assistant", "content": start}]
    events = asyncio.run(_collect(run_agent(engine, template, messages, TOOLS, SAMPLING, scripted_sandbox(OUTPUTS).executor(), continue_final_message=True)))
    assert default_tokenizer.decode(engine.prompts[0]).endswith(start)
    trajectory = events[-1].trajectory
    assert [(c.turn, c.stdout) for c in trajectory.tool_calls] == [(0, "16\n")]
    # The call's start was given: its name still reaches the client, its text does not come back.
    assert [e.name for e in events if isinstance(e, ToolCallStarted)] == [PYTHON_TOOL]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "16."


def test_a_switched_off_builtin_is_answered_as_unknown(default_tokenizer):
    engine = scripted_engine(default_tokenizer, [call("print(1)"), "ok"])
    sandbox = scripted_sandbox()
    config = LoopConfig(builtin_tools=frozenset({JUPYTER_TOOL}))
    trajectory = run(engine, sandbox.executor(), rstar_template(default_tokenizer), config)
    assert sandbox.requests == []
    assert trajectory.tool_calls[0].response == f"Error when executing tool: '{PYTHON_TOOL}'"
    assert trajectory.tool_calls[0].exec_status is None


def test_without_any_tools_the_first_turn_is_the_answer(default_tokenizer):
    engine = scripted_engine(default_tokenizer, [call("print(1)")])
    trajectory = run(engine, scripted_sandbox().executor(), rstar_template(default_tokenizer), LoopConfig(builtin_tools=frozenset()), tools=[])
    assert trajectory.stop_reason == "stop" and trajectory.tool_calls == [] and len(engine.prompts) == 1


async def _collect(events):
    return [event async for event in events]
