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
    """One forward pass: T prefixes (right-padded, possibly empty) and the branches that continue them."""

    prefix_ids: torch.Tensor  # [T, P] right-padded with 0 (P = 0 when no tree has a prefix)
    prefix_lengths: torch.Tensor  # [T]
    branch_ids: torch.Tensor  # [B, L] right-padded with 0
    branch_prefix: torch.Tensor  # [B] which prefix row each branch continues
    predict_from: torch.Tensor  # [N] index into concat(prefix states [T * P], branch states [B * L])
    targets: torch.Tensor  # [N] the loss tokens
    owners: torch.Tensor  # [N] which branch row each loss token belongs to (index into `branch_keys`)
    branch_keys: list[tuple[int, int]]  # (tree index, branch index) of each branch row
    values: dict[str, torch.Tensor]  # name -> [N]
    num_tokens: int  # real tokens computed: the prefixes' and the branches' lengths

    @property
    def num_loss_tokens(self) -> int:
        return self.targets.shape[0]


Part = tuple[int, list[int]]  # (tree index, branch indices): a tree, or the branches of it that share a batch


def pack(trees: Sequence[Tree], token_budget: int) -> list[ForwardBatch]:
    """Forward batches of at most `token_budget` computed tokens, padding included.

    A tree whose branches do not fit in one batch is split by branches (longest first, so each part pads
    little), each part with its own copy of the prefix; small trees share a batch, so a step of many short
    prompts is a few forward passes, not one per prompt. A prefix with one branch longer than the budget
    still gets a batch of its own.
    """
    if token_budget < 1:
        raise ValueError("token_budget must be positive")
    parts: list[Part] = []
    for tree_index, tree in enumerate(trees):
        order = sorted(range(len(tree.branches)), key=lambda b: len(tree.branches[b].token_ids), reverse=True)
        current: list[int] = []
        for branch_index in order:
            if current and _cost(trees, [(tree_index, [*current, branch_index])]) > token_budget:
                parts.append((tree_index, current))
                current = []
            current.append(branch_index)
        if current:
            parts.append((tree_index, current))
    batches: list[list[Part]] = []
    for part in parts:
        if batches and _cost(trees, [*batches[-1], part]) <= token_budget:
            batches[-1].append(part)
        else:
            batches.append([part])
    return [_layout(trees, batch) for batch in batches]


def _cost(trees: Sequence[Tree], parts: list[Part]) -> int:
    """Token slots one forward pass computes for these parts: prefixes and branches padded to their longest."""
    prefix = max(len(trees[t].prefix) for t, _ in parts)
    branches = [len(trees[t].branches[b].token_ids) for t, indices in parts for b in indices]
    return len(parts) * prefix + len(branches) * max(branches)


def _layout(trees: Sequence[Tree], parts: list[Part]) -> ForwardBatch:
    prefix_width = max(len(trees[t].prefix) for t, _ in parts)
    width = max(len(trees[t].branches[b].token_ids) for t, indices in parts for b in indices)
    names = sorted({name for t, indices in parts for b in indices for name in trees[t].branches[b].values})
    prefix_rows, prefix_lengths, rows, branch_prefix, branch_keys = [], [], [], [], []
    predict_from, targets, owners = [], [], []
    values: dict[str, list[float]] = {name: [] for name in names}
    branch_base = len(parts) * prefix_width  # branch states follow every prefix state, flat
    for prefix_row, (tree_index, branch_indices) in enumerate(parts):
        tree = trees[tree_index]
        prefix_rows.append(tree.prefix + [0] * (prefix_width - len(tree.prefix)))
        prefix_lengths.append(len(tree.prefix))
        last_prefix_state = prefix_row * prefix_width + len(tree.prefix) - 1
        for branch_index in branch_indices:
            branch = tree.branches[branch_index]
            row = len(rows)
            rows.append(branch.token_ids + [0] * (width - len(branch.token_ids)))
            branch_prefix.append(prefix_row)
            branch_keys.append((tree_index, branch_index))
            for offset, (token, loss) in enumerate(zip(branch.token_ids, branch.loss_mask)):
                if not loss:
                    continue
                predict_from.append(branch_base + row * width + offset - 1 if offset else last_prefix_state)
                targets.append(token)
                owners.append(row)
                for name in names:
                    values[name].append(branch.values[name][offset] if name in branch.values else 0.0)
    return ForwardBatch(
        prefix_ids=torch.tensor(prefix_rows, dtype=torch.long).reshape(len(parts), prefix_width),
        prefix_lengths=torch.tensor(prefix_lengths, dtype=torch.long),
        branch_ids=torch.tensor(rows, dtype=torch.long),
        branch_prefix=torch.tensor(branch_prefix, dtype=torch.long),
        predict_from=torch.tensor(predict_from, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        owners=torch.tensor(owners, dtype=torch.long),
        branch_keys=branch_keys,
        values={name: torch.tensor(v, dtype=torch.float32) for name, v in values.items()},
        num_tokens=sum(prefix_lengths) + sum(len(trees[t].branches[b].token_ids) for t, indices in parts for b in indices),
    )


def hidden_states(decoder, batch: ForwardBatch, device: torch.device) -> torch.Tensor:
    """The decoder's last hidden states, prefix rows then branch rows flat ([T * P + B * L, H]).

    Prefixes run as one right-padded batch (causal attention keeps pads out of every real token's view);
    each branch then attends to its own prefix's cached keys and values, with that prefix's pad slots
    masked, at positions continuing from the prefix's true length.
    """
    branch_ids = batch.branch_ids.to(device)
    count, width = branch_ids.shape
    prefixes, prefix_width = batch.prefix_ids.shape
    if prefix_width == 0:
        return decoder(input_ids=branch_ids).last_hidden_state.reshape(count * width, -1)
    prefix = decoder(input_ids=batch.prefix_ids.to(device), use_cache=True)
    cache = prefix.past_key_values
    cache.batch_select_indices(batch.branch_prefix.to(device))
    lengths = batch.prefix_lengths.to(device)[batch.branch_prefix.to(device)]
    positions = lengths[:, None] + torch.arange(width, device=device)
    real_prefix = torch.arange(prefix_width, device=device)[None, :] < lengths[:, None]
    attention = torch.cat([real_prefix, torch.ones(count, width, dtype=torch.bool, device=device)], dim=1).long()
    branches = decoder(input_ids=branch_ids, position_ids=positions, past_key_values=cache, attention_mask=attention, use_cache=True).last_hidden_state
    return torch.cat([prefix.last_hidden_state.reshape(prefixes * prefix_width, -1), branches.reshape(count * width, -1)])


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
