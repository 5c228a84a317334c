"""GRPO-RoC down-sampling against hand-built rollout groups (golden files under tests/golden/rl/).

The traces are decoded responses as the rStar template renders them: the first assistant turn's header
sits in the prompt, later turns open with `<|im_start|>assistant`, tool results come back in a user turn
as `<tool_response>` blocks in code-judge's wording (server/tool_results.py).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict

import pytest

from rstar.rl.grpo.downsample import (
    Trace,
    downsample,
    paper_penalties,
    reject_equal_reward,
    released_penalties,
    roc_quotas,
    select_paper,
    select_released,
)
from tests.unit.golden_files import check_json

OK = "Tool call success\nstdout: 5050\n\nexecution time: 0.01s"
EXCEPTION = (
    "Tool call failure\nreason: \nstderr: Traceback (most recent call last):\n"
    '  File "<string>", line 1, in <module>\nZeroDivisionError: division by zero\n\nexecution time: 0.02s'
)
TIMEOUT = "Tool call failure\nreason: worker_timeout\nexecution time: 4.00s"
DECODE_FAILURE = "Failed to decode tool call: Expecting ',' delimiter: line 1 column 40 (char 39)"
PRINTS_ERROR = "Tool call success\nstdout: relative error 1e-09\n\nexecution time: 0.01s"
FAILED = {EXCEPTION, TIMEOUT, DECODE_FAILURE}

CALL = (
    '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)", "input": ""}}\n'
    "</tool_call>"
)
ANSWER = "<answer>\\boxed{5050}</answer>"


def trace(reward: float, *results: str, answers: int = 1, closed: bool = True) -> Trace:
    """A trace making one tool call per result, then a final turn with `answers` answer pairs.

    `closed=False` cuts the final turn before its `<|im_end|>`, as a length-truncated rollout ends.
    """
    turns = [f"Let me check.</reason>\n{CALL}" for _ in results] + ["Done.</reason>\n" + ANSWER * answers]
    text = ""
    for number, body in enumerate(turns):
        header = "" if number == 0 else "<|im_start|>assistant\n<reason>"
        text += header + body
        if number < len(results):
            text += f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{results[number]}\n</tool_response><|im_end|>\n"
    if closed:
        text += "<|im_end|>"
    return Trace(
        reward=reward,
        text=text,
        num_turns=len(turns),
        tool_calls=len(results),
        tool_errors=sum(result in FAILED for result in results),
    )


def answer_then_reason_again() -> Trace:
    """Answers in its first turn, calls the tool twice to double-check, answers again: two pairs, three
    sampled turns, two of them opening with a header in the response."""
    tool_turn = f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{OK}\n</tool_response><|im_end|>\n"
    text = (
        f"First guess.</reason>\n{ANSWER}\n<reason>Check it.\n{CALL}{tool_turn}"
        f"<|im_start|>assistant\n<reason>Once more.</reason>\n{CALL}{tool_turn}"
        f"<|im_start|>assistant\n<reason>Still 5050.</reason>\n{ANSWER}<|im_end|>"
    )
    return Trace(reward=1.0, text=text, num_turns=3, tool_calls=2, tool_errors=0)


PENALTY_CASES = {
    "clean_tool_call": trace(1.0, OK),
    "no_tool_single_turn": trace(1.0),
    "exception_then_ok": trace(1.0, EXCEPTION, OK),
    "timeout_then_ok": trace(1.0, TIMEOUT, OK),
    "decode_failure_then_ok": trace(1.0, DECODE_FAILURE, OK),
    "stdout_prints_error": trace(1.0, PRINTS_ERROR),
    "no_answer": trace(0.0, OK, answers=0),
    "two_answers_one_turn": trace(1.0, OK, answers=2),
    "answer_then_reason_again": answer_then_reason_again(),
    "unbalanced_answer_tags": Trace(1.0, "x</reason>\n<answer>1</answer><answer>2<|im_end|>", 1, 0, 0),
    "final_turn_cut": trace(1.0, OK, closed=False),
}


def test_penalties_golden():
    table = {
        name: {"released": released_penalties(t.text), "paper": paper_penalties(t)}
        for name, t in PENALTY_CASES.items()
    }
    check_json("rl/downsample_penalties.json", table)

    # A correct trace without tools: 0.5 for not calling, and (released quirk) 1.0 for its zero counted
    # turns, the worst penalty there is; the paper charges it only the 0.5.
    assert table["no_tool_single_turn"] == {"released": (0.5, 1.0), "paper": (0.5, 0.0)}
    # The released substring test misses the timeout and the malformed call, and counts stdout "error".
    assert table["exception_then_ok"]["released"] == (0.5, 0.0)
    assert table["timeout_then_ok"] == {"released": (0.0, 0.0), "paper": (0.5, 0.0)}
    assert table["decode_failure_then_ok"] == {"released": (0.0, 0.0), "paper": (0.5, 0.0)}
    assert table["stdout_prints_error"] == {"released": (1.0, 0.0), "paper": (0.0, 0.0)}
    # Repeated answers: released divides by the turns it counts (headers in the response: 2 of 3), the
    # paper by the sampled turns (3).
    assert table["answer_then_reason_again"] == {"released": (0.0, 0.5), "paper": (0.0, 0.5 * 2 / 3)}
    assert table["two_answers_one_turn"] == {"released": (0.0, 1.0), "paper": (0.0, 0.5)}
    # Released only: any tag outside a closed pair, or no complete header-to-<|im_end|> span, costs 1.0.
    assert table["unbalanced_answer_tags"] == {"released": (0.5, 1.0), "paper": (0.5, 0.0)}
    assert table["final_turn_cut"] == {"released": (0.0, 1.0), "paper": (0.0, 0.0)}


def test_quotas_golden_for_32_to_16():
    table = {n_pos: roc_quotas(n_pos, 32 - n_pos, keep=16) for n_pos in range(33)}
    check_json("rl/downsample_quotas_32_to_16.json", table)
    assert table[16] == (8, 8)
    assert table[1] == (1, 15)  # round(0.5) = 0, raised to the one that exists
    assert table[2] == (2, 14)  # round(1.0) = 1, raised to the floor of 2
    assert table[5] == (2, 14)  # round(2.5) = 2: Python rounds halves to even
    assert table[7] == (4, 12)  # round(3.5) = 4 and round(12.5) = 12
    assert table[31] == (15, 1)
    assert table[0] == (0, 16) and table[32] == (16, 0)
    assert all(sum(quotas) == 16 for quotas in table.values())


def test_quotas_edges():
    assert roc_quotas(3, 1, keep=4) == (3, 1)  # exactly keep: everything
    assert roc_quotas(2, 1, keep=4) == (0, 0)  # fewer than keep: dropped, as roc.py does
    with pytest.raises(ValueError, match="assertion"):
        roc_quotas(11, 7, keep=9)  # 5.5 -> 6 and 3.5 -> 4: ten, neither at a floor
    with pytest.raises(ValueError):
        roc_quotas(8, 8, keep=3)  # floors of 2 + 2 cannot fit in 3


def test_reject_equal_reward():
    groups = [
        [trace(1.0), trace(1.0, OK)],  # all right
        [trace(0.0), trace(0.0)],  # all wrong
        [trace(1.0), trace(0.0)],
        [trace(1.0)],  # one trace: nothing to compare
        [trace(0.5), trace(0.5 + 1e-9)],  # equal within torch.allclose's tolerance
    ]
    assert reject_equal_reward(groups) == [2]


# One batch, 2G = 8 rollouts per prompt down to G = 4 (the released 32 -> 16, in small).
MIXED = [
    trace(1.0),  # 0: correct, no tool: released penalty 0.5 + 1.0
    trace(1.0, EXCEPTION, OK),  # 1: released 0.5, paper 0.5
    trace(1.0, OK),  # 2: clean: 0
    trace(1.0, TIMEOUT, OK),  # 3: released 0 (timeout not seen), paper 0.5
    trace(0.0, OK),  # 4..7: wrong
    trace(0.0, EXCEPTION),
    trace(0.0),
    trace(0.0, TIMEOUT),
]
ONE_RIGHT = [trace(0.0, OK)] * 3 + [trace(1.0, EXCEPTION)] + [trace(0.0)] * 4
BATCH = [
    [trace(1.0, OK)] * 8,  # 0: all right: dropped by reject-equal
    [trace(0.0)] * 8,  # 1: all wrong: dropped by reject-equal
    MIXED,  # 2
    ONE_RIGHT,  # 3
    [trace(1.0, OK), trace(0.0), trace(0.0)],  # 4: three traces, fewer than keep: dropped
]


def test_select_released_orders_positives_by_penalty_and_negatives_by_rollout():
    # 4 right, 4 wrong -> 2 + 2. Positives by penalty: 2 (0), 3 (0), 1 (0.5), 0 (1.5, the no-tool one last).
    assert select_released(MIXED, keep=4) == [2, 3, 4, 5]
    # 1 right, 7 wrong: round(0.5) = 0 positives, raised to the single one; negatives the first three.
    assert select_released(ONE_RIGHT, keep=4) == [0, 1, 2, 3]
    assert select_released(BATCH[4], keep=4) == []


def test_downsample_released_golden():
    selection = downsample(BATCH, "released", keep=4, rng=random.Random(0))
    check_json("rl/downsample_released.json", asdict(selection))
    assert selection.kept == {2: (2, 3, 4, 5), 3: (0, 1, 2, 3)}
    assert (selection.groups_in, selection.groups_dropped_equal, selection.groups_dropped_small) == (5, 2, 1)
    assert (selection.traces_kept, selection.positives_kept, selection.negatives_kept) == (8, 3, 5)


def test_a_selection_picks_the_kept_items_of_what_the_traces_were_made_from():
    selection = downsample(BATCH, "released", keep=4, rng=random.Random(0))
    names = [[f"g{g}t{t}" for t in range(len(group))] for g, group in enumerate(BATCH)]
    assert selection.pick(names) == [["g2t2", "g2t3", "g2t4", "g2t5"], ["g3t0", "g3t1", "g3t2", "g3t3"]]
    assert selection.pick(BATCH) == [[BATCH[g][t] for t in kept] for g, kept in selection.kept.items()]


def test_downsample_paper_golden_and_reproducible():
    selection = downsample(BATCH, "paper", keep=4, rng=random.Random(0))
    check_json("rl/downsample_paper.json", asdict(selection))
    assert selection == downsample(BATCH, "paper", keep=4, rng=random.Random(0))
    assert list(selection.kept) == [2, 3]
    assert 3 in selection.kept[3]  # the one positive of group 3 is always kept


def test_select_paper_prefers_low_penalty():
    # Two positives, one clean (weight 1 / 0.1 = 10), one whose only call failed (1 / 1.1): with one
    # positive to keep, the clean one should win 10 / 10.909 = 91.7% of draws. Negatives: uniform.
    group = [trace(1.0, EXCEPTION), trace(0.0), trace(0.0), trace(1.0, OK)] + [trace(0.0)] * 4
    assert roc_quotas(2, 6, keep=4, min_pos=1, min_neg=1) == (1, 3)
    rng = random.Random(1234)
    counts = Counter(i for _ in range(2000) for i in select_paper(group, 4, rng, min_pos=1, min_neg=1))
    assert counts[3] + counts[0] == 2000
    assert 1750 < counts[3] < 1910, counts
    for negative in (1, 2, 4, 5, 6, 7):  # each kept 3/6 of the time: 1000 +- 22 (1 sigma)
        assert 880 < counts[negative] < 1120, counts


def test_downsample_none_keeps_everything():
    selection = downsample(BATCH, "none", keep=4, rng=random.Random(0))
    assert selection.kept == {g: tuple(range(len(group))) for g, group in enumerate(BATCH)}
    assert selection.groups_dropped_equal == selection.groups_dropped_small == selection.groups_dropped_trim == 0
    assert selection.traces_kept == 35


def test_trimming_drops_whole_groups_only():
    groups = [[trace(1.0), trace(0.0), trace(0.0)], [trace(1.0), trace(0.0)] * 4, [trace(1.0), trace(0.0)] * 3]
    # Sizes 3, 8, 6 and a world size of 8: only group 1 alone makes a multiple; dropping from the end
    # (6, then 8) would have left 3 and then nothing.
    selection = downsample(groups, "none", keep=4, rng=random.Random(0), batch_multiple=8)
    assert selection.kept == {1: tuple(range(8))}
    assert selection.groups_dropped_trim == 2

    # Released mode, world size 3: groups 2 and 3 keep 4 each; 8 is not a multiple of 3, 4 is not either:
    # nothing can train (an empty selection: the step is skipped).
    assert downsample(BATCH, "released", keep=4, rng=random.Random(0), batch_multiple=3).kept == {}

    # Equal sizes: the earliest groups stay, as the released filter keeps the head of the batch.
    same = [MIXED, ONE_RIGHT, MIXED]
    selection = downsample(same, "released", keep=4, rng=random.Random(0), batch_multiple=8)
    assert list(selection.kept) == [0, 1] and selection.traces_kept == 8
    for g, indices in selection.kept.items():
        assert len(indices) == 4  # never a split group
