"""Answer checking: pull the final answer out of a response and compare it with the gold answer.

Extraction follows the rStar2-Agent paper: the `\\boxed{}` inside `<answer>...</answer>` first, else the
last `\\boxed{}` anywhere. Comparison: integers compare as integers (`025` equals `25`), everything else
goes through math-verify with the gold wrapped in `\\boxed{}`.

`score` is what runs inside a sandboxed child (`SandboxPool.verify`): math-verify parses model-written
LaTeX with sympy, which can take unbounded time on hostile input, so it runs under the pool's timeout.
"""

from __future__ import annotations

import re

_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_INTEGER = re.compile(r"[+-]?\d+")


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
    cleaned = re.sub(r"^\\text\{(.*)\}$", r"\1", cleaned).replace(",", "").replace("\\!", "").replace(" ", "")
    return int(cleaned) if _INTEGER.fullmatch(cleaned) else None


def answers_match(predicted: str, gold: str) -> bool:
    pred_int, gold_int = _as_integer(predicted), _as_integer(gold)
    if pred_int is not None and gold_int is not None:
        return pred_int == gold_int
    from math_verify import parse, verify

    gold_parsed = parse(f"\\boxed{{{gold}}}")
    pred_parsed = parse(f"\\boxed{{{predicted}}}")
    return bool(gold_parsed) and bool(pred_parsed) and bool(verify(gold_parsed, pred_parsed))


def score(response: str, gold: str) -> bool:
    """True when the response's final answer equals the gold answer."""
    predicted = extract_answer(response)
    return predicted is not None and answers_match(predicted, gold)
