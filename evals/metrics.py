"""Aggregations shared by the benchmarks."""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean

from rstar.evals.registry import Grade


def scores_by_doc(grades: list[Grade]) -> dict[str, list[float]]:
    by_doc: dict[str, list[float]] = defaultdict(list)
    for grade in grades:
        by_doc[grade.doc_id].append(grade.score)
    return dict(by_doc)


def sampled_accuracy(grades: list[Grade]) -> dict[str, float]:
    """Average pass@1 over k samples (the paper's metric), pass@k, and the counts behind them.

    Each doc's samples are averaged first, so a doc with a missing sample does not weigh less than the others.
    """
    if not grades:
        raise ValueError("no grades to aggregate")
    by_doc = scores_by_doc(grades)
    return {
        "avg_pass_at_1": fmean(fmean(scores) for scores in by_doc.values()),
        "pass_at_k": fmean(float(max(scores) > 0) for scores in by_doc.values()),
        "docs": len(by_doc),
        "samples_per_doc": max(len(scores) for scores in by_doc.values()),
    }
