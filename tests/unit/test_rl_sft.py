"""SFT encoding: the tokens trained on are the tokens the agent loop produces while serving, and only the
model's own tokens carry loss. Plus the SFT pieces that need no model: batches, schedule, bad data."""

from __future__ import annotations

import asyncio
import json

import pytest

from rstar.rl.sft.encoding import ConversationError, encode_conversation, read_conversations
from rstar.rl.sft.train import cosine_with_warmup, sft_trees, step_batches
from rstar.sandbox.schemas import RunResult
from rstar.sandbox.tools import PYTHON_TOOL
from rstar.server.agent_loop import LoopConfig, run_trajectory
from rstar.server.builtin_tools import builtin_tool_schemas
from rstar.server.chat_template import rstar_template
from rstar.server.engine import SamplingOptions
from rstar.server.tool_results import render_exec_result
from tests.scripted_engine import call, scripted_engine
from tests.scripted_sandbox import scripted_sandbox
from tests.unit.golden_files import check_json

TOOLS = builtin_tool_schemas([PYTHON_TOOL])
PROBLEM = "What is 59154 times 42196?"
CODE = "print(59154 * 42196)"
RESULT = RunResult(status="ok", exit_code=0, stdout="2496062184\n", duration_s=0.25)  # what the scripted sandbox reports
TURNS = [
    "I will compute the product with Python.\n" + call(CODE),
    "The program printed 2496062184.</reason>\n<answer>\nThe product is \\boxed{2496062184}.\n</answer>",
]


def conversation() -> list[dict]:
    arguments = {"code": CODE, "input": ""}
    return [
        {"role": "user", "content": PROBLEM},
        {"role": "assistant", "content": "<reason>I will compute the product with Python.", "tool_calls": [{"type": "function", "function": {"name": PYTHON_TOOL, "arguments": arguments}}]},
        {"role": "tool", "content": render_exec_result(RESULT, "improved")},
        {"role": "assistant", "content": "<reason>" + TURNS[1]},
    ]


@pytest.fixture(scope="module")
def template(default_tokenizer):
    return rstar_template(default_tokenizer)


def test_encoding_equals_what_the_agent_loop_serves(template, default_tokenizer):
    encoded = encode_conversation(template, conversation(), TOOLS)
    engine, executor = scripted_engine(default_tokenizer, TURNS), scripted_sandbox({CODE: RESULT.stdout}).executor()
    trajectory = asyncio.run(run_trajectory(engine, template, conversation()[:1], TOOLS, SamplingOptions(max_tokens=1), executor, LoopConfig(max_turns=3)))
    assert trajectory.prompt_ids == encoded.prompt_ids
    assert trajectory.response_ids == encoded.response_ids
    assert trajectory.response_mask == encoded.loss_mask


def test_only_the_models_own_tokens_carry_loss(template, default_tokenizer):
    encoded = encode_conversation(template, conversation(), TOOLS)
    spans, current, flag = [], [], None
    for token, loss in zip(encoded.response_ids, encoded.loss_mask):
        if loss != flag and current:
            spans.append([flag, default_tokenizer.decode(current, skip_special_tokens=False)])
            current = []
        flag = loss
        current.append(token)
    spans.append([flag, default_tokenizer.decode(current, skip_special_tokens=False)])
    check_json("rl/sft_loss_spans.json", spans)
    assert [loss for loss, _ in spans] == [1, 0, 1]
    assert spans[0][1].endswith("</tool_call><|im_end|>") and spans[2][1].endswith("</answer><|im_end|>")
    assert spans[1][1].startswith("\n<|im_start|>user\n<tool_response>\nTool call success") and spans[1][1].endswith("<|im_start|>assistant\n<reason>")
    assert default_tokenizer.decode(encoded.prompt_ids[-8:], skip_special_tokens=False).endswith("<|im_start|>assistant\n<reason>")


@pytest.mark.parametrize("messages, message", [
    (lambda c: c[:3], "must end with an assistant message"),
    (lambda c: c[1:], "at least one message before its first assistant"),
    (lambda c: [c[0], {**c[1], "content": "no reason tag"}, *c[2:]], "must start with the generation prefix"),
    (lambda c: [c[0], {"role": "assistant", "content": "<reason>hi"}, c[2], c[3]], "tool results follow an assistant message without tool calls"),
    (lambda c: [*c[:3], {"role": "user", "content": "and?"}, c[3]], "expected an assistant message after the tool results"),
])
def test_malformed_conversations_are_refused(template, messages, message):
    with pytest.raises(ConversationError, match=message):
        encode_conversation(template, messages(conversation()), TOOLS)


def test_bad_lines_are_named(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"messages": conversation()}) + "\n" + "{oops\n")
    with pytest.raises(ConversationError, match=r"data.jsonl:2: not valid JSON"):
        read_conversations(str(path))
    path.write_text(json.dumps({"messages": conversation()}) + "\n" + json.dumps({"messages": "hi"}) + "\n")
    with pytest.raises(ConversationError, match=r"data.jsonl:2: 'messages' must be a list"):
        read_conversations(str(path))


def test_a_steps_examples_share_their_common_prompt_prefix(template):
    first = encode_conversation(template, conversation(), TOOLS)
    other = [dict(m) for m in conversation()]
    other[0]["content"] = "What is 2 times 3?"
    second = encode_conversation(template, other, TOOLS)
    (tree,) = sft_trees([first, second])
    assert first.prompt_ids[: len(tree.prefix)] == second.prompt_ids[: len(tree.prefix)]
    assert len(tree.prefix) > 300  # the system prompt, tools block and problem instruction, computed once
    assert [sum(b.loss_mask) for b in tree.branches] == [sum(first.loss_mask), sum(second.loss_mask)]


def test_step_batches_cover_each_epoch_once_in_a_seeded_order():
    batches = step_batches(10, 4, 1.5, seed=3)
    flat = [i for b in batches for i in b]
    assert len(flat) == 15 and sorted(flat[:10]) == list(range(10))
    assert [len(b) for b in batches] == [4, 4, 4, 3]
    assert step_batches(10, 4, 1.5, seed=3) == batches != step_batches(10, 4, 1.5, seed=4)


def test_cosine_schedule_warms_up_then_decays_to_zero():
    factors = [cosine_with_warmup(s, 10, 2) for s in range(11)]
    assert factors[:3] == [0.5, 1.0, 1.0] and factors[-1] == pytest.approx(0.0)
    assert all(a >= b for a, b in zip(factors[1:], factors[2:]))
