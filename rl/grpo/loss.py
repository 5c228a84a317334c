"""GRPO advantages and the PPO-clip policy loss, as verl computes them for rStar2-Agent.

Sources: verl `verl/trainer/ppo/core_algos.py` (`compute_grpo_outcome_advantage`,
`compute_policy_loss_vanilla`, `agg_loss` in "token-mean" mode) and `verl/trainer/ppo/rollout_corr_helper.py`
(token-level truncated importance sampling); the values are those of microsoft/rStar's run script
(`examples/run_qwen3-14b_rstar2_agent_weave.sh`: clip 0.2 / 0.28, no KL, no entropy term) and verl's
actor defaults (`clip_ratio_c=3.0`).
"""

from __future__ import annotations

import statistics

import torch

# verl `compute_grpo_outcome_advantage`: epsilon added to the group's std.
ADVANTAGE_EPS = 1e-6
# verl clamps log(ratio) to +-20 before exponentiating, so one wild token cannot overflow the loss.
LOG_RATIO_BOUND = 20.0


def group_advantages(rewards: list[float]) -> list[float]:
    """GRPO advantages of one group: (r - mean) / (std + 1e-6), std with Bessel's correction.

    Computed on the traces that train (after down-sampling), as rStar2-Agent does (paper Eq. 7). A group of
    one has no peers to compare with: verl gives it mean 0 and std 1, so its advantage is its reward.
    """
    if len(rewards) == 1:
        mean, std = 0.0, 1.0
    else:
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    return [(r - mean) / (std + ADVANTAGE_EPS) for r in rewards]


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float = 3.0,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sum over mask-1 tokens of the clipped PPO loss, and statistics for the step's log.

    All tensors are per token and of one shape. Per token, with ratio = exp(logprobs - old_logprobs):

        loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))       (PPO, clip-higher)
        loss = min(loss, -A * dual_clip)          where A < 0                        (dual-clip)
        loss = loss * is_weights                  when given                         (truncated IS)

    Dual-clip bounds what one negative-advantage token with an exploding ratio can contribute.
    The SUM is returned, not a mean: the trainer divides it by the token count of the whole step
    (`token_mean`), so every trained token weighs the same however the step is cut into micro-batches.
    Masked tokens (tool output, template) contribute nothing: they are selected out with `torch.where`
    rather than multiplied by 0, so whatever log-probs they carry cannot reach the sum.

    Stats, over mask-1 tokens: `clip_frac` (the clipped term was the larger, so the token's gradient is
    zero; verl's `pg_clipfrac`), `dual_clip_frac` (A < 0 and the dual bound was active; verl's
    `pg_clipfrac_lower`), `ratio_mean`, `approx_kl` (mean of old - new log-prob; verl's `ppo_kl`),
    `num_tokens`.
    """
    if dual_clip <= 1.0:
        raise ValueError(f"dual_clip must exceed 1, got {dual_clip}")
    mask = mask.bool()
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()

    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    ppo = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * dual_clip
    losses = torch.where(advantages < 0, torch.minimum(ppo, dual_bound), ppo)
    if is_weights is not None:
        losses = losses * is_weights.detach()
    loss_sum = torch.where(mask, losses, 0.0).sum()

    with torch.no_grad():
        num_tokens = int(mask.sum())

        def masked_mean(values: torch.Tensor) -> float:
            return float(torch.where(mask, values.double(), 0.0).sum()) / max(num_tokens, 1)

        stats = {
            "clip_frac": masked_mean(clipped > unclipped),
            "dual_clip_frac": masked_mean((advantages < 0) & (ppo > dual_bound)),
            "ratio_mean": masked_mean(ratio),
            "approx_kl": masked_mean(-log_ratio),
            "num_tokens": num_tokens,
        }
    return loss_sum, stats


def truncated_is_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token truncated importance weights min(exp(old - rollout), cap), without gradient.

    They correct for the rollout engine's sampling distribution differing from the trainer's (kernels,
    precision, a policy one update behind), as verl's token-level `rollout_is` does.
    """
    with torch.no_grad():
        log_ratio = (old_logprobs - rollout_logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        return log_ratio.exp().clamp(max=cap)


def token_mean(loss_sum: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The step's token-mean loss (paper Eq. 6) from one micro-batch's sum.

    `num_tokens` is the mask-1 token count of the whole step, not of the micro-batch: summed over the
    micro-batches' backward passes, the gradients then equal those of one mean over every token. Current
    verl does the same (`agg_loss` "token-mean" with the batch's token count; across data-parallel ranks
    whose gradients are averaged it also multiplies by the world size). The verl 0.5 fork rStar trained
    with took a mean per micro-batch and scaled it by micro-batch rows / mini-batch rows instead
    (`dp_actor.py`), which weighs tokens unequally when micro-batches differ in length.
    """
    if num_tokens <= 0:
        raise ValueError(f"num_tokens must be positive, got {num_tokens}")
    return loss_sum / num_tokens
