"""Which trainer rank trains which GRPO group: whole groups, balanced by tokens.

A group (one prompt and its kept samples) is one packed tree: its prompt is computed once and its KV cache
reused under every response (`rl/packing.py`). Splitting a group across ranks would compute its prompt on each
of them, so groups are never split. Every rank waits for the slowest at each collective, so the ranks'
token totals should be as even as whole groups allow.

Greedy largest-first onto the lightest rank (LPT scheduling): no rank ends more than one group above the
mean, which is what a step of many similar groups needs; an exact partition is NP-hard and buys nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence


def balance_groups(group_tokens: Sequence[int], ranks: int) -> list[list[int]]:
    """Group indices per rank (each index exactly once; each rank's in ascending order).

    Ties go to the lower rank and the larger group is placed first, the lower index first among equals, so the
    result is a pure function of its input: every rank computing it gets the same answer. With fewer groups
    than ranks, some ranks get none.
    """
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    if any(tokens < 0 for tokens in group_tokens):
        raise ValueError("a group cannot have a negative token count")
    loads = [0] * ranks
    shares: list[list[int]] = [[] for _ in range(ranks)]
    for index in sorted(range(len(group_tokens)), key=lambda i: (-group_tokens[i], i)):
        lightest = min(range(ranks), key=lambda r: (loads[r], r))
        shares[lightest].append(index)
        loads[lightest] += group_tokens[index]
    return [sorted(share) for share in shares]
