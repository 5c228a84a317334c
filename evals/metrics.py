"""Aggregations shared by the benchmarks: avg@k, pass@k and their standard errors."""

from __future__ import annotations

from collections import defaultdict
from math import comb, sqrt
from statistics import fmean, stdev

from rstar.evals.registry import Grade


def scores_by_doc(grades: list[Grade]) -> dict[str, list[float]]:
    by_doc: dict[str, list[float]] = defaultdict(list)
    for grade in grades:
        by_doc[grade.doc_id].append(grade.score)
    return dict(by_doc)


def mean_stderr(values: list[float]) -> float:
    """Standard error of the mean (sample standard deviation / sqrt(n)); 0 for fewer than two values."""
    return stdev(values) / sqrt(len(values)) if len(values) > 1 else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 < k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n={n}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def sampled_accuracy(grades: list[Grade]) -> dict[str, float]:
    """Average pass@1 over k samples (the paper's metric), pass@k, their standard errors and counts.

    Each doc's samples are averaged first, so a doc with a missing sample does not weigh less than the others;
    standard errors are over docs (the samples of one doc are not independent draws of the benchmark).
    pass@k uses each doc's own sample count; `pass_at` adds the unbiased pass@j for j = 1, 2, 4, ... < k.
    """
    if not grades:
        raise ValueError("no grades to aggregate")
    by_doc = scores_by_doc(grades)
    averages = [fmean(scores) for scores in by_doc.values()]
    passed = [float(max(scores) > 0) for scores in by_doc.values()]
    k = max(len(scores) for scores in by_doc.values())
    curve = {}
    j = 1
    while j < k:
        per_doc = [pass_at_k(len(s), sum(x > 0 for x in s), j) for s in by_doc.values() if len(s) >= j]
        curve[str(j)] = fmean(per_doc)
        j *= 2
    return {
        "avg_pass_at_1": fmean(averages),
        "avg_pass_at_1_stderr": mean_stderr(averages),
        "pass_at_k": fmean(passed),
        "pass_at_k_stderr": mean_stderr(passed),
        "pass_at": curve,
        "docs": len(by_doc),
        "samples_per_doc": k,
    }
