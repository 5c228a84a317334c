"""The problem catalogue of the tool-use SFT data: families of phrasings, each tied to a `Computation`
(number sampler, exact answer, programs in a few styles, plan sentences). Pure data and pure functions;
`sft_data.py` builds conversations from it.

A phrasing's id is "family/index". The last `HELDOUT_PHRASINGS_PER_FAMILY` phrasings of every family are
held out: they appear only in the held-out split, never in SFT or RL training problems.

A small model learns the notation it is shown, so the training phrasings show every computation of a
family several ways: words, symbols (*, ×, ·, ^, **, %, ≡), LaTeX ($...$, \\times, \\cdot, ^{...}, \\bmod,
\\pmod{m}, \\sum_{i=a}^{b}), questions and imperatives, numbers with and without thousands separators;
equations with x on either side, written 8x or 8*x, 2x^2, 2x² or 2*x**2; and a few word-problem stories
for every computation. The held-out phrasings keep their texts, computations and samplers, so the same
seed gives the same held-out problems as before training phrasings were added.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

Fields = dict[str, int | str]

HELDOUT_PHRASINGS_PER_FAMILY = 2  # the last phrasings of each family, reserved for the held-out split


# --- computations: how to draw numbers, the exact answer, programs that compute it ---------------------


@dataclass(frozen=True)
class Computation:
    """One kind of calculation. Programs and sentences are str.format templates over the sampled fields;
    every program ends by printing exactly the answer, which `answer` computes independently."""

    name: str  # what is computed ("power_mod"); the same for every notation and story of it
    sample: Callable[[random.Random], Fields]
    answer: Callable[[Fields], int]
    programs: tuple[str, ...]
    plans: tuple[str, ...]
    conclusion: str  # the sentence inside <answer>; `{answer}` is the program's output


SUPERSCRIPT_DIGITS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def polynomial(coefficients: Sequence[int], style: str = "text") -> str:
    """Highest degree first, zero terms dropped, all zero as '0'. [2, -3, 1] in each style:
    'text' 2x^2 - 3x + 1, 'unicode' 2x² - 3x + 1, 'code' 2*x**2 - 3*x + 1."""
    degree = len(coefficients) - 1
    terms = []
    for power, coefficient in zip(range(degree, -1, -1), coefficients):
        if coefficient == 0:
            continue
        if power <= 1:
            variable = "x" * power
        else:
            variable = {"text": f"x^{power}", "unicode": "x" + str(power).translate(SUPERSCRIPT_DIGITS),
                        "code": f"x**{power}"}[style]
        magnitude = abs(coefficient)
        if not variable:
            body = str(magnitude)
        elif magnitude == 1:
            body = variable
        else:
            body = f"{magnitude}*{variable}" if style == "code" else f"{magnitude}{variable}"
        terms.append(("-" if coefficient < 0 else "+", body))
    if not terms:
        return "0"
    first_sign, first_body = terms[0]
    text = ("-" if first_sign == "-" else "") + first_body
    return text + "".join(f" {sign} {body}" for sign, body in terms[1:])


def equation_fields(left: Sequence[int], right: Sequence[int]) -> Fields:
    """The equation left = right (coefficients in x, highest degree first) as a problem may write it:
    equation '2x^2 - 50x = -132', equation_sup '2x² - 50x = -132', equation_code '2*x**2 - 50*x = -132';
    and as programs use it: the sides lhs and rhs, and expr = lhs - (rhs), everything on one side."""
    lhs, rhs = polynomial(left, "code"), polynomial(right, "code")
    return {
        "equation": f"{polynomial(left)} = {polynomial(right)}",
        "equation_sup": f"{polynomial(left, 'unicode')} = {polynomial(right, 'unicode')}",
        "equation_code": f"{lhs} = {rhs}",
        "lhs": lhs,
        "rhs": rhs,
        "expr": lhs if rhs == "0" else f"{lhs} - ({rhs})",
    }


def linear_fields(a: int, b: int, c: int) -> Fields:
    """a*x + b = c, with its solution."""
    return {"a": a, "b": b, "c": c, "solution": (c - b) // a, **equation_fields([a, b], [c])}


def sample_linear(rng: random.Random) -> Fields:
    """a*x + b = c with a > 1: the form held-out problems show."""
    a, x = rng.randint(2, 40), rng.choice([v for v in range(-60, 61) if v != 0])
    b = rng.choice([v for v in range(-500, 501) if v != 0])
    return linear_fields(a, b, a * x + b)


def sample_linear_any_form(rng: random.Random) -> Fields:
    """An integer solution x, with x on the left (8x - 406 = -462), on the right (-462 = 8x - 406) or on both
    sides (8x - 406 = 3x - 441); coefficients of either sign, the constant term sometimes absent."""
    x = rng.choice([v for v in range(-60, 61) if v != 0])
    a = rng.choice([v for v in range(-40, 41) if v != 0])
    b = rng.randint(-500, 500)
    form = rng.choice(("left", "right", "both"))
    d = rng.choice([v for v in range(-20, 21) if v not in (0, a)]) if form == "both" else 0
    sides = [a, b], [d, (a - d) * x + b]
    left, right = reversed(sides) if form == "right" else sides
    return {"solution": x, **equation_fields(left, right)}


# Quadratic terms written on the right-hand side (0: x², 1: x, 2: the constant): "= 0" a third of the time.
MOVED_TERMS = ((), (), (1,), (2,), (1, 2), (0,))


def quadratic_sampler(leading: Sequence[int], rearrange: bool = False) -> Callable[[random.Random], Fields]:
    """k(x - r)(x - s) = 0 expanded, k drawn from `leading`, distinct integer roots r and s. rearrange: some
    terms moved to the right-hand side with their signs flipped (2x^2 + 132 = 50x)."""

    def sample(rng: random.Random) -> Fields:
        k = rng.choice(leading)
        r, s = rng.sample(range(-25, 26), 2)
        left, right = [k, -k * (r + s), k * r * s], [0, 0, 0]
        for term in rng.choice(MOVED_TERMS) if rearrange else ():
            left[term], right[term] = 0, -left[term]
        return {"smaller_root": min(r, s), "larger_root": max(r, s), **equation_fields(left, right)}

    return sample


sample_quadratic = quadratic_sampler(leading=(1, 2, 3, 4))  # "... = 0": the form held-out problems show
sample_quadratic_any_form = quadratic_sampler(leading=(-5, -4, -3, -2, -1, 1, 2, 3, 4, 5), rearrange=True)

SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def factorize(n: int) -> dict[int, int]:
    """{prime: exponent}, primes ascending."""
    factors, p = {}, 2
    while p * p <= n:
        while n % p == 0:
            factors[p], n = factors.get(p, 0) + 1, n // p
        p += 1
    if n > 1:
        factors[n] = 1
    return factors


def factored_fields(n: int) -> Fields:
    """n's prime factorization as a problem may write it: factored '2^3 · 3^2 · 5', factored_times
    '2^3 × 3^2 × 5', factored_latex '2^{3} \\cdot 3^{2} \\cdot 5'; and as code: factored_code '2**3 * 3**2 * 5',
    exponents '[3, 2, 1]'."""
    factors = factorize(n).items()

    def join(separator: str, power: str) -> str:
        return separator.join(str(p) if e == 1 else power.format(p=p, e=e) for p, e in factors)

    return {
        "factored": join(" · ", "{p}^{e}"),
        "factored_times": join(" × ", "{p}^{e}"),
        "factored_latex": join(" \\cdot ", "{p}^{{{e}}}"),
        "factored_code": join(" * ", "{p}**{e}"),
        "exponents": str([e for _, e in factors]),
    }


def divisor_target(limit: int) -> Callable[[random.Random], Fields]:
    """A sampler of n <= limit built from 3 to 5 distinct small primes, so n has many divisors."""

    def sample(rng: random.Random) -> Fields:
        while True:
            primes = rng.sample(SMALL_PRIMES, rng.randint(3, 5))
            n = math.prod(p ** rng.randint(1, 3) for p in primes)
            if n <= limit:
                return {"n": n, **factored_fields(n)}

    return sample


def count_divisors(n: int) -> int:
    return math.prod(e + 1 for e in factorize(n).values())


def sum_divisors(n: int) -> int:
    return math.prod((p ** (e + 1) - 1) // (p - 1) for p, e in factorize(n).items())


PRODUCT = Computation(
    name="product",
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
    name="remainder",
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
    name="power_mod",
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
    return {"a": a, "a1": a + 1, "a2": a + 2, "b": a + rng.randint(100, 50_000)}


RANGE_SUM = Computation(
    name="range_sum",
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
    name="square_sum",
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
    name="multiple_sum",
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


def sample_series(rng: random.Random) -> Fields:
    k, count = rng.randint(3, 97), rng.randint(10, 3_000)
    return {"k": k, "k2": 2 * k, "k3": 3 * k, "count": count, "top": k * count}


ARITHMETIC_SERIES = Computation(
    name="arithmetic_series",
    sample=sample_series,
    answer=lambda f: f["k"] * f["count"] * (f["count"] + 1) // 2,
    programs=(
        "print(sum(range({k}, {top} + 1, {k})))",
        "total = 0\nfor j in range(1, {count} + 1):\n    total += {k} * j\nprint(total)",
        "from sympy import symbols, summation\nj = symbols('j')\nprint(summation({k} * j, (j, 1, {count})))",
    ),
    plans=(
        "The series has {count} terms, so I will add them with Python.",
        "I will let Python add the terms of this arithmetic series exactly.",
        "A short program sums the series without slips.",
    ),
    conclusion="The sum is \\boxed{{{answer}}}.",
)

DIVISOR_COUNT = Computation(
    name="divisor_count",
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

# The same count for a number given by its prime factorization: the programs start from that expression.
DIVISOR_COUNT_FACTORED = replace(DIVISOR_COUNT, programs=(
    "from sympy import divisor_count\nprint(divisor_count({factored_code}))",
    "exponents = {exponents}\ncount = 1\nfor e in exponents:\n    count *= e + 1\nprint(count)",
    "import sympy\nn = {factored_code}\nprint(len(sympy.divisors(n)))",
))

DIVISOR_SUM = Computation(
    name="divisor_sum",
    sample=divisor_target(10**7),
    answer=lambda f: sum_divisors(f["n"]),
    programs=(
        "from sympy import divisor_sigma\nprint(divisor_sigma({n}))",
        "import sympy\nprint(sum(sympy.divisors({n})))",
        "n = {n}\ntotal = 0\nd = 1\nwhile d * d <= n:\n    if n % d == 0:\n"
        "        total += d if d * d == n else d + n // d\n    d += 1\nprint(total)",
    ),
    plans=(
        "I will add the divisors with Python instead of listing them by hand.",
        "sympy can list the divisors of {n}; I will add them up.",
        "A short program finds and adds every divisor exactly.",
    ),
    conclusion="The sum of the positive divisors is \\boxed{{{answer}}}.",
)

LINEAR = Computation(
    name="linear",
    sample=sample_linear_any_form,
    answer=lambda f: f["solution"],
    programs=(
        "from sympy import Eq, symbols, solve\nx = symbols('x')\nprint(solve(Eq({lhs}, {rhs}), x)[0])",
        "from sympy import Eq, solve, symbols\nx = symbols('x')\nequation = Eq({lhs}, {rhs})\n"
        "solution = solve(equation, x)\nprint(solution[0])",
        "from sympy import symbols, solve\nx = symbols('x')\nprint(solve({expr}, x)[0])",
    ),
    plans=(
        "I will solve the equation with sympy to be sure of the arithmetic.",
        "sympy can solve this linear equation exactly.",
        "I will let sympy isolate x.",
    ),
    conclusion="The solution is x = \\boxed{{{answer}}}.",
)


def quadratic_question(name: str, result: str, answer: Callable[[int, int], int], plans: tuple[str, str],
                       conclusion: str) -> Computation:
    """A question about the two integer roots of a quadratic equation. result: the printed Python expression
    over the list `roots`; answer: the same from (smaller root, larger root)."""
    return Computation(
        name=name,
        sample=sample_quadratic_any_form,
        answer=lambda f: answer(f["smaller_root"], f["larger_root"]),
        programs=(
            "from sympy import symbols, solve\nx = symbols('x')\nroots = solve({expr}, x)\nprint(" + result + ")",
            "from sympy import Eq, symbols, solve\nx = symbols('x')\nroots = solve(Eq({lhs}, {rhs}), x)\n"
            "print(" + result + ")",
        ),
        plans=plans,
        conclusion=conclusion,
    )


LARGER_ROOT = quadratic_question(
    "larger_root", "max(roots)", lambda smaller, larger: larger,
    ("I will find both roots with sympy and take the larger one.",
     "sympy can solve the quadratic exactly; then I take the maximum root."),
    "The larger root is \\boxed{{{answer}}}.")
SMALLER_ROOT = quadratic_question(
    "smaller_root", "min(roots)", lambda smaller, larger: smaller,
    ("I will find both roots with sympy and take the smaller one.",
     "sympy can solve the quadratic exactly; then I take the minimum root."),
    "The smaller root is \\boxed{{{answer}}}.")
ROOT_SQUARES = quadratic_question(
    "root_squares", "sum(root**2 for root in roots)", lambda smaller, larger: smaller**2 + larger**2,
    ("I will solve for the roots with sympy and add their squares.",
     "sympy gives the roots exactly; squaring and adding them is then one line."),
    "The sum of the squares of the roots is \\boxed{{{answer}}}.")
ROOT_DIFFERENCE = quadratic_question(
    "root_difference", "max(roots) - min(roots)", lambda smaller, larger: larger - smaller,
    ("I will solve for both roots with sympy and subtract the smaller from the larger.",
     "sympy gives the roots exactly; their difference is then one line."),
    "The positive difference between the roots is \\boxed{{{answer}}}.")


def sample_rectangle(rng: random.Random) -> Fields:
    """x(x + extra) = area with a positive integer x (a width; the smaller of two numbers)."""
    width, extra = rng.randint(2, 80), rng.randint(1, 40)
    return {"width": width, "extra": extra, "area": width * (width + extra)}


POSITIVE_ROOT = Computation(
    name="positive_root",
    sample=sample_rectangle,
    answer=lambda f: f["width"],
    programs=(
        "from sympy import Eq, symbols, solve\nx = symbols('x')\nroots = solve(Eq(x * (x + {extra}), {area}), x)\n"
        "print(max(roots))",
        "from sympy import symbols, solve\nx = symbols('x', positive=True)\n"
        "print(solve(x**2 + {extra}*x - {area}, x)[0])",
        "import math\ndiscriminant = {extra}**2 + 4 * {area}\nprint((-{extra} + math.isqrt(discriminant)) // 2)",
    ),
    plans=(
        "This is a quadratic equation; I will solve it with sympy and keep the positive root.",
        "I will set up x(x + {extra}) = {area} and solve it in Python.",
        "The quadratic formula gives the positive root; I will compute it exactly in Python.",
    ),
    conclusion="The answer is \\boxed{{{answer}}}.",
)


# --- samplers of word problems: numbers a story can hold -------------------------------------------------


def sample_short_range(rng: random.Random) -> Fields:
    a = rng.randint(1, 300)
    return {"a": a, "b": a + rng.randint(30, 3_000)}


def sample_rate_and_start(rng: random.Random) -> Fields:
    """rate * count + start = total, all positive: a bill with a fee, a tank filling, savings growing."""
    price, fee, pens = rng.randint(2, 30), rng.randint(1, 50), rng.randint(3, 60)
    return linear_fields(price, fee, price * pens + fee)


def sample_countdown(rng: random.Random) -> Fields:
    """start - rate * steps = rest, all positive: a depth shrinking, a stock running down."""
    rate, steps, rest = rng.randint(2, 40), rng.randint(2, 60), rng.randint(1, 500)
    start = rest + rate * steps
    return {"a": rate, "b": start, "c": rest, "solution": steps, **equation_fields([-rate, start], [rest])}


def sample_times_minus(rng: random.Random) -> Fields:
    """a * x - b = c with a positive x (a number thought of)."""
    a, b, x = rng.randint(2, 30), rng.randint(1, 200), rng.randint(2, 200)
    return {**linear_fields(a, -b, a * x - b), "b": b}


def word_sampler(**ranges: tuple[int, int]) -> Callable[[random.Random], Fields]:
    """Each field drawn uniformly from its (low, high) range, in the order given."""
    return lambda rng: {name: rng.randint(low, high) for name, (low, high) in ranges.items()}


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


# Each family lists its training phrasings, then its held-out ones. The held-out phrasings keep the texts,
# computations and samplers they were first measured with (and their computations the numbers of programs
# and plans), so a seed's held-out problems stay the same while training phrasings come and go.
FAMILIES: tuple[Family, ...] = (
    Family("product", (
        Phrasing("What is {a} times {b}?", PRODUCT),
        Phrasing("Compute {a} * {b}.", PRODUCT),
        Phrasing("Find the product of {a} and {b}.", PRODUCT),
        Phrasing("Calculate {a} multiplied by {b}.", PRODUCT),
        Phrasing("What do you get when you multiply {a} by {b}?", PRODUCT),
        Phrasing("Evaluate ${a} \\times {b}$.", PRODUCT),
        Phrasing("What is {a:,} × {b:,}?", PRODUCT),
        Phrasing("Compute ${a} \\cdot {b}$.", PRODUCT),
        Phrasing("Evaluate {a}*{b}.", PRODUCT),
        Phrasing("Find {a:,} times {b:,}.", PRODUCT),
        Phrasing("What is the value of {a} · {b}?", PRODUCT),
        Phrasing("If p = {a} and q = {b}, what is pq?", PRODUCT),
        Phrasing("Determine {a} × {b}.", PRODUCT),
        Phrasing("How much is {a:,} multiplied by {b:,}?", PRODUCT),
        Phrasing("{a} * {b} = ?", PRODUCT),
        Phrasing("Calculate $({a})({b})$.", PRODUCT),
        # held out
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
        Phrasing("Compute ${a} \\bmod {m}$.", REMAINDER),
        Phrasing("What is ${a}^{{{b}}} \\pmod{{{m}}}$?", POWER_MOD),
        Phrasing("What is {a} % {m}?", REMAINDER),
        Phrasing("Compute {a}**{b} % {m}.", POWER_MOD),
        Phrasing("Find the remainder of {a:,} divided by {m:,}.", REMAINDER),
        Phrasing("Determine the remainder when ${a}^{{{b}}}$ is divided by ${m}$.", POWER_MOD),
        Phrasing("Find the integer r with 0 ≤ r < {m} such that {a} ≡ r (mod {m}).", REMAINDER),
        Phrasing("Find $r$ with $0 \\le r < {m}$ such that ${a}^{{{b}}} \\equiv r \\pmod{{{m}}}$.", POWER_MOD),
        Phrasing("Reduce {a:,} modulo {m}.", REMAINDER),
        Phrasing("Evaluate {a} to the power of {b:,}, modulo {m:,}.", POWER_MOD),
        Phrasing("What is {a}^{b} (mod {m})?", POWER_MOD),
        # held out
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
        Phrasing("Compute {a} + {a1} + {a2} + ... + {b}.", RANGE_SUM),
        Phrasing("What is 1² + 2² + 3² + ⋯ + {n}²?", SQUARE_SUM),
        Phrasing("Compute {k} + {k2} + {k3} + ... + {top}.", ARITHMETIC_SERIES),
        Phrasing("Find $\\sum_{{j={a}}}^{{{b}}} j$.", RANGE_SUM),
        Phrasing("Evaluate 1**2 + 2**2 + ... + {n}**2.", SQUARE_SUM),
        Phrasing("Add all multiples of {k} from 1 to {last:,}. What is the total?", MULTIPLE_SUM),
        Phrasing("Evaluate $\\sum_{{j=1}}^{{{count}}} {k}j$.", ARITHMETIC_SERIES),
        Phrasing("What is the sum of the whole numbers from {a:,} up to {b:,}?", RANGE_SUM),
        Phrasing("Compute $\\sum_{{j=1}}^{{{n}}} j^{{2}}$.", SQUARE_SUM),
        Phrasing("Evaluate $\\sum_{{1 \\le j < {n},\\ {k} \\mid j}} j$.", MULTIPLE_SUM),
        Phrasing("What is {k}×1 + {k}×2 + ⋯ + {k}×{count}?", ARITHMETIC_SERIES),
        Phrasing("Determine ${a} + {a1} + \\cdots + {b}$.", RANGE_SUM),
        Phrasing("Determine $1^2 + 2^2 + \\cdots + {n:,}^2$.", SQUARE_SUM),
        # held out
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
        Phrasing("How many positive divisors does $N = {factored_latex}$ have?", DIVISOR_COUNT_FACTORED),
        Phrasing("What is the sum of all positive divisors of {n}?", DIVISOR_SUM),
        Phrasing("How many positive divisors does {n:,} have?", DIVISOR_COUNT),
        Phrasing("Find the number of positive divisors of {factored}.", DIVISOR_COUNT_FACTORED),
        Phrasing("Evaluate $\\tau({n})$, where $\\tau(n)$ is the number of positive divisors of $n$.", DIVISOR_COUNT),
        Phrasing("Evaluate $\\sigma({n})$, where $\\sigma(n)$ is the sum of the positive divisors of $n$.",
                 DIVISOR_SUM),
        Phrasing("How many positive integers divide {factored_code}?", DIVISOR_COUNT_FACTORED),
        Phrasing("Count the positive divisors of {n}.", DIVISOR_COUNT),
        Phrasing("Let N = {factored_times}. How many positive factors does N have?", DIVISOR_COUNT_FACTORED),
        Phrasing("Add up all the positive divisors of {n:,}.", DIVISOR_SUM),
        # held out
        Phrasing("Compute $d({n})$, the number of positive divisors of {n}.", DIVISOR_COUNT),
        Phrasing("The integer {n} has how many positive divisors?", DIVISOR_COUNT),
    )),
    Family("equation", (
        Phrasing("Solve for x: {equation}.", LINEAR),
        Phrasing("Find the larger root of {equation}.", LARGER_ROOT),
        Phrasing("Find the sum of the squares of the roots of {equation}.", ROOT_SQUARES),
        Phrasing("What value of x satisfies {equation}?", LINEAR),
        Phrasing("The equation {equation} has two integer roots. What is the larger one?", LARGER_ROOT),
        Phrasing("If r and s are the roots of {equation}, what is r^2 + s^2?", ROOT_SQUARES),
        Phrasing("Solve {equation_code} for x.", LINEAR),
        Phrasing("Find the smaller root of {equation_sup}.", SMALLER_ROOT),
        Phrasing("Find x if ${equation}$.", LINEAR),
        Phrasing("Solve {equation_code} and give the larger solution.", LARGER_ROOT),
        Phrasing("Determine x given that {equation}.", LINEAR),
        Phrasing("The roots of {equation_sup} are integers. What is the positive difference between them?",
                 ROOT_DIFFERENCE),
        Phrasing("Compute the solution of the equation {equation_code}.", LINEAR),
        Phrasing("What is the bigger of the two roots of ${equation}$?", LARGER_ROOT),
        Phrasing("For which x does {equation} hold?", LINEAR),
        Phrasing("Let $x_1$ and $x_2$ be the roots of ${equation}$. Compute $x_1^2 + x_2^2$.", ROOT_SQUARES),
        Phrasing("What is the smallest x that satisfies {equation_code}?", SMALLER_ROOT),
        Phrasing("x is an integer and ${equation}$. What is x?", LINEAR),
        Phrasing("Find |r - s|, where r and s are the solutions of {equation}.", ROOT_DIFFERENCE),
        Phrasing("Which root of {equation_sup} is larger?", LARGER_ROOT),
        # held out
        Phrasing("Find the integer x such that {equation}.", replace(LINEAR, sample=sample_linear)),
        Phrasing("What is the greatest solution of {equation}?", replace(LARGER_ROOT, sample=sample_quadratic)),
    )),
    Family("word", (
        Phrasing("A warehouse has {a:,} boxes with {b} items each. How many items are there?",
                 replace(PRODUCT, sample=word_sampler(a=(1_000, 9_999), b=(100, 999))),
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
                 replace(RANGE_SUM, sample=sample_short_range),
                 "She runs \\boxed{{{answer}}} laps."),
        Phrasing("A teacher arranges {n:,} chairs in equal rows. How many ways can she do it, counting every possible "
                 "number of rows, including 1 and {n:,}?",
                 replace(DIVISOR_COUNT, sample=divisor_target(10**5)),
                 "There are \\boxed{{{answer}}} ways."),
        Phrasing("A pyramid of cubes has a 1 x 1 layer on top, a 2 x 2 layer below it, and so on down to a {n} x {n} "
                 "layer at the bottom. How many cubes does it have?",
                 replace(SQUARE_SUM, sample=word_sampler(n=(20, 500))),
                 "The pyramid has \\boxed{{{answer}}} cubes."),
        Phrasing("A water tank already holds {b} liters, and a pump adds {a} liters per minute. After how many "
                 "minutes does the tank hold {c} liters?",
                 replace(LINEAR, sample=sample_rate_and_start),
                 "The tank holds that much after \\boxed{{{answer}}} minutes."),
        Phrasing("A bus route has a stop every {k} km, the first one {k} km from the depot and the last one before "
                 "the {n:,} km mark. What is the sum of the distances, in km, of all the stops from the depot?",
                 MULTIPLE_SUM, "The distances add up to \\boxed{{{answer}}} km."),
        Phrasing("An orchard has {a} rows of {b} trees. How many trees are in the orchard?",
                 replace(PRODUCT, sample=word_sampler(a=(12, 400), b=(12, 400))),
                 "The orchard has \\boxed{{{answer}}} trees."),
        Phrasing("A counter starts at 1. Every second it multiplies its value by {a} and keeps only the remainder on "
                 "division by {m}. What does it show after {b:,} seconds?",
                 POWER_MOD, "It shows \\boxed{{{answer}}}."),
        Phrasing("How many squares of any size can be found in a {n} by {n} grid of unit squares?",
                 replace(SQUARE_SUM, sample=word_sampler(n=(5, 300))),
                 "There are \\boxed{{{answer}}} squares."),
        Phrasing("A diver is {b} m below the surface and rises {a} m every minute. After how many minutes is she {c} "
                 "m below the surface?",
                 replace(LINEAR, sample=sample_countdown),
                 "She is there after \\boxed{{{answer}}} minutes."),
        Phrasing("{a:,} students are split into teams of {m}. How many students are left without a full team?",
                 replace(REMAINDER, sample=word_sampler(a=(100, 99_999), m=(3, 15))),
                 "\\boxed{{{answer}}} students are left over."),
        Phrasing("How many rectangles with whole-number side lengths have an area of {n}? A w-by-h and an h-by-w "
                 "rectangle count as different.",
                 replace(DIVISOR_COUNT, sample=divisor_target(10**6)),
                 "There are \\boxed{{{answer}}} such rectangles."),
        Phrasing("A rectangle is {extra} cm longer than it is wide, and its area is {area} cm². How wide is it, "
                 "in cm?",
                 POSITIVE_ROOT, "It is \\boxed{{{answer}}} cm wide."),
        Phrasing("Ana saves ${a} on the first day of a plan and $1 more on each following day, until she saves ${b} "
                 "on the last day. How many dollars does she save in total?",
                 replace(RANGE_SUM, sample=sample_short_range),
                 "She saves \\boxed{{{answer}}} dollars."),
        Phrasing("I think of a number, multiply it by {a} and subtract {b}. The result is {c}. What number did I "
                 "think of?",
                 replace(LINEAR, sample=sample_times_minus),
                 "The number is \\boxed{{{answer}}}."),
        Phrasing("A printer prints {b} pages per minute. How many pages does it print in {a:,} minutes?",
                 replace(PRODUCT, sample=word_sampler(a=(100, 50_000), b=(10, 120))),
                 "It prints \\boxed{{{answer}}} pages."),
        Phrasing("A board game lasts {last:,} turns. On every turn whose number is a multiple of {k}, a player scores "
                 "as many points as the turn number. How many points does the player score in the whole game?",
                 MULTIPLE_SUM, "The player scores \\boxed{{{answer}}} points."),
        Phrasing("{n} candies are shared equally among a group of children with none left over. How many different "
                 "group sizes are possible, counting a group of 1 and a group of {n}?",
                 replace(DIVISOR_COUNT, sample=divisor_target(10**5)),
                 "\\boxed{{{answer}}} group sizes are possible."),
        Phrasing("Mia has ${b} and saves ${a} every week. After how many weeks will she have ${c}?",
                 replace(LINEAR, sample=sample_rate_and_start),
                 "She will have it after \\boxed{{{answer}}} weeks."),
        Phrasing("A ribbon {a:,} cm long is cut into as many {m} cm pieces as possible. How many centimeters are "
                 "left over?",
                 replace(REMAINDER, sample=word_sampler(a=(1_000, 10**6), m=(7, 150))),
                 "\\boxed{{{answer}}} cm are left over."),
        Phrasing("A gardener lays out square beds with sides of 1 m, 2 m, 3 m, and so on up to {n} m. What is their "
                 "total area in square meters?",
                 replace(SQUARE_SUM, sample=word_sampler(n=(10, 400))),
                 "Their total area is \\boxed{{{answer}}} square meters."),
        Phrasing("Two positive integers differ by {extra}, and their product is {area}. What is the smaller one?",
                 POSITIVE_ROOT, "The smaller one is \\boxed{{{answer}}}."),
        Phrasing("A pile of {a}^{b} tokens is handed out {m} at a time for as long as at least {m} are left. How "
                 "many tokens remain?",
                 replace(POWER_MOD, sample=word_sampler(a=(2, 99), b=(20, 5_000), m=(7, 1_000))),
                 "\\boxed{{{answer}}} tokens remain."),
        Phrasing("Seats in a stadium are arranged so that row r has r seats. How many seats are there in rows {a} "
                 "through {b}?",
                 replace(RANGE_SUM, sample=sample_short_range),
                 "Those rows have \\boxed{{{answer}}} seats."),
        # held out
        Phrasing("Raffle tickets are numbered from 1 to {last:,}. Every ticket whose number is a multiple of {k} wins "
                 "that many dollars. How many dollars are paid out in total?",
                 MULTIPLE_SUM, "\\boxed{{{answer}}} dollars are paid out."),
        Phrasing("A shop charges a fixed fee of ${b} plus ${a} per pen. A customer's bill is ${c}. How many pens did "
                 "the customer buy?",
                 replace(LINEAR, sample=sample_rate_and_start),
                 "The customer bought \\boxed{{{answer}}} pens."),
    )),
)
FAMILIES_BY_NAME = {family.name: family for family in FAMILIES}


def heldout_phrasing_ids() -> list[str]:
    return [pid for family in FAMILIES for pid in family.phrasing_ids("heldout")]


def phrasing_by_id(phrasing_id: str) -> Phrasing:
    family, index = phrasing_id.split("/")
    return FAMILIES_BY_NAME[family].phrasings[int(index)]
