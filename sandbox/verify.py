"""Answer checking: pull the final answer out of a response and compare it with the gold answer, by one of
two named rules (`REWARD_RULES`; RL's `reward` knob chooses):

- `boxed`, the rStar2-Agent paper's: the `\\boxed{}` inside `<answer>...</answer>` first, else the last
  `\\boxed{}` anywhere; a response with no box scores 0.
- `released`, what the released reward (`rstar2_agent/reward/compute_score.py`) accepts: verl's `prime_math`
  reading (the last `\\boxed{}` anywhere, else an "answer is"-style marker), or, when that fails,
  math-verify finding the gold answer anywhere in the whole response.

Comparison: integers compare as integers (`025` equals `25`, `1,000` equals 1000, but `3,5` is no integer),
everything else goes through math-verify with the gold wrapped in `\\boxed{}`.

`score` is what runs inside a sandboxed child (`SandboxPool.verify`): math-verify parses model-written
LaTeX with sympy, which can take unbounded time on hostile input, so it runs under the pool's timeout.
"""

from __future__ import annotations

import re
from typing import Literal

RewardRule = Literal["boxed", "released"]
REWARD_RULES: tuple[RewardRule, ...] = ("boxed", "released")

_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_INTEGER = re.compile(r"[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)")  # commas only as thousands separators


def boxed_contents(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` in order, with nested braces balanced."""
    found = []
    for match in _BOX.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    found.append(text[start:i])
                    break
    return found


def extract_answer(response: str) -> str | None:
    for block in reversed(_ANSWER.findall(response)):
        boxes = boxed_contents(block)
        if boxes:
            return boxes[-1].strip()
    boxes = boxed_contents(response)
    return boxes[-1].strip() if boxes else None


def _as_integer(text: str) -> int | None:
    cleaned = text.strip().strip("$").strip()
    cleaned = re.sub(r"^\\text\{(.*)\}$", r"\1", cleaned).replace("\\!", "").replace(" ", "")
    return int(cleaned.replace(",", "")) if _INTEGER.fullmatch(cleaned) else None


def answers_match(predicted: str, gold: str) -> bool:
    pred_int, gold_int = _as_integer(predicted), _as_integer(gold)
    if pred_int is not None and gold_int is not None:
        return pred_int == gold_int
    from math_verify import parse, verify

    gold_parsed = parse(f"\\boxed{{{gold}}}")
    pred_parsed = parse(f"\\boxed{{{predicted}}}")
    return bool(gold_parsed) and bool(pred_parsed) and bool(verify(gold_parsed, pred_parsed))


def score(response: str, gold: str, rule: RewardRule = "boxed") -> bool:
    """True when the response's final answer equals the gold answer under `rule`."""
    if rule == "released":
        return released_score(response, gold)[0]
    if rule != "boxed":
        raise ValueError(f"unknown reward rule {rule!r}; use one of {', '.join(REWARD_RULES)}")
    predicted = extract_answer(response)
    return predicted is not None and answers_match(predicted, gold)


# --- the released rule -------------------------------------------------------------------------------------

_LEADING_MARKERS = ("answer:", "answer is", "answers are")  # the answer follows the marker
_TRAILING_MARKERS = ("is answer", "is the answer", "are answers", "are the answers")  # the answer precedes it


def marked_answer(text: str) -> str | None:
    """The released reward's fallback when no `\\boxed{}` holds the answer: the text after the last
    "answer is"-style marker (or before the last "is the answer"), up to its last sentence end."""
    matched = False
    for marker in _LEADING_MARKERS:
        at = text.lower().rfind(marker)
        if at >= 0:
            matched, text = True, text[at + len(marker) :].strip()
    for marker in _TRAILING_MARKERS:
        at = text.lower().rfind(marker)
        if at >= 0:
            matched, text = True, text[:at].strip()
    if not matched:
        return None
    if ". " in text:
        text = text[: text.rfind(". ")].strip()
    return text.rstrip(".").strip() or None


def released_answer(text: str) -> str | None:
    """prime_math's reading of a response: its last `\\boxed{}` anywhere, else the marked answer."""
    boxes = boxed_contents(text)
    return boxes[-1].strip() if boxes else marked_answer(text)


def released_score(text: str, gold: str) -> tuple[bool, str | None]:
    """(correct, extracted answer) under the released rule: the extracted answer matches, or math-verify,
    parsing the whole text its own way, finds the gold answer in it."""
    predicted = released_answer(text)
    if predicted is not None and answers_match(predicted, gold):
        return True, predicted
    from math_verify import parse, verify

    gold_parsed, found = parse(f"\\boxed{{{gold}}}"), parse(text)
    return bool(gold_parsed and found and verify(gold_parsed, found)), predicted
