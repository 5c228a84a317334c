"""The non-reasoning SFT stage (paper §4.1): teach a model the tool format before RL.

Conversations are encoded as the server would serve them (`sft_encoding`); loss is the mean negative
log-likelihood of the model's own tokens. Every conversation opens with the same system prompt and tools
block, so a step's examples are packed as branches of that one shared prefix (`packing`), computed once.
LoRA (peft) or a full fine-tune; the trained LoRA delta exports as one small safetensors file
(`export_delta`), which `rstar model pull` merges onto the verified base model.

A run checkpoints (adapters or weights, optimizer, cursor) and resumes like a GRPO run.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from rstar.rl.checkpoint import TrainerState, latest_checkpoint, prune_checkpoints, read_optimizer_state, read_state, write_checkpoint
from rstar.rl.packing import Branch, Tree, common_prefix_length, pack
from rstar.rl.memory import release_freed_memory
from rstar.rl.plots import plot_run
from rstar.rl.policy import LoraSpec, Policy, model_identity, resolve_compute_dtype
from rstar.rl.runs import RunStore
from rstar.rl.sft.encoding import EncodedConversation
from rstar.rl.tensor_files import write_safetensors


class SFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epochs: float = Field(2.0, gt=0, description="Passes over the data [paper: 3].")
    examples_per_step: int = Field(16, ge=1, description="Conversations per optimizer step [paper: 128, for a 14B model].")
    learning_rate: float = Field(1e-3, gt=0, description="Peak learning rate [paper: 5e-6 full fine-tune]; LoRA wants a far larger one.")
    warmup_ratio: float = Field(0.04, ge=0, lt=1, description="Share of steps warming up linearly [paper: 4%], then cosine decay to 0.")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    lora_rank: int | None = Field(8, ge=1, description="LoRA rank on every attention and MLP projection; None: full fine-tune.")
    lora_alpha: int = Field(16, ge=1)
    compute_dtype: str = Field("auto", description="auto: bf16 where the hardware has it, else fp32 (master weights stay fp32).")
    token_budget: int = Field(4096, ge=64, description="Tokens per forward pass (shared prefix once + padded branches); peak memory grows with it: about 9 GB at 4096 for the default model.")
    seed: int = 0
    save_every: int = Field(20, ge=1, description="Steps between checkpoints.")
    keep_checkpoints: int = Field(2, ge=1)

    def lora(self) -> LoraSpec | None:
        return None if self.lora_rank is None else LoraSpec(rank=self.lora_rank, alpha=self.lora_alpha)


def sft_trees(examples: Sequence[EncodedConversation]) -> list[Tree]:
    """One tree for a step's examples: their common prompt prefix once, each example's rest as a branch."""
    shared = common_prefix_length([e.prompt_ids for e in examples])
    branches = [Branch(e.prompt_ids[shared:] + e.response_ids, [0] * (len(e.prompt_ids) - shared) + e.loss_mask) for e in examples]
    return [Tree(examples[0].prompt_ids[:shared], branches)]


def cosine_with_warmup(step: int, total: int, warmup: int) -> float:
    """Learning-rate factor of step `step` (from 0): linear warm-up, then cosine decay to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def step_batches(count: int, per_step: int, epochs: float, seed: int) -> list[list[int]]:
    """Example indices of every step: a seeded shuffle per epoch, the last batch of the run possibly short."""
    total = math.ceil(count * epochs)
    order: list[int] = []
    epoch = 0
    while len(order) < total:
        permutation = list(range(count))
        random.Random(f"{seed}/sft/{epoch}").shuffle(permutation)
        order += permutation
        epoch += 1
    order = order[:total]
    return [order[i : i + per_step] for i in range(0, total, per_step)]


@dataclass(frozen=True)
class SFTSpec:
    run_id: str
    run_dir: Path
    model_dir: Path
    data: str


class SFTTrainer:
    def __init__(self, policy: Policy, config: SFTConfig, total_steps: int):
        self.policy, self.config = policy, config
        self.optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        warmup = max(1, round(config.warmup_ratio * total_steps)) if config.warmup_ratio else 0
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: cosine_with_warmup(s, total_steps, warmup))

    def step(self, examples: Sequence[EncodedConversation]) -> dict:
        started = time.perf_counter()
        rows = pack(sft_trees(examples), self.config.token_budget)
        tokens = sum(row.num_loss_tokens for row in rows)
        self.optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        for row in rows:
            logprobs = self.policy.logprobs(row)
            loss = -logprobs.sum() / tokens
            loss.backward()
            loss_total += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.trainable_parameters(), self.config.grad_clip).item()
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        release_freed_memory()
        return {"loss": loss_total, "grad_norm": grad_norm, "lr": lr, "train_tokens": tokens, "packed_tokens": sum(r.num_tokens for r in rows), "train_s": time.perf_counter() - started}

    def optimizer_state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_optimizer_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


Progress = Callable[[int, int, dict], None]
ADAPTER_FILE = "adapter.safetensors"


def _write_trainable(policy: Policy, directory: Path) -> None:
    """A checkpoint's model part: the adapters alone for LoRA (a few MB), else the full servable model."""
    if policy.lora is None:
        policy.save_pretrained(directory)
        return
    trainable = ((name, p) for name, p in policy.model.named_parameters() if p.requires_grad)
    write_safetensors(trainable, directory / ADAPTER_FILE)


def _load_trainable(policy: Policy, directory: Path) -> None:
    if policy.lora is None:
        policy.load_weights(directory)
        return
    from safetensors.torch import load_file

    saved = load_file(str(directory / ADAPTER_FILE))
    parameters = dict(policy.model.named_parameters())
    if set(saved) != {name for name, p in parameters.items() if p.requires_grad}:
        raise ValueError(f"{directory / ADAPTER_FILE} holds other adapters than this run's (a different LoRA rank or target modules?)")
    with torch.no_grad():
        for name, tensor in saved.items():
            parameters[name].copy_(tensor)


def train_sft(spec: SFTSpec, config: SFTConfig, examples: list[EncodedConversation], store: RunStore, progress: Progress = lambda step, total, metrics: None) -> str:
    """Run (or resume) SFT to the end; writes RUN_DIR/final (merged model) and, with LoRA, RUN_DIR/delta.safetensors."""
    batches = step_batches(len(examples), config.examples_per_step, config.epochs, config.seed)
    store.begin(spec.run_id, "sft", str(spec.model_dir), {"sft": config.model_dump()}, spec.data, str(spec.run_dir), len(batches))
    with store.failed_on_error(spec.run_id):
        status = _train_sft(spec, config, examples, batches, store, progress)
    store.finish(spec.run_id, status)
    return status


def _train_sft(spec: SFTSpec, config: SFTConfig, examples: list[EncodedConversation], batches: list[list[int]], store: RunStore, progress: Progress) -> str:
    dtype, _ = resolve_compute_dtype(config.compute_dtype)
    torch.manual_seed(config.seed)  # LoRA's A matrices start random: seeded, so a rerun trains the same model
    policy = Policy(spec.model_dir, dtype, lora=config.lora())
    trainer = SFTTrainer(policy, config, len(batches))
    identity = model_identity(spec.model_dir)
    state = TrainerState(step=0, data_cursor=0, model_identity=identity)
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = latest_checkpoint(spec.run_dir)
    if checkpoint is not None:
        state = read_state(checkpoint, identity)
        _load_trainable(policy, checkpoint)
        trainer.load_optimizer_state(read_optimizer_state(checkpoint))
    store.forget_steps_after(spec.run_id, state.step)

    for step in range(state.step, len(batches)):
        if store.cancel_requested(spec.run_id):
            return "cancelled"
        metrics = trainer.step([examples[i] for i in batches[step]])
        state.step = state.data_cursor = step + 1
        store.record_step(spec.run_id, state.step, "sft", metrics)
        if state.step % config.save_every == 0 or state.step == len(batches):
            path = write_checkpoint(spec.run_dir, state, lambda d: _write_trainable(policy, d), trainer.optimizer_state())
            removed = prune_checkpoints(spec.run_dir, config.keep_checkpoints)
            store.record_checkpoint(spec.run_id, state.step, str(path), [str(p) for p in removed])
            plot_run(store.get(spec.run_id)["steps"], spec.run_dir / "curves.png", spec.run_id)
        progress(state.step, len(batches), metrics)

    policy.save_pretrained(spec.run_dir / "final")
    if policy.lora is not None:
        export_delta(policy, spec.model_dir, spec.run_dir / "delta.safetensors", {"run_id": spec.run_id, "data": spec.data, "config": config.model_dump_json()})
    return "finished"


def export_delta(policy: Policy, base_dir: Path, path: Path, provenance: dict) -> None:
    """The trained adapters as the server's LoRA delta file (`rstar.server.lora_delta`), in fp16."""
    from rstar.server.lora_delta import write_delta

    adapters = {}
    for name, module in policy.model.get_base_model().named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            adapters[name] = (module.lora_A["default"].weight.detach(), module.lora_B["default"].weight.detach(), float(module.scaling["default"]))
    write_delta(path, adapters, base_dir, provenance)
