"""GRPO advantages and the clipped policy loss against hand computations (golden: tests/golden/rl/)."""

from __future__ import annotations

import math

import pytest
import torch

from rstar.rl.grpo.loss import group_advantages, policy_loss, token_mean, truncated_is_weights
from tests.unit.golden_files import check_json


def test_group_advantages_by_hand():
    # Mean 0.6; Bessel variance (3 * 0.4^2 + 2 * 0.6^2) / 4 = 0.3.
    advantages = group_advantages([1.0, 0.0, 0.0, 1.0, 1.0])
    right, wrong = 0.4 / (math.sqrt(0.3) + 1e-6), -0.6 / (math.sqrt(0.3) + 1e-6)
    assert advantages == pytest.approx([right, wrong, wrong, right, right], abs=1e-12)
    assert advantages[0] == pytest.approx(0.730295, abs=1e-6)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    assert advantages == pytest.approx(((rewards - rewards.mean()) / (rewards.std() + 1e-6)).tolist(), abs=1e-12)

    assert group_advantages([1.0]) == [1.0 / (1.0 + 1e-6)]  # verl: a lone trace gets mean 0, std 1
    assert group_advantages([1.0, 1.0]) == [0.0, 0.0]
    groups = ([1.0, 0.0, 0.0, 1.0, 1.0], [1.0, 0.0], [1.0], [0.0, 0.0, 0.0, 1.0])
    check_json("rl/loss_advantages.json", {str(g): [round(a, 9) for a in group_advantages(g)] for g in groups})


# One token per case: (name, ratio, advantage, expected loss by hand). clip_low 0.2, clip_high 0.28, dual 3.
TOKENS = [
    ("inside_band", 1.1, 0.5, -0.5 * 1.1),  # unclipped
    ("above_band_positive_A", 1.5, 1.0, -1.28),  # clipped at 1 + 0.28: no push further up
    ("below_band_positive_A", 0.5, 1.0, -0.5),  # pessimistic term is the unclipped one: not clipped
    ("below_band_negative_A", 0.5, -1.0, 0.8),  # clipped at 1 - 0.2: no push further down
    ("above_band_negative_A", 1.5, -1.0, 1.5),  # unclipped: the token is pulled back down
    ("beyond_dual_clip", 4.0, -2.0, 2.0 * 3.0),  # -A * ratio = 8, bounded by -A * 3 = 6
]


def tensors(ratios, advantages, mask=None):
    old = torch.full((len(ratios),), -1.5, dtype=torch.float64)
    new = (old + torch.tensor(ratios, dtype=torch.float64).log()).requires_grad_()
    mask = torch.ones(len(ratios)) if mask is None else torch.tensor(mask, dtype=torch.float64)
    return new, old, torch.tensor(advantages, dtype=torch.float64), mask


def test_policy_loss_by_hand():
    per_token = {}
    for name, ratio, advantage, expected in TOKENS:
        loss, _ = policy_loss(*tensors([ratio], [advantage]))
        assert loss.item() == pytest.approx(expected, abs=1e-12), name
        per_token[name] = round(loss.item(), 9)

    loss, stats = policy_loss(*tensors([t[1] for t in TOKENS], [t[2] for t in TOKENS]))
    assert loss.item() == pytest.approx(sum(t[3] for t in TOKENS), abs=1e-12)  # the SUM, not a mean
    assert stats["num_tokens"] == 6
    # verl counts a token as clipped where the clipped term won the max: not beyond_dual_clip, whose
    # unclipped term won before the dual bound took over.
    assert stats["clip_frac"] == pytest.approx(2 / 6)
    assert stats["dual_clip_frac"] == pytest.approx(1 / 6)
    assert stats["ratio_mean"] == pytest.approx((1.1 + 1.5 + 0.5 + 0.5 + 1.5 + 4.0) / 6)
    assert stats["approx_kl"] == pytest.approx(-sum(math.log(t[1]) for t in TOKENS) / 6)
    check_json(
        "rl/loss_tokens.json",
        {"per_token": per_token, "sum": round(loss.item(), 9), "stats": {k: round(v, 9) for k, v in stats.items()}},
    )


def test_masked_tokens_change_nothing():
    ratios, advantages = [t[1] for t in TOKENS], [t[2] for t in TOKENS]
    base_loss, base_stats = policy_loss(*tensors(ratios, advantages))
    # Two masked tokens with wild log-probs (one pushes the ratio to exp(50), clamped to exp(20)).
    new, old, adv, mask = tensors(ratios + [7.0, 1.0], advantages + [-5.0, 2.0], [1] * 6 + [0, 0])
    with torch.no_grad():
        new[-2] += 50.0
    loss, stats = policy_loss(new, old, adv, mask)
    assert loss.item() == pytest.approx(base_loss.item(), abs=1e-12)
    assert stats == pytest.approx(base_stats)
    loss.backward()
    assert new.grad[-2:].tolist() == [0.0, 0.0]


def test_gradient_is_minus_advantage_over_tokens_at_ratio_one():
    advantages = [1.0, -0.5, 2.0, 0.0, -1.5]
    new, old, adv, mask = tensors([1.0] * 5, advantages, [1, 1, 0, 1, 1])
    loss_sum, stats = policy_loss(new, old, adv, mask)
    token_mean(loss_sum, stats["num_tokens"]).backward()
    assert new.grad.tolist() == pytest.approx([-1.0 / 4, 0.5 / 4, 0.0, 0.0, 1.5 / 4], abs=1e-12)
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0 and stats["approx_kl"] == 0.0


def test_clipped_tokens_have_no_gradient():
    new, old, adv, mask = tensors([1.5, 0.5, 4.0], [1.0, -1.0, -1.0])
    policy_loss(new, old, adv, mask)[0].backward()
    assert new.grad.tolist() == [0.0, 0.0, 0.0]  # above the band (A > 0), below it (A < 0), dual-clipped


def test_truncated_is_weights():
    old = torch.tensor([-1.0, -1.0, -1.0], requires_grad=True)
    rollout = torch.tensor([-1.0 - math.log(0.5), -1.0 - math.log(3.0), -1.0])
    weights = truncated_is_weights(old, rollout, cap=2.0)
    assert weights.tolist() == pytest.approx([0.5, 2.0, 1.0])  # exp(old - rollout), capped at 2
    assert not weights.requires_grad

    loss, _ = policy_loss(*tensors([1.1, 1.1, 1.1], [1.0, 1.0, 1.0]), is_weights=weights.double())
    assert loss.item() == pytest.approx(-1.1 * (0.5 + 2.0 + 1.0))


def test_token_mean_over_micro_batches_equals_one_mean():
    ratios, advantages = [t[1] for t in TOKENS], [t[2] for t in TOKENS]
    whole, stats = policy_loss(*tensors(ratios, advantages))
    first, _ = policy_loss(*tensors(ratios[:2], advantages[:2]))
    second, _ = policy_loss(*tensors(ratios[2:], advantages[2:]))
    n = stats["num_tokens"]
    assert (token_mean(first, n) + token_mean(second, n)).item() == pytest.approx(token_mean(whole, n).item())
    with pytest.raises(ValueError):
        token_mean(whole, 0)
