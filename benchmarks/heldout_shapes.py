"""A held-out set for judging RL runs: the catalogue's 12 held-out phrasings plus 24 sentence shapes that no
part of the product knows (they live here, not in rl/sft/catalogue.py, so no SFT or RL data can contain
them), problems spread evenly over all 36.

The catalogue's held-out phrasings alone are too few to judge a run by: a small model tends to get a
phrasing right or wrong as a whole, so 200 problems over 12 phrasings behave like a dozen coin flips. More
shapes make the effective sample larger. Each new shape reuses a catalogue computation and sampler, so its
answer is computed exactly as the training problems' are.

    from heldout_shapes import heldout_set
    rows = heldout_set(count=504, seed=0)  # [{"id", "family", "phrasing", "problem", "answer"}, ...]
"""

from __future__ import annotations

import random
from dataclasses import replace

from rstar.rl.sft.catalogue import (
    DIVISOR_COUNT,
    DIVISOR_SUM,
    LARGER_ROOT,
    LINEAR,
    MULTIPLE_SUM,
    POWER_MOD,
    PRODUCT,
    RANGE_SUM,
    REMAINDER,
    SMALLER_ROOT,
    SQUARE_SUM,
    Phrasing,
    divisor_target,
    heldout_phrasing_ids,
    phrasing_by_id,
    sample_countdown,
    sample_linear,
    sample_quadratic,
    sample_rate_and_start,
    sample_short_range,
    sample_times_minus,
    word_sampler,
)

# family -> shapes; ids are "bench-<family>/<index>"
BENCH_SHAPES: dict[str, tuple[Phrasing, ...]] = {
    "product": (
        Phrasing("Work out {a} times {b}.", PRODUCT),
        Phrasing("What number is {a} groups of {b}?", PRODUCT),
        Phrasing("Give the product {a:,} × {b:,}.", PRODUCT),
    ),
    "modular": (
        Phrasing("When {a:,} is divided by {m}, what is the remainder?", REMAINDER),
        Phrasing("Give {a}^{b} modulo {m}.", POWER_MOD),
        Phrasing("What is left when {a} is divided by {m} as many whole times as possible?", REMAINDER),
    ),
    "range_sum": (
        Phrasing("Find the total of the integers {a} through {b}.", RANGE_SUM),
        Phrasing("What is the sum of the first {n} perfect squares?", SQUARE_SUM),
        Phrasing("Sum every positive multiple of {k} that is smaller than {n}.", MULTIPLE_SUM),
    ),
    "divisors": (
        Phrasing("How many positive whole numbers divide {n} with no remainder?", DIVISOR_COUNT),
        Phrasing("Give the sum of the divisors of {n}, including 1 and {n}.", DIVISOR_SUM),
        Phrasing("List the positive divisors of {n}. How many are there?", DIVISOR_COUNT),
    ),
    "equation": (
        Phrasing("Find x when {equation}.", replace(LINEAR, sample=sample_linear)),
        Phrasing("What is the larger solution of {equation}?", replace(LARGER_ROOT, sample=sample_quadratic)),
        Phrasing("Give the smaller solution of {equation}.", replace(SMALLER_ROOT, sample=sample_quadratic)),
        Phrasing("Solve for x in {equation_code}.", replace(LINEAR, sample=sample_linear)),
    ),
    "word": (
        Phrasing("A baker makes {a} loaves a day. How many loaves does she make in {b} days?",
                 replace(PRODUCT, sample=word_sampler(a=(12, 500), b=(10, 365)))),
        Phrasing("A crate holds {b} bottles. How many bottles are in {a:,} crates?",
                 replace(PRODUCT, sample=word_sampler(a=(100, 9_999), b=(6, 48)))),
        Phrasing("A taxi charges ${b} to start plus ${a} per km. A ride cost ${c}. How many km long was it?",
                 replace(LINEAR, sample=sample_rate_and_start)),
        Phrasing("A tank holds {b} liters and drains {a} liters per hour. After how many hours does it hold {c} "
                 "liters?", replace(LINEAR, sample=sample_countdown)),
        Phrasing("{a:,} books are packed into boxes of {m}, filling as many boxes as possible. How many books are "
                 "not in a full box?", replace(REMAINDER, sample=word_sampler(a=(1_000, 999_999), m=(5, 60)))),
        Phrasing("Tiles are laid out as squares of side 1, 2, 3 and so on up to {n}. How many tiles are used in "
                 "all?", replace(SQUARE_SUM, sample=word_sampler(n=(10, 300)))),
        Phrasing("A club of {n} members splits into groups of equal size. How many group sizes work, counting 1 "
                 "and {n}?", replace(DIVISOR_COUNT, sample=divisor_target(10**5))),
        Phrasing("Sam reads {a} pages on the first day and one page more on each day after, ending with {b} pages "
                 "on the last day. How many pages does he read?", replace(RANGE_SUM, sample=sample_short_range)),
        Phrasing("I multiply a number by {a} and then subtract {b}, getting {c}. What was the number?",
                 replace(LINEAR, sample=sample_times_minus)),
    ),
}


def shapes() -> list[tuple[str, str, Phrasing]]:
    """(shape id, family, phrasing) for every shape: the catalogue's held-out phrasings, then the new ones."""
    listed = [(pid, pid.split("/")[0], phrasing_by_id(pid)) for pid in heldout_phrasing_ids()]
    listed += [(f"bench-{family}/{i}", family, phrasing)
               for family, phrasings in BENCH_SHAPES.items() for i, phrasing in enumerate(phrasings)]
    return listed


def heldout_set(count: int, seed: int = 0) -> list[dict]:
    """`count` distinct problems, shapes in turn, numbers drawn from a seeded stream of their own."""
    rng = random.Random(f"rstar.benchmarks.heldout_shapes/{seed}")
    every_shape = shapes()
    seen: set[str] = set()
    rows: list[dict] = []
    while len(rows) < count:
        shape_id, family, phrasing = every_shape[len(rows) % len(every_shape)]
        fields = phrasing.computation.sample(rng)
        problem = phrasing.text.format(**fields)
        if problem in seen:
            continue
        seen.add(problem)
        rows.append({"id": f"heldout-{len(rows):04d}", "family": family, "phrasing": shape_id, "problem": problem,
                     "answer": str(phrasing.computation.answer(fields))})
    return rows
