"""`rstar rl plan`'s arithmetic against hand-computed numbers and the models' published parameter counts."""

from __future__ import annotations

import pytest

from rstar.rl.plan import (
    GB, KNOWN_CONFIGS, Devices, Lengths, activation_bytes, layer_parameters, lora_parameters, parameter_count, plan_rank, problem, shape_from_config,
)

# SmolLM2-135M's config.json (the default model).
SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True}


def test_parameter_counts_are_the_published_ones():
    # By hand for SmolLM2: a layer is 576 x (576 + 2 x 192) + 576 x 576 (attention) + 3 x 576 x 1536 (MLP) + 2 x 576 (norms)
    # = 3,540,096; 30 of them, the tied 49152 x 576 embeddings and the final norm: 134,515,008.
    smollm2 = shape_from_config(SMOLLM2)
    assert layer_parameters(smollm2) == 3_540_096
    assert parameter_count(smollm2) == 134_515_008
    # The model cards' exact counts (transformers on the meta device gives the same for these configs).
    assert parameter_count(shape_from_config(KNOWN_CONFIGS["qwen2.5-1.5b"])) == 1_543_714_304  # qkv biases, tied
    assert parameter_count(shape_from_config(KNOWN_CONFIGS["qwen2.5-7b"])) == 7_615_616_512  # qkv biases, untied
    assert parameter_count(shape_from_config(KNOWN_CONFIGS["microsoft/rstar2-agent-14b"])) == 14_768_307_200  # Qwen3: q/k norms, head_dim 128


def test_lora_counts_rank_times_in_plus_out_per_projection():
    # SmolLM2, rank 8: (576+576) + 2 x (576+192) + (576+576) + 2 x (576+1536) + (1536+576) = 10,176 per layer and rank.
    assert lora_parameters(shape_from_config(SMOLLM2), 8) == 8 * 10_176 * 30


def test_full_fine_tune_is_16_bytes_a_parameter_sharded_over_the_ranks():
    shape = shape_from_config(SMOLLM2)
    lengths = Lengths(100, 100, 200, False, 4)
    one, two = plan_rank(shape, 1, lengths), plan_rank(shape, 2, lengths)
    assert (one.weights, one.gradients, one.optimizer) == (134_515_008 * 4, 134_515_008 * 4, 134_515_008 * 8)
    assert (two.weights, two.gradients, two.optimizer) == (134_515_008 * 2, 134_515_008 * 2, 134_515_008 * 4)
    assert one.gathered == 0 and one.host_extra == 0
    # Sharded: the root (embeddings + final norm) and two layers at full size, with their gradients.
    assert two.gathered == (49152 * 576 + 576 + 2 * 3_540_096) * 4 * 2
    assert two.activations == one.activations  # every rank trains whole rows of its own
    lora = plan_rank(shape, 1, lengths, lora_rank=8)
    assert lora.weights == (134_515_008 + 8 * 10_176 * 30) * 4 and lora.gradients == 8 * 10_176 * 30 * 4


def test_activations_follow_the_formula():
    shape = shape_from_config(SMOLLM2)
    per_layer_token = 4 * 576 + 2 * (9 + 3) * 64 + 4 * 1536  # 9,984 values
    # A row of 1,024 tokens (the budget beats prompt + response), fp32: layers, then 1,024 - 300 loss tokens' logits.
    assert activation_bytes(shape, Lengths(300, 500, 1024, False, 4)) == 1024 * 30 * per_layer_token * 4 + 724 * 49152 * 4
    # A group longer than the budget gets a row of its own; bf16 logits plus their fp32 copy; checkpointing keeps layer inputs.
    assert activation_bytes(shape, Lengths(300, 900, 1024, True, 2)) == 1200 * 30 * 576 * 4 + 1200 * per_layer_token * 2 + 900 * 49152 * 6


def test_fourteen_b_fits_eight_mi300x_in_full_and_one_h200_only_with_lora_or_more_ranks():
    shape = shape_from_config(KNOWN_CONFIGS["rstar2-agent-14b"])
    paper = Lengths(2048, 12288, 20480, True, 2)
    assert problem(shape, 8, paper, 0, Devices("named", 8, 192 * GB, False)) is None
    line = problem(shape, 1, paper, 0, Devices("named", 1, 141 * GB, False))
    assert line.startswith("does not fit: 274.1 GB needed on each device") and "--trainer-ranks 4 (one device each)" in line and "--lora-rank 64" in line
    assert problem(shape, 1, paper, 64, Devices("named", 1, 141 * GB, False)) is None


def test_more_ranks_than_devices_and_shared_ram_are_refused_naming_the_fix():
    shape = shape_from_config(SMOLLM2)
    cpu = Devices("cpu", 2, 8 * GB, True)
    assert problem(shape, 3, Lengths(100, 100, 200, False, 4), 0, cpu) == "3 ranks but 2 CPU cores, one rank each; use --trainer-ranks 2 or fewer, or a machine with more"
    # On shared RAM more ranks do not help; checkpointing does, and is named.
    line = problem(shape, 2, Lengths(1024, 2048, 2048, False, 4), 0, cpu)
    assert "this machine's RAM (all ranks)" in line and "--trainer-ranks" not in line and "gradient_checkpointing = true" in line


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-7B-Instruct", "RSTAR2-AGENT-14B"])
def test_known_shapes_are_found_by_hub_id_or_short_name_in_any_case(name):
    assert name.lower() in KNOWN_CONFIGS


def test_the_command_prints_each_rank_and_refuses_a_plan_that_does_not_fit_in_one_line():
    from typer.testing import CliRunner

    from rstar.rl.cli import app

    runner = CliRunner()
    fits = runner.invoke(app, ["plan", "--model", "rstar2-agent-14b", "--trainer-ranks", "8", "--device-memory-gb", "192"])
    assert fits.exit_code == 0, fits.output
    assert "14,768,307,200 parameters" in fits.output and "AdamW states" in fits.output and "fits: 8 x 192.0 GB (devices named)" in fits.output
    refused = runner.invoke(app, ["plan", "--model", "rstar2-agent-14b", "--device-memory-gb", "141"])
    assert refused.exit_code == 2 and "does not fit: 274.1 GB needed on each device" in refused.output
    unknown = runner.invoke(app, ["plan", "--model", "no-such-model-here", "--device-memory-gb", "141"])
    assert unknown.exit_code == 2 and "built-in shapes:" in unknown.output
