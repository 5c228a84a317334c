"""Tool-use SFT data (rl/sft/catalogue.py, rl/sft/data.py): programs checked in the real sandbox, split
hygiene, reproducibility, and conversations in the shape the server's rStar template and tool-call parser
expect."""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import replace
from collections import Counter

import pytest
from evals_data import shared_data_dir

from rstar.rl.sft import catalogue, data
from rstar.rl.sft.catalogue import FAMILIES, HELDOUT_PHRASINGS_PER_FAMILY
from rstar.rl.sft.data import generate_problems, make_sft_data
from rstar.sandbox.clients import LocalClient
from rstar.sandbox.tools import PYTHON_TOOL
from rstar.sandbox.verify import extract_answer
from rstar.server.builtin_tools import SandboxExecutor, builtin_tool_schemas
from rstar.server.chat_template import rstar_template, tojson
from rstar.server.tool_calls import parse_tool_calls
from tests.loop_thread import LoopThread
from tests.unit.golden_files import check_json

# Pools of their own cell uids: apart from the session pools (63000, 64000) that may be up at the same time.
MODULE_POOL_UID_BASE = 66000
MAKE_DATA_UID_BASE = 66100
SMALL_COUNTS = {"n_train": 36, "n_heldout": 12, "n_rl": 36}


class Sandbox:
    """The module's sandbox pool, on its own loop thread, for synchronous tests."""

    def __init__(self, settings):
        self.loop_thread = LoopThread()
        self.client = LocalClient(settings)
        self.loop_thread.run(self.client.start())
        self.executor = SandboxExecutor(self.client)

    def run_all(self, programs: list[str]):
        async def run_all():
            return await asyncio.gather(*(self.executor.execute(PYTHON_TOOL, code, "", ()) for code in programs))

        return self.loop_thread.run(run_all())

    def build(self, examples, progress=lambda done, total: None):
        return self.loop_thread.run(data.build_conversations(examples, self.executor, progress))

    def close(self):
        self.loop_thread.run(self.client.close())
        self.loop_thread.close()


@pytest.fixture(scope="module")
def sandbox(sandbox_settings):
    pool = Sandbox(sandbox_settings.model_copy(update={"uid_base": MODULE_POOL_UID_BASE}))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def make_data(sandbox_settings, tmp_path_factory):
    """make_sft_data(seed) into a fresh directory; returns (directory, manifest)."""
    settings = sandbox_settings.model_copy(update={"uid_base": MAKE_DATA_UID_BASE})

    def make(seed: int, progress=lambda done, total: None, **options):
        out_dir = tmp_path_factory.mktemp(f"sft_seed{seed}")
        manifest = asyncio.run(make_sft_data(out_dir, seed=seed, sandbox_settings=settings, progress=progress,
                                             **{**SMALL_COUNTS, **options}))
        return out_dir, manifest

    return make


@pytest.fixture(scope="module")
def make_data_with_gsm8k(make_data) -> dict:
    """The manifest of a small run that also converts GSM8K's first 120 training rows and draws 30 for SFT."""
    rows = read_jsonl(shared_data_dir() / "gsm8k" / "train.jsonl")[:120]
    return make_data(3, n_train=4, n_heldout=2, n_rl=2, gsm8k_rows=rows, n_gsm8k=30)[1]


@pytest.fixture(scope="module")
def seed_seven(make_data):
    progress_calls = []
    out_dir, manifest = make_data(7, progress=lambda done, total: progress_calls.append((done, total)))
    return out_dir, manifest, progress_calls


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def distinct_computations():
    """Every computation some phrasing uses, once (word stories bring their own samplers)."""
    by_id = {id(phrasing.computation): phrasing.computation for family in FAMILIES for phrasing in family.phrasings}
    return list(by_id.values())


def every_program(samples_per_computation: int):
    """(computation name, program, answer) for every program style of every computation, on several drawn numbers."""
    rng = random.Random(2024)
    for computation in distinct_computations():
        for _ in range(samples_per_computation):
            fields = computation.sample(rng)
            answer = str(computation.answer(fields))
            for program in computation.programs:
                yield computation.name, program.format(**fields), answer


# --- the programs ---------------------------------------------------------------------------------------


def test_every_program_prints_exactly_the_answer(sandbox):
    cases = list(every_program(samples_per_computation=4))
    results = sandbox.run_all([code for _, code, _ in cases])
    wrong = [(name, code, result) for (name, code, answer), result in zip(cases, results)
             if not result.ok or result.stdout != answer + "\n"]
    assert not wrong, wrong[:3]


def test_planted_bugs_fail_in_the_sandbox_with_the_error_they_name(sandbox):
    rng = random.Random(5)
    cases = []
    for _, code, _ in every_program(samples_per_computation=1):
        for maker, error in [(data.misspelled_name, "NameError"), (data.missing_import, "NameError"),
                             (data.string_concatenation, "TypeError")]:
            bug = maker(code, rng)
            if bug is not None:
                cases.append((bug, error))
    assert {error for _, error in cases} == {"NameError", "TypeError"}
    results = sandbox.run_all([bug.code for bug, _ in cases])
    for (bug, error), result in zip(cases, results):
        assert not result.ok and result.stderr.startswith(f"{error} at line"), (bug.code, result)


def test_conversations_over_many_seeds_end_in_the_programs_answer(sandbox):
    examples = [example for seed in range(4) for split in ("train", "heldout")
                for example in generate_problems(seed, 48, split)]
    progress = []
    built = sandbox.build(examples, lambda done, total: progress.append((done, total)))
    assert progress[-1] == (len(examples), len(examples)) and len(progress) == len(examples)
    for example in built:
        assert extract_answer(example.messages[-1]["content"]) == example.answer
        assert re.fullmatch(r"-?\d+", example.answer)


def test_a_wrong_answer_raises(sandbox):
    example = generate_problems(0, 1, "train")[0]
    with pytest.raises(RuntimeError, match="expected"):
        sandbox.build([replace(example, answer=str(int(example.answer) + 1))])


# --- families and splits --------------------------------------------------------------------------------


# The held-out phrasings as they were measured: their texts must not change (their ids may).
HELDOUT_TEXTS = {
    "product": ["Multiply {a} by {b}. What is the result?", "Determine the exact value of {a} \u00b7 {b}."],
    "modular": ["What remainder does {a} leave on division by {m}?", "Evaluate ${a}^{{{b}}} \\bmod {m}$."],
    "range_sum": ["Evaluate $\\sum_{{i={a}}}^{{{b}}} i$.", "What is $\\sum_{{k=1}}^{{{n}}} k^2$?"],
    "divisors": ["Compute $d({n})$, the number of positive divisors of {n}.",
                 "The integer {n} has how many positive divisors?"],
    "equation": ["Find the integer x such that {equation}.", "What is the greatest solution of {equation}?"],
    "word": ["Raffle tickets are numbered from 1 to {last:,}. Every ticket whose number is a multiple of {k} wins "
             "that many dollars. How many dollars are paid out in total?",
             "A shop charges a fixed fee of ${b} plus ${a} per pen. A customer's bill is ${c}. How many pens did "
             "the customer buy?"],
}


def test_families_have_at_least_twelve_training_phrasings_and_hold_out_the_last_ones():
    assert [family.name for family in FAMILIES] == list(HELDOUT_TEXTS)
    for family in FAMILIES:
        train, heldout = family.phrasing_ids("train"), family.phrasing_ids("heldout")
        assert len(train) >= 12 and len(heldout) == HELDOUT_PHRASINGS_PER_FAMILY
        assert train + heldout == [f"{family.name}/{i}" for i in range(len(family.phrasings))]
        assert [catalogue.phrasing_by_id(pid).text for pid in heldout] == HELDOUT_TEXTS[family.name]
    texts = [phrasing.text for family in FAMILIES for phrasing in family.phrasings]
    assert len(texts) == len(set(texts))


def test_the_heldout_problems_of_seed_zero_are_the_ones_measured():
    """Training phrasings may change; held-out problems stay comparable (numbers and answers included)."""
    check_json("rl/sft_heldout_seed0.json", [[e.problem, e.answer] for e in generate_problems(0, 200, "heldout")])


def training_computations(family) -> Counter:
    return Counter(catalogue.phrasing_by_id(pid).computation.name for pid in family.phrasing_ids("train"))


def test_every_computation_is_trained_in_several_phrasings():
    for family in FAMILIES:
        counts = training_computations(family)
        assert min(counts.values()) >= 2, (family.name, counts)
        heldout = {catalogue.phrasing_by_id(pid).computation.name for pid in family.phrasing_ids("heldout")}
        assert heldout <= set(counts), family.name
    stories = training_computations(catalogue.FAMILIES_BY_NAME["word"])
    for name in ("product", "remainder", "power_mod", "range_sum", "square_sum", "multiple_sum", "divisor_count",
                 "linear", "positive_root"):
        assert stories[name] >= 2, (name, stories)


@pytest.mark.parametrize("family_name, notations", [
    ("product", ["×", "·", "*", "\\times", "\\cdot", "times", ":,}"]),
    ("modular", ["^{{{b}}}", "\\pmod", "\\bmod", "**", "%", "≡", "modulo", ":,}"]),
    ("range_sum", ["\\sum_", "\\cdots", "...", "²", "**2", ":,}"]),
    ("divisors", ["{factored}", "{factored_latex}", "{factored_code}", "{factored_times}", "\\tau", ":,}"]),
    ("equation", ["{equation}", "{equation_sup}", "{equation_code}", "${equation}$"]),
])
def test_training_phrasings_show_each_notation(family_name, notations):
    texts = [catalogue.phrasing_by_id(pid).text for pid in catalogue.FAMILIES_BY_NAME[family_name].phrasing_ids("train")]
    assert all(any(notation in text for text in texts) for notation in notations), texts


def test_every_phrasing_formats_with_its_computations_fields():
    rng = random.Random(8)
    for family in FAMILIES:
        for phrasing in family.phrasings:
            for _ in range(5):
                fields = phrasing.computation.sample(rng)
                assert phrasing.text.format(**fields)  # every field the text names is drawn
                assert "\\boxed{1}" in (phrasing.conclusion or phrasing.computation.conclusion).format(answer=1)


def test_polynomials_and_equations_in_every_notation():
    assert catalogue.polynomial([2, -3, 1]) == "2x^2 - 3x + 1"
    assert catalogue.polynomial([2, -3, 1], "unicode") == "2x\u00b2 - 3x + 1"
    assert catalogue.polynomial([2, -3, 1], "code") == "2*x**2 - 3*x + 1"
    assert catalogue.polynomial([-1, 0, 5]) == "-x^2 + 5"
    assert catalogue.polynomial([0, 0, 0]) == "0"
    assert catalogue.linear_fields(7, -12, 30)["equation"] == "7x - 12 = 30"
    fields = catalogue.equation_fields([2, 0, 132], [0, 50, 0])
    assert fields["equation"] == "2x^2 + 132 = 50x"
    assert fields["equation_sup"] == "2x\u00b2 + 132 = 50x"
    assert fields["equation_code"] == "2*x**2 + 132 = 50*x"
    assert (fields["lhs"], fields["rhs"], fields["expr"]) == ("2*x**2 + 132", "50*x", "2*x**2 + 132 - (50*x)")
    assert catalogue.equation_fields([8, -406], [-462])["expr"] == "8*x - 406 - (-462)"
    assert catalogue.equation_fields([1, -5, 6], [0])["expr"] == "x**2 - 5*x + 6"


def test_factorizations_in_every_notation():
    fields = catalogue.factored_fields(2**3 * 3**2 * 5)
    assert fields == {"factored": "2^3 · 3^2 · 5", "factored_times": "2^3 × 3^2 × 5",
                      "factored_latex": "2^{3} \\cdot 3^{2} \\cdot 5", "factored_code": "2**3 * 3**2 * 5",
                      "exponents": "[3, 2, 1]"}
    assert catalogue.count_divisors(360) == 24 and catalogue.sum_divisors(360) == 1170


def test_training_equations_take_every_form():
    rng = random.Random(3)
    linear = [catalogue.sample_linear_any_form(rng) for _ in range(300)]
    assert any(re.fullmatch(r"-?\d+ = .*x.*", f["equation"]) for f in linear)  # x on the right
    assert any(re.fullmatch(r".*x.* = .*x.*", f["equation"]) for f in linear)  # on both sides
    assert any(re.fullmatch(r".*x.* = -\d+", f["equation"]) for f in linear)
    assert any(re.fullmatch(r".*x.* = \d+", f["equation"]) for f in linear)
    quadratic = [catalogue.sample_quadratic_any_form(rng) for _ in range(300)]
    leading = {match.group(1) for f in quadratic if (match := re.match(r"(-?\d+)\*x\*\*2 ", f["equation_code"]))}
    assert {"2", "-3"} <= leading
    assert any(f["equation"].endswith(" = 0") for f in quadratic)
    assert any("x" in f["equation"].split(" = ")[1] for f in quadratic)
    assert any(re.search(r"\d = -?\d+$", f["equation"]) for f in quadratic)  # the constant moved over


def test_equation_programs_use_sympy_and_keep_both_sides():
    equation = catalogue.FAMILIES_BY_NAME["equation"]
    for phrasing in equation.phrasings:
        for program in phrasing.computation.programs:
            assert "from sympy import" in program and "solve" in program
            assert "Eq({lhs}, {rhs})" in program or "solve({expr}, x)" in program


def test_splits_share_no_phrasing_and_no_problem(seed_seven):
    out_dir, manifest, _ = seed_seven
    train, heldout, rl = (read_jsonl(out_dir / name) for name in ("sft_train.jsonl", "heldout.jsonl", "rl_train.jsonl"))
    heldout_ids = set(manifest["heldout_phrasings"])
    assert heldout_ids == set(catalogue.heldout_phrasing_ids())
    assert {row["phrasing"] for row in heldout} <= heldout_ids
    assert not {row["phrasing"] for row in train} & heldout_ids
    assert not {row["phrasing"] for row in rl} & heldout_ids
    problems = [{row["problem"] for row in rows} for rows in (train, heldout, rl)]
    assert sum(map(len, problems)) == len(set().union(*problems)) == len(train) + len(heldout) + len(rl)
    assert len({row["id"] for row in train + heldout + rl}) == len(train) + len(heldout) + len(rl)


def test_rl_problems_avoid_the_sft_problems_and_use_their_own_numbers():
    train = generate_problems(1, 60, "train")
    rl = generate_problems(1, 60, "train", stream="rl", avoid={example.problem for example in train})
    assert not {e.problem for e in train} & {e.problem for e in rl}
    assert [e.phrasing for e in rl] != [e.phrasing for e in train]


def test_about_a_tenth_of_training_conversations_recover_from_an_error():
    train = generate_problems(0, 2000, "train")
    rate = sum(len(example.calls) == 2 for example in train) / len(train)
    assert 0.07 < rate < 0.13
    assert all(len(example.calls) == 1 for example in generate_problems(0, 300, "heldout"))


def test_generation_is_pure_and_seeded():
    first, again = generate_problems(3, 50, "train"), generate_problems(3, 50, "train")
    assert first == again and all(example.messages is None for example in first)
    assert [e.problem for e in generate_problems(4, 50, "train")] != [e.problem for e in first]
    per_family = Counter(example.family for example in first).values()
    assert len(per_family) == len(FAMILIES) and max(per_family) - min(per_family) <= 1  # families take turns


# --- files ----------------------------------------------------------------------------------------------


def test_same_seed_same_files_apart_from_execution_times(seed_seven, make_data):
    first_dir, first_manifest, progress = seed_seven
    second_dir, second_manifest = make_data(7)
    assert first_manifest == second_manifest
    names = ("sft_train.jsonl", "heldout.jsonl", "rl_train.jsonl", "manifest.json")
    assert sorted(path.name for path in first_dir.iterdir()) == sorted(names)  # no temp files left
    for name in names:
        first, second = ((d / name).read_text(encoding="utf-8") for d in (first_dir, second_dir))
        assert data.EXECUTION_TIME.sub("", first) == data.EXECUTION_TIME.sub("", second)
        if name != "manifest.json":
            assert first_manifest["files"][name]["sha256"] == data.content_sha256(first)
    assert json.loads((first_dir / "manifest.json").read_text()) == first_manifest
    built = SMALL_COUNTS["n_train"] + SMALL_COUNTS["n_heldout"]
    assert progress[-1] == (built, built)


def test_manifest_counts_rows_and_families(seed_seven):
    out_dir, manifest, _ = seed_seven
    assert manifest["seed"] == 7
    for name, count in [("sft_train.jsonl", "n_train"), ("heldout.jsonl", "n_heldout"), ("rl_train.jsonl", "n_rl")]:
        rows = read_jsonl(out_dir / name)
        assert manifest["files"][name]["rows"] == len(rows) == SMALL_COUNTS[count]
        assert manifest["files"][name]["families"] == dict(Counter(row["family"] for row in rows))
    rl_row = read_jsonl(out_dir / "rl_train.jsonl")[0]
    assert set(rl_row) == {"problem", "answer", "family", "phrasing", "id"}


# --- conversation shape ---------------------------------------------------------------------------------


def check_conversation(messages: list[dict], answer: str) -> None:
    assert messages[0]["role"] == "user"
    assert [m["role"] for m in messages[1:]] == ["assistant", "tool"] * ((len(messages) - 2) // 2) + ["assistant"]
    for message in messages[1:]:
        if message["role"] == "assistant":
            assert message["content"].startswith("<reason>")
    final = messages[-1]["content"]
    assert "tool_calls" not in messages[-1]
    boxed = r"\\boxed\{" + re.escape(answer) + r"\}"
    assert re.fullmatch(r"<reason>[^<]+</reason>\n<answer>\n[^<]*" + boxed + r"[^<]*\n</answer>", final)
    last_tool = messages[-2]["content"]
    assert last_tool.startswith("Tool call success\n") and f"stdout: {answer}\n" in last_tool


def test_rows_have_the_rstar_conversation_shape(seed_seven):
    out_dir, _, _ = seed_seven
    for name in ("sft_train.jsonl", "heldout.jsonl"):
        for row in read_jsonl(out_dir / name):
            check_conversation(row["messages"], row["answer"])


def test_error_recovery_shows_a_failure_then_a_success(sandbox):
    planned = [example for example in generate_problems(11, 200, "train") if len(example.calls) == 2][:8]
    assert planned
    for example in sandbox.build(planned):
        messages = example.messages
        check_conversation(messages, example.answer)
        assert len(messages) == 6
        failed, fixed = messages[2]["content"], messages[4]["content"]
        assert failed.startswith("Tool call failure\nreason: \nstderr: ")
        assert re.search(r"(NameError|TypeError) at line", failed)
        assert fixed.startswith("Tool call success\n")
        first_code, second_code = (messages[i]["tool_calls"][0]["function"]["arguments"]["code"] for i in (1, 3))
        assert first_code != second_code


def test_rstar_template_renders_the_calls_as_the_model_must_write_them(sandbox):
    template = rstar_template()
    planned = [example for example in generate_problems(2, 200, "train") if len(example.calls) == 2][:1]
    for example in sandbox.build(planned + generate_problems(2, 6, "heldout")):
        rendered = template.render(example.messages, tools=builtin_tool_schemas(), add_generation_prompt=False)
        calls = [m["tool_calls"][0]["function"] for m in example.messages if m.get("tool_calls")]
        for call in calls:
            expected = ('<tool_call>\n{"name": "python_code_with_standard_io", "arguments": '
                        + tojson({"code": call["arguments"]["code"], "input": ""}) + "}\n</tool_call>")
            assert expected in rendered
        # Each assistant turn opens with exactly what the generation prompt forces, then the sampled text.
        turn_opening = template.assistant_header + template.generation_prefix
        assert rendered.count(template.assistant_header) == rendered.count(turn_opening) == len(calls) + 1
        # The server's own parser reads the rendered calls back (after the system turn, whose tools block
        # shows the call format with placeholders).
        parsed = parse_tool_calls(rendered.split(template.turn_end, 1)[1])
        assert [(c.name, c.arguments) for c in parsed] == [(PYTHON_TOOL, call["arguments"]) for call in calls]


def test_gsm8k_solutions_become_conversations_and_a_program_that_misses_is_dropped(sandbox):
    rows = read_jsonl(shared_data_dir() / "gsm8k" / "train.jsonl")[:60]
    plan = data.plan_gsm8k(rows, seed=0, count=24)
    wrong = replace(plan.sft[0], answer=str(int(plan.sft[0].answer) + 1))  # its program prints the real answer
    dropped: list[str] = []
    built = sandbox.loop_thread.run(data.build_conversations([*plan.sft[1:], wrong], sandbox.executor, dropped=dropped))
    assert [e.id for e in built] == [e.id for e in plan.sft[1:]]
    assert len(dropped) == 1 and dropped[0].startswith(f"{wrong.id} (gsm8k/") and f"expected {wrong.answer!r}" in dropped[0]
    template = rstar_template()
    for example in built:
        user, call, result, final = example.messages
        assert user == {"role": "user", "content": example.problem}
        assert call["content"].startswith("<reason>") and call["content"] != "<reason>"
        stdout = re.search(r"stdout: (.*)\n", result["content"]).group(1)
        assert result["content"].startswith("Tool call success\n") and data.prints_answer(stdout, example.answer)
        assert final["content"] == f"<reason>{final['content'][8:].split('</reason>')[0]}</reason>\n<answer>\nThe answer is \\boxed{{{example.answer}}}.\n</answer>"
        assert extract_answer(final["content"]) == example.answer
        rendered = template.render(example.messages, tools=builtin_tool_schemas(), add_generation_prompt=False)
        assert tojson({"code": call["tool_calls"][0]["function"]["arguments"]["code"], "input": ""}) in rendered
    with pytest.raises(data.ProgramMismatch, match="expected"):  # without `dropped`, a miss raises as for the catalogue
        sandbox.build([wrong])


def test_make_sft_data_reports_how_many_gsm8k_rows_survive(make_data_with_gsm8k):
    manifest = make_data_with_gsm8k
    report = manifest["gsm8k"]
    assert report["rows"] == 120 and report["converted"] + sum(report["refused"].values()) == 120
    assert report["drawn_for_sft"] == 30 and report["conversations"] == 30 and report["program_did_not_print_the_answer"] == []
    assert report["rl_problems"] == report["converted"] - 30 == manifest["files"]["gsm8k_rl_train.jsonl"]["rows"]
    assert manifest["files"]["sft_train.jsonl"]["families"]["gsm8k"] == 30
