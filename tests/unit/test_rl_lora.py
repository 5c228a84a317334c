"""LoRA RL on the trainer's side (a tiny Llama, no engine): only the adapter trains, its checkpoint resumes."""

from __future__ import annotations

import pytest
import torch

from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.train import engine_lora_rank
from rstar.rl.grpo.trainer import GRPOTrainer
from rstar.rl.packing import Branch, Tree, pack
from rstar.rl.policy import ADAPTER_WEIGHTS, Policy


CONFIG = GRPOConfig(lora_rank=4, learning_rate=1e-2, warmup_steps=0, weight_decay=0.0, compute_dtype="float32")
TREE = Tree([1, 2, 3, 4], [Branch([5, 6, 7], [1, 1, 1], {"advantage": [1.0] * 3, "rollout_logprobs": [-4.0] * 3}),
                           Branch([8, 9, 10], [1, 1, 1], {"advantage": [-1.0] * 3, "rollout_logprobs": [-4.0] * 3})])


def lora_trainer(model_dir, seed: int) -> GRPOTrainer:
    torch.manual_seed(seed)
    return GRPOTrainer(Policy(model_dir, "float32", lora=CONFIG.lora()), CONFIG)


def test_a_lora_step_changes_only_the_adapter_and_leaves_the_base_bit_identical(tiny_model_dir):
    trainer = lora_trainer(tiny_model_dir, 0)
    before = {name: p.detach().clone() for name, p in trainer.policy.model.named_parameters()}
    trainer.update([TREE], CONFIG)
    changed = {name for name, p in trainer.policy.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all("lora_" in name for name in changed)
    assert all(torch.equal(p, before[name]) for name, p in trainer.policy.model.named_parameters() if "lora_" not in name)


def test_a_lora_checkpoint_holds_the_adapter_and_adamw_and_resumes(tiny_model_dir, tmp_path):
    trainer = lora_trainer(tiny_model_dir, 0)
    trainer.update([TREE], CONFIG)
    trainer.save_training_state(tmp_path)
    trainer.policy.save_adapter(tmp_path)
    assert (tmp_path / "adapter_config.json").is_file() and (tmp_path / ADAPTER_WEIGHTS).is_file() and not (tmp_path / "config.json").exists()
    resumed = lora_trainer(tiny_model_dir, 1)  # other random A factors, which the checkpoint replaces
    resumed.load_training_state(tmp_path)
    trainer.update([TREE], CONFIG)
    resumed.update([TREE], CONFIG)  # equal only if AdamW's moments came back too
    for a, b in zip(trainer.policy.model.parameters(), resumed.policy.model.parameters()):
        assert torch.equal(a, b)


def test_two_sharded_ranks_train_the_adapter_one_rank_trains(tiny_model_dir, tmp_path):
    """FSDP2 over the peft model (gloo, a spawned rank). Two updates: one group each, of unequal lengths, then one
    group (the other rank runs a padding pass); a clip that binds, which with Adam shows from the second update on
    (the adapter's gradient norm must be the global one). The adapter the sync writes on rank 0 after each is the
    one-rank trainer's. Their sharded checkpoint (adapter and AdamW, no base) resumes on one rank: a third update
    there ends where the one-rank trainer's third ends."""
    from safetensors.torch import load_file

    from rstar.rl.grpo.distributed import check_world_size
    from rstar.rl.grpo.ranks import TrainerRanks

    try:
        check_world_size(2)
    except ValueError as exc:  # one core
        pytest.skip(str(exc))
    config = CONFIG.model_copy(update={"grad_clip": 0.01})
    longer = Tree([11, 12], [Branch([13, 14, 15, 16, 17, 18], [1] * 6, {"advantage": [0.5] * 6, "rollout_logprobs": [-4.0] * 6}),
                             Branch([19, 20], [1, 1], {"advantage": [-0.5] * 2, "rollout_logprobs": [-4.0] * 2})])
    steps = [[TREE, longer], [longer]]
    single = lora_trainer(tiny_model_dir, CONFIG.seed)
    start = {name: tensor.clone() for name, tensor in single.policy.adapter_state_dict().items()}
    one, one_adapters = [], []
    for trees in steps:
        one.append(single.update(trees, config))
        one_adapters.append({name: tensor.clone() for name, tensor in single.policy.adapter_state_dict().items()})
    two, two_adapters = [], []
    with TrainerRanks(tiny_model_dir, "float32", config, size=2) as ranks:
        for index, trees in enumerate(steps):
            two.append(ranks.update(trees, config))
            ranks.policy.save_adapter(tmp_path / str(index))  # what the weight sync writes
            two_adapters.append(load_file(str(tmp_path / str(index) / ADAPTER_WEIGHTS)))
        ranks.save_training_state(tmp_path / "checkpoint")
    assert one[0]["grad_norm"] > 10 * config.grad_clip  # the clip binds
    assert max((one_adapters[0][n] - start[n]).abs().max().item() for n in start) > 1e-4  # the update is far above the tolerance
    for a, b, expected, synced in zip(one, two, one_adapters, two_adapters):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6) and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert sorted(synced) == sorted(expected) and all("lora_" in name for name in synced)
        worst = max((synced[n] - expected[n]).abs().max().item() for n in expected)
        assert worst <= 1e-5, f"two ranks' adapter differs from one rank's by {worst}"
    resumed = lora_trainer(tiny_model_dir, seed=1)  # other random A factors, which the checkpoint replaces
    resumed.load_training_state(tmp_path / "checkpoint")
    single.update([TREE], config)
    resumed.update([TREE], config)  # equal only if AdamW's moments came back too
    after, expected = resumed.policy.adapter_state_dict(), single.policy.adapter_state_dict()
    assert max((after[n] - expected[n]).abs().max().item() for n in expected) <= 1e-5


def test_the_engine_gets_the_smallest_lora_rank_vllm_takes_that_fits():
    assert [engine_lora_rank(r) for r in (0, 4, 8, 9, 64)] == [0, 8, 8, 16, 64]
    assert GRPOConfig(lora_rank=8).lora().alpha == 16  # the SFT stage's alpha / rank


def test_a_lora_checkpoint_served_without_its_base_is_refused_naming_the_merge(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from rstar.cli import app
    from rstar.server.model_store import ModelNotFound, resolve_model

    lora_trainer(tiny_model_dir, 0).policy.save_adapter(tmp_path / "checkpoint-1")
    with pytest.raises(ModelNotFound, match="rstar rl merge-lora .* --out DIR") as refused:
        resolve_model(str(tmp_path / "checkpoint-1"), tmp_path / "models", pull=False)
    assert str(tiny_model_dir) in str(refused.value) and "\n" not in str(refused.value)
    result = CliRunner().invoke(app, ["rl", "merge-lora", str(tmp_path / "checkpoint-1"), "--out", str(tmp_path / "merged")])
    assert result.exit_code == 0, result.output
    assert resolve_model(str(tmp_path / "merged"), tmp_path / "models", pull=False).source == "local"


class AdapterEngine:
    """An engine stand-in that serves a second copy of the policy and loads the sync's adapter files into it with
    peft (as vLLM reads them); `stale` keeps the adapter it had."""

    def __init__(self, model_dir, stale: bool):
        torch.manual_seed(0)
        self.served = Policy(model_dir, "float32", lora=CONFIG.lora())
        self.stale = stale
        self.weight_version = 0

    async def load_adapter(self, adapter_dir) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        if not self.stale:
            set_peft_model_state_dict(self.served.model, load_file(str(adapter_dir / ADAPTER_WEIGHTS)))
        self.weight_version += 1

    async def replica_prompt_logprobs(self, token_ids) -> dict[int, list[float]]:
        row = pack([Tree(list(token_ids[:1]), [Branch(list(token_ids[1:]), [1] * (len(token_ids) - 1))])], len(token_ids))[0]
        return {0: self.served.no_grad_logprobs(row).tolist()}


@pytest.mark.parametrize("stale", [False, True])
def test_the_probe_passes_the_synced_adapter_and_stops_a_stale_one(tiny_model_dir, stale):
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from rstar.rl.grpo.weight_sync import WeightSync, WeightSyncFailed

    trainer = lora_trainer(tiny_model_dir, 0)
    engine = AdapterEngine(tiny_model_dir, stale)
    trainer.update([TREE], CONFIG)
    with ThreadPoolExecutor(max_workers=1) as torch_thread:
        sync = WeightSync(engine, trainer.policy, list(range(1, 30)), 1e-3, "float32", torch_thread)
        try:
            if stale:
                with pytest.raises(WeightSyncFailed, match="not serving the trained weights"):
                    asyncio.run(sync.sync())
            else:
                assert asyncio.run(sync.sync()).probe_gap < 1e-5
        finally:
            sync.close()
