"""Batching training sequences by token budget, with shared prefixes computed once.

A GRPO group is one prompt and many responses; an SFT step is many conversations that open with the same
system prompt and tools block (about 420 tokens with the rStar template). Padding every sequence to the
longest (what TRL does) spends most of a CPU step recomputing the same prompt for each response. Here a
`Tree` is a prefix plus branches, and one forward pass (`ForwardBatch`) takes the prefix once, keeps its
keys and values, and runs the branches on top of them as one right-padded batch:

    prefix  [p0 p1 ... pP-1]                 (batch 1; its KV cache repeated for every branch)
    branches [b0 b1 b2 b3 .. .. ]            (batch B, positions P.., right-padded)
             [b0 b1 .. .. .. .. ]

Gradients flow through the cached keys and values back into the prefix. Right padding needs no padding
mask: under causal attention a real token never sees the pads after it, and pads carry no loss.

Measured on SmolLM2-135M, 2 cores, bf16: a flat row with a 4-D block mask (the usual way to pack trees) ran
at 170 tok/s, because any dense mask sends attention to the slow materialised path at the row's full
length; the unmasked causal path ran at 500 tok/s. Here only the branches' short [branch, prefix + branch]
attention takes the masked path.

Only loss tokens get logits: `predict_from` names, for each one, the hidden state that predicts it (the
previous token of its branch, or the prefix's last token), indexing prefix states then branch states flat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Branch:
    """One continuation of a prefix: its tokens, which of them carry loss, and per-token values
    (advantage, rollout logprobs, ...) that travel with the loss tokens."""

    token_ids: list[int]
    loss_mask: list[int]
    values: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self):
        if not self.token_ids:
            raise ValueError("a branch needs at least one token")
        if len(self.loss_mask) != len(self.token_ids):
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {len(self.token_ids)} tokens")
        for name, values in self.values.items():
            if len(values) != len(self.token_ids):
                raise ValueError(f"values[{name!r}] has {len(values)} entries for {len(self.token_ids)} tokens")


@dataclass
class Tree:
    prefix: list[int]
    branches: list[Branch]

    def __post_init__(self):
        if not self.prefix and any(branch.loss_mask[0] == 1 for branch in self.branches):
            raise ValueError("a branch's first token carries loss but nothing precedes it")


@dataclass
class ForwardBatch:
    """One forward pass: a prefix (possibly empty) and the branches that continue it."""

    prefix_ids: torch.Tensor  # [1, P]
    branch_ids: torch.Tensor  # [B, L] right-padded with 0
    predict_from: torch.Tensor  # [N] index into concat(prefix states [P], branch states [B * L])
    targets: torch.Tensor  # [N] the loss tokens
    owners: torch.Tensor  # [N] which branch each loss token belongs to (index into `branch_keys`)
    branch_keys: list[tuple[int, int]]  # (tree index, branch index) of each batch row
    values: dict[str, torch.Tensor]  # name -> [N]
    num_tokens: int  # real tokens computed: P + the branches' lengths

    @property
    def num_loss_tokens(self) -> int:
        return self.targets.shape[0]


def pack(trees: Sequence[Tree], token_budget: int) -> list[ForwardBatch]:
    """Forward batches of at most `token_budget` computed tokens (prefix + branches padded to the longest).

    A tree whose branches do not fit in one batch is split by branches, each part with its own copy of the
    prefix; branches are sorted by length first, so each part pads little. A prefix with one branch longer
    than the budget still gets a batch of its own.
    """
    if token_budget < 1:
        raise ValueError("token_budget must be positive")
    batches = []
    for tree_index, tree in enumerate(trees):
        order = sorted(range(len(tree.branches)), key=lambda b: len(tree.branches[b].token_ids), reverse=True)
        part: list[int] = []
        for branch_index in order:
            longest = len(tree.branches[part[0]].token_ids) if part else len(tree.branches[branch_index].token_ids)
            if part and len(tree.prefix) + longest * (len(part) + 1) > token_budget:
                batches.append(_layout(tree_index, tree, part))
                part = []
            part.append(branch_index)
        if part:
            batches.append(_layout(tree_index, tree, part))
    return batches


def _layout(tree_index: int, tree: Tree, branch_indices: list[int]) -> ForwardBatch:
    prefix_len = len(tree.prefix)
    width = max(len(tree.branches[b].token_ids) for b in branch_indices)
    names = sorted({name for b in branch_indices for name in tree.branches[b].values})
    rows, predict_from, targets, owners = [], [], [], []
    values: dict[str, list[float]] = {name: [] for name in names}
    for row, branch_index in enumerate(branch_indices):
        branch = tree.branches[branch_index]
        rows.append(branch.token_ids + [0] * (width - len(branch.token_ids)))
        for offset, (token, loss) in enumerate(zip(branch.token_ids, branch.loss_mask)):
            if not loss:
                continue
            predict_from.append(prefix_len + row * width + offset - 1 if offset else prefix_len - 1)
            targets.append(token)
            owners.append(row)
            for name in names:
                values[name].append(branch.values[name][offset] if name in branch.values else 0.0)
    return ForwardBatch(
        prefix_ids=torch.tensor([tree.prefix], dtype=torch.long).reshape(1, prefix_len),
        branch_ids=torch.tensor(rows, dtype=torch.long),
        predict_from=torch.tensor(predict_from, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        owners=torch.tensor(owners, dtype=torch.long),
        branch_keys=[(tree_index, b) for b in branch_indices],
        values={name: torch.tensor(v, dtype=torch.float32) for name, v in values.items()},
        num_tokens=prefix_len + sum(len(tree.branches[b].token_ids) for b in branch_indices),
    )


def hidden_states(decoder, batch: ForwardBatch, device: torch.device) -> torch.Tensor:
    """The decoder's last hidden states, prefix rows then branch rows flat ([P + B * L, H])."""
    branch_ids = batch.branch_ids.to(device)
    count, width = branch_ids.shape
    prefix_len = batch.prefix_ids.shape[1]
    if prefix_len == 0:
        return decoder(input_ids=branch_ids).last_hidden_state.reshape(count * width, -1)
    prefix = decoder(input_ids=batch.prefix_ids.to(device), use_cache=True)
    cache = prefix.past_key_values
    cache.batch_repeat_interleave(count)
    positions = torch.arange(prefix_len, prefix_len + width, device=device).expand(count, width)
    branches = decoder(input_ids=branch_ids, position_ids=positions, past_key_values=cache, use_cache=True).last_hidden_state
    return torch.cat([prefix.last_hidden_state[0], branches.reshape(count * width, -1)])


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all sequences share."""
    if not sequences:
        return 0
    shortest = min(len(s) for s in sequences)
    for i in range(shortest):
        token = sequences[0][i]
        if any(s[i] != token for s in sequences):
            return i
    return shortest
