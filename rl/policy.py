"""The trainer's side of the model: a transformers causal LM in torch, fp32 master weights, computing in
the fastest dtype the hardware has (`rstar.hardware.fast_dtype`), and logprobs of packed rows.

Logits are computed only where a loss token is predicted (`ForwardBatch.predict_from`): with a 49K vocabulary
the output projection is a fifth of SmolLM2-135M's compute, and prompts are most of every sequence.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from rstar.hardware import fast_dtype
from rstar.rl.packing import ForwardBatch, hidden_states
from rstar.rl.tensor_files import write_safetensors

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's name, which vLLM's LoRA loader reads
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LoraSpec:
    """Low-rank adapters on the attention and MLP projections (peft); the base weights stay frozen."""

    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_compute_dtype(setting: str) -> tuple[str, str]:
    """('float32' | 'bfloat16', why): a setting other than 'auto' is taken as given."""
    if setting != "auto":
        return setting, "set explicitly"
    return fast_dtype()


class Policy:
    """One model being trained. `logprobs(row)` is differentiable; everything else is bookkeeping."""

    def __init__(self, model_dir: str | Path, compute_dtype: str, lora: LoraSpec | None = None, gradient_checkpointing: bool = False):
        from transformers import AutoModelForCausalLM

        self.model_dir = Path(model_dir)
        self.compute_dtype = compute_dtype
        self.device = torch.device(device_type())
        # fp32 master weights: AdamW's small updates (lr 1e-6) vanish when added to bf16 weights.
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32, attn_implementation="sdpa")
        model.config.use_cache = False
        self.lora = lora
        if lora is not None:
            from peft import LoraConfig, get_peft_model

            config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules), bias="none")
            model = get_peft_model(model, config)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if lora is not None:
                model.enable_input_require_grads()
        self.model = model.to(self.device)
        self.model.train()
        self.forward_module = LogprobModule(self.causal_lm, self.device, self.autocast)
        self.sharded = False  # set by rstar.rl.grpo.distributed.shard: weights are FSDP2 shards across ranks

    @property
    def causal_lm(self):
        """The transformers model underneath any adapter wrapper."""
        return self.model.get_base_model() if self.lora is not None else self.model

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def autocast(self):
        dtype = DTYPES[self.compute_dtype]
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def logprobs(self, batch: ForwardBatch, temperature: float = 1.0) -> torch.Tensor:
        """Log-probability of each loss token of the batch under the current weights ([N], fp32).

        Divided by the sampling temperature, as the rollout engine's processed logprobs are.
        """
        return self.forward_module(batch, temperature)

    @torch.no_grad()
    def no_grad_logprobs(self, batch: ForwardBatch, temperature: float = 1.0, weights_dtype: torch.dtype | None = None) -> torch.Tensor:
        """weights_dtype: the weight-sync probe's reference, the weights as a sync in that dtype sends them (each
        rounded to it), computed in fp32. Rounding noise on this side would pull the probe's slope toward 0 (the
        engine's change is regressed on this one), so the reference computes exactly and the noise stays the engine's."""
        self.model.eval()  # no LoRA dropout: the probe compares these with the engine's, which has none
        try:
            with self.weights_rounded_to(weights_dtype):
                if weights_dtype is not None:
                    self.forward_module.autocast = contextlib.nullcontext
                logprobs = self.logprobs(batch, temperature)
                if self.sharded:
                    # FSDP2 keeps the root's weights gathered after its forward, for the backward that usually follows; none
                    # follows this one, and until resharded the module's parameters are not the optimizer's (sharded) ones.
                    self.forward_module.reshard()
        finally:
            self.forward_module.autocast = self.autocast
            self.model.train()
        return logprobs

    @contextlib.contextmanager
    def weights_rounded_to(self, dtype: torch.dtype | None):
        """Every parameter holds its value rounded to `dtype` inside the block, its fp32 master value after it.

        An update smaller than half a bf16 step leaves a weight's bf16 copy unchanged, and the weights the base
        model stored in bf16 (those no adapter touched: embeddings, norms) start exactly on bf16 values, so what a
        bf16 engine receives can move less than the fp32 masters do. The weights a sync sends are the rounded ones.
        """
        if dtype is None or dtype == torch.float32:
            yield
            return
        masters = [(parameter, parameter.detach().clone()) for parameter in self.model.parameters()]
        try:
            with torch.no_grad():
                for parameter, master in masters:
                    parameter.copy_(master.to(dtype))
            yield
        finally:
            with torch.no_grad():
                for parameter, master in masters:
                    parameter.copy_(master)

    def merged_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full model's weights under the base model's names (adapters merged in, fp32, detached).

        Sharded, every rank must call this (the shards are gathered, one collective a tensor); rank 0 receives
        the full weights in CPU memory, one copy, and the other ranks nothing.
        """
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            if self.lora is not None:  # a LoRA run syncs and checkpoints its adapter (adapter_state_dict), never merged weights
                raise ValueError("merged weights of a sharded LoRA policy are not gathered; use adapter_state_dict")
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            yield from get_model_state_dict(self.causal_lm, options=options).items()
            return
        if self.lora is None:
            yield from ((name, tensor.detach()) for name, tensor in self.model.state_dict().items())
            return
        # Merge into copies of the weights: the adapters keep training after this.
        deltas = lora_deltas(self.model)
        for name, tensor in self.causal_lm.state_dict().items():
            if "lora_" in name:
                continue
            clean = name.replace("base_layer.", "")
            delta = deltas.get(clean)
            yield clean, (tensor.detach() + delta if delta is not None else tensor.detach())

    def load_weights(self, model_dir: Path) -> None:
        """Load a checkpoint's full weights (as `save_pretrained` wrote them) into a policy without adapters."""
        from safetensors.torch import load_file

        if self.lora is not None:
            raise ValueError("loading full weights into a LoRA policy is not supported; start from that checkpoint instead")
        state = load_file(str(Path(model_dir) / "model.safetensors"))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or set(missing) - tied_names(self.model):
            raise ValueError(f"{model_dir} does not match this model: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")

    def save_adapter(self, out_dir: Path, dtype: torch.dtype | None = None) -> int:
        """The LoRA adapter alone, as peft writes it (`adapter_config.json`, naming the base, and `ADAPTER_WEIGHTS`):
        what vLLM loads onto the base it serves, a few MB where the merged model is the whole model. Returns the
        weights' bytes."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.model.peft_config["default"].save_pretrained(out_dir)
        return write_safetensors(self.adapter_state_dict().items(), out_dir / ADAPTER_WEIGHTS, dtype)

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter's tensors under peft's names. Sharded, every rank must call this: rank 0 receives them whole,
        in CPU memory, and the other ranks nothing."""
        from peft import get_peft_model_state_dict

        if not self.sharded:
            return get_peft_model_state_dict(self.model)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)  # the base is not gathered
        return get_peft_model_state_dict(self.model, state_dict=get_model_state_dict(self.model, options=options))

    def save_pretrained(self, out_dir: Path) -> None:
        """A complete checkpoint the engine and transformers load: merged weights, config, tokenizer files."""
        out_dir.mkdir(parents=True, exist_ok=True)
        tied = tied_names(self.causal_lm)  # saved once, as transformers does; the loader re-ties them
        write_safetensors(((n, t) for n, t in self.merged_state_dict() if n not in tied), out_dir / "model.safetensors")
        self.causal_lm.config.save_pretrained(out_dir)
        copy_tokenizer_files(self.model_dir, out_dir)


class LogprobModule(torch.nn.Module):
    """The causal LM's forward as the trainer needs it: packed rows in, loss tokens' logprobs out.

    A module of its own so that the whole computation is one `forward` call: FSDP2's root hooks (gather the
    shards, then free them) run on module forwards, and this one calls the decoder and the output head directly.
    """

    def __init__(self, causal_lm, device: torch.device, autocast):
        super().__init__()
        self.lm = causal_lm
        self.device = device
        self.autocast = autocast

    def forward(self, batch: ForwardBatch, temperature: float) -> torch.Tensor:
        lm, device = self.lm, self.device
        with self.autocast():
            hidden = hidden_states(lm.get_decoder(), batch, device)
            logits = lm.get_output_embeddings()(hidden[batch.predict_from.to(device)])
        logits = logits.float()
        if temperature != 1.0:
            logits = logits / temperature
        targets = batch.targets.to(device)
        return logits.gather(-1, targets[:, None])[:, 0] - logits.logsumexp(-1)


def lora_deltas(peft_model) -> dict[str, torch.Tensor]:
    """scale * B @ A for every adapted Linear, keyed by the base weight's name in the plain model."""
    deltas = {}
    for name, module in peft_model.get_base_model().named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            a = module.lora_A["default"].weight.detach()
            b = module.lora_B["default"].weight.detach()
            deltas[f"{name}.weight"] = (b @ a) * module.scaling["default"]
    return deltas


def tied_names(model) -> set[str]:
    """Parameter names that share storage with another (tied embeddings): saved once, as transformers does."""
    tied = set()
    if getattr(model.config, "tie_word_embeddings", False):
        tied.add("lm_head.weight")
    return tied


# What a model directory needs besides weights and config for the engine and the server to load it.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json")


def copy_tokenizer_files(source: Path, target: Path) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            (target / name).write_bytes((source / name).read_bytes())


def model_identity(model_dir: Path) -> dict:
    """What makes two checkpoints the same model family: architecture and shapes, from config.json."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    keys = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
    return {key: config.get(key) for key in keys}
