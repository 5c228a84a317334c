"""GPQA-Diamond: 198 four-option questions, asked with the rStar template and graded by the chosen letter.

The data has no letters: each (question, sample) gets its own option order from an RNG seeded by the doc id and
the sample index, so a run is reproducible and the grade records the permutation it was asked with.
The authors ask that questions never appear in plain text online: nothing here logs question or option text.
"""

from __future__ import annotations

import csv
import random
import re
from pathlib import Path

from rstar.evals.data import hf_rows, local_file
from rstar.evals.math_tasks import PAPER_SAMPLING
from rstar.evals.metrics import sampled_accuracy
from rstar.evals.registry import Benchmark, Doc, Grade, Prompt, register

HF_ID = "Idavidrein/gpqa"
LETTERS = "ABCD"
SHUFFLE_SEED = 0


def _doc(row: dict) -> Doc:
    return {
        "id": row["Record ID"],
        # options[0] is the correct one; the display order comes from `permutation`
        "options": [
            row["Correct Answer"].strip(),
            *(row[f"Incorrect Answer {i}"].strip() for i in (1, 2, 3)),
        ],
        "question": row["Question"].strip(),
        "domain": row["High-level domain"],
    }


def load(data_dir: Path | None) -> list[Doc]:
    if data_dir is None:
        rows = hf_rows("gpqa_diamond", HF_ID, "train", "gpqa_diamond")
    else:
        with open(local_file(data_dir, "gpqa_diamond", "gpqa_diamond.csv"), encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    return [_doc(row) for row in rows]


def permutation(doc_id: str, sample_index: int, seed: int = SHUFFLE_SEED) -> list[int]:
    """Display order: position i (letter LETTERS[i]) shows options[result[i]]."""
    order = list(range(len(LETTERS)))
    # A str seed is hashed with SHA-512 by `random`, so the order is stable across processes and platforms.
    random.Random(f"gpqa:{seed}:{doc_id}:{sample_index}").shuffle(order)
    return order


def build_prompt(doc: Doc, sample_index: int) -> Prompt:
    order = permutation(doc["id"], sample_index)
    options = "\n".join(f"{LETTERS[i]}) {doc['options'][j]}" for i, j in enumerate(order))
    content = (
        f"{doc['question']}\n\n{options}\n\n"
        "The final answer is the letter (A, B, C or D) of the correct option."
    )
    return Prompt(messages=[{"role": "user", "content": content}])


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
# Markup a model wraps a boxed letter in: \text{(B)}, \textbf{B}, \mathrm{B}, $B$, **B**.
_LATEX_WRAPPER = re.compile(r"\\(?:textbf|text|mathrm|mathbf|mbox)\s*|[{}$*]")
_BOXED_LETTER = re.compile(r"^\s*(?:option|choice)?\s*\(?\s*([A-Da-d])\s*\)?(?:$|[\s.:)\]])", re.I)
# Outside a box: "Answer: (C)", "**Answer:** c", "the answer is B". A lower-case letter counts only after a
# colon, where it cannot be the article "a".
_ANSWER_COLON = re.compile(r"answer\s*\**\s*:\s*[\s*]*\(?([A-Da-d])\)?(?![\w])", re.I)
_ANSWER_IS = re.compile(r"(?i:answer\s+is)\s*[\s*]*\(?([A-D])\)?(?![\w])")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None  # unbalanced: the response was cut off inside the box


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", _LATEX_WRAPPER.sub("", text)).strip().lower()


def extract_letter(response: str, displayed_options: list[str]) -> str | None:
    """The chosen letter: from \\boxed{} (inside <answer> first, else the last one), else an "Answer: X" line.

    A box holding an option's text instead of its letter counts as that option.
    """
    answers = _ANSWER_TAG.findall(response)
    boxed = (_last_boxed(answers[-1]) if answers else None) or _last_boxed(response)
    if boxed is not None:
        if match := _BOXED_LETTER.match(_LATEX_WRAPPER.sub("", boxed)):
            return match.group(1).upper()
        wanted = _normalise(boxed)
        for letter, option in zip(LETTERS, displayed_options):
            if wanted and wanted == _normalise(option):
                return letter
    matches = [(m.start(), m.group(1)) for pattern in (_ANSWER_COLON, _ANSWER_IS) for m in pattern.finditer(response)]
    if matches:
        return max(matches)[1].upper()
    return None


def grade(doc: Doc, response: str, sample_index: int) -> Grade:
    order = permutation(doc["id"], sample_index)
    gold = LETTERS[order.index(0)]
    predicted = extract_letter(response, [doc["options"][j] for j in order])
    return Grade(
        doc["id"],
        sample_index,
        1.0 if predicted == gold else 0.0,
        {"permutation": order, "gold": gold, "predicted": predicted},
    )


register(
    Benchmark(
        name="gpqa_diamond",
        source=HF_ID,
        load=load,
        build_prompt=build_prompt,
        grade=grade,
        aggregate=sampled_accuracy,
        sampling=PAPER_SAMPLING,  # paper §5.1 treats GPQA-Diamond like the math sets
        primary_metric="avg_pass_at_1",
    )
)
