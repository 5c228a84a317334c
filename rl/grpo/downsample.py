"""GRPO-RoC down-sampling: which of a prompt's 2G rollouts train.

Each prompt is rolled out 2G times (a *group*); down-sampling keeps G of them per group, in two steps:

1. reject-equal: a group whose rewards are all equal (all right or all wrong) has zero GRPO advantage
   everywhere, so it is dropped whole and not refilled;
2. Resample-on-Correct (RoC): the kept positives are the cleanest ones (fewest tool errors, tidiest
   answer format), the kept negatives a uniform subsample, in the group's own positive/negative proportion.

Two flavours of step 2, chosen by `mode`:

- ``"released"`` reproduces microsoft/rStar @ ecbfb94, `rstar2_agent/down_sample/roc.py`
  (`resample_of_correct`), quirks included: penalties read from the decoded response *text*, positives
  sorted by penalty with the lowest kept, negatives the first k in rollout order;
- ``"paper"`` follows arXiv 2508.20722 §2.2.3, Eq. 4-5: penalties from the structured tool-call records,
  positives sampled with probability inversely proportional to their penalty, negatives sampled uniformly.

``"none"`` is plain GRPO (every trace of every group trains), for ablations.

Every function here is pure; the only randomness comes from an explicit `random.Random`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

Mode = Literal["released", "paper", "none"]
T = TypeVar("T")

# Released `calc_error_ratio_penalty_weights` / `calc_format_penalty_weights` (roc.py): the patterns it
# searches the response text with (re.DOTALL), and the p_err given to a trace without any tool response.
_TOOL_RESPONSE = re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL)
_ANSWER = re.compile(r"<answer>.*?</answer>", re.DOTALL)
_ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant.*?<\|im_end\|>", re.DOTALL)
NO_TOOL_P_ERR = 0.5  # roc.py `error_ratio`; also the paper's Eq. 4, where it is meant to encourage tool use

# torch.allclose's default tolerances: the released `reject_equal_reward` compares each reward with the
# group's first one through torch.allclose(first, rewards), i.e. |first - r| <= atol + rtol * |r|.
_ALLCLOSE_RTOL = 1e-5
_ALLCLOSE_ATOL = 1e-8

# Our choice for `paper` mode (the paper gives no value): a positive is drawn with weight
# 1 / (p_err + p_format + PAPER_PENALTY_EPS), so a clean trace (penalty 0) has a finite weight of 10,
# 3x that of a trace with one failed call in five (penalty 0.2) and 6x that of a correct no-tool trace
# (penalty 0.5): preferred, as Eq. 5 intends, without the draw collapsing into a deterministic sort.
PAPER_PENALTY_EPS = 0.1


@dataclass(frozen=True)
class Trace:
    """What down-sampling needs to know about one rollout."""

    reward: float
    text: str  # the response decoded with special tokens KEPT: the released penalties read it
    num_turns: int  # sampled assistant turns
    tool_calls: int  # tool calls made
    # failed calls, from the structured records: decode error, exception or non-zero exit, timeout, unknown tool
    tool_errors: int


@dataclass(frozen=True)
class Selection:
    """The traces that train, and counts for the step's log.

    `kept` maps each surviving group's index to its kept trace indices, both in batch (rollout) order,
    which is the order the released boolean mask keeps them in.
    """

    kept: dict[int, tuple[int, ...]]
    groups_in: int
    groups_dropped_equal: int  # all rewards equal (reject-equal)
    groups_dropped_small: int  # fewer than `keep` traces: the released RoC drops them (see `roc_quotas`)
    groups_dropped_trim: int  # dropped whole so the trace count is a multiple of `batch_multiple`
    traces_kept: int
    positives_kept: int
    negatives_kept: int

    def pick(self, groups: Sequence[Sequence[T]]) -> list[list[T]]:
        """The kept items of `groups` (what the traces were made from, in the same order), one list per
        surviving group, in batch order."""
        return [[groups[group][index] for index in kept] for group, kept in self.kept.items()]


def _is_positive(trace: Trace) -> bool:
    # roc.py splits on the summed token-level score: > 0 positive, <= 0 negative.
    return trace.reward > 0


def reject_equal_reward(groups: Sequence[Sequence[Trace]]) -> list[int]:
    """Indices of the groups whose rewards are not all equal (released `reject_sampling.py`).

    Equality is torch.allclose's, against the group's first reward. A one-trace group is all-equal, so it
    goes too: its GRPO advantage would carry no comparison.
    """
    kept = []
    for index, group in enumerate(groups):
        first = group[0].reward
        if any(abs(first - t.reward) > _ALLCLOSE_ATOL + _ALLCLOSE_RTOL * abs(t.reward) for t in group):
            kept.append(index)
    return kept


def released_penalties(text: str) -> tuple[float, float]:
    """(p_err, p_format) exactly as the released roc.py computes them from the decoded response text.

    p_err: the share of `<tool_response>` blocks whose lower-cased text contains "error"; 0.5 without any.
    The substring test misses failures whose rendering lacks the word, such as a timeout
    ("reason: worker_timeout") or a malformed call ("Failed to decode tool call: Expecting ..."), and
    counts any output that merely prints "error".

    p_format: 1.0 if `<answer>` or `</answer>` is missing, or either tag's count differs from the number
    of closed `<answer>...</answer>` pairs; 1.0 if no `<|im_start|>assistant...<|im_end|>` span is found
    (roc.py returns 1.0 there instead of dividing by zero); else min(1, (pairs - 1) / spans). The first
    turn's header lies in the prompt, so spans = turns - 1: a correct single-turn trace gets 1.0.
    """
    responses = _TOOL_RESPONSE.findall(text)
    if responses:
        p_err = sum("error" in block.lower() for block in responses) / len(responses)
    else:
        p_err = NO_TOOL_P_ERR

    if "<answer>" not in text or "</answer>" not in text:
        return p_err, 1.0
    pairs = len(_ANSWER.findall(text))
    if text.count("<answer>") != pairs or text.count("</answer>") != pairs:
        return p_err, 1.0
    turns = len(_ASSISTANT_TURN.findall(text))
    if turns == 0:
        return p_err, 1.0
    return p_err, min((pairs - 1) / turns, 1.0)


def paper_penalties(trace: Trace) -> tuple[float, float]:
    """(p_err, p_format) of the paper's Eq. 4-5, from the structured fields rather than the text.

    p_err = failed calls / calls (every failure mode counts), 0.5 with no call, to favour tool use.
    p_format = 1.0 without an `<answer>...</answer>` pair, else min(1, (pairs - 1) / sampled turns): a
    single answer costs nothing, repeated answers cost in proportion to the turns taken.
    """
    p_err = trace.tool_errors / trace.tool_calls if trace.tool_calls else NO_TOOL_P_ERR
    pairs = len(_ANSWER.findall(trace.text))
    p_format = 1.0 if pairs == 0 else min((pairs - 1) / trace.num_turns, 1.0)
    return p_err, p_format


def roc_quotas(n_pos: int, n_neg: int, keep: int, min_pos: int = 2, min_neg: int = 2) -> tuple[int, int]:
    """How many positives and negatives of one group to keep: the released `resample_of_correct` rule.

    Defaults: `min_non_zero_reward_trace_num=2`, `min_zero_reward_trace_num=2` (examples/
    run_qwen3-14b_rstar2_agent_weave.sh, with `down_sample_to_n=16` of `rollout.n=32`). In order:

    - fewer than `keep` traces: (0, 0), the group is dropped (roc.py leaves its mask False);
    - exactly `keep`: everything;
    - quotas round(n_neg * keep / n) and round(n_pos * keep / n), Python's round (halves to even);
    - negatives at or under min(min_neg, n_neg): raised to it, positives take the rest of `keep`;
      then the same for positives, negatives taking the rest;
    - if the quotas still do not select exactly `keep` traces (two halves rounded the same way with
      neither side at its floor, e.g. n_pos=11, n_neg=7, keep=9), roc.py's assertion fails; so does
      this function, with a ValueError. With keep = n/2 and an even keep it cannot happen.

    roc.py also keeps the whole group when both rounded quotas fall under their floors; rounding loses
    at most one trace in total, so with min_pos + min_neg <= keep (which both check) that branch is
    unreachable and is left out here.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    if min_pos + min_neg > keep:
        raise ValueError(f"min_pos + min_neg = {min_pos + min_neg} exceeds keep = {keep}")
    n = n_pos + n_neg
    if n < keep:
        return 0, 0
    if n == keep:
        return n_pos, n_neg

    neg_quota = round(n_neg * keep / n)
    pos_quota = round(n_pos * keep / n)
    if neg_quota <= min(min_neg, n_neg):
        neg_quota = min(min_neg, n_neg)
        pos_quota = keep - neg_quota
    if pos_quota <= min(min_pos, n_pos):
        pos_quota = min(min_pos, n_pos)
        neg_quota = keep - pos_quota
    # roc.py slices its sorted lists with these quotas, so a quota beyond what exists selects what exists.
    pos_quota, neg_quota = min(pos_quota, n_pos), min(neg_quota, n_neg)
    if pos_quota + neg_quota != keep:
        raise ValueError(
            f"quotas of {pos_quota} positives + {neg_quota} negatives out of ({n_pos}, {n_neg}) do not "
            f"select {keep} traces (the released code fails its assertion here)"
        )
    return pos_quota, neg_quota


def _split(group: Sequence[Trace]) -> tuple[list[int], list[int]]:
    positives = [i for i, trace in enumerate(group) if _is_positive(trace)]
    negatives = [i for i, trace in enumerate(group) if not _is_positive(trace)]
    return positives, negatives


def select_released(group: Sequence[Trace], keep: int, min_pos: int = 2, min_neg: int = 2) -> list[int]:
    """Kept trace indices of one group, in rollout order, as the released RoC picks them.

    Positives: sorted by ascending p_err + p_format (`released_penalties`; Python's sort is stable, so
    ties keep rollout order), the lowest `pos_quota` kept. Negatives: the first `neg_quota` in rollout
    order, unscored (rStar PR #50, commit 5e95b19, removed their sort). Empty when `roc_quotas` drops it.
    """
    positives, negatives = _split(group)
    pos_quota, neg_quota = roc_quotas(len(positives), len(negatives), keep, min_pos, min_neg)
    ranked = sorted(positives, key=lambda i: sum(released_penalties(group[i].text)))
    return sorted(ranked[:pos_quota] + negatives[:neg_quota])


def _weighted_sample(items: list[int], weights: list[float], k: int, rng: random.Random) -> list[int]:
    """k items without replacement, each draw proportional to the weights of the items still left."""
    items, weights, chosen = list(items), list(weights), []
    for _ in range(k):
        pick = rng.choices(range(len(items)), weights=weights)[0]
        chosen.append(items.pop(pick))
        weights.pop(pick)
    return chosen


def select_paper(
    group: Sequence[Trace], keep: int, rng: random.Random, min_pos: int = 2, min_neg: int = 2
) -> list[int]:
    """Kept trace indices of one group, in rollout order, as the paper's Eq. 5 describes the pick.

    The quotas are `roc_quotas` (the paper's half of each side, made concrete the released way), so the
    two modes differ only in how the traces are chosen. Positives are drawn without replacement, each with
    weight 1 / (p_err + p_format + PAPER_PENALTY_EPS) from `paper_penalties`; negatives uniformly.
    """
    positives, negatives = _split(group)
    pos_quota, neg_quota = roc_quotas(len(positives), len(negatives), keep, min_pos, min_neg)
    weights = [1.0 / (sum(paper_penalties(group[i])) + PAPER_PENALTY_EPS) for i in positives]
    chosen = _weighted_sample(positives, weights, pos_quota, rng)
    chosen += rng.sample(negatives, neg_quota)
    return sorted(chosen)


def _groups_to_keep(sizes: list[int], multiple: int) -> list[int]:
    """Positions of the groups to keep so that their trace count is a multiple of `multiple`.

    Whole groups only. The kept count is the largest such multiple that whole groups can reach; among
    equally large choices the earliest groups stay and later ones go, as the released `filter_by_mask`
    keeps the head of the batch (it cuts mid-group; this does not).
    """
    # best[i][r]: the most traces groups i.. can contribute with a total ≡ r (mod multiple); None if none can.
    best: list[list[int | None]] = [[None] * multiple for _ in range(len(sizes) + 1)]
    best[len(sizes)][0] = 0
    for i in range(len(sizes) - 1, -1, -1):
        for r in range(multiple):
            skip = best[i + 1][r]
            rest = best[i + 1][(r - sizes[i]) % multiple]
            take = None if rest is None else rest + sizes[i]
            best[i][r] = max((v for v in (skip, take) if v is not None), default=None)
    # Walk forward, keeping each group whenever keeping it still reaches the best total.
    kept, need = [], 0
    for i, size in enumerate(sizes):
        rest = best[i + 1][(need - size) % multiple]
        if rest is not None and rest + size == best[i][need]:
            kept.append(i)
            need = (need - size) % multiple
    return kept


def downsample(
    groups: Sequence[Sequence[Trace]],
    mode: Mode,
    keep: int,
    rng: random.Random,
    min_pos: int = 2,
    min_neg: int = 2,
    batch_multiple: int = 1,
) -> Selection:
    """Turn rollout groups into the traces that train.

    "released" and "paper": reject-equal, then RoC per group (`select_released` / `select_paper`).
    "none": every trace of every group (plain GRPO). In every mode the result is then cut to a multiple of
    `batch_multiple` (the trainer's world size) by dropping whole groups (`_groups_to_keep`). The released
    code cuts the flat batch instead, once after reject-equal (a group cut there falls under `keep` and RoC
    drops it) and once after RoC, where a split group gets its advantages from part of its traces. An empty
    `kept` means there is nothing to train on: the released trainer skips the step.
    """
    if batch_multiple < 1:
        raise ValueError(f"batch_multiple must be at least 1, got {batch_multiple}")
    if mode == "none":
        candidates = range(len(groups))
    elif mode in ("released", "paper"):
        candidates = reject_equal_reward(groups)
    else:
        raise ValueError(f"unknown down-sampling mode {mode!r}")

    selected: dict[int, tuple[int, ...]] = {}
    dropped_small = 0
    for index in candidates:
        group = groups[index]
        if mode == "none":
            chosen = list(range(len(group)))
        elif mode == "released":
            chosen = select_released(group, keep, min_pos, min_neg)
        else:
            chosen = select_paper(group, keep, rng, min_pos, min_neg)
        if chosen:
            selected[index] = tuple(chosen)
        else:
            dropped_small += 1

    order = list(selected)
    survivors = _groups_to_keep([len(selected[index]) for index in order], batch_multiple)
    kept = {order[position]: selected[order[position]] for position in survivors}

    traces = [groups[g][t] for g, indices in kept.items() for t in indices]
    positives = sum(_is_positive(trace) for trace in traces)
    return Selection(
        kept=kept,
        groups_in=len(groups),
        groups_dropped_equal=len(groups) - len(candidates),
        groups_dropped_small=dropped_small,
        groups_dropped_trim=len(selected) - len(kept),
        traces_kept=len(traces),
        positives_kept=positives,
        negatives_kept=len(traces) - positives,
    )
