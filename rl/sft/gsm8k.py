"""GSM8K training solutions turned into Python programs for the tool-use SFT data.

Every step of a GSM8K solution that computes carries a calculator annotation, `48/2 = <<48/2=24>>24 clips in
May`. Each annotation becomes one line of a program: a variable named after what the step counts (the words
after its result, here `clips_in_may`; else the words before it), its expression with every number that an
earlier step produced replaced by that step's variable, so the program reads as the solution's reasoning and
not as a list of constants. The program prints the step that gives the gold answer.

A step a solution writes out without its annotation (`20/4 = $5`, often the last) counts when it reads as arithmetic
and gives what it states. A row is refused, with its index and the reason, when it writes no calculation down,
when an annotation's expression does not give the result it states, or when no step gives the gold answer. Pure: the sandbox run that checks what a
program really prints happens in `sft.data`.
"""

from __future__ import annotations

import ast
import builtins
import itertools
import keyword
import operator
import re
from dataclasses import dataclass
from fractions import Fraction

ANNOTATION = re.compile(r"<<([^<>]*)=([^<>=]*)>>")
# A step some solutions write out without its annotation, usually the last one: `20/4 = $5`.
WRITTEN_OUT = re.compile(r"((?:[\d.,$()]|\s*[-+*/×x−]\s*)+?)\s*=\s*\$?(-?\d[\d,]*(?:\.\d+)?)")
# Words that say nothing about what a step counts.
FILLER = frozenset(
    "a an the so then that this these those there it its is are was were be been has have had will would can "
    "he she they we you i his her their our your him them us me means meaning total altogether "
    "to of for by on at with from into per be because and which who".split()
)
MAX_NAME_WORDS = 3
LEADING_ZEROS = re.compile(r"(?<![\d.])0+(\d)")  # "05" is 5 to a calculator and a syntax error to Python
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class NotConvertible(ValueError):
    """A GSM8K row that cannot become a program; the message names the row and why, `reason` says which of the
    refusals it is (one of REFUSALS), for counting."""

    def __init__(self, index: int, reason: str, detail: str = ""):
        super().__init__(f"row {index}: {reason}{': ' + detail if detail else ''}")
        self.index, self.reason = index, reason


NO_CALCULATION = "the solution writes no calculation down (no annotation, no arithmetic)"
DOES_NOT_COMPUTE = "an annotation is not arithmetic Python can run"
WRONG_RESULT = "an annotation's expression does not give the result it states"
NO_ANSWER_STEP = "no written step gives the gold answer"
REFUSALS = (NO_CALCULATION, DOES_NOT_COMPUTE, WRONG_RESULT, NO_ANSWER_STEP)


@dataclass(frozen=True)
class Step:
    name: str
    expression: str  # Python, with earlier steps' names
    value: Fraction


@dataclass(frozen=True)
class SolutionProgram:
    steps: tuple[Step, ...]
    printed: str  # the name of the step whose value is the answer

    @property
    def code(self) -> str:
        return "\n".join([*(f"{step.name} = {step.expression}" for step in self.steps), f"print({self.printed})"])


def evaluate(node: ast.AST, names: dict[str, Fraction]) -> Fraction:
    """An annotation's arithmetic, exactly: numbers, earlier steps' names, + - * / // % and small powers."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(str(node.value))
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = evaluate(node.operand, names)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = evaluate(node.left, names), evaluate(node.right, names)
        if exponent.denominator != 1 or abs(exponent) > 64:
            raise ValueError(f"a power of {exponent} is not calculator arithmetic")
        return base**int(exponent)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](evaluate(node.left, names), evaluate(node.right, names))
    raise ValueError(f"{ast.unparse(node)!r} is not calculator arithmetic")


def as_number(text: str) -> Fraction | None:
    """A stated result ("24", "0.2", "1,080", "$5", "-3", "50%"), exactly; None when it is not a number."""
    cleaned = re.sub(r"[\s,$%]", "", text)
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def rounding_of(stated: str) -> Fraction:
    """How far a stated result may be from its expression's value: half a unit of its last digit (a solution
    writes 1/3 as 0.33), and nothing for a whole number."""
    decimals = len(stated.strip().partition(".")[2].rstrip("%$ "))
    return Fraction(1, 2 * 10**decimals) if decimals else Fraction(0)


def step_name(line: str, start: int, end: int, taken: set[str]) -> str:
    """A variable name for the annotation at line[start:end]: what the words after its result say it counts,
    else the words before it; made a unique identifier. A name an earlier step took is told apart by the nearest
    words before this step (`weight`, then `beans_weight`), and numbered only when those do not tell it apart:
    the answers that loop until their tokens run out count a numbered name up (`eggs_122 = eggs_122 + 2`)."""
    def words(text: str) -> list[str]:
        return [w for w in re.findall(r"[a-z]+", re.sub(r"'s\b", "", text.lower())) if w not in FILLER]

    def identifier(chosen: list[str]) -> str:
        name = "_".join(chosen) or "step"
        return name + "_value" if keyword.iskeyword(name) or hasattr(builtins, name) else name

    before = line[:start]
    before = before[: before.rfind("=")] if "=" in before else before
    before_words = words(re.sub(r"(?:[\d.,$%*/+×()\s-]|\bx\b)+$", "", before))  # without the expression written out
    after = re.match(r"[\d.,%]*\s*(.*?)(?:[.,;:!?(]|$)", line[end:]).group(1)
    counted = words(after)[:MAX_NAME_WORDS] or before_words[-MAX_NAME_WORDS:]
    qualifiers = [w for w in reversed(before_words) if w not in counted]
    candidates = [identifier(counted), *(identifier(qualifiers[:n][::-1] + counted) for n in (1, 2))]
    numbered = (f"{candidates[0]}_{n}" for n in itertools.count(2))
    return next(name for name in itertools.chain(candidates, numbered) if name not in taken)


def written_arithmetic(text: str) -> str:
    """A step as the solution writes it out (`10 × $4`, `40 − 4`, `2 x 8`) in Python's arithmetic."""
    return re.sub(r"(?<=[\d)])\s*x\s*(?=[\d($])", " * ", text).replace("×", "*").replace("−", "-").replace("$", "").replace(",", "")


class _NameEarlierResults(ast.NodeTransformer):
    """Numbers that an earlier step produced, and that the question does not state, become that step's name."""

    def __init__(self, results: list[Step], question_numbers: set[Fraction]):
        self.results, self.question_numbers = results, question_numbers

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if not isinstance(node.value, (int, float)) or isinstance(node.value, bool):
            return node
        value = Fraction(str(node.value))
        if value in self.question_numbers:
            return node
        for step in reversed(self.results):
            if step.value == value:
                return ast.copy_location(ast.Name(step.name, ast.Load()), node)
        return node


def calculation(index: int, expression: str, stated: str, steps: list[Step], question_numbers: set[Fraction]) -> tuple[str, Fraction]:
    """One step's Python (earlier results by name) and its exact value; NotConvertible when it does not compute
    or does not give the result it states."""
    written = f"<<{expression}={stated}>>"
    try:
        tree = ast.parse(LEADING_ZEROS.sub(r"\1", expression.strip().replace("^", "**")), mode="eval")
        tree = ast.fix_missing_locations(_NameEarlierResults(steps, question_numbers).visit(tree))
        value = evaluate(tree, {step.name: step.value for step in steps})
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        raise NotConvertible(index, DOES_NOT_COMPUTE, f"{written}: {exc}") from None
    claimed = as_number(stated)
    if claimed is None or abs(value - claimed) > rounding_of(stated):
        raise NotConvertible(index, WRONG_RESULT, f"{written} gives {float(value):g}")
    return ast.unparse(tree), value


def solution_program(index: int, question: str, solution: str, gold: str) -> SolutionProgram:
    """The program for one GSM8K row, or NotConvertible naming `index` and why."""
    question_numbers = {n for text in re.findall(r"\d[\d,]*(?:\.\d+)?", question) if (n := as_number(text)) is not None}
    steps: list[Step] = []
    for line in solution.split("\n"):
        annotated = [(m.start(), m.end(), m.group(1), m.group(2)) for m in ANNOTATION.finditer(line)]
        # Without an annotation, an equation written out counts only when it reads as arithmetic and computes.
        written_out = [] if annotated else [(m.start(), m.end(), written_arithmetic(m.group(1)), m.group(2)) for m in WRITTEN_OUT.finditer(line)
                                            if re.search(r"\d\s*[-+*/×x−]\s*\$?\d", m.group(1))]
        for start, end, expression, stated in annotated or written_out:
            try:
                code, value = calculation(index, expression, stated, steps, question_numbers)
            except NotConvertible:
                if annotated:
                    raise
                continue  # prose that looked like an equation
            steps.append(Step(step_name(line, start, end, {step.name for step in steps}), code, value))
    if not steps:
        raise NotConvertible(index, NO_CALCULATION)
    answer = as_number(gold)
    printed = next((step for step in reversed(steps) if step.value == answer), None)
    if printed is None:
        raise NotConvertible(index, NO_ANSWER_STEP, f"{gold}")
    return SolutionProgram(tuple(steps[: steps.index(printed) + 1]), printed.name)
