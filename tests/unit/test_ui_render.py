"""The UI's pure rendering: code cells, streamed turns, stored conversations, eval trajectories, score tables.

Eval samples are the ones the eval runner wrote (tests/eval_run.py), read through the eval endpoints as the
UI's client reads them."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from rstar.server.db import close_database, open_database
from rstar.ui.render import (
    AssistantTurn,
    answer_markdown,
    boxed_values,
    cell_images_markdown,
    cell_markdown,
    conversation_messages,
    fence,
    math_boxes,
    output_block,
    sample_messages,
    scores_caption,
    scores_table,
    trajectory_turn,
    turn_messages,
)
from tests.eval_run import eval_routes_app, write_eval_run

# The runner's summary shape (`rstar.evals.runner.summarize`) for one benchmark, cut to a few metrics.
SUMMARY = {"aime24": {"primary_metric": "avg_pass_at_1", "score": 0.5, "stderr": 0.5, "samples": 2, "expected_samples": 2, "docs": 2}}


@pytest.fixture(scope="module")
def written(tmp_path_factory, default_tokenizer):
    """(what the runner wrote, its samples by doc id as `GET /v1/evals/runs/{id}/samples/{id}` returns them)."""
    root = tmp_path_factory.mktemp("evals")
    sessions = open_database(f"sqlite:///{root / 'rstar.db'}")
    run = write_eval_run(sessions, root / "runs", default_tokenizer)
    client = TestClient(eval_routes_app(sessions))
    listed = client.get(f"/v1/evals/runs/{run.run_id}/samples").json()["data"]
    samples = {s["doc_id"]: client.get(f"/v1/evals/runs/{run.run_id}/samples/{s['id']}").json() for s in listed}
    close_database(sessions)
    return run, samples


@pytest.fixture(scope="module")
def right(written):
    """The right answer's sample: a turn that calls the python tool, then a turn that answers."""
    run, samples = written
    return samples[str(run.right_doc["id"])]

RUNNING = {"index": 0, "name": "python_code_with_standard_io", "code": "print(6*7)", "status": "running", "stdout": "", "stderr": "", "duration_s": None}
DONE = {**RUNNING, "status": "ok", "stdout": "42\n", "duration_s": 0.031}


def test_a_running_cell_shows_its_code_and_no_output_yet():
    text = cell_markdown(RUNNING)
    assert "Python cell 1 · running…" in text
    assert "```python\nprint(6*7)\n```" in text
    assert "stdout" not in text and "no output" not in text and " s**" not in text


def test_a_finished_cell_shows_status_timing_and_outputs():
    text = cell_markdown({**DONE, "stderr": "warning: x"})
    assert "Python cell 1 · ✓ ok · 0.03 s" in text
    assert "*stdout*\n\n```\n42\n```" in text and "*stderr*\n\n```\nwarning: x\n```" in text
    assert "✗ timed out" in cell_markdown({**DONE, "status": "timeout", "stdout": ""})
    assert "*no output*" in cell_markdown({**DONE, "stdout": ""})


def test_every_figure_of_a_cell_shows_inline_in_order_after_its_output():
    first, second = "data:image/png;base64,iVBORw0KGgoAAA=", "data:image/png;base64,iVBORw0KGgoBBB="
    cell = {**DONE, "index": 1, "images": [first, second], "image_notes": ["figure 3 not returned: over the cap"]}
    text = cell_markdown(cell)
    assert text.index("*stdout*") < text.index(f"![figure 1 of cell 2]({first})") < text.index(f"![figure 2 of cell 2]({second})")
    assert text.endswith("*figures left out*\n\n```\nfigure 3 not returned: over the cap\n```")
    assert "*no output*" not in cell_markdown({**DONE, "stdout": "", "images": [first]})
    assert cell_images_markdown(DONE) == ""


def test_only_inline_pngs_are_drawn():
    """The URL goes into the page's Markdown: one that could close the image's parentheses or load from elsewhere is not drawn."""
    bad = ["https://example.com/x.png", "data:image/png;base64,AAAA) <img src=x onerror=alert(1)>", "data:image/svg+xml;base64,PHN2Zz4=", 7]
    assert cell_images_markdown({**DONE, "images": bad}) == ""


def test_fences_outlast_backticks_inside():
    assert fence("a ``` b", "python") == "````python\na ``` b\n````"


def test_long_output_shows_a_head_and_the_rest_behind_a_toggle():
    text = "\n".join(str(i) for i in range(100))
    block = output_block(text, max_lines=5)
    head, _, hidden = block.partition("<details>")
    assert "0\n1\n2\n3\n4\n```" in head and "\n5\n" not in head
    assert "<summary>Show all 100 lines" in hidden and "\n99\n" in hidden
    assert output_block("short") == "```\nshort\n```"
    assert "<details>" in output_block("x" * 5000)  # one very long line is cut too


def test_a_streamed_turn_keeps_arrival_order_and_the_cell_update_replaces_the_start():
    turn = AssistantTurn()
    turn.add_reasoning("Let me ")
    turn.add_reasoning("compute.")
    turn.update_cell(RUNNING)
    turn.update_cell(DONE)
    turn.add_reasoning("It printed 42.")
    turn.add_content("The answer is ")
    turn.add_content("$42$.")
    assert [kind for kind, _ in turn.segments] == ["reasoning", "cell", "reasoning", "answer"]
    assert turn.segments[1][1]["status"] == "ok" and turn.content == "The answer is $42$."
    assert turn.reasoning == "Let me compute.It printed 42."
    messages = turn_messages(turn)
    assert messages[0] == {"role": "assistant", "content": "Let me compute.", "metadata": {"title": "Reasoning", "status": "done"}}
    assert "✓ ok" in messages[1]["content"] and "metadata" not in messages[1]
    assert messages[-1] == {"role": "assistant", "content": "The answer is $42$."}


def test_while_streaming_the_last_reasoning_block_is_pending_and_an_empty_turn_shows_progress():
    turn = AssistantTurn()
    assert turn_messages(turn, streaming=True) == [{"role": "assistant", "content": "…"}]
    turn.add_reasoning("thinking")
    assert turn_messages(turn, streaming=True)[0]["metadata"]["status"] == "pending"
    assert turn_messages(turn)[0]["metadata"]["status"] == "done"


def test_raw_tool_calls_in_text_are_left_to_the_cell_and_errors_and_cuts_are_said():
    turn = AssistantTurn(error="Cannot reach the server")
    turn.add_reasoning('Run it. <tool_call>{"name": "python_code_with_standard_io"}</tool_call>')
    turn.finish_reason = "length"
    messages = turn_messages(turn)
    assert messages[0]["content"] == "Run it."
    assert "max-tokens" in messages[1]["content"] and "⚠ Cannot reach the server" in messages[2]["content"]


# (what the model wrote, what the chat is sent): a box outside math and code goes between $...$, which the chat's
# KaTeX renders; everything else stays as written.
MATH_BOXES = [
    (r"has \boxed{512} loaves", r"has $\boxed{512}$ loaves"),
    (r"so \boxed{\frac{1}{2}}.", r"so $\boxed{\frac{1}{2}}$."),  # nested braces
    (r"\boxed{\{1, 2\}}", r"$\boxed{\{1, 2\}}$"),  # escaped braces are not the box's
    (r"\boxed{3} or \boxed{x^{2}}", r"$\boxed{3}$ or $\boxed{x^{2}}$"),
    (r"$\boxed{3}$, \(\boxed{4}\), \[\boxed{5}\] and $$\boxed{6}$$", None),  # already math
    (r"$\boxed{\$5}$ then \boxed{6}", r"$\boxed{\$5}$ then $\boxed{6}$"),  # an escaped $ does not end math
    ("`\\boxed{1}` and\n```\n\\boxed{2}\n```\n\\boxed{3}", "`\\boxed{1}` and\n```\n\\boxed{2}\n```\n$\\boxed{3}$"),  # code
    (r"almost \boxed{\frac{1}{2", None),  # not closed yet: streaming
    ("no box at all, $x$ stays", None),
]


@pytest.mark.parametrize("written, sent", MATH_BOXES)
def test_boxes_become_math_wherever_they_are_outside_math_and_code(written, sent):
    assert math_boxes(written) == (written if sent is None else sent)


def test_boxed_values_keep_nested_braces_whole_and_skip_an_unclosed_box():
    assert boxed_values(r"\boxed{\frac{1}{2}} and \boxed{a\}b} then \boxed{open") == [r"\frac{1}{2}", r"a\}b"]
    assert boxed_values("nothing boxed") == []


# (the answer as written, as the chat shows it): tags gone, the boxed values first as the answer line, the words
# after it unless the boxes were all there was.
ANSWERS = [
    ("<answer> The bakery still has \\boxed{512} loaves. </answer>", "**Answer:** $\\boxed{512}$\n\nThe bakery still has $\\boxed{512}$ loaves."),
    ("<answer>\\boxed{\\frac{1}{2}}.</answer>", "**Answer:** $\\boxed{\\frac{1}{2}}$"),
    ("x = \\boxed{2} and y = \\boxed{3}", "**Answer:** $\\boxed{2}, \\boxed{3}$\n\nx = $\\boxed{2}$ and y = $\\boxed{3}$"),
    ("<answer>It is 42, as 6 < 7.</answer>", "It is 42, as 6 < 7."),
]


@pytest.mark.parametrize("written, shown", ANSWERS)
def test_the_answer_shows_without_tags_and_leads_with_its_boxed_values(written, shown):
    assert answer_markdown(written) == shown


def test_a_streaming_answer_hides_its_tags_even_unclosed_or_half_arrived():
    assert answer_markdown("<answer> The bakery still has \\boxed{51", streaming=True) == "The bakery still has \\boxed{51"
    assert answer_markdown("<answer> It is 42 </ans", streaming=True) == "It is 42"
    assert answer_markdown("<answer> It is 42 <", streaming=True) == "It is 42"
    assert answer_markdown("<answer> a < b", streaming=True) == "a < b"  # not a tag's start


def test_an_ended_turn_shows_the_rendered_answer_then_the_raw_one_folded():
    turn = AssistantTurn()
    turn.add_reasoning("It is \\boxed{512}, I think.")
    turn.add_content("<answer> The bakery still has \\boxed{512} loaves. </answer>")
    streaming = turn_messages(turn, streaming=True)
    assert [m["content"] for m in streaming] == ["It is $\\boxed{512}$, I think.", ANSWERS[0][1]]  # no raw block yet
    reasoning, answer, raw = turn_messages(turn)
    assert reasoning["metadata"] == {"title": "Reasoning", "status": "done"} and answer == {"role": "assistant", "content": ANSWERS[0][1]}
    assert raw == {"role": "assistant", "content": fence(ANSWERS[0][0]), "metadata": {"title": "Raw answer", "status": "done"}}
    plain = AssistantTurn()
    plain.add_content("Just words.")
    assert turn_messages(plain) == [{"role": "assistant", "content": "Just words."}]  # nothing raw to add


def test_a_stopped_turn_says_so_after_what_it_had():
    turn = AssistantTurn(stopped=True)
    turn.add_reasoning("Let me")
    turn.add_content("<answer>")  # stopped as the answer began: nothing of it to show, raw or not
    messages = turn_messages(turn)
    assert messages[0]["content"] == "Let me" and "■ stopped" in messages[-1]["content"] and len(messages) == 2


def test_a_stored_conversation_renders_reasoning_cells_then_the_answer():
    stored = [
        {"role": "user", "content": "6*7?"},
        {"role": "assistant", "content": "42", "reasoning_content": "use python", "code_cells": [DONE]},
    ]
    shown = conversation_messages(stored)
    assert [m.get("metadata", {}).get("title") for m in shown] == [None, "Reasoning", None, None]
    assert shown[0] == {"role": "user", "content": "6*7?"} and "print(6*7)" in shown[2]["content"] and shown[3]["content"] == "42"
    cut = conversation_messages([{"role": "assistant", "content": "4", "finish_reason": "length"}])
    assert "max-tokens" in cut[-1]["content"]  # how it ended, as when it streamed


def test_a_trajectory_becomes_reasoning_cell_reasoning_answer(written, right):
    run, _ = written
    answer = run.right_doc["answer"]
    turn = trajectory_turn(right["trajectory"], right["code_cells"])
    kinds = [kind for kind, _ in turn.segments]
    assert kinds == ["reasoning", "cell", "reasoning", "answer"]
    assert turn.segments[0][1].startswith("I will check the value") and "<reason>" not in turn.reasoning
    cell = turn.segments[1][1]
    assert cell["status"] == "ok" and cell["stdout"] == f"{answer}\n" and cell["code"] == run.code and cell["duration_s"] > 0
    assert turn.content.strip() == f"<answer>\\boxed{{{answer}}}</answer>"


def test_a_call_shows_the_cell_the_server_drew_and_none_without_one(right):
    timed_out = {**right["code_cells"][0], "status": "timeout", "stdout": ""}
    turn = trajectory_turn(right["trajectory"], [timed_out])
    assert turn.segments[1][1] == timed_out
    assert [kind for kind, _ in trajectory_turn(right["trajectory"], []).segments] == ["reasoning", "answer"]  # the two turns run together


def test_a_forced_call_from_the_prompt_comes_before_the_first_turn(right):
    trajectory = right["trajectory"]
    forced = {**trajectory["tool_calls"][0], "turn": -1}
    turn = trajectory_turn({**trajectory, "tool_calls": [forced]}, right["code_cells"])
    assert [kind for kind, _ in turn.segments] == ["cell", "reasoning", "answer"]


def test_sample_drill_down_shows_prompt_trajectory_and_grade(written):
    run, samples = written
    shown = sample_messages(samples[str(run.right_doc["id"])])
    assert shown[0] == {"role": "user", "content": run.right_doc["problem"]}
    assert any("Python cell 1 · ✓ ok" in m["content"] for m in shown)
    assert shown[-1]["content"].startswith("**Grade: ✓ correct**") and f'"predicted": "{run.right_doc["answer"]}"' in shown[-1]["content"]
    wrong = sample_messages(samples[str(run.wrong_doc["id"])])
    answer = next(m["content"] for m in shown if m["content"].startswith("**Answer:**"))
    assert answer == f"**Answer:** $\\boxed{{{run.right_doc['answer']}}}$" and not any("<answer>" in m["content"] for m in shown if "metadata" not in m)
    assert any(m.get("metadata", {}).get("title") == "Raw answer" and "<answer>" in m["content"] for m in shown)
    assert "✗ wrong" in wrong[-1]["content"] and not any("Python cell" in m["content"] for m in wrong)
    # A sample stored without a trajectory shows its response instead.
    bare = sample_messages({**samples[str(run.wrong_doc["id"])], "trajectory": None, "response": "The answer is 12."})
    assert bare[1]["content"] == "The answer is 12."


def test_scores_table_unions_metrics_across_benchmarks():
    headers, rows = scores_table({**SUMMARY, "gpqa": {"avg_pass_at_1": 0.25, "stderr": 0.1}, "ifeval": 0.7})
    assert headers == ["benchmark", "primary_metric", "score", "stderr", "samples", "expected_samples", "docs", "avg_pass_at_1"]
    assert rows[0] == ["aime24", "avg_pass_at_1", "0.5000", "0.5000", "2", "2", "2", ""]
    assert rows[1] == ["gpqa", "", "", "0.1000", "", "", "", "0.2500"]
    assert rows[2][2] == "0.7000"


def test_scores_table_of_a_runner_written_run_shows_its_own_metrics_as_numbers(written):
    run, _ = written
    summary = json.loads((run.run_dir / "report.json").read_text())["benchmarks"]  # the runner's own summary
    headers, rows = scores_table(summary)
    assert "avg_pass_at_1" in headers and "metrics" not in headers  # the runner's nested metrics, flattened
    assert not any(cell.startswith(("{", "[")) for row in rows for cell in row)


def test_scores_caption_names_each_benchmark_and_its_metric():
    summary = {**SUMMARY, "ifeval": {"primary_metric": "prompt_level_strict_acc", "score": 0.3}, "old": 0.7}
    assert scores_caption(summary) == "Scores, % ± 1 s.e.: aime24 (avg_pass_at_1), ifeval (prompt_level_strict_acc)"
    assert scores_caption({}) == "Scores, % ± 1 s.e."
