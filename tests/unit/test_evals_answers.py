"""One grading path: a trajectory reads (and grades) the same whichever client produced it; the extraction
variants against goldens; `native` renders the model's own template on both paths; the budget check."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import asdict

import httpx
import pytest
from evals_data import shared_data_dir
from golden_files import check_json
from scripted_engine import ScriptedEngine
from typer.testing import CliRunner

from rstar.evals import NATIVE_TEMPLATE, RSTAR_TEMPLATE, get_benchmark
from rstar.evals.answers import EXTRACTIONS, AnswerView, answer_view
from rstar.evals.budget import Budget, longest_prompt, measure_with_server, measure_with_tokenizer, refusal
from rstar.evals.cli import app as eval_app
from rstar.evals.client import GenerationParams, HttpChatClient, InProcessChatClient, generate
from rstar.evals.registry import Prompt
from rstar.server.chat_template import RSTAR_TEMPLATE_PATH, choose_template
from tests.scripted_sandbox import ScriptedSandbox
from tests.unit.api_server import make_server  # noqa: F401 (fixture)

RSTAR_MODEL = "smollm2-135m-rstar-tool"  # an rStar-named model: the server's default template is rStar's
RSTAR_INSTRUCTION = "You must put your answer inside <answer> </answer> tags"
CODE = "print(2+2)"
TOOL_TURN = 'Let me compute.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "' + CODE + '", "input": ""}}\n</tool_call>'
FINAL_TURN = "The tool says 4, so the answer is 4.</reason>\n<answer>\\boxed{4}</answer>"


def over_http(http) -> HttpChatClient:
    """Our HTTP client talking to the app behind a Starlette TestClient."""
    client = HttpChatClient("http://testserver/v1", backoff_s=0.0)

    def forward(request: httpx.Request) -> httpx.Response:
        answer = http.request(request.method, request.url.path, content=request.content, headers={"content-type": "application/json"})
        return httpx.Response(answer.status_code, content=answer.content, headers={"content-type": answer.headers["content-type"]})

    client.http = httpx.AsyncClient(transport=httpx.MockTransport(forward))
    return client


def params(template: str, max_tokens: int = 200, max_turns: int = 5) -> GenerationParams:
    return GenerationParams(model=RSTAR_MODEL, template=template, temperature=0.0, top_p=1.0, max_tokens=max_tokens, max_turns=max_turns)


# ------------------------------------------------------------------------------------ one grading path


def test_one_trajectory_grades_the_same_in_process_and_over_http(make_server, default_tokenizer):
    doc = {"id": "1", "problem": "What is 2+2?", "answer": "4"}
    prompt = get_benchmark("aime24").build_prompt(doc, 0)
    _, http, served, _ = make_server(replies=[TOOL_TURN, FINAL_TURN], sandbox=ScriptedSandbox(outputs={CODE: "4\n"}), model_name=RSTAR_MODEL)
    remote = asyncio.run(generate(over_http(http), prompt, params(RSTAR_TEMPLATE)))
    engine = ScriptedEngine(default_tokenizer, [TOOL_TURN, FINAL_TURN], model_name=RSTAR_MODEL)
    local = asyncio.run(generate(InProcessChatClient(engine, ScriptedSandbox(outputs={CODE: "4\n"}).executor()), prompt, params(RSTAR_TEMPLATE)))

    # the same model text: two turns, one code cell, on both paths (the shapes of the trajectories differ)
    assert served.prompts[0] == engine.prompts[0]
    assert "response" in remote.trajectory and len(local.trajectory["turns"]) == 2
    view = answer_view(local.trajectory)
    assert answer_view(remote.trajectory) == view
    assert view == AnswerView(
        reasoning="Let me compute.\nThe tool says 4, so the answer is 4.", content="\n<answer>\\boxed{4}</answer>", tool_outputs=["4\n"]
    )
    assert remote.response == local.response == view.content
    aime = get_benchmark("aime24")
    for extraction in EXTRACTIONS:
        graded = [aime.grade_view(doc, answer_view(s.trajectory), 0, extraction) for s in (remote, local)]
        assert graded[0] == graded[1] and graded[0].score == 1.0, extraction
    # both say which tool protocol built the tool turn: the embedded default's (it was trained on `improved`)
    assert remote.trajectory["tool_protocol"] == local.trajectory["tool_protocol"] == "improved"


# Answers on which the two extraction variants are compared; golden: tests/golden/evals/answer_extraction.json.
EXTRACTION_CASES = {
    "answer block": AnswerView("think", "<answer>\\boxed{4}</answer>"),
    "box outside the answer block": AnswerView("think", "So \\boxed{4}."),
    "answer block and a later box": AnswerView("", "<answer>\\boxed{4}</answer> or maybe \\boxed{5}"),
    "box only in the reasoning": AnswerView("the total is \\boxed{4}", "<answer>four</answer>"),
    "box only in tool output": AnswerView("compute it", "<answer>I am not sure</answer>", ["\\boxed{4}\n"]),
    "tool output boxes a wrong answer after the reasoning": AnswerView("\\boxed{4}", "", ["\\boxed{5}"]),
    "answer marker, no box": AnswerView("", "After checking, the answer is 4. Done"),
    "trailing marker, no box": AnswerView("", "Clearly 4 is the answer."),
    "bare expression math-verify finds": AnswerView("", "We get $x = \\frac{8}{2}$"),
    "nothing to read": AnswerView("", "I give up"),
    "cut off in the reasoning": AnswerView("so far \\boxed{4}", ""),
}


def test_extraction_variants_golden():
    aime = get_benchmark("aime24")
    doc = {"id": "d", "problem": "p", "answer": "4"}
    results = {}
    for name, view in EXTRACTION_CASES.items():
        results[name] = {"view": asdict(view)}
        for extraction in EXTRACTIONS:
            grade = aime.grade_view(doc, view, 0, extraction)
            results[name][extraction] = {"score": grade.score, "predicted": grade.details["predicted"]}
    check_json("evals/answer_extraction.json", results)
    # what the golden must show: the paper reads only the answer text, the released rule reads everything
    assert results["box only in the reasoning"]["paper"]["score"] == 0.0 and results["box only in the reasoning"]["released"]["score"] == 1.0
    assert results["answer marker, no box"]["paper"]["score"] == 0.0 and results["answer marker, no box"]["released"]["score"] == 1.0
    assert results["answer block and a later box"]["paper"]["predicted"] == "4" and results["answer block and a later box"]["released"]["predicted"] == "5"


def test_an_unknown_extraction_is_a_one_line_cli_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    result = CliRunner().invoke(eval_app, ["run", "--suite", "aime24", "--answer-extraction", "fuzzy", "--database-url", url])
    assert result.exit_code == 2
    assert "unknown answer extraction 'fuzzy'; use one of: paper, released" in result.output and "Traceback" not in result.output


# ------------------------------------------------------------------------------------- native template


def native_prompts() -> dict[str, Prompt]:
    data = shared_data_dir()
    bfcl = next(doc for doc in get_benchmark("bfcl_v3").load(data) if doc.get("category") == "simple")
    return {
        "ifeval": get_benchmark("ifeval").build_prompt(get_benchmark("ifeval").load(data)[0], 0),
        "bfcl_v3": get_benchmark("bfcl_v3").build_prompt(bfcl, 0),
    }


def test_native_never_carries_the_rstar_instruction_on_either_path(make_server, default_tokenizer):
    for name, prompt in native_prompts().items():
        _, http, served, _ = make_server(replies=["Sure."], model_name=RSTAR_MODEL)
        asyncio.run(generate(over_http(http), prompt, params(NATIVE_TEMPLATE, max_turns=1)))
        engine = ScriptedEngine(default_tokenizer, ["Sure."], model_name=RSTAR_MODEL)
        asyncio.run(generate(InProcessChatClient(engine, ScriptedSandbox(outputs={CODE: "4\n"}).executor()), prompt, params(NATIVE_TEMPLATE, max_turns=1)))
        sent = [default_tokenizer.decode(prompts[0]) for prompts in (served.prompts, engine.prompts)]
        assert sent[0] == sent[1], name
        # SmolLM2's own ChatML system prompt, no rStar instruction, no python tool, no opened <reason>
        assert RSTAR_INSTRUCTION not in sent[0] and "python_code_with_standard_io" not in sent[0] and "<reason>" not in sent[0], name
        if prompt.tools:  # BFCL: the functions listed in the model's template (tool protocol injected)
            assert all(tool["function"]["name"] in sent[0] for tool in prompt.tools) and "<tools>" in sent[0], name
        else:
            assert "You are a helpful AI assistant named SmolLM" in sent[0], name
    # what `native` used to mean for this model (the server's default choice): the rStar instruction
    default_choice = choose_template(default_tokenizer, RSTAR_MODEL, None).render([{"role": "user", "content": "hi"}])
    assert RSTAR_INSTRUCTION in default_choice


def test_native_on_a_model_whose_own_template_is_rstars_has_no_math_instruction(make_server, default_tokenizer):
    """The embedded default ships rstar.jinja as its own template: native keeps its format (system prompt,
    answers opened in <reason>) and leaves out the answer instruction, on both paths alike."""
    own_rstar = copy.deepcopy(default_tokenizer)
    own_rstar.chat_template = RSTAR_TEMPLATE_PATH.read_text(encoding="utf-8")
    prompt = native_prompts()["ifeval"]
    _, http, served, _ = make_server(replies=["Sure."], model_name=RSTAR_MODEL, tokenizer=own_rstar)
    asyncio.run(generate(over_http(http), prompt, params(NATIVE_TEMPLATE, max_turns=1)))
    engine = ScriptedEngine(own_rstar, ["Sure."], model_name=RSTAR_MODEL)
    asyncio.run(generate(InProcessChatClient(engine, ScriptedSandbox(outputs={CODE: "4\n"}).executor()), prompt, params(NATIVE_TEMPLATE, max_turns=1)))
    sent = [default_tokenizer.decode(prompts[0]) for prompts in (served.prompts, engine.prompts)]
    assert sent[0] == sent[1]
    assert RSTAR_INSTRUCTION not in sent[0] and "python_code_with_standard_io" not in sent[0]
    assert "The reasoning process is enclosed within <reason>" in sent[0] and sent[0].endswith("<|im_start|>assistant\n<reason>")
    assert "<|im_start|>user\n" + prompt.messages[0]["content"] + "<|im_end|>" in sent[0]


def test_native_on_a_model_without_a_template_is_a_clear_error(default_tokenizer):
    bare = copy.deepcopy(default_tokenizer)
    bare.chat_template = None
    prompts = native_prompts()
    with pytest.raises(ValueError, match="has no chat template of its own"):
        measure_with_tokenizer(bare, RSTAR_MODEL, {"ifeval": {"template": NATIVE_TEMPLATE, "max_tokens": 1280}}, prompts)


# ------------------------------------------------------------------------------------------- budget


def test_refusal_names_both_numbers_and_the_fix():
    budgets = [Budget("aime24", 30720, 310), Budget("ifeval", 1280, 120)]
    message = refusal(budgets, 8192, "the server's context window", "serve with a larger window (rstar serve --max-model-len N)")
    assert message == (
        "the token budget does not fit the server's context window of 8192 tokens: aime24 (max_tokens 30720 + longest prompt 310 = 31030). "
        "To fix: pass --max-tokens 7882 or less, or serve with a larger window (rstar serve --max-model-len N)"
    )
    assert refusal(budgets, 31030, "w", "f") is None  # exactly fits
    assert "longest prompt alone is over the window" in refusal([Budget("bfcl_v3", 100, None)], 512, "w", "f")


def test_longest_prompt_is_the_longest_in_characters():
    docs = [{"id": "a", "problem": "short"}, {"id": "b", "problem": "a much longer problem"}, {"id": "c", "problem": "mid size"}]
    assert longest_prompt(docs, get_benchmark("aime24").build_prompt).messages[0]["content"] == "a much longer problem"


def test_the_server_counts_the_budget_and_refuses_what_cannot_fit(make_server):
    _, http, served, _ = make_server(replies=["x"], model_name=RSTAR_MODEL, max_model_len=1024)
    prompts = {"aime24": Prompt(messages=[{"role": "user", "content": "What is 2+2?"}]), "ifeval": Prompt(messages=[{"role": "user", "content": "word " * 2000}])}
    benchmarks = {"aime24": {"template": RSTAR_TEMPLATE, "max_tokens": 30720}, "ifeval": {"template": NATIVE_TEMPLATE, "max_tokens": 1280}}
    budgets = asyncio.run(measure_with_server(over_http(http), benchmarks, prompts, RSTAR_MODEL))
    rstar_prompt = len(served.prompts[0])  # the one probe that fitted: what the server rendered for it
    assert budgets == [Budget("aime24", 30720, rstar_prompt, opens_reasoning=True), Budget("ifeval", 1280, None)]
    message = refusal(budgets, 1024, "the server's context window", "serve with a larger window")
    assert "aime24 (max_tokens 30720 + longest prompt" in message and "ifeval (its longest prompt alone is over the window)" in message


def test_in_process_run_over_the_models_window_is_refused_with_nothing_stored(tmp_path):
    """The default model supports 8192 positions; the paper's 30720-token answers cannot fit, so the run is
    refused before an engine starts or a run row is written."""
    from rstar.evals.runner import RunStore
    from rstar.server.db import open_database

    url = f"sqlite:///{tmp_path / 'r.db'}"
    result = CliRunner().invoke(eval_app, ["run", "--suite", "aime24", "--limit", "1", "--data-dir", str(shared_data_dir()), "--database-url", url])
    assert result.exit_code == 2, result.output
    assert "of 8192 tokens: aime24 (max_tokens 30720 + longest prompt" in result.output and "pass --max-tokens" in result.output

    assert RunStore(open_database(url)).runs() == []


# ---------------------------------------------------------------------------------------- truncation


def test_cut_off_is_the_finish_reason_length_of_any_stop_reason():
    from rstar.server.trajectory import Trajectory, cut_off, openai_finish_reason

    # the loop's stop reasons, then finish reasons as a trajectory read back over HTTP holds them
    table = {stop: (openai_finish_reason(stop), cut_off(stop)) for stop in ("stop", "length", "max_turns", "tool_calls", "abort", None, "content_filter")}
    assert table == {
        "stop": ("stop", False),
        "length": ("length", True),
        "max_turns": ("length", True),
        "tool_calls": ("tool_calls", False),
        "abort": ("abort", False),
        None: ("abort", False),
        "content_filter": ("abort", False),
    }
    over_http = Trajectory.from_chat_response({"choices": [{"message": {"content": "2+2 is"}, "finish_reason": "length"}]})
    assert cut_off(over_http.stop_reason)


def test_truncation_rate_is_in_the_summary_and_the_report():
    from rstar.evals.registry import Grade
    from rstar.evals.report import markdown
    from rstar.evals.runner import plan, summarize

    grades = [Grade(str(i), 0, 1.0, {"truncated": i < 1}) for i in range(4)]
    summary = summarize(get_benchmark("aime24"), grades, [], 4)
    assert summary["truncation_rate"] == 0.25
    run = {"id": "r", "model": "m", "endpoint": "", "status": "finished", "created_at": "t", "config": {"benchmarks": plan(["aime24"], {})}}
    assert "| 30720 | 25.0% |" in markdown(run, {"aime24": summary})


# ------------------------------------------------------------------------------- reasoning budgets


def test_ifeval_gets_its_reasoning_budget_only_where_the_template_opens_reasoning(make_server, default_tokenizer):
    """lm-eval's 1280-token cap is for an answer; a template that opens every answer in <reason> (the default
    model's own) gets room for the reasoning too, detected the same way on both paths."""
    from rstar.evals.budget import with_reasoning_budgets
    from rstar.evals.ifeval import LM_EVAL_MAX_TOKENS, REASONING_ALLOWANCE
    from rstar.evals.runner import plan

    own_rstar = copy.deepcopy(default_tokenizer)
    own_rstar.chat_template = RSTAR_TEMPLATE_PATH.read_text(encoding="utf-8")
    prompts = native_prompts()
    assert "reasoning_max_tokens" not in plan(["ifeval"], {"max_tokens": 2000})["ifeval"]  # a given --max-tokens wins
    for tokenizer, opens in ((own_rstar, True), (default_tokenizer, False)):
        _, http, _, _ = make_server(replies=["Sure."], model_name=RSTAR_MODEL, tokenizer=tokenizer, max_model_len=8192)
        benchmarks = plan(["ifeval", "gpqa_diamond"], {})
        remote = asyncio.run(measure_with_server(over_http(http), benchmarks, {"ifeval": prompts["ifeval"], "gpqa_diamond": prompts["ifeval"]}, RSTAR_MODEL))
        local = measure_with_tokenizer(tokenizer, RSTAR_MODEL, benchmarks, {"ifeval": prompts["ifeval"], "gpqa_diamond": prompts["ifeval"]})
        assert [b.opens_reasoning for b in remote] == [b.opens_reasoning for b in local] == [opens, True]
        config = {"benchmarks": benchmarks}
        checked = with_reasoning_budgets(config, local)
        expected = LM_EVAL_MAX_TOKENS + REASONING_ALLOWANCE if opens else LM_EVAL_MAX_TOKENS
        assert config["benchmarks"]["ifeval"]["max_tokens"] == checked[0].max_tokens == expected
        assert config["benchmarks"]["gpqa_diamond"]["max_tokens"] == plan(["gpqa_diamond"], {})["gpqa_diamond"]["max_tokens"]  # no reasoning budget of its own
        assert with_reasoning_budgets(config, local) == checked  # a resumed run's stored config stays as it was
