"""Will a run fit? What each trainer rank holds, from a model's shape and a recipe's lengths; pure arithmetic.

`rstar rl plan` prints this before a week-long run is launched. Assumptions, each as the trainer does it:

- Full fine-tune, 16 bytes a parameter, sharded 1/N by FSDP2: fp32 weights (4; `Policy` keeps fp32 master
  weights, since AdamW's lr-1e-6 updates vanish in bf16, and computes under autocast, so there is no second
  bf16 copy), fp32 gradients (4; FSDP reduce-scatters in the parameter dtype), AdamW's two fp32 moments (8).
- LoRA (rank R on the seven projections of every layer, `LoraSpec`): the frozen base at 4 bytes (fp32, as
  `Policy` loads it), the adapters at 16.
- Sharded (N > 1), a unit's full weights exist while it computes: the root (embeddings, output head, final
  norm) for the whole pass and two decoder layers (the one computing and the one prefetched), each with its
  unsharded gradient before the reduce-scatter. One rank alone holds no such copy.
- Activations are not sharded: every rank trains whole packed rows of its own. The trainer runs one row at a
  time, forward then backward, so the peak is one row of T = max(token_budget, max prompt + max response)
  tokens (a group longer than the budget still gets a row of its own, `packing.pack`). Per token and decoder
  layer the backward keeps about 4H + 2(q + kv) + 4I values in the compute dtype (the two norms' and the
  projections' inputs, q, k, v, the attention output, the MLP's gate, up, their product and its activation;
  attention by a fused kernel, so no T^2 term). With gradient checkpointing only each layer's input stays
  (H per token, fp32 residual stream) plus one layer recomputed. The output head's logits exist only for loss
  tokens (at most T - max prompt of them): V values in the compute dtype and their fp32 copy for logsumexp.
- It fits when the total is within HEADROOM of a device's memory (allocator fragmentation, CUDA context, the
  process's own tensors). On CPU all ranks share one machine's RAM, and a sharded rank 0 also gathers the
  full fp32 weights once per weight sync (P x 4 bytes of host memory). The rollout engine is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GB = 1e9
HEADROOM = 0.9  # of a device's memory a plan may fill
WEIGHT_BYTES = 4  # fp32 master weights (and the frozen base under LoRA)
GRADIENT_BYTES = 4  # fp32, the parameters' dtype
ADAM_BYTES = 8  # exp_avg and exp_avg_sq, fp32
LORA_TARGETS = 7  # q, k, v, o, gate, up, down (rstar.rl.policy.LoraSpec)
GATHERED_LAYERS = 2  # FSDP2: the layer computing and the one prefetched


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's sizes, as its config.json gives them."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool  # output head shares the embeddings
    qkv_bias: bool  # Qwen2's q, k, v projections carry biases
    qk_norm: bool  # Qwen3's per-head RMSNorm on q and k


def shape_from_config(config: dict) -> Shape:
    heads = config["num_attention_heads"]
    model_type = config.get("model_type", "")
    return Shape(
        hidden=config["hidden_size"], intermediate=config["intermediate_size"], layers=config["num_hidden_layers"], heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads, head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        vocab=config["vocab_size"], tied=bool(config.get("tie_word_embeddings", False)),
        # Qwen2's config has no attention_bias key: its biases are in the architecture.
        qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")), qk_norm=model_type.startswith("qwen3"),
    )


# Public config.json facts of models a user may plan for before downloading them (Hugging Face model cards).
_QWEN25_1_5B = {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}
_QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
              "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}
# rStar2-Agent-14B is Qwen3-14B-Base trained further: the same shape.
_QWEN3_14B = {"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 40, "num_attention_heads": 40,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False}
KNOWN_CONFIGS = {
    name.lower(): config
    for names, config in (
        (("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-Math-1.5B"), _QWEN25_1_5B),
        (("qwen2.5-7b", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-Math-7B"), _QWEN25_7B),
        (("rstar2-agent-14b", "microsoft/rStar2-Agent-14B", "rstar2-reproduce/rStar2-Agent-14B", "Qwen/Qwen3-14B", "Qwen/Qwen3-14B-Base"), _QWEN3_14B),
    )
    for name in names
}


def parameter_count(shape: Shape) -> int:
    """Every weight of the model: embeddings, decoder layers, final norm, and the output head unless tied."""
    return root_parameters(shape) + shape.layers * layer_parameters(shape)


def layer_parameters(shape: Shape) -> int:
    s = shape
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention = s.hidden * (q + 2 * kv) + q * s.hidden + ((q + 2 * kv) if s.qkv_bias else 0) + (2 * s.head_dim if s.qk_norm else 0)
    return attention + 3 * s.hidden * s.intermediate + 2 * s.hidden  # SwiGLU MLP, two RMSNorms


def root_parameters(shape: Shape) -> int:
    """What FSDP's root unit holds: embeddings, output head unless tied, final norm."""
    return shape.vocab * shape.hidden * (1 if shape.tied else 2) + shape.hidden


def lora_parameters(shape: Shape, rank: int) -> int:
    """rank x (in + out) for each adapted projection of every layer."""
    s = shape
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    per_layer = (s.hidden + q) + 2 * (s.hidden + kv) + (q + s.hidden) + 2 * (s.hidden + s.intermediate) + (s.intermediate + s.hidden)
    return rank * per_layer * s.layers


@dataclass(frozen=True)
class Lengths:
    """What a recipe asks of one packed row (its largest stage)."""

    prompt_tokens: int
    response_tokens: int
    token_budget: int
    gradient_checkpointing: bool
    compute_bytes: int  # 2 for bf16 autocast, 4 for fp32

    @property
    def row_tokens(self) -> int:
        return max(self.token_budget, self.prompt_tokens + self.response_tokens)


def recipe_lengths(shape: Shape, stage_configs, compute_bytes: int) -> Lengths:
    """The recipe's stage whose row needs the most activation memory (`stage_configs`: each stage's GRPOConfig)."""
    rows = [Lengths(c.max_prompt_tokens, c.max_response_tokens, c.token_budget, c.gradient_checkpointing, compute_bytes) for c in stage_configs]
    return max(rows, key=lambda lengths: (activation_bytes(shape, lengths), lengths.response_tokens))


def activation_bytes(shape: Shape, lengths: Lengths) -> int:
    s, t, c = shape, lengths.row_tokens, lengths.compute_bytes
    per_layer_token = 4 * s.hidden + 2 * (s.heads + s.kv_heads) * s.head_dim + 4 * s.intermediate
    if lengths.gradient_checkpointing:
        layers = t * s.layers * s.hidden * 4 + t * per_layer_token * c
    else:
        layers = t * s.layers * per_layer_token * c
    loss_tokens = max(t - lengths.prompt_tokens, 1)
    logits = loss_tokens * s.vocab * (c + 4 if c != 4 else 4)
    return layers + logits


@dataclass(frozen=True)
class RankPlan:
    """Bytes one rank holds; `host_extra` is rank 0's gathered copy of the full weights (a LoRA run's adapter) for
    each weight sync (host memory; sharded runs only). The rollout engine's own memory is not counted."""

    parameters: int
    trainable: int
    weights: int
    gradients: int
    optimizer: int
    gathered: int
    activations: int
    host_extra: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.gathered + self.activations


def plan_rank(shape: Shape, ranks: int, lengths: Lengths, lora_rank: int = 0) -> RankPlan:
    parameters = parameter_count(shape)
    trainable = lora_parameters(shape, lora_rank) if lora_rank else parameters
    base = parameters if lora_rank else 0  # frozen weights: no gradient, no moments
    weights = ((base + trainable) * WEIGHT_BYTES) // ranks
    gradients = trainable * GRADIENT_BYTES // ranks
    optimizer = trainable * ADAM_BYTES // ranks
    gathered = 0
    if ranks > 1:
        unit = root_parameters(shape) + GATHERED_LAYERS * layer_parameters(shape)
        gathered = unit * WEIGHT_BYTES * (1 if lora_rank else 2)  # and their full gradients, unless frozen
    host_extra = 0  # one rank's state dict is its own tensors, not a copy
    if ranks > 1:  # gathered on rank 0 for each sync: the full weights, or a LoRA run's adapter alone
        host_extra = (trainable if lora_rank else parameters) * WEIGHT_BYTES
    return RankPlan(parameters, trainable, weights, gradients, optimizer, gathered, activation_bytes(shape, lengths), host_extra)


@dataclass(frozen=True)
class Devices:
    """Where the ranks run: `count` devices of `memory` bytes each, or (shared) one machine's RAM."""

    kind: str  # "cuda" (NVIDIA or ROCm), "cpu", or "named" (--device-memory-gb)
    count: int
    memory: int
    shared: bool  # True on CPU: every rank draws on the same RAM


def devices_here() -> Devices:
    """The GPUs torch sees (ROCm builds answer to torch.cuda too), each with its own memory; else this machine's
    cores sharing its RAM. The one function here that looks at the machine."""
    import os

    import torch

    from rstar.hardware import usable_cores

    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return Devices("cuda", count, min(torch.cuda.get_device_properties(i).total_memory for i in range(count)), False)
    return Devices("cpu", len(usable_cores()), os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), True)


def needed_on_device(plan: RankPlan, ranks: int, devices: Devices) -> int:
    """What the fullest device must hold: one rank's share, or on shared RAM every rank's plus rank 0's copy."""
    return plan.total * ranks + plan.host_extra if devices.shared else plan.total


def fits(plan: RankPlan, ranks: int, devices: Devices) -> bool:
    return ranks <= devices.count and needed_on_device(plan, ranks, devices) <= HEADROOM * devices.memory


def problem(shape: Shape, ranks: int, lengths: Lengths, lora_rank: int, devices: Devices, max_ranks: int = 1024) -> str | None:
    """None if the plan fits; else one line naming what does not fit and the changes that would make it fit."""
    if ranks > devices.count:
        unit = "CPU cores" if devices.kind == "cpu" else "devices"
        return f"{ranks} ranks but {devices.count} {unit}, one rank each; use --trainer-ranks {devices.count} or fewer, or a machine with more"
    plan = plan_rank(shape, ranks, lengths, lora_rank)
    needed = needed_on_device(plan, ranks, devices)
    if needed <= HEADROOM * devices.memory:
        return None
    fixes = []
    if not devices.shared:  # more ranks help only where each has memory of its own
        more = next((n for n in range(ranks + 1, max_ranks + 1) if fits(plan_rank(shape, n, lengths, lora_rank), n, Devices(devices.kind, n, devices.memory, False))), None)
        if more is not None:
            fixes.append(f"--trainer-ranks {more} (one device each)")
    if not lora_rank and fits(plan_rank(shape, ranks, lengths, 64), ranks, devices):
        fixes.append("--lora-rank 64")
    checkpointed = replace(lengths, gradient_checkpointing=True)
    if not lengths.gradient_checkpointing and fits(plan_rank(shape, ranks, checkpointed, lora_rank), ranks, devices):
        fixes.append("gradient_checkpointing = true in the recipe")
    fix = "use " + ", or ".join(fixes) if fixes else "no number of ranks, LoRA rank or checkpointing fits it here: use devices with more memory, or a smaller token_budget"
    where = "this machine's RAM (all ranks)" if devices.shared else "each device"
    return (f"does not fit: {needed / GB:.1f} GB needed on {where}, over {HEADROOM:.0%} of {devices.memory / GB:.1f} GB "
            f"(activations {plan.activations / GB:.1f} GB of it); {fix}")
