"""A run's curves as one PNG (matplotlib, Agg: no display), redrawn after every step into the run directory."""

from __future__ import annotations

from pathlib import Path

PANELS = (
    ("reward", ("reward_mean", "solve_rate", "kept_reward_mean")),
    ("groups", ("groups_kept", "groups_dropped_equal", "groups_dropped_small")),
    ("tokens per sample", ("sampled_tokens_mean", "response_tokens_mean")),
    ("tool use", ("tool_call_rate", "tool_error_rate_positive", "tool_error_rate_kept_positive", "tool_error_rate_kept_negative")),
    ("update", ("clip_frac", "grad_norm", "approx_kl")),
    ("rollout vs trainer logprobs", ("logprob_gap", "probe_gap")),
    ("seconds per step", ("rollout_s", "reward_s", "train_s", "sync_s")),
)


def plot_run(steps: list[dict], path: Path, title: str) -> None:
    """Draw every panel whose metrics the steps carry; steps as `RunStore.get` returns them."""
    if not steps:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(name, keys) for name, keys in PANELS if any(step.get(key) is not None for step in steps for key in keys)]
    columns = 2
    rows = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(11, 2.8 * rows), squeeze=False)
    x = [step["step"] for step in steps]
    for axis, (name, keys) in zip(axes.flat, panels):
        for key in keys:
            values = [step.get(key) for step in steps]
            if any(v is not None for v in values):
                axis.plot(x, [float("nan") if v is None else v for v in values], marker="o", markersize=2, label=key)
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("step", fontsize=8)
        axis.tick_params(labelsize=7)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    temporary = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(temporary, dpi=90)
    plt.close(figure)
    temporary.replace(path)
