"""Every knob of GRPO-RoC training, with rStar2-Agent's values as defaults.

Defaults are the released run script's (microsoft/rStar @ ecbfb94, `examples/run_qwen3-14b_rstar2_agent_weave.sh`
on verl's defaults); where the paper (arXiv 2508.20722) differs, its value is given in brackets. Recipes
(`rl/grpo/recipes/*.toml`) override these per run and per stage; unknown keys are refused by name.

Not knobs, because the release has none of them: a KL term (`use_kl_loss=False`, no reference model), an
entropy bonus (`entropy_coeff=0`), overlong filtering (truncated traces score 0 like any wrong answer),
format or tool-use rewards (the reward is the answer alone).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rstar.rl.grpo.downsample import Mode
from rstar.rl.policy import LoraSpec
from rstar.sandbox.tools import ToolSettings
from rstar.sandbox.verify import RewardRule


class GRPOConfig(ToolSettings):
    """The tool protocol and the cut of each tool result come from ToolSettings (its defaults are the
    released ones): the rollouts' agent loop runs with exactly those."""

    model_config = ConfigDict(extra="forbid")

    # --- rollout
    prompts_per_step: int = Field(128, ge=1, description="Problems per step (train_batch_size=128) [paper 512].")
    rollouts_per_prompt: int = Field(32, ge=1, description="Samples per problem, 2G (rollout.n=32).")
    keep_per_prompt: int = Field(16, ge=1, description="Samples per problem that train after down-sampling, G (down_sample_to_n=16).")
    temperature: float = Field(1.0, gt=0, description="Rollout sampling temperature (verl default 1.0).")
    top_p: float = Field(1.0, gt=0, le=1, description="Rollout nucleus sampling (verl default 1.0, i.e. off).")
    max_prompt_tokens: int = Field(2048, ge=1, description="Problems whose rendered prompt is longer are left out (max_prompt_length=2048).")
    max_response_tokens: int = Field(8192, ge=1, description="Token budget of a whole trajectory, tool tokens included (8192 in stage 1) [paper 8K, 12K, 12K].")
    max_turns: int = Field(5, ge=1, description="Assistant turns per trajectory (max_assistant_turns=5) [paper 10, 10, 15].")
    max_parallel_calls: int = Field(1, ge=1, description="Tool calls run per turn; later ones in a turn are ignored (verl max_parallel_calls=1).")
    builtin_tools: bool = Field(True, description="Offer the Python tool in rollouts (rStar2-Agent); off: plain GRPO on text answers, e.g. to compare with other trainers.")
    tool_timeout_s: float = Field(4.0, gt=0, description="Wall-clock limit per tool call (code-judge MAX_EXECUTION_TIME=4 in rStar's README).")
    # --- reward
    reward: RewardRule = Field(
        "released",
        description="How an answer is checked (sandbox/verify.py): 'released', what compute_score.py accepts (prime_math's reading of the last "
        "\\boxed{} or an 'answer is' marker, else math-verify over the whole response); 'boxed', the paper's rule (the \\boxed{} in <answer>, "
        "no box scores 0).",
    )
    reward_timeout_s: float = Field(10.0, gt=0, description="Answer checking runs in the sandbox under this limit; a check that hangs scores 0 and is logged.")
    # --- down-sampling
    downsample: Mode = Field(
        "released",
        description="'released': reject-equal + RoC as the code does it (text penalties, lowest-penalty positives); 'paper': penalties from tool records, "
        "positives sampled inversely to penalty; 'none': plain GRPO, every sample trains.",
    )
    min_positive_traces: int = Field(2, ge=0, description="RoC keeps at least this many correct samples where they exist (min_non_zero_reward_trace_num=2).")
    min_negative_traces: int = Field(2, ge=0, description="RoC keeps at least this many wrong samples where they exist (min_zero_reward_trace_num=2).")
    # --- loss
    clip_low: float = Field(0.2, ge=0, description="PPO clip below 1 (clip_ratio_low=0.2).")
    clip_high: float = Field(0.28, ge=0, description="PPO clip above 1, clip-higher (clip_ratio_high=0.28).")
    dual_clip: float = Field(3.0, gt=1, description="Dual-clip bound for negative advantages (verl clip_ratio_c=3.0).")
    old_logprobs: Literal["trainer", "rollout"] = Field(
        "trainer",
        description="pi_old for the PPO ratio: recomputed by the trainer (as released), or the rollout engine's logprobs (verl's 'bypass').",
    )
    tis_cap: float | None = Field(
        None, gt=0, description="Truncated importance weights min(pi_old / pi_rollout, cap) on every token, for the engine/trainer mismatch; off as released."
    )
    # --- optimizer
    learning_rate: float = Field(1e-6, ge=0, description="AdamW learning rate, constant after warm-up (lr=1e-6); 0 makes a control run: the same problems and sampling seeds, and weights that never change.")
    warmup_steps: int = Field(20, ge=0, description="Linear warm-up steps (lr_warmup_steps=20).")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (verl default 0.01).")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas (verl default).")
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clip (verl grad_clip=1.0).")
    mini_batches_per_step: int = Field(
        1, ge=1, description="Optimizer updates per step (ppo_mini_batch_size = the whole batch: 1, so each step is on-policy)."
    )
    # --- trainer
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Trainer compute dtype (weights stay fp32); auto: bf16 on GPUs and CPUs with native bf16, else fp32."
    )
    token_budget: int = Field(8192, ge=64, description="Tokens per packed micro-batch row (shared prompts counted once).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward: less memory, about a third more time.")
    trainer_ranks: int = Field(
        1, ge=1, description="Trainer processes on this machine, the policy sharded across them with FSDP2 (one per GPU; on CPU one per core, gloo). "
        "Read from the first stage. Not in the release (verl shards over its Ray workers).",
    )
    sleep_engine: bool = Field(
        True, description="Colocated trainer and engine (the release's hybrid engine): the engine sleeps while the trainer updates (vLLM sleep mode, "
        "level 1: weights to host memory, KV cache dropped) and wakes before the weight sync, so the update has the devices' memory "
        "(verl's rollout.free_cache_engine=True, as released). Where vLLM has no sleep mode (CPU) or the engine runs as replicas, one line "
        "says so at the run's start and the engine stays awake. Read from the first stage.",
    )
    # --- LoRA (not in the paper or the release: both train every weight of the 14B model, on 64 MI300X)
    lora_rank: int = Field(
        0, ge=0, le=256, description="0: full fine-tuning, as the paper and the release do. R > 0: train a rank-R LoRA adapter (peft) on the frozen base, "
        "and sync only the adapter (vLLM serves base + adapter; the engine needs max_lora_rank >= R). How one device trains a model too large to "
        "fine-tune in full (`rstar rl plan --lora-rank`). LoRA wants a learning rate far above full fine-tuning's 1e-6 (commonly 1e-5 to 1e-4). "
        "Read from the first stage.",
    )
    lora_alpha: int | None = Field(None, ge=1, description="LoRA's alpha (the adapter's update is scaled by alpha / rank); None: twice the rank, the SFT stage's ratio (8 / 16).")
    lora_dropout: float = Field(LoraSpec.dropout, ge=0, lt=1, description="Dropout on the adapter's input in training forwards (the SFT stage's 0); the probe's forward runs without it.")
    lora_target_modules: tuple[str, ...] = Field(LoraSpec.target_modules, min_length=1, description="Linear layers that get adapters: every attention and MLP projection, as in the SFT stage.")
    # --- weight sync
    max_logprob_gap: float | None = Field(
        0.05, gt=0, description="Largest mean |rollout - trainer| logprob over a step's sampled tokens before the run stops (the engine and trainer "
        "disagree on the policy; about 0.008 with a bf16 engine here); None: logged only. Not in the release.",
    )
    probe_tolerance: float | None = Field(
        None, gt=0, description="Largest mean |engine - trainer| logprob gap on the probe after a sync; default by dtypes: 1e-3 when both are fp32, else 0.15."
    )
    # --- run
    seed: int = Field(0, description="Data order, rollout sampling seeds and RoC's draws all derive from it.")
    save_every: int = Field(1, ge=1, description="Steps between checkpoints; a killed run loses at most this many steps.")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept on disk (oldest removed first).")

    @model_validator(mode="after")
    def _consistent(self) -> "GRPOConfig":
        if self.keep_per_prompt > self.rollouts_per_prompt:
            raise ValueError(f"keep_per_prompt ({self.keep_per_prompt}) exceeds rollouts_per_prompt ({self.rollouts_per_prompt})")
        if self.downsample != "none" and self.min_positive_traces + self.min_negative_traces > self.keep_per_prompt:
            raise ValueError("min_positive_traces + min_negative_traces exceeds keep_per_prompt")
        if self.downsample == "none" and self.keep_per_prompt != self.rollouts_per_prompt:
            raise ValueError("downsample 'none' trains every sample: set keep_per_prompt equal to rollouts_per_prompt")
        return self

    def lora(self) -> LoraSpec | None:
        """The adapter to train, or None for full fine-tuning."""
        if not self.lora_rank:
            return None
        alpha = self.lora_alpha or 2 * self.lora_rank
        return LoraSpec(rank=self.lora_rank, alpha=alpha, dropout=self.lora_dropout, target_modules=tuple(self.lora_target_modules))
