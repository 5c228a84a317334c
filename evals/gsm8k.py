"""GSM8K: grade-school math word problems (Cobbe et al. 2021), 1,319 test problems, 0-shot.

The prompt is the bare question: the rStar template adds the answer instruction and offers the Python tool, as
for the competition suites. The gold answer is the number after the solution's final `#### `. A response is
right when the number its extracted answer states (the run's extraction, as for math: the paper's `\\boxed{}` in
`<answer>`, or the released reward's rule) equals the gold one as a number: thousands separators, currency and
percent signs, units and surrounding words do not count, `18`, `$18.00`, `18 dollars` and `\\frac{36}{2}` all
state 18. When the answer holds several numbers (`3 \\times 6 = 18`), the last one is the one stated, as
lm-eval's flexible GSM8K extraction reads it.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

from rstar.evals.answers import PAPER_EXTRACTION, AnswerView
from rstar.evals.data import hf_rows, local_file, read_jsonl
from rstar.evals.metrics import sampled_accuracy
from rstar.sandbox.verify import released_answer
from rstar.evals.registry import RSTAR_TEMPLATE, Benchmark, Doc, Grade, Prompt, Sampling, register

# Greedy, one sample: how GSM8K is reported for small models (lm-eval's gsm8k task, Qwen2.5-Math's evaluation).
# Word problems need one or two cells, so a few turns and a short budget suffice.
GSM8K_SAMPLING = Sampling(temperature=0.0, samples=1, max_turns=5, max_tokens=2048, template=RSTAR_TEMPLATE)

# The pieces of LaTeX and prose that wrap a number without changing it.
_WRAPPERS = re.compile(r"\\text\{|\\mathrm\{|\\\$|\\%|\\,|\\!|\{,\}|[$%]")
_FRACTION = re.compile(r"(-?)\\d?frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}")
# A plain number: thousands groups only in threes (so "3,4" is two numbers), then decimals; a slash fraction.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?")


def gold_answer(solution: str) -> str:
    """The number after a GSM8K solution's `#### `, without thousands separators."""
    marker = solution.rfind("####")
    if marker < 0:
        raise ValueError("a GSM8K solution ends with '#### <answer>'; this one has no '####'")
    return solution[marker + 4 :].strip().replace(",", "")


def stated_number(text: str | None) -> Fraction | None:
    """The number an answer states (its last one), exactly; None when it states none."""
    if not text:
        return None
    text = _FRACTION.sub(lambda m: f"{m[1]}{m[2]}/{m[3]}", text)
    text = _WRAPPERS.sub("", text)
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    last = numbers[-1].replace(",", "")
    numerator, _, denominator = last.partition("/")
    try:
        return Fraction(numerator) / Fraction(denominator or "1")
    except ZeroDivisionError:
        return None


def load(data_dir: Path | None) -> list[Doc]:
    """The test split: the shared copy's `gsm8k/test.jsonl` (Qwen2.5-Math's file, rows in openai's order), or
    the Hugging Face dataset the anchors load."""
    rows = hf_rows("gsm8k", "openai/gsm8k", "test", "main") if data_dir is None else read_jsonl(local_file(data_dir, "gsm8k", "test.jsonl"))
    return [{"id": str(row.get("idx", n)), "problem": row["question"].strip(), "answer": gold_answer(row["answer"])} for n, row in enumerate(rows)]


def build_prompt(doc: Doc, sample_index: int) -> Prompt:
    return Prompt(messages=[{"role": "user", "content": doc["problem"]}])


def _graded(doc: Doc, sample_index: int, predicted: str | None, **details) -> Grade:
    value = stated_number(predicted)
    correct = value is not None and value == Fraction(doc["answer"])
    return Grade(doc["id"], sample_index, 1.0 if correct else 0.0, {"gold": doc["answer"], "predicted": predicted, **details})


def grade(doc: Doc, response: str, sample_index: int) -> Grade:
    """The paper's extraction (the `\\boxed{}` inside `<answer>`, else the last one) on an answer text."""
    from rstar.sandbox.verify import extract_answer

    return _graded(doc, sample_index, extract_answer(response))


def grade_view(doc: Doc, view: AnswerView, sample_index: int, extraction: str) -> Grade:
    if extraction == PAPER_EXTRACTION:
        return grade(doc, view.answer_text, sample_index)
    return _graded(doc, sample_index, released_answer(view.whole_text), extraction=extraction)


register(
    Benchmark(
        name="gsm8k",
        source="openai/gsm8k",
        load=load,
        build_prompt=build_prompt,
        grade=grade,
        grade_view=grade_view,
        aggregate=sampled_accuracy,
        sampling=GSM8K_SAMPLING,
        primary_metric="avg_pass_at_1",
    )
)
