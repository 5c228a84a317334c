"""Sharded trainer ranks (FSDP2 on gloo, real processes): two ranks compute the update one rank computes, the
step's groups are spread over the ranks whole and balanced by tokens, and a checkpoint written on either number
of ranks resumes on either."""

from __future__ import annotations

import random

import pytest
import torch

from rstar.hardware import usable_cores
from rstar.rl.grpo.balance import balance_groups
from rstar.rl.checkpoint import OPTIMIZER_FILE, CheckpointError, TrainerState, write_checkpoint
from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.distributed import check_world_size
from rstar.rl.grpo.ranks import split_trees, tree_tokens
from rstar.rl.grpo.trainer import GRPOTrainer
from rstar.rl.packing import Branch, Tree, pack
from rstar.rl.policy import Policy

VOCAB = 49152  # the default model's (SmolLM2) tokenizer


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def group(rng: random.Random, prompt: int, lengths: list[int], advantages: list[float]) -> Tree:
    def tokens(n):
        return [rng.randrange(5, VOCAB) for _ in range(n)]

    branches = [Branch(tokens(n), [1] * n, {"advantage": [a] * n, "rollout_logprobs": [-1.0] * n}) for n, a in zip(lengths, advantages)]
    return Tree(tokens(prompt), branches)


def test_balance_never_splits_a_group_and_evens_the_tokens():
    rng = random.Random(0)
    for _ in range(200):
        tokens = [rng.randrange(1, 500) for _ in range(rng.randrange(1, 30))]
        ranks = rng.randrange(1, 6)
        shares = balance_groups(tokens, ranks)
        assert len(shares) == ranks
        assert sorted(i for share in shares for i in share) == list(range(len(tokens)))  # each group once, whole
        loads = [sum(tokens[i] for i in share) for share in shares]
        assert max(loads) - min(loads) <= max(tokens)  # largest-first: no rank more than one group off
        assert shares == balance_groups(tokens, ranks)  # every rank computes the same split
    # By hand: 9 -> rank 0, 5 and 4 -> rank 1 (9 each), 3 -> rank 0 (the tie goes low), 3 -> rank 1, 2 -> rank 0: 14 / 12.
    assert balance_groups([9, 5, 4, 3, 3, 2], 2) == [[0, 3, 5], [1, 2, 4]]
    assert balance_groups([7], 3) == [[0], [], []]  # fewer groups than ranks: some ranks train padding only


def test_split_trees_balances_by_each_groups_prompt_and_responses():
    rng = random.Random(1)
    trees = [group(rng, 50, [10, 10], [1, -1]), group(rng, 5, [60, 2], [1, -1]), group(rng, 40, [30], [1]), group(rng, 3, [3], [1])]
    assert [tree_tokens(t) for t in trees] == [70, 67, 70, 6]
    shares = split_trees(trees, 2)
    assert [[tree_tokens(t) for t in share] for share in shares] == [[70, 67], [70, 6]]  # 137 / 76, the best two-way split


def test_more_ranks_than_cores_is_refused_in_one_line_naming_the_fix():
    cores = len(usable_cores())
    check_world_size(cores, "cpu")
    with pytest.raises(ValueError, match=rf"trainer_ranks {cores + 1}: this machine has {cores} CPU core.*use --trainer-ranks {cores} or fewer"):
        check_world_size(cores + 1, "cpu")


def test_two_ranks_update_the_weights_one_rank_does(tiny_model_dir):
    """Groups of unequal lengths, so each rank's token count differs from the step's (the loss must be normalised
    over the global batch), a clip that binds (grad norm about 1, clip 0.05: the norm must be global; with Adam
    the clip shows from the second update on), and one group fewer than twice the ranks on the second step (a
    rank runs a padding pass)."""
    try:
        check_world_size(2)
    except ValueError as exc:  # one core, or one GPU
        pytest.skip(str(exc))
    from rstar.rl.grpo.ranks import TrainerRanks

    rng = random.Random(2)
    first = [group(rng, 10, [5, 9], [1.0, -1.0]), group(rng, 7, [20, 3, 4], [0.5, -0.5, 1.0]), group(rng, 12, [2, 2], [-1.0, 1.0])]
    second = [group(rng, 9, [30, 6], [-1.0, 1.0])]
    config = GRPOConfig(learning_rate=1e-3, warmup_steps=0, compute_dtype="float32", grad_clip=0.05)

    single = GRPOTrainer(Policy(tiny_model_dir, "float32"), config)
    start = {name: tensor.clone() for name, tensor in single.policy.merged_state_dict()}
    one = [single.update(first, config)]
    one_weights = [{name: tensor.clone() for name, tensor in single.policy.merged_state_dict()}]
    one.append(single.update(second, config))
    one_weights.append(dict(single.policy.merged_state_dict()))

    probe = pack([second[0]], 1000)[0]
    with TrainerRanks(tiny_model_dir, "float32", config, size=2) as ranks:
        two = [ranks.update(first, config)]
        two_weights = [ranks.full_state_dict()]
        two.append(ranks.update(second, config))
        two_weights.append(ranks.full_state_dict())
        # What the weight sync's probe reads on rank 0, the other rank taking its part.
        probe_two = ranks.policy.no_grad_logprobs(probe)
        # And as a bf16 engine receives the weights: each rank rounds its shard, and keeps its fp32 masters.
        rounded_two = ranks.policy.no_grad_logprobs(probe, 1.0, torch.bfloat16)
        assert torch.equal(ranks.policy.no_grad_logprobs(probe), probe_two)
    assert torch.allclose(probe_two, single.policy.no_grad_logprobs(probe), atol=1e-5)
    rounded_one = single.policy.no_grad_logprobs(probe, 1.0, torch.bfloat16)
    assert torch.allclose(rounded_two, rounded_one, atol=1e-5) and not torch.allclose(rounded_one, probe_two, atol=1e-5)

    assert one[0]["grad_norm"] > 10 * config.grad_clip  # the clip binds
    assert max((one_weights[0][n] - start[n]).abs().max().item() for n in start) > 1e-4  # the update is far above the tolerance
    for a, b, wa, wb in zip(one, two, one_weights, two_weights):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert b["train_tokens"] == a["train_tokens"]
        assert sorted(wb) == sorted(wa)
        worst = max((wa[n] - wb[n]).abs().max().item() for n in wa)
        assert worst <= 1e-5, f"two ranks' weights differ from one rank's by {worst}"


def weights(trainer_or_ranks) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in trainer_or_ranks.policy.merged_state_dict()}


def worst(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max((a[n] - b[n]).abs().max().item() for n in a)


def test_sharded_checkpoints_resume_on_two_ranks_and_on_one(tiny_model_dir, tmp_path):
    """A checkpoint after one update, written by two ranks (each its own shards) or by one, then the second update
    after resuming: on two ranks, on one, and a one-rank checkpoint on two. Each must end where two updates without
    a checkpoint end (weights within 1e-5), which needs the weights, AdamW's moments and the warm-up schedule back.
    A checkpoint from before sharded checkpoints is refused on two ranks, naming the way out."""
    try:
        check_world_size(2)
    except ValueError as exc:
        pytest.skip(str(exc))
    from rstar.rl.grpo.ranks import TrainerRanks

    rng = random.Random(3)
    first = [group(rng, 10, [5, 9], [1.0, -1.0]), group(rng, 7, [20, 3], [0.5, -0.5]), group(rng, 12, [2, 2], [-1.0, 1.0])]
    second = [group(rng, 9, [30, 6], [-1.0, 1.0]), group(rng, 4, [8, 8], [1.0, -1.0])]
    config = GRPOConfig(learning_rate=1e-3, warmup_steps=3, compute_dtype="float32")
    state = TrainerState(step=1, data_cursor=0, model_identity={})

    single = GRPOTrainer(Policy(tiny_model_dir, "float32"), config)
    single.update(first, config)
    one_rank_checkpoint = write_checkpoint(tmp_path / "one", state, single.policy.save_pretrained, single.save_training_state)
    single.update(second, config)
    expected = weights(single)

    old = tmp_path / "old" / "checkpoint-1"
    old.mkdir(parents=True)
    (old / OPTIMIZER_FILE).write_bytes(b"")
    with TrainerRanks(tiny_model_dir, "float32", config, size=2) as ranks:
        ranks.update(first, config)
        two_rank_checkpoint = write_checkpoint(tmp_path / "two", state, ranks.policy.save_pretrained, ranks.save_training_state)
        with pytest.raises(CheckpointError, match=r"checkpoint-1 was written before sharded checkpoints .* --trainer-ranks 1"):
            ranks.load_training_state(old)
    assert sorted(p.name for p in (two_rank_checkpoint / "distributed").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]  # a file per rank

    with TrainerRanks(tiny_model_dir, "float32", config, size=2) as ranks:
        ranks.load_training_state(two_rank_checkpoint)
        ranks.update(second, config)
        assert worst(weights(ranks), expected) <= 1e-5, "two ranks resumed from two"
        ranks.load_training_state(one_rank_checkpoint)
        ranks.update(second, config)
        assert worst(weights(ranks), expected) <= 1e-5, "two ranks resumed from one"

    resumed = GRPOTrainer(Policy(tiny_model_dir, "float32"), config)
    resumed.load_training_state(two_rank_checkpoint)
    assert resumed.scheduler.last_epoch == 1
    mine, theirs = dict(resumed.policy.model.named_parameters()), dict(single.policy.model.named_parameters())
    assert int(resumed.optimizer.state[mine["model.norm.weight"]]["step"]) == 1
    resumed.update(second, config)
    assert worst(weights(resumed), expected) <= 1e-5, "one rank resumed from two"
    for name, parameter in mine.items():  # and the moments two updates built
        assert (resumed.optimizer.state[parameter]["exp_avg"] - single.optimizer.state[theirs[name]]["exp_avg"]).abs().max().item() <= 1e-5


def test_a_rank_killed_with_sigkill_is_named_and_no_rank_process_stays(tiny_model_dir):
    try:
        check_world_size(2)
    except ValueError as exc:
        pytest.skip(str(exc))
    import os
    import signal

    from rstar.rl.grpo.ranks import RankDied, TrainerRanks

    config = GRPOConfig(learning_rate=1e-3, warmup_steps=0, compute_dtype="float32")
    trees = [group(random.Random(4), 10, [5, 9], [1.0, -1.0])]
    with pytest.raises(RankDied, match=r"trainer rank 1 of 2 \(pid (\d+)\) died with exit code -9; .* the same command resumes") as caught:
        with TrainerRanks(tiny_model_dir, "float32", config, size=2) as ranks:
            ranks.update(trees, config)
            pid = ranks.followers.processes[0].pid
            os.kill(pid, signal.SIGKILL)
            ranks.update(trees, config)
    assert str(pid) in str(caught.value)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie
