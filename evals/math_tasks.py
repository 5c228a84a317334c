"""AIME 2024, AIME 2025, HMMT February 2025 and MATH-500: answer-checked competition math.

The prompt is the bare problem: the rStar template adds the answer instruction (<answer> tags, \\boxed{}).
Grading reads the answer from the sample's trajectory (`rstar.evals.answers`: the paper's extraction by
default, the released reward's with `--answer-extraction released`) and compares it with the sandbox's
check, `rstar.sandbox.verify.answers_match`, the same one RL rewards use: math-verify plus integer comparison
(AIME's zero-padded "025" equals 25).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from rstar.evals.answers import PAPER_EXTRACTION, AnswerView
from rstar.evals.data import hf_rows, local_file, read_jsonl
from rstar.evals.metrics import sampled_accuracy
from rstar.sandbox.verify import released_answer, released_score
from rstar.evals.registry import RSTAR_TEMPLATE, Benchmark, Doc, Grade, Prompt, Sampling, missing_packages, register

# Paper §5.1: rStar template, temperature 0.6, 16 samples, up to 30 turns, 30K-token responses. MATH-500 takes
# the same: the paper gives no separate setting for it (the released examples/math500_eval.sh leaves verl's
# validation defaults: one greedy sample, 5 turns; `--samples 1 --temperature 0 --max-turns 5` repeats that).
PAPER_SAMPLING = Sampling(temperature=0.6, samples=16, max_turns=30, max_tokens=30720, template=RSTAR_TEMPLATE)


def _doc(doc_id, problem: str, answer) -> Doc:
    return {"id": str(doc_id), "problem": problem.strip(), "answer": str(answer).strip()}


def load_aime24(data_dir: Path | None) -> list[Doc]:
    if data_dir is None:  # the set rStar2-Agent's data_preprocess loads
        rows = hf_rows("aime24", "HuggingFaceH4/aime_2024", "train")
    else:
        rows = read_jsonl(local_file(data_dir, "aime24", "test.jsonl"))
    return [_doc(row["id"], row["problem"], row["answer"]) for row in rows]


def load_aime25(data_dir: Path | None) -> list[Doc]:
    if data_dir is None:  # rStar2-Agent loads both papers of opencompass/AIME2025; their rows carry no id
        return [
            _doc(f"{config}-{n}", row["question"], row["answer"])
            for config in ("AIME2025-I", "AIME2025-II")
            for n, row in enumerate(hf_rows("aime25", "opencompass/AIME2025", "test", config), start=1)
        ]
    return [
        _doc(row["id"], row["problem"], row["answer"])
        for row in read_jsonl(local_file(data_dir, "aime25", "aime25.jsonl"))
    ]


def load_hmmt_feb_2025(data_dir: Path | None) -> list[Doc]:
    if data_dir is None:  # the Hugging Face copy of MathArena's files, which the local jsonl was built from
        return [
            _doc(row["problem_idx"], row["problem"], row["answer"])
            for row in hf_rows("hmmt_feb_2025", "MathArena/hmmt_feb_2025", "train")
        ]
    return [
        _doc(row["id"], row["problem"], row["answer"])
        for row in read_jsonl(local_file(data_dir, "hmmt_feb_2025", "hmmt_feb_2025.jsonl"))
    ]


def load_math500(data_dir: Path | None) -> list[Doc]:
    # rStar2-Agent's data_preprocess loads the Hugging Face copy and grades against its `answer` field (LaTeX,
    # e.g. `\left( 3, \frac{\pi}{2} \right)`); unique_id is the problem's path in the MATH release.
    rows = hf_rows("math500", "HuggingFaceH4/MATH-500", "test") if data_dir is None else read_jsonl(local_file(data_dir, "math500", "test.jsonl"))
    return [_doc(row["unique_id"], row["problem"], row["answer"]) for row in rows]


def build_prompt(doc: Doc, sample_index: int) -> Prompt:
    return Prompt(messages=[{"role": "user", "content": doc["problem"]}])


def grade(doc: Doc, response: str, sample_index: int) -> Grade:
    """The paper's extraction on an answer text."""
    """In-process check. math-verify's own timeouts use SIGALRM (main thread only); a runner that grades
    untrusted responses at scale can send the same `score` through the sandbox pool instead."""
    # Imported here so that loading the registry does not pull in math-verify and sympy.
    from rstar.sandbox.verify import extract_answer, score

    correct = score(response, doc["answer"])
    return Grade(doc["id"], sample_index, 1.0 if correct else 0.0, {"gold": doc["answer"], "predicted": extract_answer(response)})


def grade_view(doc: Doc, view: AnswerView, sample_index: int, extraction: str) -> Grade:
    """A whole answer under the run's extraction: the paper's (its answer text) or the released reward's
    (its whole text, tool output included)."""
    if extraction == PAPER_EXTRACTION:
        return grade(doc, view.answer_text, sample_index)
    correct, predicted = released_score(view.whole_text, doc["answer"])
    return Grade(doc["id"], sample_index, 1.0 if correct else 0.0, {"gold": doc["answer"], "predicted": predicted, "extraction": extraction})


for _name, _source, _load in (
    ("aime24", "HuggingFaceH4/aime_2024", load_aime24),
    ("aime25", "opencompass/AIME2025", load_aime25),
    ("hmmt_feb_2025", "MathArena/hmmt_feb_2025", load_hmmt_feb_2025),
    ("math500", "HuggingFaceH4/MATH-500", load_math500),
):
    register(
        Benchmark(
            name=_name,
            source=_source,
            load=_load,
            build_prompt=build_prompt,
            grade=grade,
            grade_view=grade_view,
            aggregate=sampled_accuracy,
            sampling=PAPER_SAMPLING,
            primary_metric="avg_pass_at_1",
            grader_problems=partial(missing_packages, _name, {"math_verify": "math-verify", "sympy": "sympy"}),
        )
    )
