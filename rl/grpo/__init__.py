"""GRPO-RoC, the RL stage: its knobs (`config`, `recipe`), rollouts through the server's agent loop
(`rollout`), down-sampling, the loss and the update (`downsample`, `loss`, `trainer`), weight sync into the
serving engine and the step loop (`train`)."""
