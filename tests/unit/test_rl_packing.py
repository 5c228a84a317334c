"""Packing: each branch, computed on top of its prefix's cached keys and values in a padded batch, gets
exactly the logprobs of an unpacked forward of prefix + branch; gradients reach the prefix."""

from __future__ import annotations

import pytest
import torch

from rstar.rl.packing import Branch, Tree, common_prefix_length, hidden_states, pack


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    model.config.use_cache = False
    return model


def unpacked_logprobs(model, prefix: list[int], branch: Branch) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prefix + branch.token_ids])).logits[0].float()
    logprobs = logits.log_softmax(-1)
    return [logprobs[len(prefix) + offset - 1, token].item() for offset, (token, loss) in enumerate(zip(branch.token_ids, branch.loss_mask)) if loss]


def packed_logprobs(model, batch) -> torch.Tensor:
    hidden = hidden_states(model.get_decoder(), batch, torch.device("cpu"))
    logits = model.get_output_embeddings()(hidden[batch.predict_from]).float()
    return logits.gather(-1, batch.targets[:, None])[:, 0] - logits.logsumexp(-1)


def random_trees():
    g = torch.Generator().manual_seed(1)

    def tokens(n):
        return torch.randint(3, 97, (n,), generator=g).tolist()

    return [
        Tree(tokens(7), [Branch(tokens(5), [1] * 5), Branch(tokens(3), [0, 1, 1]), Branch(tokens(6), [1, 1, 0, 0, 1, 1])]),
        Tree(tokens(4), [Branch(tokens(9), [0, 0, 1, 1, 1, 1, 1, 1, 1])]),
        Tree([], [Branch(tokens(6), [0, 1, 1, 1, 0, 1]), Branch(tokens(2), [0, 1])]),
        Tree(tokens(11), [Branch(tokens(2), [1, 1]), Branch(tokens(4), [1, 0, 1, 0])]),
    ]


@pytest.mark.parametrize("budget", [1000, 40, 20])
def test_packed_batches_match_unpacked_forwards(tiny_model, budget):
    trees = random_trees()
    batches = pack(trees, token_budget=budget)
    assert sum(b.num_loss_tokens for b in batches) == sum(sum(br.loss_mask) for t in trees for br in t.branches)
    seen = set()
    for batch in batches:
        with torch.no_grad():
            got = packed_logprobs(tiny_model, batch)
        for owner, (tree_index, branch_index) in enumerate(batch.branch_keys):
            seen.add((tree_index, branch_index))
            tree = trees[tree_index]
            expected = unpacked_logprobs(tiny_model, tree.prefix, tree.branches[branch_index])
            assert got[batch.owners == owner].tolist() == pytest.approx(expected, abs=1e-5)
    assert seen == {(t, b) for t, tree in enumerate(trees) for b in range(len(tree.branches))}


def test_gradients_through_the_shared_prefix_equal_unpacked_ones(tiny_model):
    tree = random_trees()[0]
    tiny_model.zero_grad()
    (batch,) = pack([tree], token_budget=1000)
    packed_logprobs(tiny_model, batch).sum().backward()
    packed = {name: p.grad.clone() for name, p in tiny_model.named_parameters()}
    tiny_model.zero_grad()
    for branch in tree.branches:
        logits = tiny_model(input_ids=torch.tensor([tree.prefix + branch.token_ids])).logits[0].float().log_softmax(-1)
        picks = [logits[len(tree.prefix) + o - 1, t] for o, (t, loss) in enumerate(zip(branch.token_ids, branch.loss_mask)) if loss]
        torch.stack(picks).sum().backward()
    for name, p in tiny_model.named_parameters():
        assert torch.allclose(packed[name], p.grad, atol=1e-5), name


def test_layout_pads_right_and_points_each_loss_token_at_its_predictor():
    tree = Tree([5, 6, 7], [Branch([8, 9], [1, 1], {"advantage": [0.5, 0.5]}), Branch([10], [1], {"advantage": [-1.0]})])
    (batch,) = pack([tree], token_budget=100)
    assert batch.prefix_ids.tolist() == [[5, 6, 7]]
    assert batch.branch_ids.tolist() == [[8, 9], [10, 0]]
    # Prefix states are rows 0-2, branch states follow flat (width 2): the first token of each branch is
    # predicted by the prefix's last state, the next by its own branch's previous state.
    assert batch.predict_from.tolist() == [2, 3, 2]
    assert batch.targets.tolist() == [8, 9, 10]
    assert batch.values["advantage"].tolist() == [0.5, 0.5, -1.0]
    assert batch.num_tokens == 6


def test_small_trees_share_one_forward_pass():
    trees = [Tree([1, 2, 3], [Branch([4], [1]), Branch([5, 6], [1, 1])]), Tree([7], [Branch([8, 9, 10], [1, 1, 1])])]
    (batch,) = pack(trees, token_budget=100)
    assert batch.prefix_ids.tolist() == [[1, 2, 3], [7, 0, 0]] and batch.prefix_lengths.tolist() == [3, 1]
    assert batch.branch_ids.tolist() == [[5, 6, 0], [4, 0, 0], [8, 9, 10]] and batch.branch_prefix.tolist() == [0, 0, 1]
    # Branch states start after both prefixes (2 x 3 slots); tree 2's first token comes from its prefix's slot 3.
    assert batch.predict_from.tolist() == [2, 6, 2, 3, 12, 13]
    assert batch.num_tokens == 10


def test_a_tree_over_budget_is_split_by_branches_longest_first_with_the_prefix_repeated():
    tree = Tree([1, 2, 3, 4], [Branch([5, 6, 7], [1, 1, 1]), Branch([8], [1]), Branch([9, 10, 11], [1, 1, 1])])
    batches = pack([tree], token_budget=10)
    assert [b.branch_ids.tolist() for b in batches] == [[[5, 6, 7], [9, 10, 11]], [[8]]]
    assert all(b.prefix_ids.tolist() == [[1, 2, 3, 4]] for b in batches)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="loss_mask"):
        Branch([1, 2], [1])
    with pytest.raises(ValueError, match="nothing precedes"):
        Tree([], [Branch([1, 2], [1, 1])])


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[1], [2]]) == 0
    assert common_prefix_length([]) == 0
