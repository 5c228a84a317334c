"""Tool-use SFT data made by the product itself: problems that need computation, a correct program for each,
the program's real output from our sandbox, and a final answer in rStar2-Agent's format.

The embedded default model never calls its Python tool; a small supervised fine-tune on these conversations
teaches it to. Each conversation is what the served model should produce, in the server's own terms:

    user       the problem
    assistant  "<reason>" + a short plan, one `python_code_with_standard_io` call
    tool       the sandbox's result, rendered by `render_exec_result` exactly as the server shows it
    assistant  "<reason>" + a sentence reading the output + "</reason>\\n<answer>\\n... \\boxed{N} ...\\n</answer>"

Every assistant turn opens with "<reason>" because the rStar template's generation prompt forces it there.
In about `BUG_RATE` of training conversations the first program has a realistic bug (a misspelled name, a
missing import, a string + number TypeError); the sandbox reports the failure and the assistant fixes it
in a second call. This teaches recovery and gives RL's tool-error filter something to see.

Problems come from `FAMILIES`: one declarative entry per family, listing phrasings, each tied to a
`Computation` (number sampler, exact answer, programs in a few styles, plan sentences). A phrasing's id
is "family/index". The last `HELDOUT_PHRASINGS_PER_FAMILY` phrasings of every family are held out: they
appear only in the held-out split, never in SFT or RL training problems.

Reproducibility: everything random is drawn from local `random.Random` streams named by (stream, split,
seed). The same seed gives identical files except for the `execution time: X.XXs` text of tool results,
the only field that depends on the machine; the manifest's sha256 of each file is computed with those
timings normalized, so it is the same for the same seed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rstar.sandbox.clients import LocalClient
from rstar.sandbox.settings import SandboxSettings
from rstar.server.builtin_tools import PYTHON_TOOL, CodeExecutor, SandboxExecutor
from rstar.server.tool_results import render_exec_result

Fields = dict[str, int | str]

BUG_RATE = 0.1  # share of training conversations whose first program fails and is fixed
HELDOUT_PHRASINGS_PER_FAMILY = 2  # the last phrasings of each family, reserved for the held-out split
# Conversations built at once: enough to keep a sandbox pool's workers busy, far below its queue limit.
CONCURRENT_CONVERSATIONS = 8

SPLITS = ("train", "heldout")


# --- computations: how to draw numbers, the exact answer, programs that compute it ---------------------


@dataclass(frozen=True)
class Computation:
    """One kind of calculation. Programs and sentences are str.format templates over the sampled fields;
    every program ends by printing exactly the answer, which `answer` computes independently."""

    sample: Callable[[random.Random], Fields]
    answer: Callable[[Fields], int]
    programs: tuple[str, ...]
    plans: tuple[str, ...]
    conclusion: str  # the sentence inside <answer>; `{answer}` is the program's output


def polynomial(coefficients: Sequence[int], *, code: bool) -> str:
    """Highest degree first, zero terms dropped: [2, -3, 1] -> '2x^2 - 3x + 1', or '2*x**2 - 3*x + 1' as code."""
    degree = len(coefficients) - 1
    terms = []
    for power, coefficient in zip(range(degree, -1, -1), coefficients):
        if coefficient == 0:
            continue
        variable = "" if power == 0 else "x" if power == 1 else f"x**{power}" if code else f"x^{power}"
        magnitude = abs(coefficient)
        if not variable:
            body = str(magnitude)
        elif magnitude == 1:
            body = variable
        else:
            body = f"{magnitude}*{variable}" if code else f"{magnitude}{variable}"
        sign = "-" if coefficient < 0 else "+"
        terms.append((sign, body))
    first_sign, first_body = terms[0]
    text = ("-" if first_sign == "-" else "") + first_body
    return text + "".join(f" {sign} {body}" for sign, body in terms[1:])


def linear_fields(a: int, b: int, c: int) -> Fields:
    """a*x + b = c, as the problem shows it and as sympy code."""
    lhs = polynomial([a, b], code=False)
    return {"a": a, "b": b, "c": c, "lhs": polynomial([a, b], code=True), "equation": f"{lhs} = {c}"}


def sample_linear(rng: random.Random) -> Fields:
    a, x = rng.randint(2, 40), rng.choice([v for v in range(-60, 61) if v != 0])
    b = rng.choice([v for v in range(-500, 501) if v != 0])
    return linear_fields(a, b, a * x + b)


def sample_quadratic(rng: random.Random) -> Fields:
    """k(x - r)(x - s) = 0 with distinct integer roots r, s, expanded."""
    k = rng.randint(1, 4)
    r, s = rng.sample(range(-25, 26), 2)
    coefficients = [k, -k * (r + s), k * r * s]
    return {"expr": polynomial(coefficients, code=True), "equation": f"{polynomial(coefficients, code=False)} = 0",
            "k": k, "p": coefficients[1], "q": coefficients[2]}


def quadratic_roots(fields: Fields) -> tuple[int, int]:
    """The integer roots of k x^2 + p x + q, from the discriminant (exact: the sampler made them integers)."""
    k, p, q = fields["k"], fields["p"], fields["q"]
    root = math.isqrt(p * p - 4 * k * q)
    return (-p - root) // (2 * k), (-p + root) // (2 * k)


SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def divisor_target(limit: int) -> Callable[[random.Random], Fields]:
    """A sampler of n <= limit built from 3 to 5 distinct small primes, so n has many divisors."""

    def sample(rng: random.Random) -> Fields:
        while True:
            primes = rng.sample(SMALL_PRIMES, rng.randint(3, 5))
            n = math.prod(p ** rng.randint(1, 3) for p in primes)
            if n <= limit:
                return {"n": n}

    return sample


def count_divisors(n: int) -> int:
    count, rest, p = 1, n, 2
    while p * p <= rest:
        exponent = 0
        while rest % p == 0:
            rest, exponent = rest // p, exponent + 1
        count *= exponent + 1
        p += 1
    return count * (2 if rest > 1 else 1)


PRODUCT = Computation(
    sample=lambda rng: {"a": rng.randint(1_000, 99_999), "b": rng.randint(100, 99_999)},
    answer=lambda f: f["a"] * f["b"],
    programs=(
        "print({a} * {b})",
        "a = {a}\nb = {b}\nproduct = a * b\nprint(product)",
        "import math\nprint(math.prod([{a}, {b}]))",
        "result = 1\nfor factor in [{a}, {b}]:\n    result *= factor\nprint(result)",
    ),
    plans=(
        "Multiplying these by hand is error-prone, so I will compute the product with Python.",
        "I will let Python multiply the two numbers exactly.",
        "A one-line program gives the exact product.",
    ),
    conclusion="The product is \\boxed{{{answer}}}.",
)

REMAINDER = Computation(
    sample=lambda rng: {"a": rng.randint(10**6, 10**12), "m": rng.randint(7, 9_999)},
    answer=lambda f: f["a"] % f["m"],
    programs=(
        "print({a} % {m})",
        "number = {a}\nmodulus = {m}\nremainder = number % modulus\nprint(remainder)",
        "quotient, remainder = divmod({a}, {m})\nprint(remainder)",
    ),
    plans=(
        "Long division with a number this large is tedious, so I will take the remainder in Python.",
        "Python's % operator gives the remainder exactly.",
        "I will compute the remainder with a short program.",
    ),
    conclusion="The remainder is \\boxed{{{answer}}}.",
)

POWER_MOD = Computation(
    sample=lambda rng: {"a": rng.randint(2, 999), "b": rng.randint(20, 10**6), "m": rng.randint(10, 10**5)},
    answer=lambda f: pow(f["a"], f["b"], f["m"]),
    programs=(
        "print(pow({a}, {b}, {m}))",
        "base = {a}\nexponent = {b}\nmodulus = {m}\nprint(pow(base, exponent, modulus))",
        "result = 1\nbase = {a} % {m}\nexponent = {b}\nwhile exponent > 0:\n    if exponent % 2 == 1:\n"
        "        result = result * base % {m}\n    base = base * base % {m}\n    exponent //= 2\nprint(result)",
    ),
    plans=(
        "The power is far too large to expand, so I will use modular exponentiation in Python.",
        "Python's three-argument pow computes this remainder directly.",
        "I will reduce modulo {m} at every step with a short program.",
    ),
    conclusion="The remainder is \\boxed{{{answer}}}.",
)


def sample_range(rng: random.Random) -> Fields:
    a = rng.randint(1, 2_000)
    return {"a": a, "b": a + rng.randint(100, 50_000)}


RANGE_SUM = Computation(
    sample=sample_range,
    answer=lambda f: (f["a"] + f["b"]) * (f["b"] - f["a"] + 1) // 2,
    programs=(
        "print(sum(range({a}, {b} + 1)))",
        "total = 0\nfor i in range({a}, {b} + 1):\n    total += i\nprint(total)",
        "first = {a}\nlast = {b}\ncount = last - first + 1\nprint((first + last) * count // 2)",
    ),
    plans=(
        "Adding that many terms by hand is slow, so I will sum the range in Python.",
        "I will let Python add up the integers in the range.",
        "A short program can add the whole range exactly.",
    ),
    conclusion="The sum is \\boxed{{{answer}}}.",
)

SQUARE_SUM = Computation(
    sample=lambda rng: {"n": rng.randint(50, 5_000)},
    answer=lambda f: f["n"] * (f["n"] + 1) * (2 * f["n"] + 1) // 6,
    programs=(
        "print(sum(k * k for k in range(1, {n} + 1)))",
        "total = 0\nfor k in range(1, {n} + 1):\n    total += k ** 2\nprint(total)",
        "from sympy import symbols, summation\nk = symbols('k')\nprint(summation(k**2, (k, 1, {n})))",
    ),
    plans=(
        "I will add the squares with Python rather than by hand.",
        "A loop over 1 to {n} adds the squares exactly.",
        "Summing this many squares by hand invites mistakes, so I will compute it in Python.",
    ),
    conclusion="The sum of the squares is \\boxed{{{answer}}}.",
)


def sample_multiples(rng: random.Random) -> Fields:
    n = rng.randint(500, 100_000)
    return {"k": rng.randint(3, 97), "n": n, "last": n - 1}


MULTIPLE_SUM = Computation(
    sample=sample_multiples,
    answer=lambda f: f["k"] * ((f["n"] - 1) // f["k"]) * ((f["n"] - 1) // f["k"] + 1) // 2,
    programs=(
        "print(sum(range({k}, {n}, {k})))",
        "total = 0\nfor i in range(1, {n}):\n    if i % {k} == 0:\n        total += i\nprint(total)",
        "count = ({n} - 1) // {k}\ntotal = {k} * count * (count + 1) // 2\nprint(total)",
    ),
    plans=(
        "I will add the multiples with Python to avoid an off-by-one mistake at the upper end.",
        "A short program can collect and add the multiples of {k}.",
        "I will let Python sum the multiples exactly.",
    ),
    conclusion="The sum of the multiples is \\boxed{{{answer}}}.",
)

DIVISOR_COUNT = Computation(
    sample=divisor_target(10**8),
    answer=lambda f: count_divisors(f["n"]),
    programs=(
        "from sympy import divisor_count\nprint(divisor_count({n}))",
        "import sympy\nexponents = sympy.factorint({n}).values()\ncount = 1\nfor e in exponents:\n    count *= e + 1\n"
        "print(count)",
        "n = {n}\ncount = 0\nd = 1\nwhile d * d <= n:\n    if n % d == 0:\n        count += 1 if d * d == n else 2\n"
        "    d += 1\nprint(count)",
    ),
    plans=(
        "I will count the divisors with Python instead of listing them by hand.",
        "Factoring {n} and counting divisors is easy to get wrong by hand, so I will use sympy.",
        "A short program can count every divisor exactly.",
    ),
    conclusion="The number of positive divisors is \\boxed{{{answer}}}.",
)

LINEAR = Computation(
    sample=sample_linear,
    answer=lambda f: (f["c"] - f["b"]) // f["a"],
    programs=(
        "from sympy import Eq, symbols, solve\nx = symbols('x')\nprint(solve(Eq({lhs}, {c}), x)[0])",
        "from sympy import Eq, solve, symbols\nx = symbols('x')\nequation = Eq({lhs}, {c})\n"
        "solution = solve(equation, x)\nprint(solution[0])",
        "from sympy import symbols, solve\nx = symbols('x')\nrhs = {c}\nprint(solve({lhs} - rhs, x)[0])",
    ),
    plans=(
        "I will solve the equation with sympy to be sure of the arithmetic.",
        "sympy can solve this linear equation exactly.",
        "I will let sympy isolate x.",
    ),
    conclusion="The solution is x = \\boxed{{{answer}}}.",
)

QUADRATIC_LARGER_ROOT = Computation(
    sample=sample_quadratic,
    answer=lambda f: max(quadratic_roots(f)),
    programs=(
        "from sympy import symbols, solve\nx = symbols('x')\nroots = solve({expr}, x)\nprint(max(roots))",
        "from sympy import Eq, symbols, solve\nx = symbols('x')\nprint(max(solve(Eq({expr}, 0), x)))",
    ),
    plans=(
        "I will find both roots with sympy and take the larger one.",
        "sympy can solve the quadratic exactly; then I take the maximum root.",
    ),
    conclusion="The larger root is \\boxed{{{answer}}}.",
)

QUADRATIC_ROOT_SQUARES = Computation(
    sample=sample_quadratic,
    answer=lambda f: sum(root * root for root in quadratic_roots(f)),
    programs=(
        "from sympy import symbols, solve\nx = symbols('x')\nroots = solve({expr}, x)\nprint(sum(r**2 for r in roots))",
        "from sympy import expand, symbols, solve\nx = symbols('x')\nr, s = solve({expr}, x)\n"
        "print(expand(r**2 + s**2))",
    ),
    plans=(
        "I will solve for the roots with sympy and add their squares.",
        "sympy gives the roots exactly; squaring and adding them is then one line.",
    ),
    conclusion="The sum of the squares of the roots is \\boxed{{{answer}}}.",
)


def sample_training_days(rng: random.Random) -> Fields:
    a = rng.randint(1, 300)
    return {"a": a, "b": a + rng.randint(30, 3_000)}


def sample_pen_bill(rng: random.Random) -> Fields:
    """price * pens + fee = bill, all positive."""
    price, fee, pens = rng.randint(2, 30), rng.randint(1, 50), rng.randint(3, 60)
    return linear_fields(price, fee, price * pens + fee)


# --- families: phrasings, each tied to a computation ----------------------------------------------------


@dataclass(frozen=True)
class Phrasing:
    text: str  # str.format template over the computation's fields
    computation: Computation
    conclusion: str | None = None  # overrides the computation's, where a story needs its own words


@dataclass(frozen=True)
class Family:
    name: str
    phrasings: tuple[Phrasing, ...]

    def phrasing_ids(self, split: str) -> list[str]:
        """Ids of the phrasings a split may use: the last HELDOUT_PHRASINGS_PER_FAMILY are held out."""
        cut = len(self.phrasings) - HELDOUT_PHRASINGS_PER_FAMILY
        indexes = range(cut) if split == "train" else range(cut, len(self.phrasings))
        return [f"{self.name}/{index}" for index in indexes]


FAMILIES: tuple[Family, ...] = (
    Family("product", (
        Phrasing("What is {a} times {b}?", PRODUCT),
        Phrasing("Compute {a} * {b}.", PRODUCT),
        Phrasing("Find the product of {a} and {b}.", PRODUCT),
        Phrasing("Calculate {a} multiplied by {b}.", PRODUCT),
        Phrasing("What do you get when you multiply {a} by {b}?", PRODUCT),
        Phrasing("Evaluate ${a} \\times {b}$.", PRODUCT),
        Phrasing("Multiply {a} by {b}. What is the result?", PRODUCT),
        Phrasing("Determine the exact value of {a} \u00b7 {b}.", PRODUCT),
    )),
    Family("modular", (
        Phrasing("What is the remainder when {a} is divided by {m}?", REMAINDER),
        Phrasing("Compute {a}^{b} mod {m}.", POWER_MOD),
        Phrasing("Find {a} mod {m}.", REMAINDER),
        Phrasing("What is the remainder when {a}^{b} is divided by {m}?", POWER_MOD),
        Phrasing("Compute {a} modulo {m}.", REMAINDER),
        Phrasing("Find the value of {a} raised to the power {b}, modulo {m}.", POWER_MOD),
        Phrasing("What remainder does {a} leave on division by {m}?", REMAINDER),
        Phrasing("Evaluate ${a}^{{{b}}} \\bmod {m}$.", POWER_MOD),
    )),
    Family("range_sum", (
        Phrasing("What is the sum of all integers from {a} to {b}, inclusive?", RANGE_SUM),
        Phrasing("Compute 1^2 + 2^2 + ... + {n}^2.", SQUARE_SUM),
        Phrasing("What is the sum of all positive multiples of {k} less than {n}?", MULTIPLE_SUM),
        Phrasing("Add up every integer from {a} through {b}. What is the total?", RANGE_SUM),
        Phrasing("Find the sum of the squares of the first {n} positive integers.", SQUARE_SUM),
        Phrasing("Find the sum of the positive integers below {n} that are divisible by {k}.", MULTIPLE_SUM),
        Phrasing("Evaluate $\\sum_{{i={a}}}^{{{b}}} i$.", RANGE_SUM),
        Phrasing("What is $\\sum_{{k=1}}^{{{n}}} k^2$?", SQUARE_SUM),
    )),
    Family("divisors", (
        Phrasing("How many positive divisors does {n} have?", DIVISOR_COUNT),
        Phrasing("Find the number of positive divisors of {n}.", DIVISOR_COUNT),
        Phrasing("How many positive integers divide {n} evenly?", DIVISOR_COUNT),
        Phrasing("What is the number of positive factors of {n}?", DIVISOR_COUNT),
        Phrasing("Determine how many positive integers are divisors of {n}.", DIVISOR_COUNT),
        Phrasing("How many factors does {n} have, counting 1 and {n} itself?", DIVISOR_COUNT),
        Phrasing("Compute $d({n})$, the number of positive divisors of {n}.", DIVISOR_COUNT),
        Phrasing("The integer {n} has how many positive divisors?", DIVISOR_COUNT),
    )),
    Family("equation", (
        Phrasing("Solve for x: {equation}.", LINEAR),
        Phrasing("Find the larger root of {equation}.", QUADRATIC_LARGER_ROOT),
        Phrasing("Find the sum of the squares of the roots of {equation}.", QUADRATIC_ROOT_SQUARES),
        Phrasing("What value of x satisfies {equation}?", LINEAR),
        Phrasing("The equation {equation} has two integer roots. What is the larger one?", QUADRATIC_LARGER_ROOT),
        Phrasing("If r and s are the roots of {equation}, what is r^2 + s^2?", QUADRATIC_ROOT_SQUARES),
        Phrasing("Find the integer x such that {equation}.", LINEAR),
        Phrasing("What is the greatest solution of {equation}?", QUADRATIC_LARGER_ROOT),
    )),
    Family("word", (
        Phrasing("A warehouse has {a:,} boxes with {b} items each. How many items are there?",
                 replace(PRODUCT, sample=lambda rng: {"a": rng.randint(1_000, 9_999), "b": rng.randint(100, 999)}),
                 "There are \\boxed{{{answer}}} items."),
        Phrasing("A farm collects {a:,} eggs and packs them into cartons of {m}. How many eggs are left over?",
                 replace(REMAINDER, sample=lambda rng: {"a": rng.randint(10_000, 10**7),
                                                        "m": rng.choice([6, 10, 12, 18, 24, 30])}),
                 "\\boxed{{{answer}}} eggs are left over."),
        Phrasing("A 24-hour clock shows 0:00. What hour does it show after {a:,} hours (a number from 0 to 23)?",
                 replace(REMAINDER, sample=lambda rng: {"a": rng.randint(100, 10**6), "m": 24}),
                 "The clock shows hour \\boxed{{{answer}}}."),
        Phrasing("On day d of her training a runner runs d laps. How many laps does she run in total from day {a} "
                 "to day {b}?",
                 replace(RANGE_SUM, sample=sample_training_days),
                 "She runs \\boxed{{{answer}}} laps."),
        Phrasing("A teacher arranges {n:,} chairs in equal rows. How many ways can she do it, counting every possible "
                 "number of rows, including 1 and {n:,}?",
                 replace(DIVISOR_COUNT, sample=divisor_target(10**5)),
                 "There are \\boxed{{{answer}}} ways."),
        Phrasing("A pyramid of cubes has a 1 x 1 layer on top, a 2 x 2 layer below it, and so on down to a {n} x {n} "
                 "layer at the bottom. How many cubes does it have?",
                 replace(SQUARE_SUM, sample=lambda rng: {"n": rng.randint(20, 500)}),
                 "The pyramid has \\boxed{{{answer}}} cubes."),
        Phrasing("Raffle tickets are numbered from 1 to {last:,}. Every ticket whose number is a multiple of {k} wins "
                 "that many dollars. How many dollars are paid out in total?",
                 MULTIPLE_SUM, "\\boxed{{{answer}}} dollars are paid out."),
        Phrasing("A shop charges a fixed fee of ${b} plus ${a} per pen. A customer's bill is ${c}. How many pens did "
                 "the customer buy?",
                 replace(LINEAR, sample=sample_pen_bill),
                 "The customer bought \\boxed{{{answer}}} pens."),
    )),
)
FAMILIES_BY_NAME = {family.name: family for family in FAMILIES}


def heldout_phrasing_ids() -> list[str]:
    return [pid for family in FAMILIES for pid in family.phrasing_ids("heldout")]


def phrasing_by_id(phrasing_id: str) -> Phrasing:
    family, index = phrasing_id.split("/")
    return FAMILIES_BY_NAME[family].phrasings[int(index)]


# --- bugs: realistic first attempts that fail, and what the assistant says when fixing them --------------


@dataclass(frozen=True)
class Bug:
    code: str  # the failing program
    fix: str  # the assistant's sentence after seeing the failure


def misspelled_name(code: str, rng: random.Random) -> Bug | None:
    """A NameError: a variable of the final print, misspelled by dropping one inner letter."""
    *body, last = code.split("\n")
    assigned = {name for line in body if (target := re.match(r"([a-z_][\w, ]*) = ", line))
                for name in target.group(1).split(", ")}
    used = [name for name in re.findall(r"[A-Za-z_]\w*", last) if name in assigned and len(name) >= 4]
    if not used:
        return None
    name = rng.choice(sorted(set(used)))
    cut = rng.randint(1, len(name) - 2)
    typo = name[:cut] + name[cut + 1 :]
    buggy_last = re.sub(rf"\b{name}\b", typo, last)
    return Bug("\n".join([*body, buggy_last]),
               f"The program failed with a NameError: I wrote `{typo}` instead of `{name}`. "
               "I will fix the name and run it again.")


def missing_import(code: str, rng: random.Random) -> Bug | None:
    """A NameError: the program's import line left out."""
    first, _, rest = code.partition("\n")
    if not first.startswith(("import ", "from ")):
        return None
    return Bug(rest, f"The program failed because I forgot `{first}`. I will add the import and run it again.")


def string_concatenation(code: str, rng: random.Random) -> Bug | None:
    """A TypeError: the final print glues a label onto the number with +."""
    *body, last = code.split("\n")
    match = re.fullmatch(r"print\((.*)\)", last)
    if not match:
        return None
    label = rng.choice(["Answer: ", "Result: ", "The answer is "])
    return Bug("\n".join([*body, f'print("{label}" + {match.group(1)})']),
               "Adding a string to a number raised a TypeError. I will print the number on its own.")


BUG_MAKERS = (misspelled_name, missing_import, string_concatenation)


# --- planning examples (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedCall:
    reason: str  # the assistant's sentence before the call
    code: str
    fails: bool  # the sandbox must report a failure (a planted bug); else it must print the answer


@dataclass(frozen=True)
class Example:
    id: str
    family: str
    phrasing: str  # "family/index"
    split: str  # "train" | "heldout"
    problem: str
    answer: str  # an integer, as the program prints it
    messages: list[dict] | None = None  # filled by build_conversations
    # What build_conversations will do, drawn with the problem so that step needs no randomness:
    calls: tuple[PlannedCall, ...] = ()
    reading: str = ""  # the final turn's sentence; `{output}` is the program's stdout
    conclusion: str = ""  # inside <answer>; `{answer}` is the program's stdout

    def row(self) -> dict:
        """The JSON row of sft_train.jsonl and heldout.jsonl."""
        return {"id": self.id, "family": self.family, "phrasing": self.phrasing, "split": self.split,
                "problem": self.problem, "answer": self.answer, "messages": self.messages}

    def rl_row(self) -> dict:
        """The JSON row of rl_train.jsonl: a problem and its answer, no conversation."""
        return {"problem": self.problem, "answer": self.answer, "family": self.family, "phrasing": self.phrasing,
                "id": self.id}


READINGS = (
    "The program printed {output}.",
    "Python returned {output}.",
    "The output is {output}.",
    "The code ran and printed {output}.",
)


def plan_example(rng: random.Random, example_id: str, phrasing_id: str, split: str) -> Example:
    """Draw the numbers, the program, the sentences and (in training, at BUG_RATE) a failing first attempt."""
    phrasing = phrasing_by_id(phrasing_id)
    computation = phrasing.computation
    fields = computation.sample(rng)
    code = rng.choice(computation.programs).format(**fields)
    plan = rng.choice(computation.plans).format(**fields)
    calls = (PlannedCall(plan, code, fails=False),)
    if split == "train" and rng.random() < BUG_RATE:
        bugs = [bug for maker in BUG_MAKERS if (bug := maker(code, rng)) is not None]
        bug = rng.choice(bugs)  # string_concatenation applies to every program
        calls = (PlannedCall(plan, bug.code, fails=True), PlannedCall(bug.fix, code, fails=False))
    return Example(
        id=example_id,
        family=phrasing_id.split("/")[0],
        phrasing=phrasing_id,
        split=split,
        problem=phrasing.text.format(**fields),
        answer=str(computation.answer(fields)),
        calls=calls,
        reading=rng.choice(READINGS),
        conclusion=phrasing.conclusion or computation.conclusion,
    )


def generate_problems(seed: int, count: int, split: str, *, stream: str = "sft",
                      avoid: Collection[str] = ()) -> list[Example]:
    """`count` problems of `split`'s phrasings, families in turn, with their planned programs; no sandbox.

    stream: names an independent random stream ("sft" for conversations, "rl" for RL problems), so one seed
    gives different numbers for each. avoid: problem texts not to produce (e.g. another file's), and no
    problem repeats within the result.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    rng = random.Random(f"rstar.rl.sft_data/{stream}/{split}/{seed}")
    seen = set(avoid)
    examples = []
    while len(examples) < count:
        family = FAMILIES[len(examples) % len(FAMILIES)]
        example_id = f"{stream}-{split}-{len(examples):05d}"
        example = plan_example(rng, example_id, rng.choice(family.phrasing_ids(split)), split)
        if example.problem not in seen:
            seen.add(example.problem)
            examples.append(example)
    return examples


# --- running the programs (the sandbox edge) -------------------------------------------------------------


def tool_call_message(reason: str, code: str, call_id: str) -> dict:
    return {
        "role": "assistant",
        "content": f"<reason>{reason}",
        "tool_calls": [{"id": call_id, "type": "function",
                        "function": {"name": PYTHON_TOOL, "arguments": {"code": code, "input": ""}}}],
    }


async def build_conversation(example: Example, executor: CodeExecutor) -> Example:
    """Run the planned programs in the sandbox and write the conversation around their real results."""
    messages: list[dict] = [{"role": "user", "content": example.problem}]
    output = ""
    for index, call in enumerate(example.calls):
        result = await executor.execute(PYTHON_TOOL, call.code, "", ())
        output = result.stdout.strip()
        if call.fails == result.success or (not call.fails and output != example.answer):
            raise RuntimeError(
                f"{example.id} ({example.phrasing}): expected {'a failure' if call.fails else example.answer!r}, "
                f"the sandbox gave {render_exec_result(result)!r} for:\n{call.code}")
        call_id = f"call_{index}"
        messages.append(tool_call_message(call.reason, call.code, call_id))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": render_exec_result(result)})
    messages.append({
        "role": "assistant",
        "content": f"<reason>{example.reading.format(output=output)}</reason>\n"
                   f"<answer>\n{example.conclusion.format(answer=output)}\n</answer>",
    })
    return replace(example, messages=messages)


async def build_conversations(examples: Sequence[Example], executor: CodeExecutor,
                              progress: Callable[[int, int], None] = lambda done, total: None) -> list[Example]:
    """Every example with its conversation, in order. A program whose output is not the answer raises."""
    slots = asyncio.Semaphore(CONCURRENT_CONVERSATIONS)
    done = 0

    async def build(example: Example) -> Example:
        nonlocal done
        async with slots:
            built = await build_conversation(example, executor)
        done += 1
        progress(done, len(examples))
        return built

    return list(await asyncio.gather(*(build(example) for example in examples)))


# --- files (the disk edge) -------------------------------------------------------------------------------

EXECUTION_TIME = re.compile(r"execution time: \d+\.\d\ds")


def content_sha256(text: str) -> str:
    """sha256 of a file's text with tool timings normalized, the only part that differs between runs."""
    return hashlib.sha256(EXECUTION_TIME.sub("execution time: X.XXs", text).encode()).hexdigest()


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def jsonl(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


async def make_sft_data(out_dir: Path, seed: int = 0, n_train: int = 1000, n_heldout: int = 200, n_rl: int = 1000,
                        sandbox_settings: SandboxSettings | None = None,
                        progress: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """Write sft_train.jsonl, heldout.jsonl, rl_train.jsonl and manifest.json into out_dir; return the manifest.

    The programs run in an in-process sandbox pool started here. RL problems use training phrasings with
    numbers from their own stream, and never repeat an SFT problem.
    """
    train = generate_problems(seed, n_train, "train")
    heldout = generate_problems(seed, n_heldout, "heldout")
    rl = generate_problems(seed, n_rl, "train", stream="rl", avoid={example.problem for example in train})
    async with LocalClient(sandbox_settings or SandboxSettings()) as client:
        built = await build_conversations([*train, *heldout], SandboxExecutor(client), progress)
    train, heldout = built[: len(train)], built[len(train) :]

    files = {
        "sft_train.jsonl": (train, jsonl(example.row() for example in train)),
        "heldout.jsonl": (heldout, jsonl(example.row() for example in heldout)),
        "rl_train.jsonl": (rl, jsonl(example.rl_row() for example in rl)),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "seed": seed,
        "heldout_phrasings": heldout_phrasing_ids(),
        "error_recovery_conversations": sum(len(example.calls) > 1 for example in train),
        "sha256_note": "of each file's text with every 'execution time: X.XXs' normalized",
        "files": {},
    }
    for name, (examples, text) in files.items():
        write_atomically(out_dir / name, text)
        manifest["files"][name] = {
            "rows": len(examples),
            "families": dict(sorted(Counter(example.family for example in examples).items())),
            "sha256": content_sha256(text),
        }
    write_atomically(out_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return manifest
