"""GRPO-RoC and the non-reasoning SFT stage, on the serving stack's own engine, template and sandbox.

Rollouts go through `rstar.server.agent_loop.run_trajectory` on the engine that serves the API; `rl/` never
re-implements generation, templating or the tool loop. Pure protocol pieces (down-sampling, advantages,
loss, packing) are functions with golden tests; the trainer, weight sync and run bookkeeping are the edges.
"""
