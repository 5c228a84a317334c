"""The GRPO update on a tiny random Llama: kept samples become trees, positives gain probability, and a
batch without signal leaves the weights alone."""

from __future__ import annotations

import pytest
import torch

from rstar.rl.data import Problem
from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.downsample import Selection
from rstar.rl.grpo.samples import Sample
from rstar.rl.grpo.train import rollout_metrics
from rstar.rl.grpo.trainer import GRPOTrainer, split_by_tokens, training_trees
from rstar.rl.packing import Branch, Tree, pack
from rstar.rl.policy import Policy
from rstar.server.trajectory import Trajectory

PROMPT = [5, 6, 7, 8]


def sample(response: list[int], reward: float, mask: list[int] | None = None) -> Sample:
    trajectory = Trajectory(prompt_ids=PROMPT, response_ids=response, response_mask=mask or [1] * len(response), logprobs=[-1.0] * len(response))
    return Sample(Problem("p", "q", "1"), trajectory, reward, "ok")


def config(**overrides) -> GRPOConfig:
    return GRPOConfig(**{"learning_rate": 1e-2, "warmup_steps": 0, "weight_decay": 0.0, "compute_dtype": "float32", **overrides})


def test_step_metrics_read_the_samples_the_selection_picked():
    groups = [[sample([1], 1.0), sample([2], 0.0), sample([3], 0.0)], [sample([4], 1.0), sample([5], 1.0)]]
    selection = Selection({0: (0, 2)}, 2, 1, 0, 0, 2, 1, 1)
    metrics = rollout_metrics(groups, selection, selection.pick(groups))
    assert (metrics["reward_mean"], metrics["kept_reward_mean"], metrics["groups_kept"], metrics["solve_rate"]) == (0.6, 0.5, 1, 1.0)


def test_training_trees_carry_advantages_of_the_kept_samples_only():
    groups = [[sample([10, 11], 1.0), sample([12], 0.0), sample([13, 14, 15], 0.0, mask=[1, 0, 1]), sample([16], 1.0)]]
    trees = training_trees(Selection({0: (0, 1, 2)}, 1, 0, 0, 0, 3, 1, 2).pick(groups))
    (tree,) = trees
    assert tree.prefix == PROMPT and [b.token_ids for b in tree.branches] == [[10, 11], [12], [13, 14, 15]]
    # rewards (1, 0, 0): mean 1/3, Bessel std 0.577 -> +1.155, -0.577, -0.577
    assert [round(b.values["advantage"][0], 3) for b in tree.branches] == [1.155, -0.577, -0.577]
    assert tree.branches[2].loss_mask == [1, 0, 1]  # tool tokens stay out of the loss


def logprob_of(policy, response):
    (batch,) = pack([Tree(PROMPT, [Branch(response, [1] * len(response))])], 1000)
    with torch.no_grad():
        return policy.logprobs(batch).sum().item()


def test_an_update_raises_the_positive_samples_and_lowers_the_negatives(tiny_model_dir):
    policy = Policy(tiny_model_dir, "float32")
    trainer = GRPOTrainer(policy, config())
    good, bad = [20, 21, 22], [30, 31, 32]
    before = (logprob_of(policy, good), logprob_of(policy, bad))
    groups = [[sample(good, 1.0), sample(bad, 0.0)]]
    trees = training_trees(Selection({0: (0, 1)}, 1, 0, 0, 0, 2, 1, 1).pick(groups))
    stats = trainer.update(trees, config())
    after = (logprob_of(policy, good), logprob_of(policy, bad))
    assert after[0] > before[0] and after[1] < before[1]
    assert stats["train_tokens"] == 6 and stats["clip_frac"] == 0.0 and stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["grad_norm"] > 0 and stats["lr"] == pytest.approx(1e-2)
    assert stats["logprob_gap"] > 0  # the fake rollout logprobs (-1.0) are not the model's


def test_equal_rewards_give_zero_advantage_and_no_change(tiny_model_dir):
    policy = Policy(tiny_model_dir, "float32")
    trainer = GRPOTrainer(policy, config(weight_decay=0.0))
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    trees = training_trees(Selection({0: (0, 1)}, 1, 0, 0, 0, 2, 2, 0).pick([[sample([20, 21], 1.0), sample([30], 1.0)]]))
    trainer.update(trees, config())
    assert all(torch.equal(before[n], p) for n, p in policy.model.named_parameters())


def test_the_probe_computes_with_the_weights_a_bf16_sync_sends_and_keeps_the_fp32_masters(tiny_model_dir):
    policy = Policy(tiny_model_dir, "float32")
    parameters = list(policy.model.parameters())
    with torch.no_grad():
        for parameter in parameters:  # on bf16 values, as the weights a base model stored in bf16 start
            parameter.copy_(parameter.to(torch.bfloat16))
    (batch,) = pack([Tree(PROMPT, [Branch([20, 21, 22], [1, 1, 1])])], 1000)
    before = policy.no_grad_logprobs(batch), policy.no_grad_logprobs(batch, 1.0, torch.bfloat16)
    with torch.no_grad():
        for parameter in parameters:  # a relative step of 1e-4, far under half a bf16 step (2^-9)
            parameter.add_(parameter.abs() * 1e-4)
    masters = [parameter.detach().clone() for parameter in parameters]
    after = policy.no_grad_logprobs(batch), policy.no_grad_logprobs(batch, 1.0, torch.bfloat16)
    assert not torch.equal(after[0], before[0])  # the fp32 masters moved
    assert torch.equal(after[1], before[1])  # what a bf16 engine receives did not: its probe must not expect a move
    assert all(torch.equal(parameter, master) for parameter, master in zip(parameters, masters))


def test_the_zero_learning_rate_control_never_changes_a_weight(tiny_model_dir):
    # The recipe bench evaluates the start model as the control on this ground: with a learning signal,
    # weight decay on and several steps, AdamW at lr 0 leaves every weight bit-identical.
    control = config(learning_rate=0.0, weight_decay=0.1, warmup_steps=2)
    policy = Policy(tiny_model_dir, "float32")
    trainer = GRPOTrainer(policy, control)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    stats = [trainer.update(signal_trees(), control) for _ in range(3)]
    assert all(s["grad_norm"] > 0 for s in stats)  # there was something to learn
    assert all(torch.equal(before[n], p) for n, p in policy.model.named_parameters())


@pytest.mark.parametrize("overrides", [{"old_logprobs": "rollout"}, {"tis_cap": 2.0}])
def test_rollout_logprobs_as_old_policy_and_truncated_is_weights_still_learn(tiny_model_dir, overrides):
    policy = Policy(tiny_model_dir, "float32")
    trainer = GRPOTrainer(policy, config(**overrides))
    good = [20, 21, 22]
    before = logprob_of(policy, good)
    trees = training_trees(Selection({0: (0, 1)}, 1, 0, 0, 0, 2, 1, 1).pick([[sample(good, 1.0), sample([30, 31, 32], 0.0)]]))
    stats = trainer.update(trees, config(**overrides))
    assert logprob_of(policy, good) > before
    if overrides.get("old_logprobs") == "rollout":
        assert stats["ratio_mean"] != pytest.approx(1.0)  # pi_theta / pi_rollout, and the fake rollout logprobs are -1


def test_two_mini_batches_update_twice_against_the_old_policy(tiny_model_dir):
    policy = Policy(tiny_model_dir, "float32")
    trainer = GRPOTrainer(policy, config(mini_batches_per_step=2, token_budget=64))
    # Two groups of 30-token answers: 4 + 2 x 30 = 64 slots each, so each group is its own forward pass.
    long = [list(range(10 + i, 40 + i)) for i in range(4)]
    groups = [[sample(long[0], 1.0), sample(long[1], 0.0)], [sample(long[2], 1.0), sample(long[3], 0.0)]]
    stats = trainer.update(training_trees(Selection({0: (0, 1), 1: (0, 1)}, 2, 0, 0, 0, 4, 2, 2).pick(groups)), config(mini_batches_per_step=2, token_budget=64))
    # The second mini-batch runs on weights the first update moved, against logprobs from before it.
    assert stats["rows"] == 2 and stats["ratio_mean"] != pytest.approx(1.0, abs=1e-6)
    assert trainer.optimizer.state[next(iter(policy.trainable_parameters()))]["step"] == 2


def test_split_by_tokens_keeps_order_and_balances():
    batches = pack([Tree([1, 2], [Branch([3] * n, [1] * n)]) for n in (5, 5, 5, 5)], token_budget=8)
    chunks = split_by_tokens(batches, 2)
    assert [len(c) for c in chunks] == [2, 2]
    assert split_by_tokens(batches, 9) == [[b] for b in batches]


def test_step_metrics_count_tool_errors_among_all_positives_and_among_kept_ones_apart():
    from rstar.rl.data import Problem
    from rstar.rl.grpo.downsample import Selection
    from rstar.rl.grpo.samples import Sample
    from rstar.rl.grpo.train import rollout_metrics
    from rstar.server.trajectory import ToolCallRecord, Trajectory

    def sample(reward: float, failed_calls: int, clean_calls: int) -> Sample:
        calls = [ToolCallRecord(0, i, "", "python", {}, None, "", exec_status="error" if i < failed_calls else "ok", success=i >= failed_calls)
                 for i in range(failed_calls + clean_calls)]
        return Sample(Problem("p", "q", "1"), Trajectory([1], tool_calls=calls), reward, "ok")

    # Four positives, two with a failing call; selection kept the two clean ones and one negative.
    group = [sample(1.0, 1, 1), sample(1.0, 1, 1), sample(1.0, 0, 2), sample(1.0, 0, 2), sample(0.0, 2, 0)]
    selection = Selection({0: (2, 3, 4)}, 1, 0, 0, 0, 3, 2, 1)
    metrics = rollout_metrics([group], selection, selection.pick([group]))
    assert metrics["tool_error_rate_positive"] == 2 / 8  # before selection: the paper's measure
    assert metrics["tool_error_rate_kept_positive"] == 0.0  # after it: low because RoC chose so
    assert metrics["tool_error_rate"] == 4 / 10


def test_a_repeated_step_asks_for_the_same_problems_with_the_same_seeds(default_tokenizer):
    """What a resumed step repeats exactly: its problems (data_order) and every turn's sampling seed."""
    import asyncio

    from rstar.rl.data import Problem
    from rstar.rl.grpo.config import GRPOConfig
    from rstar.rl.grpo.rollout import RolloutEnv, generate
    from rstar.rl.grpo.train import data_order
    from rstar.server.chat_template import rstar_template
    from tests.scripted_engine import call, scripted_engine
    from tests.scripted_sandbox import ScriptedSandbox

    problems = [Problem(str(i), f"What is {i} + {i}?", str(2 * i)) for i in range(10)]
    config = GRPOConfig(prompts_per_step=3, rollouts_per_prompt=2, keep_per_prompt=2, min_positive_traces=1, min_negative_traces=1, max_turns=2, max_response_tokens=512)

    def step(seed: int, number: int) -> tuple[list[int], list[tuple[int, int | None]]]:
        batch = data_order(len(problems), seed, cursor=3 * number, take=3)
        engine = scripted_engine(default_tokenizer, [call("print(1)")])  # every turn calls: each sample takes both turns
        env = RolloutEnv(engine, rstar_template(default_tokenizer), ScriptedSandbox())
        asyncio.run(generate(env, [problems[i] for i in batch], 2, config, seed, number))
        return batch, sorted((len(prompt), options.seed) for prompt, options in zip(engine.prompts, engine.sampling))

    first, again = step(seed=7, number=4), step(seed=7, number=4)
    assert first == again
    seeds = [seed for _, seed in first[1]]
    assert len(seeds) == 12 and len(set(seeds)) == 12  # 3 problems x 2 samples x 2 turns, each its own seed
    assert step(seed=8, number=4) != first and step(seed=7, number=5) != first


def signal_trees():
    groups = [[sample([20, 21, 22], 1.0), sample([30, 31, 32], 0.0)]]
    return training_trees(Selection({0: (0, 1)}, 1, 0, 0, 0, 2, 1, 1).pick(groups))


def test_the_learning_rate_warms_up_linearly_and_a_stage_reset_starts_it_again(tiny_model_dir):
    warm = config(warmup_steps=3)
    trainer = GRPOTrainer(Policy(tiny_model_dir, "float32"), warm)
    rates = [trainer.update(signal_trees(), warm)["lr"] for _ in range(4)]
    assert rates == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2])  # step k learns at (k + 1) / warm-up of the rate
    assert trainer.optimizer.state  # AdamW moments gathered
    trainer.reset_optimizer(warm)  # a stage with reset_optimizer (the paper's stage 3)
    assert not trainer.optimizer.state
    assert trainer.update(signal_trees(), warm)["lr"] == pytest.approx(1e-2 / 3)


def test_an_unsolved_filter_keeps_the_problems_the_policy_does_not_solve_every_time(default_tokenizer):
    import asyncio

    from rstar.rl.grpo.recipe import Stage
    from rstar.rl.grpo.rollout import RolloutEnv
    from rstar.rl.grpo.train import stage_data
    from rstar.sandbox.schemas import VerifyResult
    from rstar.sandbox.verify import score
    from rstar.server.chat_template import rstar_template
    from tests.scripted_engine import scripted_engine
    from tests.scripted_sandbox import ScriptedSandbox

    class Grading(ScriptedSandbox):
        async def verify(self, response, gold, timeout_s=None, rule="boxed"):
            return VerifyResult(correct=score(response, gold, rule), status="ok")

    def filtered(problems, **stage_fields):
        engine = scripted_engine(default_tokenizer, ["</reason>\n<answer>\\boxed{2}</answer>"])  # always answers 2
        env = RolloutEnv(engine, rstar_template(default_tokenizer), Grading())
        stage = Stage(name="hard", steps=1, filter="unsolved", filter_samples=2, **stage_fields)
        return asyncio.run(stage_data(env, stage, config(max_turns=1, max_response_tokens=64), problems, None, step=5))

    problems = [Problem(str(i), f"What is {i}?", answer) for i, answer in enumerate(["2", "3", "2", "4"])]
    assert [p.id for p in filtered(problems)] == ["1", "3"]
    subset = filtered(problems, filter_max_problems=2)  # a seeded subset of the problems is judged
    assert {p.id for p in subset} <= {"1", "3"} and subset == filtered(problems, filter_max_problems=2)
    with pytest.raises(ValueError, match="stage 'hard': the policy solves every judged problem 2/2"):
        filtered([problems[0], problems[2]])
